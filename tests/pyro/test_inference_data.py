"""ArviZ conversion covers the full data, not one minibatch."""

import arviz as az
import numpy as np
import pyro
import pytest
import torch
from pyro.infer import MCMC

from ppl_sgmcmc.pyro import SGNHT, full_data_log_likelihood, to_inference_data
from tests.pyro.models import logistic_model


@pytest.fixture(scope="module")
def mcmc(logistic_data):
    pyro.set_rng_seed(0)
    with pytest.warns(UserWarning, match="sequentially"):  # 2 chains on 2 cores: Pyro keeps one for itself
        mcmc = MCMC(SGNHT(logistic_model, step_size=1e-2, steps_per_sample=2), warmup_steps=100, num_samples=100,
                    num_chains=2, disable_progbar=True)  # fmt: skip
    mcmc.run(*logistic_data)
    return mcmc


def exact_pointwise_log_likelihood(mcmc, X, y):
    logits = np.einsum("cdk,nk->cdn", mcmc.get_samples(group_by_chain=True)["w"].numpy(), X.numpy())
    return np.where(y.numpy() == 1, -np.logaddexp(0, -logits), -np.logaddexp(0, logits))


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
    mcmc = MCMC(SGNHT(logistic_model, step_size=50.0, integrator="euler"), warmup_steps=0, num_samples=20,
                disable_progbar=True)  # fmt: skip
    mcmc.run(*logistic_data)
    idata = to_inference_data(mcmc, log_likelihood=False)
    diverging = idata.sample_stats["diverging"].values[0]
    assert diverging.any()
    np.testing.assert_array_equal(np.flatnonzero(diverging), mcmc.diagnostics()["divergences"]["chain 0"])


def test_plot_trace_runs(mcmc):
    import matplotlib

    matplotlib.use("Agg")
    axes = az.plot_trace(to_inference_data(mcmc, log_likelihood=False), var_names=["scale"])
    assert axes.shape == (1, 2)


def test_to_inference_data_needs_an_sgmcmc_run():
    from pyro.infer import NUTS

    with pytest.raises(TypeError, match="ppl_sgmcmc kernel"):
        to_inference_data(MCMC(NUTS(logistic_model), num_samples=1))


def test_predictive_on_the_full_data(mcmc, logistic_data):
    """``Predictive`` with the kernel's model draws replicated data of the full size."""
    from pyro.infer import Predictive

    samples = {k: v for k, v in mcmc.get_samples().items() if k in ("w", "scale")}
    predictive = Predictive(mcmc.kernel.model, samples, return_sites=["y"])
    y = predictive(logistic_data[0])["y"]
    assert y.shape == (200, 200)
    assert torch.all((y == 0) | (y == 1))
