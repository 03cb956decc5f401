"""Cyclical SG-MCMC on Pyro (``cycle_length``): the exploration stage is the rule without noise, the kernel records
each draw's step count, ``pyro.infer.MCMC`` runs say that their draws mix the stages, and ``to_inference_data``
keeps only the sampling stages' draws; cyclical SGLD with its defaults reproduces a conjugate posterior's moments
within Monte Carlo error."""

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC

from ppl_sgmcmc.pyro import SGLD, to_inference_data
from ppl_sgmcmc.pyro.inference_data import sample_stats
from tests.cyclical_prediction import predicted_cov
from tests.helpers import assert_mc_close, assert_small_bias, cov_and_mcse, mean_and_mcse

# the short runs run the model (or potential) eagerly: a cyclical step size is a schedule, so the step itself is never
# compiled, and with `compile_potential` a kernel would still compile its gradient and noise estimate's graphs
# (seconds of Inductor compiling each), which these tests are not about; the eager step gives the same draws
# (`test_compile.py` checks the compiled graphs against the eager ones). The conjugate test's 4500 steps keep the
# compiled gradient: run eagerly they took longer than its compiling
EAGER = dict(compile_potential=False)


@pytest.mark.slow
def test_exploration_is_gradient_descent_and_only_sampling_draws_are_kept():
    # U = |x|²/2: an exploring SGLD step is x ← (1 - h_i) x exactly; a sampling step adds sqrt(2 h_i) ζ
    pyro.set_rng_seed(0)
    kernel = SGLD(potential_fn=lambda z: 0.5 * (z["x"] ** 2).sum(), step_size=0.1, cycle_length=10,
                  exploration_fraction=0.4, **EAGER)  # fmt: skip
    mcmc = MCMC(kernel, warmup_steps=5, num_samples=30, initial_params={"x": torch.ones(3)}, disable_progbar=True)
    with pytest.warns(UserWarning, match="exploration stage"):
        mcmc.run()
    x = mcmc.get_samples()["x"].double().numpy()
    stats = sample_stats(mcmc)
    counts, h = stats["i"][0], stats["step_size"][0]
    np.testing.assert_array_equal(counts, np.arange(6, 36))
    exploring = ~kernel.sampling_stage(counts)
    assert exploring.tolist() == ([True] * 4 + [False] * 6) * 3
    np.testing.assert_allclose(h, [0.1 * kernel.cycles.factor(int(i) - 1, 5, 1) for i in counts], rtol=1e-6)
    residual = x[1:] - (1 - h[1:, None]) * x[:-1]
    assert np.abs(residual[exploring[1:]]).max() < 1e-6 * np.abs(x).max()
    noise = residual[~exploring[1:]] / np.sqrt(2 * h[1:][~exploring[1:], None])
    assert noise.std() == pytest.approx(1.0, abs=0.35)
    idata = to_inference_data(mcmc)
    np.testing.assert_array_equal(idata.sample_stats["i"].values[0], counts[~exploring])
    np.testing.assert_array_equal(idata.posterior["x"].values[0], x[~exploring])


def test_arviz_from_a_model_keeps_the_sampling_draws_and_their_log_likelihood():
    def model(y):
        mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
        with pyro.plate("data", y.shape[0], subsample_size=5):
            pyro.sample("y", dist.Normal(mu, 1.0), obs=pyro.subsample(y, event_dim=0))

    pyro.set_rng_seed(1)
    mcmc = MCMC(SGLD(model, step_size=1e-2, cycle_length=8, **EAGER), warmup_steps=8, num_samples=32, disable_progbar=True)
    with pytest.warns(UserWarning, match="to_inference_data"):
        mcmc.run(torch.zeros(20))
    idata = to_inference_data(mcmc, chunk_size=7)
    assert idata.posterior["mu"].shape == (1, 16) and idata.log_likelihood["y"].shape == (1, 16, 20)
    assert ((idata.sample_stats["i"].values[0] - 9) % 8 >= 4).all()


# --- a conjugate posterior: Bayesian linear regression, prior N(0, I), unit noise, the full-data gradient ---------
rng = np.random.default_rng(0)
X = rng.normal(size=(20, 2))
Y = X @ np.array([1.0, -0.5]) + rng.normal(size=20)
PRECISION = X.T @ X + np.eye(2)
POST_COV = np.linalg.inv(PRECISION)
POST_MEAN = POST_COV @ X.T @ Y


def regression(X, y):
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    with pyro.plate("data", X.shape[0]):
        pyro.sample("y", dist.Normal(X @ w, 1.0), obs=y)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:SGLD. the model has no plate")
def test_conjugate_posterior_with_defaults():
    # Pyro's tuned step size as the cycles' peak, with the default exploration fraction. One chain of 2000 kept draws
    # (its ESS is low: each sampling stage restarts at the mode and ends with a vanishing step) gives variance MCSEs
    # of about 15% of the posterior's: wide; this checks the Pyro path end to end (tuning, cycles, the kept draws)
    # against gross errors, such as sampling stages that never spread from the mode (variances near 0); the NumPyro
    # test of the same posterior, with 8 chains, is the sharp one
    pyro.set_rng_seed(0)
    kernel = SGLD(regression, cycle_length=200)
    num_warmup, num_samples = 500, 4000
    mcmc = MCMC(kernel, warmup_steps=num_warmup, num_samples=num_samples, disable_progbar=True)
    with pytest.warns(UserWarning, match="exploration stage"):
        mcmc.run(torch.tensor(X, dtype=torch.float32), torch.tensor(Y, dtype=torch.float32))
    draws = to_inference_data(mcmc, log_likelihood=False).posterior["w"].values.astype(np.float64)
    assert draws.shape == (1, num_samples // 2, 2)
    mean, mean_mcse = mean_and_mcse(draws)
    assert_mc_close("mean", mean, POST_MEAN, mean_mcse)
    cov, cov_mcse = cov_and_mcse(draws)
    adapt = kernel.last_state.state.adapt_state
    predicted = predicted_cov(kernel, [adapt.step_size], adapt.preconditioner.scale[None], PRECISION, num_warmup,
                              num_samples)  # fmt: skip
    assert_small_bias("covariance", predicted - POST_COV, np.sqrt(np.outer(np.diag(POST_COV), np.diag(POST_COV))), 0.1)
    assert_mc_close("covariance", cov, POST_COV, cov_mcse, allowance=predicted - POST_COV)
