"""Shared helpers of the statistical tests: Monte Carlo standard errors, MCSE-based assertions,
the conjugate linear-regression posterior, and the predicted stationary covariance of a linear
SG-MCMC chain (used as the documented discretisation-bias allowance).

Conventions: ``draws`` are NumPy arrays shaped ``(chains, samples, ...)``, as returned by
``mcmc.get_samples(group_by_chain=True)``. Standard errors use NumPyro's multi-chain effective
sample size (:func:`numpyro.diagnostics.effective_sample_size`).
"""

import contextlib

import jax
import numpy as np
import scipy.linalg
import scipy.optimize
from numpyro.diagnostics import effective_sample_size

# Number of Monte Carlo standard errors a statistic may miss its target by. With ~70 compared
# statistics per file, |Z| > 4.5 has probability ~7e-6 each under a correct sampler.
K_SIGMA = 4.5


@contextlib.contextmanager
def optimized_compilation():
    """Compile with XLA's optimisations for a long chain, against the session's compile-for-compile-time default
    (``tests/conftest.py``): a 100,000-step SGHMC run on the 3-feature regression takes 11.3 s of CPU time at
    ``jax_disable_most_optimizations`` and 4.2 s with it off (92 vs 20 µs a step; compiling costs ~0.2 s more).

    XLA:CPU's elemental emitters stay on (``XLA_FLAGS``, read once per process). With them at ``-O2``, LLVM took
    over 20 GB to optimise the CSGLD mixture's vectorised loop (Gaussian gradient noise drawn in the potential;
    ``tests/numpyro/test_csgld.py``'s short run of it stays at the session's ``-O0``)."""
    previous = jax.config.values["jax_disable_most_optimizations"]
    jax.config.update("jax_disable_most_optimizations", False)
    try:
        yield
    finally:
        jax.config.update("jax_disable_most_optimizations", previous)


# --- Monte Carlo standard errors ------------------------------------------------------------------
def ess(draws):
    """Effective sample size of each trailing coordinate of ``(chains, samples, ...)`` draws."""
    draws = np.asarray(draws, dtype=np.float64)
    if draws.ndim < 2:
        raise ValueError("draws must be shaped (chains, samples, ...)")
    return np.asarray(effective_sample_size(draws))


def mean_and_mcse(draws):
    """Pooled mean and its MCSE ``sd / sqrt(ESS)``, per coordinate."""
    draws = np.asarray(draws, dtype=np.float64)
    flat = draws.reshape((-1,) + draws.shape[2:])
    return flat.mean(0), flat.std(0, ddof=1) / np.sqrt(ess(draws))


def cov_and_mcse(draws):
    """Pooled covariance matrix of ``(chains, samples, d)`` draws and the MCSE of each entry.

    The entry ``C_ij`` is the mean of the products ``(x_i - x̄_i)(x_j - x̄_j)``; its MCSE is the sd of
    those products over ``sqrt(ESS)`` of the product series (for a Gaussian and i = j this is about
    ``var · sqrt(2 / ESS)``).
    """
    draws = np.asarray(draws, dtype=np.float64)
    centred = draws - draws.mean(axis=(0, 1))
    products = centred[..., :, None] * centred[..., None, :]
    flat = products.reshape((-1,) + products.shape[2:])
    return flat.mean(0), flat.std(0, ddof=1) / np.sqrt(ess(products))


def sd_and_mcse(draws):
    """Pooled sd and its MCSE by the delta method, ``MCSE(var) / (2 sd)``, per coordinate."""
    draws = np.asarray(draws, dtype=np.float64)
    centred = draws - draws.mean(axis=(0, 1))
    squares = centred**2
    flat = squares.reshape((-1,) + squares.shape[2:])
    var = flat.mean(0)
    mcse_var = flat.std(0, ddof=1) / np.sqrt(ess(squares))
    sd = np.sqrt(var)
    return sd, mcse_var / (2 * sd)


