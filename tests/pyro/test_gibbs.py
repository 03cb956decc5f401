"""Local Gibbs sites on the Pyro kernels (``gibbs_sites=``, ``gibbs_fn=``, ``gibbs_sweeps=``): the
options' errors, the ``gibbs_fn`` contract with a ``torch.Generator``, the traced gradient against the
eager one, reproducibility, and the Fisher-identity gradient on the two-component mixture of
``tests/numpyro/test_gibbs.py`` (memberships summed out exactly).

The LDA declaration in Pyro is tested in ``tests/models/test_lda_pyro.py``.
"""

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC

from ppl_sgmcmc.pyro import SGFS, SGLD, SGNHT
from ppl_sgmcmc.pyro.gibbs import GibbsFnError
from tests.helpers import K_SIGMA

N, BATCH = 40, 8
WEIGHTS = torch.tensor([0.3, 0.7])
PRIOR_SD = 3.0


def mixture(x):
    mu = pyro.sample("mu", dist.Normal(0.0, PRIOR_SD).expand([2]).to_event(1))
    with pyro.plate("data", x.shape[0], subsample_size=BATCH):
        xb = pyro.subsample(x, event_dim=0)
        z = pyro.sample("z", dist.Categorical(probs=WEIGHTS))
        pyro.sample("x", dist.Normal(mu[z], 1.0), obs=xb)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(1)
    z = rng.random(N) < 0.7
    return torch.as_tensor(np.where(z, 2.0, -1.5) + rng.normal(size=N), dtype=torch.float32)


def make_gibbs_fn(x):
    """The exact conditional ``p(z_i | x_i, μ) ∝ w_k N(x_i; μ_k, 1)`` of the minibatch's memberships."""

    def gibbs_fn(generator, gibbs_sites, hmc_sites, subsample_indices):
        xb = x[subsample_indices["data"]]
        logits = WEIGHTS.log() + dist.Normal(hmc_sites["mu"], 1.0).log_prob(xb[:, None])
        return {"z": torch.multinomial(logits.softmax(-1), 1, generator=generator)[:, 0]}

    return gibbs_fn


def run(kernel, *args, warmup_steps=2, num_samples=2):
    mcmc = MCMC(kernel, warmup_steps=warmup_steps, num_samples=num_samples, disable_progbar=True)
    mcmc.run(*args)
    return mcmc


# --- option errors (the checks are shared with the NumPyro backend: one case per path here) ------------
@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(gibbs_sites=["z"]), r"SGLD: `gibbs_sites` needs `gibbs_fn`"),
        (dict(gibbs_sites=["z"], gibbs_fn=lambda *a: a[1], gibbs_sweeps=(2, 0)), r"kept >= 1"),
    ],
)
def test_option_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SGLD(mixture, step_size=1e-3, **kwargs)


def test_gibbs_needs_a_model():
    with pytest.raises(ValueError, match=r"local Gibbs sites need a `model`"):
        SGLD(potential_fn=lambda z: 0.0, step_size=1e-3, gibbs_sites=["z"], gibbs_fn=lambda *a: a[1])


def test_site_errors(data):
    for site, message in [
        ("zz", r"`gibbs_sites` names 'zz', which is not a sample site.*'mu', 'z'"),
        ("x", r"Gibbs site 'x' is observed"),
        ("mu", r"Gibbs site 'mu' is not inside a subsampled plate"),
    ]:
        with pytest.raises(ValueError, match=message):
            run(SGLD(mixture, step_size=1e-3, gibbs_sites=[site], gibbs_fn=make_gibbs_fn(data)), data)


def test_discrete_local_without_gibbs_is_refused(data):
    with pytest.raises(NotImplementedError, match=r"latent site 'z' is discrete .*gibbs_sites"):
        run(SGLD(mixture, step_size=1e-3), data)


def test_sgfs_with_gibbs_sites_is_refused(data):
    with pytest.raises(NotImplementedError, match=r"SGFS with local Gibbs sites is not supported"):
        SGFS(mixture, step_size=1e-3, gibbs_sites=["z"], gibbs_fn=make_gibbs_fn(data))


