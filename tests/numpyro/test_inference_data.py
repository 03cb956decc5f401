"""ArviZ conversion covers the full data, not one minibatch."""

import subprocess
import sys
import warnings

import arviz as az
import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import MCMC

from ppl_sgmcmc.numpyro import SGLD, SGNHT, full_data_log_likelihood, to_inference_data
from tests.numpyro.conftest import logistic_model

# the tests of the shared run `mcmc`: on one pytest-xdist worker (`--dist loadgroup`), which runs it once
on_mcmc = pytest.mark.xdist_group("numpyro_inference_data_mcmc")


@pytest.fixture(scope="module")
def mcmc(logistic_data):
    mcmc = MCMC(SGNHT(logistic_model, step_size=1e-2), num_warmup=100, num_samples=200, num_chains=2,
                chain_method="vectorized", thinning=2, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), *logistic_data, extra_fields=("potential_energy",))
    return mcmc


def exact_pointwise_log_likelihood(mcmc, X, y):
    logits = np.einsum("cdk,nk->cdn", np.asarray(mcmc.get_samples(group_by_chain=True)["w"]), np.asarray(X))
    return np.where(np.asarray(y) == 1, -np.logaddexp(0, -logits), -np.logaddexp(0, logits))


@on_mcmc
def test_from_numpyro_uses_the_full_data(mcmc, logistic_data):
    idata = az.from_numpyro(mcmc)
    X, y = logistic_data
    assert idata.log_likelihood["y"].shape == (2, 100, 200)
    np.testing.assert_array_equal(idata.observed_data["y"].values, np.asarray(y))
    np.testing.assert_array_equal(idata.observed_data["data"].values, np.arange(200))
    np.testing.assert_allclose(idata.log_likelihood["y"].values, exact_pointwise_log_likelihood(mcmc, X, y),
                               rtol=1e-4, atol=1e-5)
    assert "diverging" in idata.sample_stats
    loo = az.loo(idata)
    assert np.isfinite(loo.elpd_loo) and loo.n_data_points == 200
    assert np.isfinite(az.waic(idata).elpd_waic)
    summary = az.summary(idata, var_names=["w", "scale"])
    assert np.all(np.isfinite(summary["r_hat"])) and np.all(summary["ess_bulk"] > 0)


@on_mcmc
def test_to_inference_data_chunks_and_renames(mcmc, logistic_data):
    reference = az.from_numpyro(mcmc)
    idata = to_inference_data(mcmc, chunk_size=37)
    np.testing.assert_allclose(idata.log_likelihood["y"].values, reference.log_likelihood["y"].values, rtol=1e-5)
    assert idata.log_likelihood["y"].dims == ("chain", "draw", "data")
    assert "minibatch_lp" in idata.sample_stats and "lp" not in idata.sample_stats
    np.testing.assert_allclose(idata.sample_stats["minibatch_lp"].values, -mcmc.get_extra_fields(
        group_by_chain=True)["potential_energy"])
    skipped = to_inference_data(mcmc, log_likelihood=False)
    assert "log_likelihood" not in skipped.groups()


@on_mcmc
def test_plot_trace_runs(mcmc):
    import matplotlib

    matplotlib.use("Agg")
    axes = az.plot_trace(az.from_numpyro(mcmc, log_likelihood=False), var_names=["scale"])
    assert axes.shape == (1, 2)


def test_to_inference_data_needs_an_sgmcmc_run():
    from numpyro.infer import NUTS

    with pytest.raises(TypeError, match="ppl_sgmcmc kernel"):
        to_inference_data(MCMC(NUTS(logistic_model), num_warmup=1, num_samples=1))


@on_mcmc
def test_predictive_helper_covers_every_row(mcmc, logistic_data):
    """``predictive(mcmc, key, X)`` is ``Predictive(full_data(model), samples)``: one replicate of every row per
    draw (``Predictive(model, samples)`` on the subsampled model returns 20 random rows per draw, and NumPyro's
    ``log_likelihood`` refuses it), and the posterior predictive check runs on it."""
    from numpyro.infer import Predictive
    from numpyro.infer import log_likelihood as numpyro_log_likelihood

    from ppl_sgmcmc.numpyro import full_data, full_data_log_likelihood, predictive

    X, y = logistic_data
    samples = mcmc.get_samples()
    key = jax.random.PRNGKey(1)
    assert Predictive(logistic_model, samples)(key, X)["y"].shape == (200, 20)  # the trap itself
    with pytest.raises(ValueError, match="subsampl"):
        numpyro_log_likelihood(logistic_model, samples, X, y)
    y_rep = predictive(mcmc, key, X)
    assert y_rep["y"].shape == (200, 200) and np.all((y_rep["y"] == 0) | (y_rep["y"] == 1))
    np.testing.assert_array_equal(y_rep["y"], Predictive(full_data(logistic_model), samples)(key, X)["y"])
    assert predictive(mcmc, key, X[:50])["y"].shape == (200, 50)  # new data of another size
    pointwise = numpyro_log_likelihood(full_data(logistic_model), samples, X, y)["y"]
    np.testing.assert_allclose(np.asarray(pointwise).reshape(2, 100, 200), full_data_log_likelihood(mcmc)["y"],
                               rtol=1e-6)  # fmt: skip
    idata = to_inference_data(mcmc, log_likelihood=False, posterior_predictive=y_rep)
    assert idata.posterior_predictive["y"].dims == ("chain", "draw", "data")
    assert idata.posterior_predictive["y"].shape == idata.posterior["w"].shape[:2] + idata.observed_data["y"].shape

    import matplotlib

    matplotlib.use("Agg")
    az.plot_ppc(idata, var_names=["y"], num_pp_samples=5, random_seed=0)