# --- assertions -----------------------------------------------------------------------------------
def mc_report(name, estimate, target, mcse, allowance=0.0, k=K_SIGMA):
    """Rows ``(label, estimate, target, error, lower, upper, MCSE, allowance)`` with the accepted error
    interval ``[min(0, b) - k·MCSE, max(0, b) + k·MCSE]`` for a predicted bias ``b = allowance``."""
    estimate, target, mcse = (np.atleast_1d(np.asarray(a, dtype=np.float64)) for a in (estimate, target, mcse))
    allowance = np.broadcast_to(np.asarray(allowance, dtype=np.float64), estimate.shape)
    error = estimate - target
    lower = np.minimum(0.0, allowance) - k * mcse
    upper = np.maximum(0.0, allowance) + k * mcse
    rows = []
    for index in np.ndindex(estimate.shape):
        label = name + ("" if estimate.size == 1 else str(list(index)))
        rows.append(
            (label, estimate[index], target[index], error[index])
            + (lower[index], upper[index], mcse[index], allowance[index])
        )
    return rows


def assert_mc_close(name, estimate, target, mcse, allowance=0.0, k=K_SIGMA):
    """Assert ``estimate - target`` lies in ``[min(0, b) - k·MCSE, max(0, b) + k·MCSE]``; print the comparison.

    ``allowance`` ``b`` is a documented, *predicted* systematic bias (e.g. of the step size; signed), never
    a fudge factor: the error may lie anywhere between 0 and ``b``, plus ``k`` MCSEs either side. Callers
    bound ``b`` separately (see :func:`assert_small_bias`).
    """
    rows = mc_report(name, estimate, target, mcse, allowance, k)
    lines = []
    for label, est, tgt, err, lo, hi, se, allow in rows:
        slack = min(err - lo, hi - err)  # > 0 inside the interval
        lines.append(
            f"  {label:<30} est {est: .5g}  target {tgt: .5g}  err {err: .3g}  accepted [{lo:.3g}, {hi:.3g}] "
            f"(bias {allow:.2g}, {k}·MCSE {k * se:.3g})  |err|/tol {abs(err) / (hi if err >= 0 else -lo):.2f}"
            + ("" if slack >= 0 else "  FAIL")
        )
    print("\n".join(lines))
    failed = [line for line, row in zip(lines, rows) if not row[4] <= row[3] <= row[5]]
    assert not failed, f"{name}: outside the Monte Carlo tolerance:\n" + "\n".join(failed)


def assert_small_bias(name, bias, scale, fraction):
    """Guard on an allowance: the predicted systematic bias is at most ``fraction`` of ``scale``."""
    ratio = np.max(np.abs(np.asarray(bias)) / np.asarray(scale))
    assert ratio <= fraction, (
        f"{name}: the predicted discretisation bias is {ratio:.3g} of the posterior scale (> {fraction}); "
        "reduce the step size rather than accept it"
    )


# --- the conjugate linear-regression posterior ----------------------------------------------------
def linear_regression_data(num_data, num_features, noise_scale, seed, feature_corr=0.3):
    """Simulated regression data with correlated Gaussian features.

    Returns ``(X, y, w_true)`` (``X``, ``y`` in float32); feature ``j`` and ``j+1`` have correlation
    ``feature_corr`` (alternating in sign), so the posterior covariance has non-zero off-diagonals.
    """
    rng = np.random.default_rng(seed)
    corr = np.eye(num_features)
    for j in range(num_features - 1):
        corr[j, j + 1] = corr[j + 1, j] = feature_corr * (-1) ** j
    X = rng.normal(size=(num_data, num_features)) @ np.linalg.cholesky(corr).T
    w_true = rng.normal(size=num_features)
    y = X @ w_true + noise_scale * rng.normal(size=num_data)
    return X.astype(np.float32), y.astype(np.float32), w_true


def conjugate_posterior(X, y, noise_scale, prior_scale):
    """Exact posterior of ``w`` for ``y ~ N(X w, σ²)``, ``w ~ N(0, s² I)``.

    ``Λ = I/s² + XᵀX/σ²``, ``Σ = Λ⁻¹``, ``μ = Σ Xᵀy/σ²``; returns ``(μ, Σ)`` in float64.
    """
    X, y = np.asarray(X, np.float64), np.asarray(y, np.float64)
    precision = np.eye(X.shape[1]) / prior_scale**2 + X.T @ X / noise_scale**2
    cov = np.linalg.inv(precision)
    return cov @ X.T @ y / noise_scale**2, cov


