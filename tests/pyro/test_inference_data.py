"""ArviZ conversion covers the full data, not one minibatch."""

import subprocess
import sys

import arviz as az
import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC

from ppl_sgmcmc.pyro import SGNHT, full_data_log_likelihood, to_inference_data
from tests.pyro.models import logistic_model

# the tests of the shared run `mcmc`: on one pytest-xdist worker (`--dist loadgroup`), which runs it once
on_mcmc = pytest.mark.xdist_group("pyro_inference_data_mcmc")


@pytest.fixture(scope="module")
def mcmc(logistic_data):
    pyro.set_rng_seed(0)
    # the eager potential (no compiled graph of the model or the step): what the tests check is the conversion of
    # the run, and the eager step draws what the compiled one draws (`test_compile.py`)
    kernel = SGNHT(logistic_model, step_size=1e-2, steps_per_sample=2, compile_potential=False)
    with pytest.warns(UserWarning, match="sequentially"):  # 2 chains on 2 cores: Pyro keeps one for itself
        mcmc = MCMC(kernel, warmup_steps=100, num_samples=100, num_chains=2, disable_progbar=True)
    mcmc.run(*logistic_data)
    return mcmc


def exact_pointwise_log_likelihood(mcmc, X, y):
    logits = np.einsum("cdk,nk->cdn", mcmc.get_samples(group_by_chain=True)["w"].numpy(), X.numpy())
    return np.where(y.numpy() == 1, -np.logaddexp(0, -logits), -np.logaddexp(0, logits))


@on_mcmc
def test_from_pyro_uses_the_full_data(mcmc, logistic_data):
    X, y = logistic_data
    idata = az.from_pyro(mcmc)
    assert idata.log_likelihood["y"].shape == (2, 100, 200)  # not (2, 100, 20): the full data
    np.testing.assert_array_equal(idata.observed_data["y"].values, y.numpy())
    np.testing.assert_allclose(idata.log_likelihood["y"].values, exact_pointwise_log_likelihood(mcmc, X, y),
                               rtol=1e-4, atol=1e-5)  # fmt: skip
    assert idata.sample_stats["diverging"].shape == (2, 100)
    assert idata.posterior["scaled_w"].shape == (2, 100, 2)
    loo = az.loo(idata, var_name="y")  # from_pyro also lists pyro.deterministic sites as observed
    assert np.isfinite(loo.elpd_loo) and loo.n_data_points == 200
    summary = az.summary(idata, var_names=["w", "scale"])
    assert np.all(np.isfinite(summary["r_hat"])) and np.all(summary["ess_bulk"] > 0)


@on_mcmc
def test_to_inference_data_chunks_and_drops_deterministic_sites(mcmc, logistic_data):
    reference = az.from_pyro(mcmc)
    idata = to_inference_data(mcmc, chunk_size=37)
    assert list(idata.log_likelihood.data_vars) == ["y"]
    assert list(idata.observed_data.data_vars) == ["y"] and list(idata.observed_data.dims) == ["y_dim_0"]
    np.testing.assert_allclose(idata.log_likelihood["y"].values, reference.log_likelihood["y"].values, rtol=1e-5)
    assert idata.log_likelihood["y"].dims == idata.observed_data["y"].dims[:0] + ("chain", "draw", "y_dim_0")
    loo = az.loo(idata)  # one log-likelihood variable: no var_name needed
    assert loo.n_data_points == 200
    assert np.isfinite(az.waic(idata).elpd_waic)
    skipped = to_inference_data(mcmc, log_likelihood=False)
    assert "log_likelihood" not in skipped.groups()
    pointwise = full_data_log_likelihood(mcmc, chunk_size=1000)
    np.testing.assert_allclose(pointwise["y"], idata.log_likelihood["y"].values, rtol=1e-6)


def test_divergences_reach_sample_stats(logistic_data):
    pyro.set_rng_seed(0)
    # the eager potential (no compiled graph, seconds): what is checked is the conversion of the run's divergences
    mcmc = MCMC(SGNHT(logistic_model, step_size=50.0, integrator="euler", compile_potential=False), warmup_steps=0,
                num_samples=20, disable_progbar=True)  # fmt: skip
    mcmc.run(*logistic_data)
    idata = to_inference_data(mcmc, log_likelihood=False)
    diverging = idata.sample_stats["diverging"].values[0]
    assert diverging.any()
    np.testing.assert_array_equal(np.flatnonzero(diverging), mcmc.diagnostics()["divergences"]["chain 0"])


@on_mcmc
def test_plot_trace_runs(mcmc):
    import matplotlib

    matplotlib.use("Agg")
    axes = az.plot_trace(to_inference_data(mcmc, log_likelihood=False), var_names=["scale"])
    assert axes.shape == (1, 2)


def test_to_inference_data_needs_an_sgmcmc_run():
    from pyro.infer import NUTS

    with pytest.raises(TypeError, match="ppl_sgmcmc kernel"):
        to_inference_data(MCMC(NUTS(logistic_model), num_samples=1))


