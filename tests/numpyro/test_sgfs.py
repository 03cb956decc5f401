"""The SGFS kernel on NumPyro models: per-datum scores, accuracy against the posterior, resumability, errors.

**Accuracy (the paper's §5.1 experiment in small).** Bayesian logistic regression with ``d = 3``
correlated features, ``N = 2000``, minibatch ``n = 200``, prior ``N(0, 1)`` (the paper's ``λ = 1``),
``α = 0`` (``ε = ∞``: no injected noise, the fastest-mixing setting of the paper's Fig. 1). The
reference is the posterior's mean and covariance by quadrature (``exact_moments``: exact to far below any
Monte Carlo error, so the MCSE is SGFS's alone). Tolerances are Monte Carlo errors: ``estimate - target``
must lie in ``[min(0, b) - K_SIGMA·MCSE, max(0, b) + K_SIGMA·MCSE]``, the MCSE from SGFS's effective
sample size (tests/helpers.py). A shift is caught once it exceeds about ``(K_SIGMA + 2)·MCSE``. SGFS-f's
4 chains × 4,800 draws (ESS ~2000 for the means, ~1000 for the covariance products) put the MCSE at ~0.022
posterior sd for a mean and ~2.4% of a variance: a mean off by 0.15 sd, or a variance off by 16%, fails.
SGFS-d's 4,000 draws (ESS ~1000) catch a mean off by 0.15 sd; its covariance check, against a prediction
without Monte Carlo error, keeps the length it had. (These runs were sized against NUTS's draws as reference
before: its Monte Carlo error made SGFS-f's run 1.7 times longer for less power.)

The allowance ``b`` is the bias the theory predicts, not a tuned number. Near the mode ``θ̂`` the
posterior is ``N(θ̂, H⁻¹)`` (``H`` the full-data Hessian of ``U``) and SGFS at ``α = 0`` is the linear
recursion ``θ' = θ - K H (θ - θ̂) + K ξ`` with ``K = 2 (γ N F)⁻¹``, ``F`` the converged Fisher average
(the population covariance ``S_g`` of the per-datum scores at ``θ̂``, plus the ridge) and ``ξ`` the
minibatch noise, ``Cov(ξ) = N² S_g / n`` (indices drawn with replacement). Its stationary covariance
``S`` solves ``S = M S Mᵀ + K Cov(ξ) Kᵀ``, ``M = I - K H``; if ``N F`` were exactly ``H``, ``S = H⁻¹``
exactly (the paper's derivation, γ = (n+N)/n). Here ``N S_g`` differs from ``H`` by the prior's
curvature and by the finite-sample difference between the empirical Fisher and the Hessian, so
``b_cov = S - H⁻¹``. For the mean, stationarity gives ``E[∇U(θ)] = 0`` under both SGFS and the
posterior, so to second order ``μ_SGFS - μ_post = -½ H⁻¹ T:(S - H⁻¹)`` with ``T`` the third
derivative of ``U`` at ``θ̂``: ``b_mean``. Both are checked to be at most 5% of the posterior scale
(``assert_small_bias``). SGFS-d at ``α = 0`` is the same recursion with the diagonal ``F``: its
covariance is *not* the posterior's (the paper: it underestimates the variance), so its covariance
is compared to its own predicted ``S_d`` and its mean to the posterior's.

The errors E1 (mean) and E2 (covariance) of the paper's eq. (14) are printed (``pytest -s``).
"""

import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
import scipy.linalg
from jax.flatten_util import ravel_pytree
from numpyro.infer import MCMC

from ppl_sgmcmc.numpyro import SGFS, SGLD
from ppl_sgmcmc.numpyro.potential import ModelTarget
from ppl_sgmcmc.rules import sgfs
from tests.helpers import assert_mc_close, assert_small_bias, cov_and_mcse, ess, mean_and_mcse

NUM_DATA, NUM_FEATURES, BATCH = 2000, 3, 200
FEATURE_CORR = np.array([[1.0, 0.5, 0.2], [0.5, 1.0, -0.3], [0.2, -0.3, 1.0]])
W_TRUE = np.array([1.0, -0.8, 0.5])
MAX_BIAS = 0.05


def logistic_data(num_data=NUM_DATA, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(num_data, NUM_FEATURES)) @ np.linalg.cholesky(FEATURE_CORR).T
    y = rng.uniform(size=num_data) < 1 / (1 + np.exp(-X @ W_TRUE))
    return X.astype(np.float32), y.astype(np.float32)


