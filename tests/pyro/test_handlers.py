"""The handlers on subsampled plates, and the kernel's own minibatch draws."""

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine

from ppl_sgmcmc.pyro import FullDataModel, full_data, minibatch, subsample_plates
from ppl_sgmcmc.pyro.handlers import is_subsample_site


def model(X, y):
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    with pyro.plate("data", X.shape[0], subsample_size=3) as idx:  # user indexing ...
        pyro.deterministic("idx", idx.float())
        x = pyro.subsample(X, event_dim=1)  # ... and pyro.subsample
        pyro.sample("y", dist.Normal(x @ w, 1.0), obs=y[idx])


X, Y = torch.randn(7, 2), torch.randn(7)


def test_full_data_runs_subsampled_plates_on_all_data():
    tr = poutine.trace(full_data(model)).get_trace(X, Y)
    assert tr.nodes["y"]["value"].shape == (7,)
    assert tr.nodes["y"]["scale"] == 1.0
    torch.testing.assert_close(tr.nodes["y"]["value"], Y)
    torch.testing.assert_close(tr.nodes["idx"]["value"], torch.arange(7.0))
    (frame,) = tr.nodes["y"]["cond_indep_stack"]
    assert frame.size == 7
    # the same handler as a context, and FullDataModel (which also converts NumPy arguments)
    with full_data():
        assert poutine.trace(model).get_trace(X, Y).nodes["y"]["value"].shape == (7,)
    tr = poutine.trace(FullDataModel(model)).get_trace(X.numpy(), Y.numpy())
    torch.testing.assert_close(tr.nodes["y"]["value"], Y)


def test_full_data_leaves_other_plates_and_later_runs_alone():
    poutine.trace(full_data(model)).get_trace(X, Y)
    tr = poutine.trace(model).get_trace(X, Y)  # plates built outside the handler are untouched
    assert tr.nodes["y"]["value"].shape == (3,)
    assert tr.nodes["y"]["scale"] == pytest.approx(7 / 3)


def test_subsample_plates_sets_the_indices():
    handler = subsample_plates({"data": torch.tensor([6, 6, 0])})
    tr = poutine.trace(handler(model)).get_trace(X, Y)
    torch.testing.assert_close(tr.nodes["y"]["value"], Y[[6, 6, 0]])
    torch.testing.assert_close(tr.nodes["idx"]["value"], torch.tensor([6.0, 6.0, 0.0]))
    assert tr.nodes["y"]["scale"] == pytest.approx(7 / 3)
    assert handler.fixed == {"data": (7, 3)}
    # no indices: the first n (a prototype trace; Pyro's own draw would shuffle all N)
    tr = poutine.trace(subsample_plates()(model)).get_trace(X, Y)
    torch.testing.assert_close(tr.nodes["idx"]["value"], torch.arange(3.0))


def test_minibatch_with_replacement_is_uniform():
    generator = torch.Generator().manual_seed(0)
    sizes = {"a": (10, 4), "b": (3, 2)}
    state = minibatch.init(generator, sizes, replace=True)
    counts = torch.zeros(10)
    for _ in range(2000):
        batch, state = minibatch.draw(generator, state, sizes, replace=True)
        assert batch["a"].shape == (4,) and batch["b"].shape == (2,)
        assert int(batch["b"].max()) < 3
        counts += torch.bincount(batch["a"], minlength=10)
    # 8000 draws over 10 indices: 800 ± 27 each; 5 sd
    assert torch.all((counts - 800).abs() < 5 * (8000 * 0.1 * 0.9) ** 0.5)


def test_minibatch_epochs_cover_every_index_once():
    generator = torch.Generator().manual_seed(1)
    sizes = {"data": (10, 3)}
    state = minibatch.init(generator, sizes, replace=False)
    epochs = []
    for _ in range(2):
        seen = []
        for _ in range(3):  # 3 batches of 3 per epoch; the tail of 1 is skipped
            batch, state = minibatch.draw(generator, state, sizes, replace=False)
            seen.append(batch["data"])
        seen = torch.cat(seen)
        assert len(set(seen.tolist())) == 9  # no index twice within an epoch
        epochs.append(seen)
    assert not torch.equal(epochs[0], epochs[1])  # reshuffled


# --- full_data leaves no subsample site: Pyro's NUTS runs on it (the gold standard) -------------------
def normal_mean(y):
    mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
    with pyro.plate("data", y.shape[0], subsample_size=10):
        pyro.sample("y", dist.Normal(mu, 1.0), obs=pyro.subsample(y, event_dim=0))


def test_full_data_trace_has_no_subsample_site():
    tr = poutine.trace(full_data(model)).get_trace(X, Y)
    assert not any(site["type"] == "sample" and is_subsample_site(site) for site in tr.nodes.values())
    assert tr.nodes["data"]["fn"].size == 7 and tr.nodes["data"]["fn"].subsample_size is None
    assert is_subsample_site(poutine.trace(model).get_trace(X, Y).nodes["data"])  # the model itself still subsamples


def test_nuts_runs_on_the_full_data_view():
    """``NUTS(full_data(model))``: Pyro's NUTS on all N points matches the conjugate posterior of a normal mean."""
    from pyro.infer import MCMC, NUTS

    from tests.helpers import K_SIGMA, mean_and_mcse

    y = 1.5 + torch.randn(50, generator=torch.Generator().manual_seed(0))
    precision = 1 / 10.0**2 + len(y)
    post_mean, post_sd = float(y.sum()) / precision, precision**-0.5
    mcmc = MCMC(NUTS(full_data(normal_mean)), warmup_steps=150, num_samples=300, disable_progbar=True)
    mcmc.run(y)
    draws = mcmc.get_samples(group_by_chain=True)["mu"].numpy()
    mean, mcse = mean_and_mcse(draws)
    assert abs(mean - post_mean) < K_SIGMA * mcse
    assert abs(draws.std() / post_sd - 1) < 0.25