def test_gibbs_fn_must_return_the_sites(data):
    kernel = SGLD(mixture, step_size=1e-3, gibbs_sites=["z"], gibbs_fn=lambda g, s, h, i: {"w": s["z"]})
    with pytest.raises(GibbsFnError, match=r"`gibbs_fn` must return a dict with the keys \['z'\]"):
        run(kernel, data)
    kernel = SGLD(mixture, step_size=1e-3, gibbs_sites=["z"], gibbs_fn=lambda g, s, h, i: {"z": s["z"][:2]})
    with pytest.raises(GibbsFnError, match=r"returned 'z' of shape \(2,\); the minibatch's site has shape \(8,\)"):
        run(kernel, data)


# --- the contract -------------------------------------------------------------------------------------
def test_gibbs_fn_sees_the_minibatch_and_constrained_globals(data):
    """``gibbs_fn`` gets a generator, the minibatch's indices, the current globals and the local sites of the
    minibatch; the samples hold the globals only."""
    seen, starts = [], []

    def gibbs_fn(generator, gibbs_sites, hmc_sites, subsample_indices):
        assert isinstance(generator, torch.Generator)
        seen.append((set(gibbs_sites), set(hmc_sites), {k: tuple(v.shape) for k, v in subsample_indices.items()}))
        return make_gibbs_fn(data)(generator, gibbs_sites, hmc_sites, subsample_indices)

    def gibbs_init(generator, gibbs_sites, hmc_sites, subsample_indices):
        starts.append(tuple(gibbs_sites["z"].shape))
        return {"z": torch.zeros(BATCH, dtype=torch.int32)}  # cast back to the site's dtype

    kernel = SGNHT(mixture, step_size=1e-3, gibbs_sites="z", gibbs_fn=gibbs_fn, gibbs_sweeps=(1, 2), gibbs_init=gibbs_init)
    mcmc = run(kernel, data)
    assert set(mcmc.get_samples()) == {"mu"}
    assert seen and all(s == ({"z"}, {"mu"}, {"data": (BATCH,)}) for s in seen)
    assert starts and all(s == (BATCH,) for s in starts)


def test_traced_equals_eager_and_runs_reproduce(data):
    """The traced gradient (local sites as graph inputs) gives the eager chain's draws; a second run with the
    same seed gives the same draws."""
    draws = []
    for compile_potential in (True, False, True):
        pyro.set_rng_seed(3)
        kernel = SGNHT(
            mixture, step_size=1e-3, gibbs_sites=["z"], gibbs_fn=make_gibbs_fn(data), gibbs_sweeps=(1, 2),
            compile_potential=compile_potential,
        )  # fmt: skip
        draws.append(run(kernel, data, warmup_steps=20, num_samples=30).get_samples()["mu"])
    torch.testing.assert_close(draws[0], draws[1], rtol=1e-5, atol=1e-6)
    assert torch.equal(draws[0], draws[2])


# --- the Fisher identity -------------------------------------------------------------------------------
def exact_gradient(mu, x):
    """``∇U(μ)`` of the marginal ``U = -log N(μ; 0, 3²) - Σ_i log Σ_k w_k N(x_i; μ_k, 1)``."""
    mu = mu.clone().requires_grad_()
    prior = dist.Normal(0.0, PRIOR_SD).log_prob(mu).sum()
    lik = torch.logsumexp(WEIGHTS.log() + dist.Normal(mu, 1.0).log_prob(x[:, None]), -1).sum()
    (grad,) = torch.autograd.grad(-(prior + lik), mu)
    return grad


@pytest.mark.slow
def test_fisher_identity_gradient_is_unbiased(data):
    """Averaged over minibatches and Gibbs draws, the kernel's stochastic gradient equals the gradient of
    the exact marginal potential (the memberships summed out)."""
    mu = torch.tensor([-1.0, 1.5])
    kernel = SGLD(mixture, step_size=1e-3, gibbs_sites=["z"], gibbs_fn=make_gibbs_fn(data), gibbs_sweeps=(1, 2))
    kernel.initial_params = {"mu": mu}
    kernel.setup(0, data)
    target, generator = kernel._target, torch.Generator().manual_seed(1)
    batch_state = target.init_batch(generator)
    grads = torch.stack([target.gradient(mu, target.draw(generator, batch_state)[0]).grad for _ in range(3000)])
    grads = grads.double().numpy()
    exact = exact_gradient(mu, data).double().numpy()
    mcse = grads.std(0) / np.sqrt(len(grads))
    print("mean", grads.mean(0), "exact", exact, "mcse", mcse)
    assert np.all(np.abs(grads.mean(0) - exact) < K_SIGMA * mcse)