def exact_unknown_noise_posterior(X, y):
    """The posterior of ``w ~ N(0, I)``, ``σ ~ HalfNormal(1)``, ``y ~ N(X w, σ²)``: given ``σ`` it is
    Gaussian with precision ``Λ = I + XᵀX/σ²`` and mean ``Λ⁻¹Xᵀy/σ²``; ``σ``'s marginal
    ``p(σ | y) ∝ HalfNormal(σ) N(y; 0, σ²I + XXᵀ)`` is tabulated on a fine grid of ``log σ``.

    Returns ``E[w]``, ``E[σ]``, ``sd(σ)``, ``sd(w)``, and the mean and covariance of ``(w, log σ)``."""
    X, y = np.asarray(X, np.float64), np.asarray(y, np.float64)
    log_sigma = np.linspace(np.log(0.3), np.log(2.0), 4001)
    XtX, Xty, yty = X.T @ X, X.T @ y, y @ y
    log_post, means, covs = [], [], []
    for s in np.exp(log_sigma):
        precision = np.eye(X.shape[1]) + XtX / s**2
        cov = np.linalg.inv(precision)
        mean = cov @ Xty / s**2
        log_lik = -len(y) * np.log(s) - 0.5 * np.linalg.slogdet(precision)[1] - 0.5 * (yty - Xty @ mean) / s**2
        log_post.append(log_lik - s**2 / 2 + np.log(s))  # + log HalfNormal(σ) + log|dσ/d log σ|
        means.append(mean)
        covs.append(cov)
    weights = np.exp(np.asarray(log_post) - max(log_post))
    weights /= weights.sum()
    means, covs, sigma = np.asarray(means), np.asarray(covs), np.exp(log_sigma)
    w_mean = weights @ means
    w_cov = np.einsum("k,kij->ij", weights, covs + np.einsum("ki,kj->kij", means, means)) - np.outer(w_mean, w_mean)
    ls_mean = weights @ log_sigma
    joint_cov = np.zeros((3, 3))
    joint_cov[:2, :2] = w_cov
    joint_cov[:2, 2] = joint_cov[2, :2] = weights @ (means * log_sigma[:, None]) - w_mean * ls_mean
    joint_cov[2, 2] = weights @ log_sigma**2 - ls_mean**2
    sigma_mean = weights @ sigma
    sigma_sd = np.sqrt(weights @ sigma**2 - sigma_mean**2)
    return w_mean, sigma_mean, sigma_sd, np.sqrt(np.diag(w_cov)), np.append(w_mean, ls_mean), joint_cov


def unknown_noise_gradient_cov(X, y, mean, batch_size):
    """Covariance of the minibatch gradient of ``U`` in ``(w, log σ)`` for ``y ~ N(X w, σ²)`` at ``mean = (w, log σ)``
    (``n`` indices drawn with replacement): ``(N²/n) Cov_i(g_i)``, ``g_i`` the gradients of ``-log N(y_i | x_i w, σ)``."""
    X, y = np.asarray(X, np.float64), np.asarray(y, np.float64)
    residual = y - X @ mean[:-1]
    sigma2 = np.exp(2 * mean[-1])
    per_datum = np.concatenate([-X * (residual / sigma2)[:, None], (1 - residual**2 / sigma2)[:, None]], axis=1)
    return X.shape[0] ** 2 / batch_size * np.cov(per_datum.T, bias=True)


def minibatch_gradient_cov(X, y, w, noise_scale, batch_size):
    """Covariance of the minibatch gradient ``∇Ũ_t(w)`` with ``n`` indices drawn with replacement:
    ``(N²/n) Cov_i(g_i)`` with per-datum gradients ``g_i = x_i (x_iᵀ w - y_i) / σ²``."""
    X, y = np.asarray(X, np.float64), np.asarray(y, np.float64)
    per_datum = X * ((X @ w - y) / noise_scale**2)[:, None]
    return X.shape[0] ** 2 / batch_size * np.cov(per_datum.T, bias=True)