def logistic(X, y, batch_size=BATCH):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=batch_size):
        logits = numpyro.subsample(X, event_dim=1) @ w
        numpyro.sample("y", dist.Bernoulli(logits=logits), obs=numpyro.subsample(y, event_dim=0))


def small_logistic(X, y):
    logistic(X, y, batch_size=10)


X, Y = logistic_data()


# --- the linearised theory of SGFS on this posterior (float64) ---------------------------------------------
def _laplace(X, y):
    """Mode ``θ̂``, Hessian ``H`` of ``U``, third-derivative contraction ``S ↦ T:S``, score covariance ``S_g``."""
    X, y = np.asarray(X, np.float64), np.asarray(y, np.float64)
    w = np.zeros(X.shape[1])
    for _ in range(50):  # Newton
        p = 1 / (1 + np.exp(-X @ w))
        grad = w - X.T @ (y - p)
        H = np.eye(X.shape[1]) + (X * (p * (1 - p))[:, None]).T @ X
        w = w - np.linalg.solve(H, grad)
    p = 1 / (1 + np.exp(-X @ w))
    H = np.eye(X.shape[1]) + (X * (p * (1 - p))[:, None]).T @ X
    third = p * (1 - p) * (1 - 2 * p)

    def contract(S):  # (T:S)_i = Σ_jk T_ijk S_jk, T_ijk = Σ_n p(1-p)(1-2p) x_ni x_nj x_nk
        return X.T @ (third * np.einsum("nj,jk,nk->n", X, S, X))

    scores = X * (y - p)[:, None]
    return w, H, contract, np.cov(scores.T, bias=True)


MODE, HESSIAN, CONTRACT_T, SCORE_COV = _laplace(X, Y)
LAPLACE_COV = np.linalg.inv(HESSIAN)


def predicted_sgfs(fisher, ridge=1e-4):
    """``(covariance S, mean shift b_mean)`` of SGFS at ``α = 0`` on the Laplace approximation."""
    gamma = (BATCH + NUM_DATA) / BATCH
    F = SCORE_COV + ridge * np.diag(np.diag(SCORE_COV))
    if fisher == "diagonal":
        F = np.diag(np.diag(F))
    K = 2 * np.linalg.inv(gamma * NUM_DATA * F)
    M = np.eye(NUM_FEATURES) - K @ HESSIAN
    Q = K @ (NUM_DATA**2 / BATCH * SCORE_COV) @ K.T
    S = scipy.linalg.solve_discrete_lyapunov(M, Q)
    return S, -0.5 * LAPLACE_COV @ CONTRACT_T(S - LAPLACE_COV)


def e1_e2(mean, cov, mean_ref, cov_ref):
    """The relative errors of the paper's eq. (14)."""
    return np.abs(mean - mean_ref).sum() / np.abs(mean_ref).sum(), np.abs(cov - cov_ref).sum() / np.abs(cov_ref).sum()


def exact_moments(nodes=10):
    """Posterior mean and covariance by Gauss-Hermite quadrature (``nodes`` per axis) on the Laplace
    approximation's whitened axes, ``∫ f p = ∫ f (p/q) q`` with ``q = N(θ̂, H⁻¹)``: ``p/q`` is smooth and nearly
    constant here, so 8 nodes agree with 24 to 1e-8 of the moments, far below any Monte Carlo error."""
    features, labels = np.asarray(X, np.float64), np.asarray(Y, np.float64)
    z, weights = np.polynomial.hermite_e.hermegauss(nodes)
    grid = np.stack(np.meshgrid(*[z] * NUM_FEATURES, indexing="ij"), -1).reshape(-1, NUM_FEATURES)
    log_weights = np.stack(np.meshgrid(*[np.log(weights)] * NUM_FEATURES, indexing="ij"), -1).sum(-1).ravel()
    theta = MODE + grid @ np.linalg.cholesky(LAPLACE_COV).T
    logits = theta @ features.T
    log_post = (labels * logits - np.logaddexp(0, logits)).sum(1) - 0.5 * (theta**2).sum(1)  # prior N(0, 1)
    log_ratio = log_weights + log_post + 0.5 * (grid**2).sum(1)  # ÷ q, up to a constant
    ratio = np.exp(log_ratio - log_ratio.max())
    ratio /= ratio.sum()
    mean = ratio @ theta
    centred = theta - mean
    return mean, (ratio[:, None] * centred).T @ centred


