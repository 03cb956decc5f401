"""Statistical correctness of the NumPyro kernels on posteriors with a known answer.

1. Conjugate Bayesian linear regression with known noise: every kernel, minibatched, must reproduce
   the exact Gaussian posterior mean and covariance.
2. The same regression with an unknown noise scale (a constrained latent) and a deterministic site,
   against the exact posterior (one-dimensional quadrature over ``σ``).

Tolerances are Monte Carlo errors: ``estimate - target`` must lie in
``[min(0, b) - K_SIGMA·MCSE, max(0, b) + K_SIGMA·MCSE]`` with ``K_SIGMA = 4.5``, MCSEs from NumPyro's
multi-chain effective sample size (see ``tests/helpers.py``), and ``b`` the allowance below (signed:
the estimate may be biased towards ``b``, not away from it).

The allowance ``b`` is the systematic bias of the chosen step size, *predicted*, not tuned: on a Gaussian
target with additive gradient noise every rule here is a linear recursion (the thermostat frozen at
its equilibrium), whose stationary covariance solves a discrete Lyapunov equation
(:func:`tests.helpers.predicted_cov_sgld`, ...). It includes the O(h) discretisation bias and the
extra variance injected by the minibatch gradient noise, ``h²·Cov(∇Ũ)`` per step, which for SGLD
inflates the variance by about ``(1 + N/n)·hλ/2``: with ``N/n = 20`` that term dominates. The step
sizes are chosen so that this predicted bias is at most a few per cent of the posterior scale
(checked by ``assert_small_bias`` at 5%), i.e. a small fraction of the Monte Carlo tolerance (~10-13%
of a posterior variance, 6-9% for the pooled Mahalanobis statistic, at the ESS of ~1600-2600 these
runs reach; a 10% error in the noise scale or the temperature fails). The stationary *mean* of a
linear recursion with zero-mean noise is exactly the posterior mean, so means get no allowance.

Problem scale: the noise sd ``σ = 16`` makes the posterior sd O(0.5) (curvature 3-6). Momentum and
thermostat hyper-parameters then take natural values (friction 2.5, D = 2). The scaling matters for
the thermostats: ``ξ`` has unit mass and relaxes on a time scale ``~ξ`` (time units, h per step), so on a
stiff posterior (curvature ~1e3, which wants ξ ~ 30) the thermostat that heats up during the initial
descent needs ~1e5 steps to cool down.
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import MCMC

from ppl_sgmcmc.numpyro import PSGLD, SGHMC, SGLD, SGNHT
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
# chains of 10⁴-10⁵ steps: compiled for run time, not compile time (tests/conftest.py)
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("xla_optimizations")]


NUM_DATA, NUM_FEATURES, BATCH = 1000, 3, 50
NOISE, PRIOR = 16.0, 1.0
NUM_CHAINS = 16
MAX_BIAS = 0.05  # the predicted step-size bias may be at most 5% of sqrt(Σ_ii Σ_jj)

X, Y, _ = linear_regression_data(NUM_DATA, NUM_FEATURES, NOISE, seed=0)
POST_MEAN, POST_COV = conjugate_posterior(X, Y, NOISE, PRIOR)
PRECISION = np.linalg.inv(POST_COV)
GRAD_COV = minibatch_gradient_cov(X, Y, POST_MEAN, NOISE, BATCH)
SCALE = np.sqrt(np.outer(np.diag(POST_COV), np.diag(POST_COV)))


def regression(X, y):
    w = numpyro.sample("w", dist.Normal(0.0, PRIOR).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=BATCH):
        x = numpyro.subsample(X, event_dim=1)
        numpyro.sample("y", dist.Normal(x @ w, NOISE), obs=numpyro.subsample(y, event_dim=0))


def _psgld_prediction(step_size, eps=1e-5):
    # With α = 0.999 the RMSprop average V ≈ E[ḡ⊙ḡ] spans ~1000 steps, longer than θ's relaxation
    # (~600), so G is nearly constant and pSGLD is SGLD preconditioned by G ≈ 1/(λ + sqrt(E V)) (≈ 115).
    # With the default α = 0.99, V follows the current θ (the full-data mean score grows away from the
    # MLE), G(θ) varies by a few per cent over the posterior, and the dropped Γ(θ) = ∇·G term leaves a
    # bias that does not vanish with h: measured +5.0 ± 0.8% in E[(θ-μ)ᵀΣ⁻¹(θ-μ)]/d against the +1.8%
    # predicted here (16 chains × 4e5 steps); with α = 0.999, +2.5 ± 0.7%; α = 0.9999, +1.9 ± 0.7%.
    square_avg = mean_score_second_moment(X, Y, POST_MEAN, POST_COV, NOISE, BATCH)
    return predicted_cov_sgld(PRECISION, GRAD_COV, step_size, preconditioner=1 / (eps + np.sqrt(square_avg)))


# (kernel, predicted stationary covariance, num_warmup, num_samples, thinning[, (num_chains, chain_method)]);
# by default NUM_CHAINS vectorised chains. Slowest-mode relaxation ~1/(h_eff·λ_min) ≈ 600 steps for
# SGLD/pSGLD/SGHMC (the gradient-noise bias, ∝ h/friction, caps their speed alike) and ~200 for the
# thermostats, which absorb the gradient noise's diagonal.
CASES = {
    "sgld": (
        lambda: SGLD(regression, step_size=5e-4),
        lambda: predicted_cov_sgld(PRECISION, GRAD_COV, 5e-4),
        10_000,
        100_000,
        10,
    ),
    # minibatches by epoch-wise reshuffling: less gradient noise than with replacement, so the
    # with-replacement prediction bounds the bias from above. One chain (ESS ~200, a coarse check):
    # vectorised, every step pays the O(N) reshuffle (both branches of the epoch test run under
    # vmap), ~300x slower per step here.
    "sgld-epochs": (
        lambda: SGLD(regression, step_size=5e-4, replace=False),
        lambda: predicted_cov_sgld(PRECISION, GRAD_COV, 5e-4),
        5_000,
        200_000,
        10,
        (1, "sequential"),
    ),
    "psgld": (
        lambda: PSGLD(regression, step_size=4e-6, alpha=0.999),
        lambda: _psgld_prediction(4e-6),
        10_000,
        100_000,
        10,
    ),
    "sghmc-splitting": (
        lambda: SGHMC(regression, step_size=2e-3, friction=2.5, integrator="splitting"),
        lambda: predicted_cov_momentum(PRECISION, GRAD_COV, 2e-3, 2.5, 2.5, "splitting"),
        10_000,
        100_000,
        10,
    ),
    "sghmc-euler": (
        lambda: SGHMC(regression, step_size=2e-3, friction=2.5, integrator="euler"),
        lambda: predicted_cov_momentum(PRECISION, GRAD_COV, 2e-3, 2.5, 2.5, "euler"),
        10_000,
        100_000,
        10,
    ),
    "sgnht-multivariate-splitting": (
        lambda: SGNHT(regression, step_size=5e-3, diffusion=2.0),
        lambda: predicted_thermostat(PRECISION, GRAD_COV, 5e-3, 2.0, "splitting")[1],
        5_000,
        40_000,
        5,
    ),
    "sgnht-multivariate-euler": (
        lambda: SGNHT(regression, step_size=5e-3, diffusion=2.0, integrator="euler"),
        lambda: predicted_thermostat(PRECISION, GRAD_COV, 5e-3, 2.0, "euler")[1],
        5_000,
        40_000,
        5,
    ),
    "sgnht-scalar-splitting": (
        lambda: SGNHT(regression, step_size=5e-3, diffusion=2.0, thermostat="scalar"),
        lambda: predicted_thermostat(PRECISION, GRAD_COV, 5e-3, 2.0, "splitting", "scalar")[1],
        5_000,
        40_000,
        5,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_conjugate_linear_regression(case):
    make_kernel, predict_cov, num_warmup, num_samples, thinning, *chains = CASES[case]
    num_chains, chain_method = chains[0] if chains else (NUM_CHAINS, "vectorized")
    predicted_bias = predict_cov() - POST_COV
    assert_small_bias(case, predicted_bias, SCALE, MAX_BIAS)

    mcmc = MCMC(
        make_kernel(),
        num_warmup=num_warmup,
        num_samples=num_samples,
        num_chains=num_chains,
        chain_method=chain_method,
        thinning=thinning,
        progress_bar=False,
    )
    mcmc.run(jax.random.PRNGKey(1), X, Y)  # initial values: init_to_uniform(-2, 2), ~4 sd away
    assert not np.any(np.asarray(mcmc.get_extra_fields()["diverging"]))
    draws = np.asarray(mcmc.get_samples(group_by_chain=True)["w"])
    assert draws.shape == (num_chains, num_samples // thinning, NUM_FEATURES)

    mean, mean_se = mean_and_mcse(draws)
    cov, cov_se = cov_and_mcse(draws)
    upper = np.triu_indices(NUM_FEATURES)
    print(f"\n{case}: ESS of w {np.round(ess(draws))}")
    assert_mc_close(f"{case} mean", mean, POST_MEAN, mean_se)
    assert_mc_close(f"{case} cov", cov[upper], POST_COV[upper], cov_se[upper], allowance=predicted_bias[upper])
    # all coordinates at once: E[(θ-μ)ᵀΣ⁻¹(θ-μ)] / d = 1 (a 10% error in the temperature fails it)
    distance, distance_se = mean_and_mcse(mahalanobis(draws, POST_MEAN, POST_COV)[..., None] / NUM_FEATURES)
    distance_bias = np.trace(PRECISION @ predicted_bias) / NUM_FEATURES
    assert_mc_close(f"{case} Mahalanobis/d", distance, 1.0, distance_se, allowance=distance_bias)


# --- a constrained latent and a deterministic site, against the exact posterior ----------------------
SIGMA_DATA = 0.8
X2, Y2, _ = linear_regression_data(NUM_DATA, 2, SIGMA_DATA, seed=1)
BATCH2 = 100  # N/n = 10: halves SGLD's gradient-noise bias at a given step size, so steps can be larger
NUM_SAMPLES2 = 30_000


def regression_unknown_noise(X, y):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    numpyro.deterministic("log_sigma", jnp.log(sigma))
    with numpyro.plate("data", X.shape[0], subsample_size=BATCH2):
        x = numpyro.subsample(X, event_dim=1)
        mean = numpyro.deterministic("mean", x @ w)
        numpyro.sample("y", dist.Normal(mean, sigma), obs=numpyro.subsample(y, event_dim=0))


def test_constrained_latent_and_deterministic_against_the_exact_posterior():
    """SGLD on ``(w, log σ)`` against the exact posterior (quadrature over ``σ``, ``w`` integrated analytically:
    :func:`tests.helpers.exact_unknown_noise_posterior`); no reference chain, so the MCSE is SGLD's alone.

    Sized to catch a mean off by 0.15 posterior sd and an sd off by ~13% (a temperature or minibatch-scale
    error of 30%; a missing log-Jacobian of ``σ`` moves log σ by only its variance, ~0.02 sd here, beyond
    reach): 16 chains × 30,000 steps give ESS ~700-950 for the means (MCSE ~0.035 sd, caught beyond ~6.5 MCSE)
    and ~1400-1600 for the sds. Against NUTS (one chain of 2000 draws, ESS ~1750 for the means and ~1000 for
    the sds), 45,000 steps were needed for the same power on the means and gave less on the sds.
    """
    w_mean, sigma_mean, sigma_sd, w_sd, joint_mean, joint_cov = exact_unknown_noise_posterior(X2, Y2)

    # curvature ≈ N/σ² ≈ 1600 (w) and 2N = 2000 (log σ): at h = 2e-6 SGLD's variance bias
    # ≈ (1 + N/n)·hλ/2 is ≈ 2% (predicted below, gradient covariance at the posterior mean); the slowest mode
    # relaxes in 1/(h·λ_min) ≈ 400 steps. Means get no allowance: the only O(h) mean shift, E[σ] = E[exp(log σ)]
    # moving with the log-σ variance bias δv ≈ 2% of 5e-4, is σ·δv/2 ≈ 4e-6, under 1% of its MCSE.
    step_size = 2e-6
    grad_cov = unknown_noise_gradient_cov(X2, Y2, joint_mean, BATCH2)
    var_bias = np.diag(predicted_cov_sgld(np.linalg.inv(joint_cov), grad_cov, step_size) - joint_cov)
    assert_small_bias("sgld (w, log σ) variance", var_bias, np.diag(joint_cov), MAX_BIAS)

    num_samples, thinning = NUM_SAMPLES2, 90
    mcmc = MCMC(
        SGLD(regression_unknown_noise, step_size=step_size),
        num_warmup=4_000,
        num_samples=num_samples,
        num_chains=NUM_CHAINS,
        chain_method="vectorized",
        thinning=thinning,
        progress_bar=False,
    )
    mcmc.run(jax.random.PRNGKey(3), X2, Y2)
    assert not np.any(np.asarray(mcmc.get_extra_fields()["diverging"]))
    samples = {k: np.asarray(v) for k, v in mcmc.get_samples(group_by_chain=True).items()}

    # the deterministic sites: present, on the full data, with the right values
    assert set(samples) == {"w", "sigma", "log_sigma", "mean"}
    assert samples["sigma"].min() > 0
    np.testing.assert_allclose(samples["log_sigma"], np.log(samples["sigma"]), rtol=1e-5, atol=1e-6)
    assert samples["mean"].shape == (NUM_CHAINS, num_samples // thinning, NUM_DATA)
    np.testing.assert_allclose(samples["mean"], samples["w"] @ X2.T, rtol=1e-4, atol=1e-4)

    print(f"\nESS: w {np.round(ess(samples['w']))}, sigma {np.round(ess(samples['sigma']))}")
    # predicted SGLD sd bias: sd·(sqrt(1 + δvar/var) - 1), the same relative bias for σ as for log σ
    sd_bias = np.sqrt(1 + var_bias / np.diag(joint_cov)) - 1
    for site, target_mean, target_sd, index in (("w", w_mean, w_sd, slice(0, 2)), ("sigma", sigma_mean, sigma_sd, 2)):
        mean, mean_se = mean_and_mcse(samples[site])
        assert_mc_close(f"{site} mean", mean, target_mean, mean_se)
        sd, sd_se = sd_and_mcse(samples[site])
        assert_mc_close(f"{site} sd", sd, target_sd, sd_se, allowance=target_sd * sd_bias[index])


# --- the matrix thermostat absorbs correlated gradient noise -----------------------------------------------------
NOISE_EIGENVALUES = np.array([90.0, 50.0, 10.0, 1.0])
_ROTATION = np.linalg.qr(np.random.default_rng(1).normal(size=(4, 4)))[0]
CORRELATED_NOISE = _ROTATION @ np.diag(NOISE_EIGENVALUES) @ _ROTATION.T


def test_matrix_thermostat_absorbs_correlated_gradient_noise():
    """SGNHT's matrix thermostat on ``N(0, I)`` whose gradient carries a correlated noise ``ε ~ N(0, V)`` (``V``'s
    eigenvalues 90, 50, 10, 1 along rotated axes; ``h V / 2`` up to 2.25 at ``h = 0.05``): the draws' covariance is
    the posterior's, as the linear chain at the thermostat's equilibrium predicts (``Ξ ≈ D I + h V/2``: its bias is
    0). The multivariate thermostat, which absorbs only ``V``'s diagonal, is predicted (and was measured: the
    library's benchmarks) to leave covariance eigenvalues 0.6-1.5, far outside this test's tolerance, so a matrix
    thermostat that updated only its diagonal, or damped by ``exp(-diag(Ξ) h/2)``, fails it. 16 chains of 40,000
    steps: an ESS of ~10⁴, a tolerance of ~6 % on each covariance entry."""
    step_size, dim = 0.05, 4
    root = jnp.asarray(np.linalg.cholesky(CORRELATED_NOISE), jnp.float32)

    def potential(z, rng):  # E[∇Ũ] = x: the posterior N(0, I); ∇Ũ - x = R ζ ~ N(0, V)
        x = z["x"]
        return 0.5 * jnp.sum(x * x) + jnp.dot(root @ jax.random.normal(rng, (dim,)), x)

    predicted = {kind: predicted_thermostat(np.eye(dim), CORRELATED_NOISE, step_size, 1.0, "splitting", kind)
                 for kind in ("multivariate", "matrix")}  # fmt: skip
    assert_small_bias("matrix thermostat", predicted["matrix"][1] - np.eye(dim), np.ones((dim, dim)), 0.01)
    # the diagonal thermostat's predicted covariance is far off (the test's power against it)
    assert np.abs(predicted["multivariate"][1] - np.eye(dim)).max() > 0.25

    mcmc = MCMC(SGNHT(potential_fn=potential, step_size=step_size, thermostat="matrix"), num_warmup=2_000,
                num_samples=40_000, num_chains=NUM_CHAINS, chain_method="vectorized", thinning=10,
                progress_bar=False)  # fmt: skip
    mcmc.run(jax.random.PRNGKey(2), init_params={"x": jnp.zeros((NUM_CHAINS, dim))},
             extra_fields=("rule_state.thermostat",))  # fmt: skip
    draws = np.asarray(mcmc.get_samples(group_by_chain=True)["x"], np.float64)
    cov, cov_se = cov_and_mcse(draws)
    upper = np.triu_indices(dim)
    print(f"\nESS of x {np.round(ess(draws))}")
    mean, mean_se = mean_and_mcse(draws)
    assert_mc_close("matrix thermostat mean", mean, np.zeros(dim), mean_se)
    assert_mc_close("matrix thermostat cov", cov[upper], np.eye(dim)[upper], cov_se[upper])
    # the thermostat settled where the linear chain's equilibrium puts it, off-diagonal entries included
    thermostat = np.asarray(mcmc.get_extra_fields(group_by_chain=True)["rule_state.thermostat"], np.float64)
    np.testing.assert_allclose(thermostat.mean(axis=(0, 1)), predicted["matrix"][0], atol=0.1)


def test_sghmc_friction_absorbs_the_measured_gradient_noise():
    """SGHMC with ``absorb_noise`` on ``N(0, I)`` whose gradient carries an independent noise of variances ``V`` =
    90, 50, 10, 1 (``B = h V/2`` up to 2.25 at ``h = 0.05``, friction ``A = 1``): the friction ``C = A + B̂``, ``B̂``
    from the chain's own running estimate of ``V``, keeps each draw's variance at the linear chain's prediction for
    ``C = A + B``, within 2 % of the posterior's; without ``B̂`` the prediction is up to 3.2 times it (the test's power:
    a ``B̂`` added to the injected noise instead of the friction, or one off by a factor of 2, fails). 16 chains of
    20,000 steps: an ESS of ~4000 a coordinate, a tolerance of ~10 % on each variance."""
    step_size, dim, friction = 0.05, 4, 1.0
    scale = jnp.asarray(np.sqrt(NOISE_EIGENVALUES), jnp.float32)
    noise_cov = np.diag(NOISE_EIGENVALUES)

    def potential(z, rng):  # E[∇Ũ] = x: the posterior N(0, I); ∇Ũ - x ~ N(0, diag V)
        x = z["x"]
        return 0.5 * jnp.sum(x * x) + jnp.dot(scale * jax.random.normal(rng, (dim,)), x)

    absorbed = friction + step_size * NOISE_EIGENVALUES / 2
    predicted = predicted_cov_momentum(np.eye(dim), noise_cov, step_size, absorbed, friction, "splitting")
    assert_small_bias("SGHMC with B̂", np.diag(predicted) - 1, np.ones(dim), 0.02)
    left = predicted_cov_momentum(np.eye(dim), noise_cov, step_size, friction, friction, "splitting")
    assert np.diag(left).max() > 3

    kernel = SGHMC(potential_fn=potential, step_size=step_size, friction=friction, absorb_noise=True)
    mcmc = MCMC(kernel, num_warmup=2_000, num_samples=20_000, num_chains=NUM_CHAINS, chain_method="vectorized",
                thinning=5, progress_bar=False)  # fmt: skip
    mcmc.run(jax.random.PRNGKey(3), init_params={"x": jnp.zeros((NUM_CHAINS, dim))})
    draws = np.asarray(mcmc.get_samples(group_by_chain=True)["x"], np.float64)
    mean, mean_se = mean_and_mcse(draws)
    assert_mc_close("SGHMC with B̂ mean", mean, np.zeros(dim), mean_se)
    cov, cov_se = cov_and_mcse(draws)
    print(f"\nESS of x {np.round(ess(draws))}, variances {np.round(np.diag(cov), 3)}")
    assert_mc_close("SGHMC with B̂ variances", np.diag(cov), np.ones(dim), np.diag(cov_se), np.diag(predicted) - 1)
