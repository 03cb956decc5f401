"""ArviZ conversion covers the full data, not one minibatch."""

import arviz as az
import jax
import numpy as np
import pytest
from numpyro.infer import MCMC

from ppl_sgmcmc.numpyro import SGNHT, to_inference_data
from tests.numpyro.conftest import logistic_model


@pytest.fixture(scope="module")
def mcmc(logistic_data):
    mcmc = MCMC(SGNHT(logistic_model, step_size=1e-2), num_warmup=100, num_samples=200, num_chains=2,
                chain_method="vectorized", thinning=2, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), *logistic_data, extra_fields=("potential_energy",))
    return mcmc


def exact_pointwise_log_likelihood(mcmc, X, y):
    logits = np.einsum("cdk,nk->cdn", np.asarray(mcmc.get_samples(group_by_chain=True)["w"]), np.asarray(X))
    return np.where(np.asarray(y) == 1, -np.logaddexp(0, -logits), -np.logaddexp(0, logits))


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


def test_plot_trace_runs(mcmc):
    import matplotlib

    matplotlib.use("Agg")
    axes = az.plot_trace(az.from_numpyro(mcmc, log_likelihood=False), var_names=["scale"])
    assert axes.shape == (1, 2)


def test_to_inference_data_needs_an_sgmcmc_run():
    from numpyro.infer import NUTS

    with pytest.raises(TypeError, match="ppl_sgmcmc kernel"):
        to_inference_data(MCMC(NUTS(logistic_model), num_warmup=1, num_samples=1))