# Compiled at the session's -O0 (tests/conftest.py), as is the PyMC3 test's chain: their 4 × 5,100 and 10,000 steps
# run in less time than XLA's optimisations take to compile (the three runs: 15.8 s of CPU time with them, 13.7 s
# without)
NUM_SAMPLES_FULL, NUM_SAMPLES_DIAGONAL = 4_800, 4_000


def run_sgfs(fisher, num_samples, seed):
    # 4 vectorised chains; at α = 0 the lag-1 autocorrelation is 1 - 2/γ ≈ 0.82 (γ = 11), ~10 steps per
    # effective draw; warm-up from init_to_uniform takes a few tens of steps
    mcmc = MCMC(
        SGFS(logistic, alpha=0.0, fisher=fisher),
        num_warmup=300,
        num_samples=num_samples,
        num_chains=4,
        chain_method="vectorized",
        thinning=2,
        progress_bar=False,
    )
    mcmc.run(jax.random.PRNGKey(seed), X, Y)
    return mcmc, np.asarray(mcmc.get_samples(group_by_chain=True)["w"], np.float64)


@pytest.fixture(scope="module")
def posterior_moments():
    return exact_moments()


@pytest.mark.slow
def test_sgfs_full_matches_the_posterior(posterior_moments):
    """SGFS-f at α = 0: mean and covariance match the posterior's (paper 003, §5.1, Fig. 1 top)."""
    mcmc, draws = run_sgfs("full", NUM_SAMPLES_FULL, seed=2)
    assert int(mcmc.last_state.num_diverging.sum()) == 0
    S, b_mean = predicted_sgfs("full")
    scale = np.sqrt(np.diag(LAPLACE_COV))
    assert_small_bias("SGFS-f mean", b_mean, scale, MAX_BIAS)
    assert_small_bias("SGFS-f cov", S - LAPLACE_COV, np.outer(scale, scale), MAX_BIAS)

    mean_p, cov_p = posterior_moments
    mean_s, mean_s_se = mean_and_mcse(draws)
    cov_s, cov_s_se = cov_and_mcse(draws)
    print(f"\nESS SGFS-f {ess(draws).round()}")
    print("SGFS-f E1 = {:.4f}, E2 = {:.4f}".format(*e1_e2(mean_s, cov_s, mean_p, cov_p)))
    assert_mc_close("SGFS-f mean", mean_s, mean_p, mean_s_se, b_mean)
    assert_mc_close("SGFS-f cov", cov_s, cov_p, cov_s_se, S - LAPLACE_COV)

    # the Fisher estimate in the state: γ N Î approximates the posterior precision
    fisher = np.asarray(mcmc.last_state.rule_state.fisher, np.float64)
    assert fisher.shape == (4, NUM_FEATURES, NUM_FEATURES)
    np.testing.assert_allclose(fisher, np.broadcast_to(SCORE_COV, fisher.shape), rtol=0.05, atol=0.05 * SCORE_COV.max())
    np.testing.assert_array_equal(mcmc.last_state.rule_state.t, 300 + NUM_SAMPLES_FULL)


@pytest.mark.slow
def test_sgfs_diagonal_mean_matches_the_posterior(posterior_moments):
    """SGFS-d at α = 0: the mean matches the posterior's; the covariance is the predicted (too narrow) one."""
    mcmc, draws = run_sgfs("diagonal", NUM_SAMPLES_DIAGONAL, seed=3)
    assert mcmc.last_state.rule_state.fisher.shape == (4, NUM_FEATURES)
    S_d, b_mean = predicted_sgfs("diagonal")
    scale = np.sqrt(np.diag(LAPLACE_COV))
    assert_small_bias("SGFS-d mean", b_mean, scale, MAX_BIAS)

    mean_p, cov_p = posterior_moments
    mean_s, mean_s_se = mean_and_mcse(draws)
    cov_s, cov_s_se = cov_and_mcse(draws)
    print(f"\nESS SGFS-d {ess(draws).round()}")
    print("SGFS-d E1 = {:.4f}, E2 = {:.4f}".format(*e1_e2(mean_s, cov_s, mean_p, cov_p)))
    assert_mc_close("SGFS-d mean", mean_s, mean_p, mean_s_se, b_mean)
    # the diagonal preconditioner: SGFS-d's own stationary covariance, far from the posterior's here
    assert np.abs(S_d - LAPLACE_COV).max() > 0.2 * LAPLACE_COV.max()
    assert_mc_close("SGFS-d cov vs its prediction", cov_s, S_d, cov_s_se)