N_MIX = 40
MIX_WEIGHTS = jnp.array([0.3, 0.7])


def mixture(x):
    mu = numpyro.sample("mu", dist.Normal(0.0, 3.0).expand([2]).to_event(1))
    with numpyro.plate("data", x.shape[0], subsample_size=8):
        xb = numpyro.subsample(x, event_dim=0)
        z = numpyro.sample("z", dist.Categorical(probs=MIX_WEIGHTS))
        numpyro.sample("x", dist.Normal(mu[z], 1.0), obs=xb)


@pytest.fixture(scope="module")
def gibbs_run():
    x = jnp.asarray(np.random.default_rng(1).normal(size=N_MIX), dtype=jnp.float32)

    def gibbs_fn(rng_key, gibbs_sites, hmc_sites, subsample_indices):
        logits = jnp.log(MIX_WEIGHTS) + dist.Normal(hmc_sites["mu"], 1.0).log_prob(x[subsample_indices["data"], None])
        return {"z": jax.random.categorical(rng_key, logits)}

    mcmc = MCMC(SGLD(mixture, step_size=1e-3, gibbs_sites=["z"], gibbs_fn=gibbs_fn), num_warmup=2, num_samples=5,
                progress_bar=False)  # fmt: skip
    mcmc.run(jax.random.PRNGKey(0), x)
    return mcmc


def test_local_gibbs_sites_leave_the_log_likelihood_out(gibbs_run):
    """After a run with local Gibbs sites (not among the samples), the log-likelihood would need them
    marginalised: ``to_inference_data`` leaves it out with a warning that says why, ``az.from_numpyro`` gets a
    NaN log-likelihood and the same reason (it used to fail with a bare ``AssertionError``)."""
    with pytest.warns(UserWarning, match=r"local Gibbs site\(s\) \['z'\].*marginalised"):
        idata = to_inference_data(gibbs_run)
    assert "log_likelihood" not in idata.groups()
    assert idata.observed_data["x"].shape == (N_MIX,) and idata.posterior["mu"].shape == (1, 5, 2)
    with pytest.raises(ValueError, match="local Gibbs site"):
        full_data_log_likelihood(gibbs_run)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert "log_likelihood" not in to_inference_data(gibbs_run, log_likelihood=False).groups()
    with pytest.warns(UserWarning, match=r"\['z'\].*log-likelihood of the observed site 'x'.*is NaN"):
        idata = az.from_numpyro(gibbs_run)
    assert idata.log_likelihood["x"].shape == (1, 5, N_MIX) and np.all(np.isnan(idata.log_likelihood["x"]))
    assert idata.posterior["mu"].shape == (1, 5, 2) and idata.observed_data["x"].shape == (N_MIX,)


@on_mcmc
def test_log_likelihood_size_limit(mcmc):
    with pytest.raises(ValueError, match=r"above max_log_likelihood_bytes=100000\. Pass log_likelihood=False"):
        to_inference_data(mcmc, max_log_likelihood_bytes=100_000)  # 2 × 100 × 200 float32 = 160 kB
    assert to_inference_data(mcmc, max_log_likelihood_bytes=160_000).log_likelihood["y"].shape == (2, 100, 200)


PEAK_MEMORY_SCRIPT = """
import resource, jax, jax.numpy as jnp, numpyro, numpyro.distributions as dist
from numpyro.infer import MCMC
from ppl_sgmcmc.numpyro import SGLD, full_data_log_likelihood

def model(y):
    mu = numpyro.sample("mu", dist.Normal(0, 10))
    with numpyro.plate("data", y.shape[0], subsample_size=10):
        numpyro.sample("y", dist.Normal(mu, 1), obs=numpyro.subsample(y, event_dim=0))

mcmc = MCMC(SGLD(model, step_size=1e-7), num_warmup=0, num_samples=200, progress_bar=False)
mcmc.run(jax.random.PRNGKey(0), jnp.zeros(125_000))
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