def mean_score_second_moment(X, y, w_mean, w_cov, noise_scale, batch_size):
    """``E[ḡ ⊙ ḡ]`` of the minibatch mean score ``ḡ = (1/n) Σ_{i∈S} ∇ log p(y_i|w)`` (indices drawn
    with replacement), averaged over ``w ~ N(w_mean, w_cov)``: the squared full-data mean score, its
    spread over the posterior, and the minibatch variance (evaluated at ``w_mean``)."""
    X, y = np.asarray(X, np.float64), np.asarray(y, np.float64)
    per_datum = X * ((y - X @ w_mean) / noise_scale**2)[:, None]
    slope = X.T @ X / (X.shape[0] * noise_scale**2)  # the mean score is linear in w with this slope
    return per_datum.mean(0) ** 2 + np.diag(slope @ w_cov @ slope.T) + per_datum.var(0) / batch_size


# --- predicted stationary covariance of linear SG-MCMC chains -------------------------------------
# On a Gaussian target U(θ) = ½ (θ-μ)ᵀ Λ (θ-μ) with additive gradient noise of covariance C, every
# rule below (with friction frozen) is a linear recursion x' = M x + ε, ε ~ N(0, Q). Its stationary
# mean is exactly μ and its stationary covariance S solves S = M S Mᵀ + Q. S - Σ is the combined
# discretisation and gradient-noise bias of the chosen step size, O(h).
def _stationary(M, Q):
    return scipy.linalg.solve_discrete_lyapunov(M, Q)


def predicted_cov_sgld(precision, grad_cov, step_size, preconditioner=None, temperature=1.0):
    """Stationary covariance of (preconditioned) SGLD: ``θ' = θ - h G (Λθ + g) + sqrt(2hτG) ζ``."""
    d = precision.shape[0]
    G = np.eye(d) if preconditioner is None else np.diag(np.broadcast_to(preconditioner, (d,)))
    h = step_size
    M = np.eye(d) - h * G @ precision
    Q = 2 * h * temperature * G + h**2 * G @ grad_cov @ G
    return _stationary(M, Q)


def predicted_cov_momentum(precision, grad_cov, step_size, friction, diffusion, integrator):
    """Stationary covariance of θ for SGHMC (or SGNHT with the thermostat frozen at ``friction``,
    a scalar or a vector), for the ``"euler"`` and ``"splitting"`` rules of ALGORITHMS.md."""
    d = precision.shape[0]
    return _momentum_chain_cov(precision, grad_cov, step_size, friction, diffusion, integrator)[:d, :d]


def _momentum_chain_cov(precision, grad_cov, step_size, friction, diffusion, integrator):
    """Stationary covariance of ``(θ, p)`` of the linear momentum chain (``friction``: a scalar, a vector or a
    ``d × d`` matrix)."""
    d = precision.shape[0]
    h, Id, Z = step_size, np.eye(d), np.zeros((d, d))
    friction = np.asarray(friction, np.float64)
    A = friction if friction.ndim == 2 else np.diag(np.broadcast_to(friction, (d,)))
    noise_p = 2 * h * np.diag(np.broadcast_to(np.asarray(diffusion, np.float64), (d,))) + h**2 * grad_cov
    Q_p = np.block([[Z, Z], [Z, noise_p]])  # noise enters the momentum
    if integrator == "euler":
        # θ' = θ + h p;  p' = p - h Λ θ' - h A p + noise
        M = np.block([[Id, h * Id], [-h * precision, Id - h * A - h**2 * precision]])
        Q = Q_p
    elif integrator == "splitting":
        half = np.block([[Id, h / 2 * Id], [Z, Id]])
        damp = np.block([[Id, Z], [Z, scipy.linalg.expm(-A * h / 2)]])
        kick = np.block([[Id, Z], [-h * precision, Id]])
        after_kick = half @ damp  # the noise is added at O, then damped and drifted
        M = after_kick @ kick @ damp @ half
        Q = after_kick @ Q_p @ after_kick.T
    else:
        raise ValueError(integrator)
    return _stationary(M, Q)