# --- per-datum scores ------------------------------------------------------------------------------------------
def two_site_model(X, y, c):
    """Two observed sites in the subsampled plate (one with an event dimension), a constrained latent."""
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    with numpyro.plate("data", X.shape[0], subsample_size=7):
        x = numpyro.subsample(X, event_dim=1)
        numpyro.sample("y", dist.StudentT(4.0, x @ w, sigma), obs=numpyro.subsample(y, event_dim=0))
        logits = x[:, :2] * w[0]
        numpyro.sample("c", dist.Bernoulli(logits=logits).to_event(1), obs=numpyro.subsample(c, event_dim=1))


@pytest.mark.slow
def test_per_example_scores_are_per_datum_gradients():
    rng = np.random.default_rng(0)
    Xs = jnp.asarray(rng.normal(size=(50, 3)), jnp.float32)
    ys = jnp.asarray(rng.normal(size=50), jnp.float32)
    cs = jnp.asarray(rng.uniform(size=(50, 2)) < 0.5, jnp.float32)
    args = (Xs, ys, cs)
    target = ModelTarget(two_site_model, args, {}, jax.random.PRNGKey(0), True, "SGFS")
    z = {"w": jnp.array([0.3, -0.2, 0.5]), "sigma": jnp.array(-0.4)}  # unconstrained: sigma = exp(-0.4)
    flat, unravel = ravel_pytree(z)
    batch = {"data": jnp.array([3, 10, 10, 0, 49, 21, 7])}
    assert jax.jit(lambda f: target.gradient(f, unravel, batch, args, {}))(flat).per_example is None  # off by default
    target.enable_per_example_scores()
    result = jax.jit(lambda f: target.gradient(f, unravel, batch, args, {}))(flat)

    def datum_loglik(f, i):  # written out by hand, in unconstrained coordinates
        p = unravel(f)
        loglik = dist.StudentT(4.0, Xs[i] @ p["w"], jnp.exp(p["sigma"])).log_prob(ys[i])
        return loglik + dist.Bernoulli(logits=Xs[i, :2] * p["w"][0]).log_prob(cs[i]).sum()

    datum_grad = jax.jit(jax.grad(datum_loglik))
    brute = np.stack([datum_grad(flat, i) for i in batch["data"]])
    assert result.per_example.shape == (7, flat.size)
    np.testing.assert_allclose(result.per_example, brute, rtol=1e-5, atol=1e-6)
    # rows sum to (n/N) times the minibatch gradient of the likelihood part, and average to ḡ
    prior_grad = jax.jit(jax.grad(lambda f: target._energies(unravel(f), batch, args, {})[0]))(flat)
    data_grad = -(result.grad - prior_grad)
    np.testing.assert_allclose(result.per_example.sum(0) * 50 / 7, data_grad, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(result.per_example.mean(0), result.score, rtol=1e-5, atol=1e-6)


def test_other_kernels_do_not_compute_per_example_scores():
    kernel = SGLD(small_logistic, step_size=1e-3)
    _init(kernel, logistic_data(100))
    assert not kernel._target.per_example_scores


# --- resumability ------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_resume_continues_the_fisher_average():
    """A run of 20 warm-up + 30 steps resumed for 30 more equals one run of 20 + 60: same draws, same Î. The runs
    are ``ppl_sgmcmc.numpyro.MCMC``'s without a verdict (which is not what is tested): their programs hold no host
    callback, so the second run's start is the first's, loaded from the session's compilation cache."""
    from ppl_sgmcmc.numpyro import MCMC as SGMCMC

    data = logistic_data(100)
    kernel = lambda: SGFS(small_logistic, alpha=2.0, fisher_window=5)  # noqa: E731
    whole = SGMCMC(kernel(), num_warmup=20, num_samples=60, progress_bar=False, verdict=False)
    whole.run(jax.random.PRNGKey(5), *data)
    first = SGMCMC(kernel(), num_warmup=20, num_samples=30, progress_bar=False, verdict=False)
    first.run(jax.random.PRNGKey(5), *data)
    first.post_warmup_state = first.last_state
    first.run(first.last_state.rng_key, *data)
    assert first.sampler._target.per_example_scores
    np.testing.assert_allclose(first.get_samples()["w"], whole.get_samples()["w"][30:], rtol=1e-5, atol=1e-6)
    a, b = first.last_state.rule_state, whole.last_state.rule_state
    np.testing.assert_allclose(a.fisher, b.fisher, rtol=1e-5, atol=1e-7)
    assert (int(a.t), int(a.count)) == (int(b.t), int(b.count)) == (80, 5 + 60)


# --- errors ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(alpha=0.0, fisher="block"), "unknown fisher 'block'"),
        (dict(alpha=0.0, B="eye"), "unknown B 'eye'"),
        (dict(alpha=0.0, B=np.array([[1.0, 2.0], [2.0, 1.0]])), "positive definite"),
        (dict(alpha=0.0, B=np.array([1.0, -1.0])), "positive entries"),
        (dict(alpha=0.0, B=np.eye(3), fisher="diagonal"), "needs a diagonal `B`"),
        (dict(alpha=-1.0), "`alpha` must be a finite non-negative number"),
        (dict(alpha=1.0, step_size=0.1), "give one of `step_size` .* not both"),
        (dict(step_size=-0.1), "`step_size` must be a finite positive number"),
        (dict(alpha=1.0, temperature=2.0), "`temperature` must be 1"),
        (dict(alpha=1.0, ridge=-1.0), "`ridge`"),
        (dict(alpha=1.0, fisher_window=0), "`fisher_window`"),
    ],
)
def test_bad_hyperparameters(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SGFS(logistic, **kwargs)


def test_needs_a_model():
    with pytest.raises(ValueError, match="give `model`"):
        SGFS(potential_fn=lambda z: (z**2).sum(), alpha=0.0)


def test_step_size_infinity_is_alpha_zero():
    assert SGFS(logistic, step_size=math.inf).step_size_at(0) == math.inf


def test_defaults_are_alpha_zero_from_an_approximate_mode():
    kernel = SGFS(logistic)
    assert kernel.step_size_at(0) == math.inf and kernel.find_mode_steps > 0
    assert SGFS(logistic, find_mode=False).find_mode_steps == 0
    assert SGFS(logistic, alpha=1.0).find_mode_steps == 0  # a given step: the init strategy's start


def _init(kernel, model_args):
    """``kernel.init`` at ``w = 0`` (given initial values skip NumPyro's ``initialize_model``)."""
    kernel.init(jax.random.PRNGKey(0), 0, init_params={"w": jnp.zeros(model_args[0].shape[1])}, model_args=model_args)


def test_B_shape_must_fit_the_model():
    with pytest.raises(ValueError, match=r"SGFS: B of shape \(4,\) does not fit the 3 parameters"):
        _init(SGFS(small_logistic, alpha=0.0, B=np.ones(4)), logistic_data(100))


def test_full_fisher_too_large_raises_and_points_to_diagonal():
    """d = 2001 > MAX_FULL_DIM: a clear error at initialisation (not a d³ step or a d² allocation)."""
    Xw = np.zeros((100, sgfs.MAX_FULL_DIM + 1), np.float32)
    yw = np.zeros(100, np.float32)
    with pytest.raises(ValueError, match=r"SGFS: a full Fisher for d = 2001 .* fisher='diagonal'"):
        _init(SGFS(small_logistic, alpha=0.0), (Xw, yw))
    with pytest.raises(ValueError, match="max_full_dim = 2"):
        _init(SGFS(small_logistic, alpha=0.0, max_full_dim=2), logistic_data(100))


def test_plate_requirements():
    data = logistic_data(100)

    def no_subsampling(X, y):
        w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.Bernoulli(logits=X @ w), obs=y)

    with pytest.warns(UserWarning, match="no plate with `subsample_size`"):
        with pytest.raises(ValueError, match="exactly one plate with `subsample_size`"):
            _init(SGFS(no_subsampling, alpha=0.0), data)
    with pytest.raises(ValueError, match="needs n >= 2"):
        _init(SGFS(lambda X, y: logistic(X, y, 1), alpha=0.0), data)