@on_mcmc
def test_predictive_on_the_full_data(mcmc, logistic_data):
    """``Predictive`` with the kernel's model draws replicated data of the full size."""
    from pyro.infer import Predictive

    samples = {k: v for k, v in mcmc.get_samples().items() if k in ("w", "scale")}
    predictive = Predictive(mcmc.kernel.model, samples, return_sites=["y"])
    y = predictive(logistic_data[0])["y"]
    assert y.shape == (200, 200)
    assert torch.all((y == 0) | (y == 1))


@on_mcmc
def test_predictive_helper_covers_every_row(mcmc, logistic_data):
    """``predictive(mcmc, X)`` is ``Predictive(full_data(model), samples)``: one replicate of every row per draw
    (``Predictive(model, samples)`` on the subsampled model would return 20 random rows per draw)."""
    from pyro.infer import Predictive

    from ppl_sgmcmc.pyro import full_data, predictive

    X, y = logistic_data
    assert Predictive(logistic_model, mcmc.get_samples())(X)["y"].shape == (200, 20)  # the trap itself
    y_rep = predictive(mcmc, X)
    assert y_rep["y"].shape == (200, 200) and torch.all((y_rep["y"] == 0) | (y_rep["y"] == 1))
    samples = mcmc.get_samples()
    torch.testing.assert_close(y_rep["scaled_w"].reshape(200, 2), samples["scale"][:, None] * samples["w"])
    latents = {k: v for k, v in mcmc.get_samples().items() if k in ("w", "scale")}
    pyro.set_rng_seed(3)
    expected = Predictive(full_data(logistic_model), latents)(X[:50])["y"]
    pyro.set_rng_seed(3)
    torch.testing.assert_close(predictive(mcmc, X[:50])["y"], expected)  # new data of another size
    idata = to_inference_data(mcmc, log_likelihood=False, posterior_predictive=y_rep)
    assert idata.posterior_predictive["y"].shape == (2, 100, 200)
    assert idata.posterior_predictive["y"].dims == idata.observed_data["y"].dims[:0] + ("chain", "draw", "y_dim_0")

    import matplotlib

    matplotlib.use("Agg")
    az.plot_ppc(idata, var_names=["y"], num_pp_samples=5, random_seed=0)


def matmul_model(X, y=None):
    """A logistic regression written the natural way, ``Xb @ w``: it does not broadcast over a leading
    sample dimension of ``w``."""
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with pyro.plate("data", X.shape[0], subsample_size=20):
        Xb = pyro.subsample(X, event_dim=1)
        yb = pyro.subsample(y, event_dim=0) if y is not None else None
        pyro.sample("y", dist.Bernoulli(logits=Xb @ w), obs=yb)


def test_log_likelihood_of_a_model_that_does_not_broadcast(logistic_data):
    X, y = logistic_data
    # the eager potential (no compiled graph of this model, seconds): what is checked is the conversion
    mcmc = MCMC(SGNHT(matmul_model, step_size=1e-2, compile_potential=False), warmup_steps=20, num_samples=30,
                disable_progbar=True)  # fmt: skip
    mcmc.run(X, y)
    with pytest.warns(UserWarning, match="Could not get vectorized trace"):
        assert "log_likelihood" not in az.from_pyro(mcmc).groups()  # ArviZ's own converter drops it
    with pytest.warns(UserWarning, match=r"does not broadcast.*w.unsqueeze\(-1\)"):
        idata = to_inference_data(mcmc, chunk_size=7)
    np.testing.assert_allclose(idata.log_likelihood["y"].values, exact_pointwise_log_likelihood(mcmc, X, y),
                               rtol=1e-4, atol=1e-5)  # fmt: skip
    assert az.loo(idata).n_data_points == 200
    from ppl_sgmcmc.pyro import predictive

    assert predictive(mcmc, X)["y"].shape == (30, 200)


def test_local_gibbs_sites_leave_the_log_likelihood_out():
    """After a run with local Gibbs sites, the log-likelihood would need them marginalised: ``to_inference_data``
    leaves it out with a warning that says why, instead of conditioning on a prior draw of them."""
    from ppl_sgmcmc.pyro import SGLD

    weights = torch.tensor([0.3, 0.7])

    def mixture(x):
        mu = pyro.sample("mu", dist.Normal(0.0, 3.0).expand([2]).to_event(1))
        with pyro.plate("data", x.shape[0], subsample_size=8):
            xb = pyro.subsample(x, event_dim=0)
            z = pyro.sample("z", dist.Categorical(probs=weights))
            pyro.sample("x", dist.Normal(mu[z], 1.0), obs=xb)

    def gibbs_fn(generator, gibbs_sites, hmc_sites, subsample_indices):
        logits = weights.log() + dist.Normal(hmc_sites["mu"], 1.0).log_prob(x[subsample_indices["data"], None])
        return {"z": torch.multinomial(logits.softmax(-1), 1, generator=generator)[:, 0]}

    x = torch.as_tensor(np.random.default_rng(1).normal(size=40), dtype=torch.float32)
    # the eager potential (no compiled graph of this model, seconds): what is checked is the conversion
    mcmc = MCMC(SGLD(mixture, step_size=1e-3, gibbs_sites=["z"], gibbs_fn=gibbs_fn, compile_potential=False),
                warmup_steps=2, num_samples=5, disable_progbar=True)  # fmt: skip
    mcmc.run(x)
    with pytest.warns(UserWarning, match=r"local Gibbs site\(s\) \['z'\].*marginalised"):
        idata = to_inference_data(mcmc)
    assert "log_likelihood" not in idata.groups()
    assert idata.observed_data["x"].shape == (40,) and idata.posterior["mu"].shape == (1, 5, 2)
    with pytest.raises(ValueError, match="local Gibbs site"):
        full_data_log_likelihood(mcmc)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert "log_likelihood" not in to_inference_data(mcmc, log_likelihood=False).groups()


