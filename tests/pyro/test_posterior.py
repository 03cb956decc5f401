"""Statistical correctness of the Pyro kernels on posteriors with a known answer.

1. Conjugate Bayesian linear regression with known noise: every kernel, minibatched, reproduces the
   exact Gaussian posterior mean and covariance.
2. The same regression with an unknown noise scale (a constrained latent) and two deterministic
   sites, against the exact posterior (one-dimensional quadrature over ``σ``, the regression weights
   integrated analytically).

Tolerances are Monte Carlo errors, as in ``tests/numpyro/test_posterior.py`` (whose helpers and
conventions this file uses): ``estimate - target`` must lie in
``[min(0, b) - K_SIGMA·MCSE, max(0, b) + K_SIGMA·MCSE]``, ``K_SIGMA = 4.5``, with ``b`` the step-size
bias *predicted* by the linear-recursion (Lyapunov) helpers, which ``assert_small_bias`` keeps under 5%
of the posterior scale (10% for the stiff constrained model). Means get no allowance.

These runs are shorter than the NumPyro backend's (one Pyro chain of ~20k steps per case, effective
sample sizes ~250-700 instead of ~2000): the tolerance on a variance is ~25-40%, on the pooled
Mahalanobis statistic ~20-25%, enough to catch a wrong ``N/n`` scale (×3 here), a wrong temperature
or noise scale (×2), a missing log-Jacobian or a biased minibatch, not a 10% error. The exact
equivalence of the two backends' potentials and kernels (``test_cross_backend.py``) carries the
NumPyro backend's sharper statistical tests over to this one. To keep the runs short the problem is
smaller and less stiff (N/n = 3 instead of 20) and ``steps_per_sample=10`` thins inside the kernel.
"""

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC
from pyro.infer.autoguide.initialization import init_to_median

from ppl_sgmcmc import pyro as pyro_backend
from tests.helpers import (
    assert_mc_close,
    assert_small_bias,
    conjugate_posterior,
    cov_and_mcse,
    ess,
    exact_unknown_noise_posterior,
    linear_regression_data,
    mahalanobis,
    mean_and_mcse,
    mean_score_second_moment,
    minibatch_gradient_cov,
    predicted_cov_momentum,
    predicted_cov_sgld,
    predicted_thermostat,
    sd_and_mcse,
    unknown_noise_gradient_cov,
)

# long chains sized by their Monte Carlo error (above): the slow tier; the quick tier runs every kernel on
# small models (test_kernel.py and the kernels' own files)
pytestmark = pytest.mark.slow

NUM_DATA, NUM_FEATURES, BATCH = 300, 2, 100
NOISE, PRIOR = 12.0, 1.0
MAX_BIAS = 0.05
STEPS_PER_SAMPLE, WARMUP_DRAWS, DRAWS = 10, 200, 2000  # 22,000 steps per chain

X, Y, _ = linear_regression_data(NUM_DATA, NUM_FEATURES, NOISE, seed=0)
POST_MEAN, POST_COV = conjugate_posterior(X, Y, NOISE, PRIOR)
PRECISION = np.linalg.inv(POST_COV)
GRAD_COV = minibatch_gradient_cov(X, Y, POST_MEAN, NOISE, BATCH)
SCALE = np.sqrt(np.outer(np.diag(POST_COV), np.diag(POST_COV)))


def regression(X, y):
    w = pyro.sample("w", dist.Normal(0.0, PRIOR).expand([X.shape[1]]).to_event(1))
    with pyro.plate("data", X.shape[0], subsample_size=BATCH):
        x = pyro.subsample(X, event_dim=1)
        pyro.sample("y", dist.Normal(x @ w, NOISE), obs=pyro.subsample(y, event_dim=0))


def _psgld_prediction(step_size, eps=1e-5):
    # α = 0.999: V averages ~1000 steps, longer than θ relaxes, so G ≈ 1/(λ + sqrt(E V)) is nearly
    # constant and pSGLD is SGLD preconditioned by G (see tests/numpyro/test_posterior.py)
    square_avg = mean_score_second_moment(X, Y, POST_MEAN, POST_COV, NOISE, BATCH)
    return predicted_cov_sgld(PRECISION, GRAD_COV, step_size, preconditioner=1 / (eps + np.sqrt(square_avg)))


# (kernel name, hyper-parameters, predicted stationary covariance). Step sizes put the predicted bias
# at 2.5-5% of the posterior scale; the slowest modes relax in ~60 (SGLD, pSGLD) to ~15 (thermostat) steps.
CASES = {
    "sgld": ("SGLD", dict(step_size=1.1e-2), lambda: predicted_cov_sgld(PRECISION, GRAD_COV, 1.1e-2)),
    "sghmc": (
        "SGHMC",
        dict(step_size=0.038, friction=2.0),
        lambda: predicted_cov_momentum(PRECISION, GRAD_COV, 0.038, 2.0, 2.0, "splitting"),
    ),
    "sgnht": (
        "SGNHT",
        dict(step_size=0.06, diffusion=2.0),
        lambda: predicted_thermostat(PRECISION, GRAD_COV, 0.06, 2.0, "splitting")[1],
    ),
    "psgld": ("PSGLD", dict(step_size=1e-4, alpha=0.999), lambda: _psgld_prediction(1e-4)),
}