@pytest.mark.slow
def test_small_minibatch_warns():
    """n ≤ d: the Fisher estimate starts singular; the default ridge is too small for that. The kernel warns when it
    checks the model's dimension, before it compiles its start: the warning raised as an error stops ``init`` there
    (the start is any other model's)."""
    Xw, yw = np.ones((100, 12), np.float32), np.zeros(100, np.float32)
    message = r"n = 10\) is not larger than the number of parameters \(d = 12\)"
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=f".*{message}", category=UserWarning)
        with pytest.raises(UserWarning, match=message):
            _init(SGFS(small_logistic, alpha=0.0), (Xw, yw))


def test_gibbs_sites_are_not_supported():
    with pytest.raises(NotImplementedError, match="local Gibbs sites"):
        SGFS(logistic, alpha=0.0, gibbs_sites=["z"], gibbs_fn=lambda *args: None)


def hierarchical(y):
    """``mu`` and ``tau`` enter only through the prior of ``beta``: no Fisher information on them."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfNormal(1.0))
    beta = numpyro.sample("beta", dist.Normal(mu, tau).expand([2]).to_event(1))
    with numpyro.plate("data", y.shape[0], subsample_size=10):
        numpyro.sample("y", dist.Normal(beta[0] + beta[1], 1.0), obs=numpyro.subsample(y, event_dim=0))


def test_latents_outside_the_likelihood_are_refused():
    y = jnp.asarray(np.random.default_rng(0).normal(size=50), jnp.float32)
    with pytest.raises(ValueError, match="latent site\\(s\\) 'mu', 'tau' are zero in all"):
        SGFS(hierarchical).init(jax.random.PRNGKey(0), 0, model_args=(y,))
    # with a fixed B and a finite step the preconditioner is defined: accepted
    SGFS(hierarchical, step_size=1e-3, B="identity").init(jax.random.PRNGKey(0), 0, model_args=(y,))


def quadratic(x, y):
    """PyMC3's own SGFS test (``pymc3/tests/test_sgmcmc.py``): ``y = a x² + b x + c + N(0, 1)`` with
    ``(a, b, c) = (1, 2, 3)``, ``x ~ U(-10, 10)``, 25 000 points, minibatch 50, prior ``N(1, 1)``."""
    abc = numpyro.sample("abc", dist.Normal(1.0, 1.0).expand([3]).to_event(1))
    with numpyro.plate("data", x.shape[0], subsample_size=50):
        xb = numpyro.subsample(x, event_dim=0)
        mean = abc[0] * xb**2 + abc[1] * xb + abc[2]
        numpyro.sample("y", dist.Normal(mean, 1.0), obs=numpyro.subsample(y, event_dim=0))


@pytest.mark.slow
def test_pymc3_sgfs_test_passes_from_the_prior_mean():
    """The defaults (α = 0 from an approximate mode) from PyMC3's start, the prior mean (1, 1, 1), with 5000
    warm-up steps: the posterior mean within 10 % of (1, 2, 3), as PyMC3's test asks (a fixed-step SGFS run
    ended at (0.97, 1.29, 2.40) from there)."""
    rng = np.random.default_rng(0)
    x = rng.uniform(-10, 10, size=25_000).astype(np.float32)
    y = (x**2 + 2 * x + 3 + rng.normal(size=x.shape)).astype(np.float32)
    mcmc = MCMC(SGFS(quadratic), num_warmup=5000, num_samples=5000, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), jnp.asarray(x), jnp.asarray(y), init_params={"abc": jnp.ones(3)})
    mean = np.asarray(mcmc.get_samples()["abc"]).mean(0)
    np.testing.assert_allclose(mean, [1.0, 2.0, 3.0], rtol=0.1)


def test_hand_set_step_from_the_prior_mean_warns_at_the_end():
    """A hand-set ``step_size=1.0`` from PyMC3's start keeps its burn-in: its chains never meet (they ended
    140-700 posterior sds off, silently, before the end-of-run verdict). ``ppl_sgmcmc.numpyro.MCMC`` judges the
    draws and says so."""
    from ppl_sgmcmc.numpyro import MCMC as JudgedMCMC

    rng = np.random.default_rng(0)
    x = rng.uniform(-10, 10, size=25_000).astype(np.float32)
    y = (x**2 + 2 * x + 3 + rng.normal(size=x.shape)).astype(np.float32)
    mcmc = JudgedMCMC(SGFS(quadratic, step_size=1.0), num_warmup=1000, num_samples=5000, num_chains=2,
                      chain_method="vectorized", progress_bar=False)  # fmt: skip
    with pytest.warns(RuntimeWarning, match="probably not a sample of the posterior yet: the chains disagree"):
        mcmc.run(jax.random.PRNGKey(0), jnp.asarray(x), jnp.asarray(y), init_params={"abc": jnp.ones((2, 3))})
    assert not mcmc.last_verdict.ok and mcmc.last_verdict.too_few