@on_mcmc
def test_log_likelihood_size_limit(mcmc):
    with pytest.raises(ValueError, match=r"above max_log_likelihood_bytes=100000\. Pass log_likelihood=False"):
        to_inference_data(mcmc, max_log_likelihood_bytes=100_000)  # 2 × 100 × 200 float32 = 160 kB
    assert to_inference_data(mcmc, max_log_likelihood_bytes=160_000).log_likelihood["y"].shape == (2, 100, 200)


PEAK_MEMORY_SCRIPT = """
import resource, torch, pyro, pyro.distributions as dist
from pyro.infer import MCMC
from ppl_sgmcmc.pyro import SGLD, full_data_log_likelihood

def model(y):
    mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
    with pyro.plate("data", y.shape[0], subsample_size=10):
        pyro.sample("y", dist.Normal(mu, 1.0), obs=pyro.subsample(y, event_dim=0))

mcmc = MCMC(SGLD(model, step_size=1e-7, compile_potential=False), warmup_steps=0, num_samples=200,
            disable_progbar=True)
mcmc.run(torch.zeros(125_000))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
result = full_data_log_likelihood(mcmc, chunk_size=10)["y"]
print(result.nbytes, (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ru_maxrss in kB (Linux)")
def test_chunked_log_likelihood_peaks_at_the_result_size():
    """The chunks fill one preallocated result: the peak memory grows by the result (100 MB) and a chunk, not
    twice the result (chunks, then their concatenation)."""
    out = subprocess.run([sys.executable, "-c", PEAK_MEMORY_SCRIPT], capture_output=True, text=True, check=True)
    result_bytes, peak_growth = map(int, out.stdout.split())
    assert result_bytes == 200 * 125_000 * 4
    assert peak_growth < 1.5 * result_bytes


def _masked_data():
    """Half the rows masked out, and holding junk: their log-likelihood must not count."""
    rng = np.random.default_rng(3)
    y = rng.normal(1.0, 1.0, size=60)
    keep = np.arange(60) % 2 == 0
    return np.where(keep, y, 50.0), keep


def test_pointwise_log_likelihood_respects_poutine_mask_as_numpyro_does():
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as ndist
    from numpyro.infer.util import log_likelihood

    from ppl_sgmcmc.pyro import SGLD

    y, keep = _masked_data()

    def pyro_model(y, keep):
        mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
        with pyro.plate("data", y.shape[0], subsample_size=10):
            yb, kb = pyro.subsample(y, event_dim=0), pyro.subsample(keep, event_dim=0)
            with pyro.poutine.mask(mask=kb):
                pyro.sample("y", dist.Normal(mu, 1.0), obs=yb)

    def numpyro_model(y, keep):
        mu = numpyro.sample("mu", ndist.Normal(0.0, 10.0))
        with numpyro.plate("data", y.shape[0]), numpyro.handlers.mask(mask=keep):
            numpyro.sample("y", ndist.Normal(mu, 1.0), obs=y)

    pyro.set_rng_seed(0)
    # the eager potential (no compiled graph of this model, seconds): what is checked is the conversion's mask
    mcmc = MCMC(SGLD(pyro_model, step_size=1e-3, compile_potential=False), warmup_steps=20, num_samples=30,
                disable_progbar=True)  # fmt: skip
    mcmc.run(torch.tensor(y, dtype=torch.float32), torch.tensor(keep))
    pointwise = to_inference_data(mcmc).log_likelihood["y"].values[0]
    mu = mcmc.get_samples()["mu"].numpy()
    expected = log_likelihood(numpyro_model, {"mu": jnp.asarray(mu)}, jnp.asarray(y, jnp.float32), jnp.asarray(keep))
    np.testing.assert_allclose(pointwise, np.asarray(expected["y"]), rtol=1e-5, atol=1e-5)
    assert np.all(pointwise[:, ~keep] == 0) and np.all(pointwise[:, keep] < 0)
    np.testing.assert_allclose(full_data_log_likelihood(mcmc, chunk_size=7)["y"][0], pointwise, rtol=1e-6)