def pyro_draws(case):
    """``(1, DRAWS, d)`` draws of ``w`` from one Pyro chain."""
    name, hyper, _ = CASES[case]
    torch.set_num_threads(1)
    pyro.set_rng_seed(1)
    kernel = getattr(pyro_backend, name)(regression, steps_per_sample=STEPS_PER_SAMPLE, **hyper)
    mcmc = MCMC(kernel, warmup_steps=WARMUP_DRAWS, num_samples=DRAWS, disable_progbar=True)
    mcmc.run(torch.from_numpy(X), torch.from_numpy(Y))  # initial values: init_to_uniform(-2, 2), ~4 sd away
    assert mcmc.diagnostics()["divergences"] == {"chain 0": []}
    return mcmc.get_samples(group_by_chain=True)["w"].numpy()


@pytest.mark.parametrize("case", list(CASES))
def test_conjugate_linear_regression(case):
    predicted_bias = CASES[case][2]() - POST_COV
    assert_small_bias(case, predicted_bias, SCALE, MAX_BIAS)
    draws = pyro_draws(case)
    assert draws.shape == (1, DRAWS, NUM_FEATURES)

    mean, mean_se = mean_and_mcse(draws)
    cov, cov_se = cov_and_mcse(draws)
    upper = np.triu_indices(NUM_FEATURES)
    print(f"\n{case}: ESS of w {np.round(ess(draws))}")
    assert_mc_close(f"{case} mean", mean, POST_MEAN, mean_se)
    assert_mc_close(f"{case} cov", cov[upper], POST_COV[upper], cov_se[upper], allowance=predicted_bias[upper])
    distance, distance_se = mean_and_mcse(mahalanobis(draws, POST_MEAN, POST_COV)[..., None] / NUM_FEATURES)
    distance_bias = np.trace(PRECISION @ predicted_bias) / NUM_FEATURES
    assert_mc_close(f"{case} Mahalanobis/d", distance, 1.0, distance_se, allowance=distance_bias)


# --- a constrained latent and deterministic sites, against the exact posterior ---------------------
NUM_DATA2, BATCH2, SIGMA_DATA = 100, 25, 0.8
X2, Y2, _ = linear_regression_data(NUM_DATA2, 2, SIGMA_DATA, seed=1)


def regression_unknown_noise(X, y):
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    sigma = pyro.sample("sigma", dist.HalfNormal(1.0))
    pyro.deterministic("log_sigma", sigma.log())
    with pyro.plate("data", X.shape[0], subsample_size=BATCH2):
        x = pyro.subsample(X, event_dim=1)
        mean = pyro.deterministic("mean", x @ w)
        pyro.sample("y", dist.Normal(mean, sigma), obs=pyro.subsample(y, event_dim=0))


def test_constrained_latent_and_deterministic_sites_against_the_exact_posterior():
    w_mean, sigma_mean, sigma_sd, w_sd, joint_mean, joint_cov = exact_unknown_noise_posterior(X2, Y2)

    # SGHMC on (w, log σ), curvature 130-200: the predicted variance bias (Laplace approximation, minibatch
    # gradient covariance at the posterior mean) is 5-9%, allowed for; the chain relaxes in ~20 steps.
    step_size, friction = 0.004, 25.0
    grad_cov = unknown_noise_gradient_cov(X2, Y2, joint_mean, BATCH2)
    predicted = predicted_cov_momentum(np.linalg.inv(joint_cov), grad_cov, step_size, friction, friction, "splitting")
    var_bias = np.diag(predicted - joint_cov)
    assert_small_bias("sghmc (w, log σ) variance", var_bias, np.diag(joint_cov), 0.1)

    pyro.set_rng_seed(3)
    kernel = pyro_backend.SGHMC(regression_unknown_noise, step_size=step_size, friction=friction,
                                steps_per_sample=STEPS_PER_SAMPLE, init_strategy=init_to_median)  # fmt: skip
    mcmc = MCMC(kernel, warmup_steps=WARMUP_DRAWS, num_samples=DRAWS, disable_progbar=True)
    mcmc.run(torch.from_numpy(X2), torch.from_numpy(Y2))
    assert mcmc.diagnostics()["divergences"] == {"chain 0": []}
    samples = {k: v.numpy()[None] for k, v in mcmc.get_samples().items()}

    # the deterministic sites: present, on the full data, with the right values
    assert set(samples) == {"w", "sigma", "log_sigma", "mean"}
    assert samples["sigma"].min() > 0
    np.testing.assert_allclose(samples["log_sigma"], np.log(samples["sigma"]), rtol=1e-5, atol=1e-6)
    assert samples["mean"].shape == (1, DRAWS, NUM_DATA2)
    np.testing.assert_allclose(samples["mean"], samples["w"] @ X2.T, rtol=1e-4, atol=1e-4)

    print(f"\nESS: w {np.round(ess(samples['w']))}, sigma {np.round(ess(samples['sigma']))}")
    mean, mean_se = mean_and_mcse(samples["w"])
    assert_mc_close("w mean", mean, w_mean, mean_se)
    mean, mean_se = mean_and_mcse(samples["sigma"])
    assert_mc_close("sigma mean", mean, sigma_mean, mean_se)
    mean, mean_se = mean_and_mcse(samples["log_sigma"])
    assert_mc_close("log sigma mean", mean, joint_mean[2], mean_se)
    # sd bias predicted from the variance bias, sd·(sqrt(1 + δvar/var) - 1); the same relative bias for σ
    sd_bias = np.sqrt(1 + var_bias / np.diag(joint_cov)) - 1
    sd, sd_se = sd_and_mcse(samples["w"])
    assert_mc_close("w sd", sd, w_sd, sd_se, allowance=w_sd * sd_bias[:2])
    sd, sd_se = sd_and_mcse(samples["sigma"])
    assert_mc_close("sigma sd", sd, sigma_sd, sd_se, allowance=sigma_sd * sd_bias[2])