def predicted_thermostat(precision, grad_cov, step_size, diffusion, integrator, thermostat="multivariate"):
    """SGNHT on a Gaussian target, frozen at its equilibrium friction: the thermostat ``ξ`` settles
    where the stationary momentum has ``E[p ⊙ p] = 1`` (``"multivariate"``), ``E[pᵀp]/d = 1`` (``"scalar"``)
    or ``E[p pᵀ] = I`` (``"matrix"``, a symmetric ``ξ``), i.e. where ``ξ_{t+1} - ξ_t`` has mean zero. Returns
    ``(ξ, Cov(θ))`` of that linear chain.

    To first order ``ξ ≈ D + h·diag(C)/2``: the multivariate thermostat absorbs the diagonal of the gradient
    noise, not its off-diagonal part, whose bias remains in ``Cov(θ)``; the matrix one, ``Ξ ≈ D I + h C/2``,
    absorbs all of it.
    """
    d = precision.shape[0]
    h = step_size
    upper = np.triu_indices(d)

    def friction_of(x):
        if thermostat == "matrix":
            xi = np.zeros((d, d))
            xi[upper] = x
            return xi + np.triu(xi, 1).T
        return x if thermostat == "multivariate" else np.full(d, x[0])

    def momentum_excess(x):
        p_cov = _momentum_chain_cov(precision, grad_cov, h, friction_of(x), diffusion, integrator)[d:, d:]
        if thermostat == "matrix":
            return (p_cov - np.eye(d))[upper]
        p_var = np.diag(p_cov)
        return (p_var if thermostat == "multivariate" else np.atleast_1d(p_var.mean())) - 1.0

    first_order = diffusion * np.eye(d) + h * np.asarray(grad_cov, np.float64) / 2
    start = {"matrix": first_order[upper], "multivariate": np.diag(first_order),
             "scalar": np.atleast_1d(np.diag(first_order).mean())}[thermostat]  # fmt: skip
    xi = friction_of(scipy.optimize.fsolve(momentum_excess, start))
    cov = _momentum_chain_cov(precision, grad_cov, h, xi, diffusion, integrator)[:d, :d]
    return (xi[0] if thermostat == "scalar" else xi), cov


def mahalanobis(draws, mean, cov):
    """``(θ - μ)ᵀ Σ⁻¹ (θ - μ)`` per draw, shaped ``(chains, samples)``: its mean is ``d`` under N(μ, Σ) and
    ``tr(Σ⁻¹ S)`` under a chain with mean ``μ`` and covariance ``S``. A pooled check of the temperature
    of all coordinates at once, sharper than any single covariance entry."""
    centred = np.asarray(draws, np.float64) - mean
    return np.einsum("...i,ij,...j->...", centred, np.linalg.inv(cov), centred)


def assert_linear_network_posterior(samples, X, y, noise, prior):
    """The draws of a network with no hidden layer and one output (``layers.0.weight``, ``layers.0.bias``,
    grouped by chain) match the conjugate posterior of the linear regression on ``X`` with an intercept,
    within Monte Carlo error."""
    draws = np.concatenate([samples["layers.0.weight"][..., 0, :], samples["layers.0.bias"]], axis=-1)
    mu, cov = conjugate_posterior(np.hstack([X, np.ones((X.shape[0], 1), X.dtype)]), y, noise, prior)
    mean, mean_mcse = mean_and_mcse(draws)
    sd, sd_mcse = sd_and_mcse(draws)
    assert_mc_close("mean", mean, mu, mean_mcse)
    assert_mc_close("sd", sd, np.sqrt(np.diag(cov)), sd_mcse)


def walled(backend):
    """``U = x²/2`` inside ``|x| < 1.5`` and a steep quartic wall outside (curvature ~1e4 beyond), as ``potential_fn``
    of ``backend`` (``ppl_sgmcmc.numpyro`` or ``ppl_sgmcmc.pyro``): the start's step size (the cap), stable at the start
    (curvature 1), makes a chain that reaches the wall (within the first re-tuning period) run off."""
    if backend.__name__ == "ppl_sgmcmc.numpyro":
        import jax.numpy as jnp

        return lambda z: jnp.sum(0.5 * z["x"] ** 2 + 50 * jnp.maximum(jnp.abs(z["x"]) - 1.5, 0.0) ** 4)
    import torch

    return lambda z: (0.5 * z["x"] ** 2 + 50 * torch.clamp(z["x"].abs() - 1.5, min=0.0) ** 4).sum()
