"""Tests of :mod:`ppl_sgmcmc.adaptation`, backend-neutral.

* the schedule's structure (contiguous, proportional windows doubling, the minimum warm-up);
* a window's variance and its effective sample size by batch means, against independent draws, a trend and
  an AR(1) chain of known autocorrelation time;
* the change of variables ``θ = L u``: round trips, the Laplace preconditioner of a Hessian (unit curvature in
  ``u``, negative curvature by magnitude, the floor), the pulled-back gradient against autodiff of ``U(L u)``
  (JAX and torch), and SGLD in ``u`` on a Gaussian of condition number 10⁴ with a step size 2.5·10² times
  SGLD's stability limit in ``θ`` (moments within Monte Carlo error, with the predicted discretisation bias
  as the documented allowance);
* the tuned step size, and :func:`adapt_step` over a warm-up: the step size set from the noise at every
  window's end, the rescaling from the slow windows' draws (and none where they are too few), frozen after
  the warm-up, the same numbers on ``jax.numpy`` (under ``jit`` and ``vmap``) and ``torch``.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from ppl_sgmcmc import adaptation as ad
from ppl_sgmcmc.rules import StochasticGradient, sgld
from tests.helpers import (
    K_SIGMA,
    assert_mc_close,
    assert_small_bias,
    cov_and_mcse,
    mahalanobis,
    mean_and_mcse,
    predicted_cov_sgld,
)


def as_np(x: object) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy().astype(np.float64)
    return np.asarray(x, dtype=np.float64)


COV3 = np.array([[4.0, 1.2, -0.6], [1.2, 1.0, 0.3], [-0.6, 0.3, 0.5]])


# --- the schedule ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("num_steps", [200, 201, 333, 1000, 5000, 123457])
def test_schedule_structure(num_steps: int) -> None:
    windows = ad.adaptation_schedule(num_steps)
    assert windows[0] == (0, round(0.15 * num_steps))
    assert windows[-1] == (num_steps - round(0.1 * num_steps), num_steps)
    assert all(a[1] == b[0] for a, b in zip(windows, windows[1:]))  # contiguous
    sizes = [end - start for start, end in windows[1:-1]]
    assert sizes[0] == round(0.05 * num_steps) >= ad.MIN_WINDOW
    assert all(b == 2 * a for a, b in zip(sizes[:-2], sizes[1:-1]))  # doubling, but for the stretched last
    assert sizes[-1] >= (2 * sizes[-2] if len(sizes) > 1 else sizes[0])


def test_schedule_too_short() -> None:
    assert ad.minimum_warmup_steps() == 200
    ad.adaptation_schedule(200)
    with pytest.raises(ValueError, match="at least 200 warm-up steps"):
        ad.adaptation_schedule(199)


def test_window_ends() -> None:
    schedule = ad.adaptation_schedule(1000)
    assert schedule == [(0, 150), (150, 200), (200, 300), (300, 500), (500, 900), (900, 1000)]
    for like in (jnp.zeros(1), torch.zeros(1)):
        assert as_np(ad.window_ends(schedule, like)).tolist() == [150, 200, 300, 500, 900, 1000]


# --- a window's variance ---------------------------------------------------------------------------------
@jax.jit
def _moments_scan(xs: jax.Array, batches: jax.Array) -> ad.WindowMoments:
    """The window moments of the rows ``xs`` in the batches ``batches``, one ``lax.scan`` (compiled once a shape)."""

    def body(moments: ad.WindowMoments, row: tuple[jax.Array, jax.Array]) -> tuple[ad.WindowMoments, None]:
        return ad._add(moments, *row), None

    return jax.lax.scan(body, ad.window_moments(xs.shape[1], like=xs), (xs, batches))[0]


def moments_of(draws: np.ndarray, xp: str = "jax") -> ad.WindowMoments:
    """The window moments of ``draws`` added one by one (a ``lax.scan`` on JAX, a loop on torch)."""
    n = draws.shape[0]
    batches = np.arange(n) * ad.BATCHES // n
    if xp == "jax":
        return _moments_scan(jnp.asarray(draws, jnp.float32), jnp.asarray(batches))
    ts = torch.tensor(draws, dtype=torch.float32)
    moments = ad.window_moments(draws.shape[1], like=ts[0])
    for t in range(n):
        moments = ad._add(moments, ts[t], torch.tensor(int(batches[t])))
    return moments


def ar1(n: int, rho: float, d: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = np.zeros((n, d))
    x[0] = rng.normal(size=d)
    for t in range(1, n):
        x[t] = rho * x[t - 1] + math.sqrt(1 - rho**2) * rng.normal(size=d)
    return x


def test_window_variance_of_independent_draws() -> None:
    draws = np.random.default_rng(0).normal(size=(1600, 3)) * np.array([2.0, 1.0, 0.5])
    variance, n_eff = ad.window_variance(moments_of(draws))
    np.testing.assert_allclose(as_np(variance), np.var(draws, axis=0), rtol=1e-4)
    # batch means of independent draws: n_eff = n up to the 16 batch means' chi-square spread (sd sqrt(2/15))
    assert np.all(np.abs(np.log(as_np(n_eff) / 1600)) < 3 * math.sqrt(2 / 15)), as_np(n_eff)


def test_window_variance_of_correlated_and_trending_draws() -> None:
    rho = 0.98  # integrated autocorrelation time (1 + ρ)/(1 - ρ) = 99
    draws = ar1(32_000, rho, 4, seed=1)
    _, n_eff = ad.window_variance(moments_of(draws))
    expected = 32_000 * (1 - rho) / (1 + rho)
    assert np.all(np.abs(np.log(as_np(n_eff) / expected)) < 3 * math.sqrt(2 / 15)), (as_np(n_eff), expected)
    trend = np.linspace(-1.0, 1.0, 800)[:, None] * np.ones((1, 2))
    _, n_eff = ad.window_variance(moments_of(trend))
    assert np.all(as_np(n_eff) < ad.MIN_EFFECTIVE)  # a window that only drifted says little


def test_window_variance_far_from_zero() -> None:
    """Draws of unit spread around 3000 (a coordinate of ``u`` whose mean the preconditioner made large): in float32
    the raw ``E[u²] - E[u]²`` loses every digit (``u²`` ~ 10⁷, resolved to ~1); the window's moments are taken
    about its first draw, and give the variance within its sampling error."""
    draws = (3000.0 + np.random.default_rng(7).normal(size=(1600, 2))).astype(np.float32)
    for xp in ("jax", "torch"):
        variance, n_eff = ad.window_variance(moments_of(draws, xp))
        np.testing.assert_allclose(as_np(variance), np.var(draws.astype(np.float64), axis=0), rtol=1e-3)
        assert np.all(np.abs(np.log(as_np(n_eff) / 1600)) < 3 * math.sqrt(2 / 15))


def test_window_variance_same_on_torch() -> None:
    draws = ar1(640, 0.5, 2, seed=2)
    jax_result = ad.window_variance(moments_of(draws, "jax"))
    torch_result = ad.window_variance(moments_of(draws, "torch"))
    for a, b in zip(jax_result, torch_result):
        np.testing.assert_allclose(as_np(a), as_np(b), rtol=1e-4)


# --- the preconditioner ----------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["jax", "torch"])
@pytest.mark.parametrize("dense", [False, True])
def test_round_trip_and_factor(backend: str, dense: bool) -> None:
    cov = COV3 if dense else np.diag(COV3)
    arr = (lambda a: jnp.asarray(a, jnp.float32)) if backend == "jax" else (lambda a: torch.tensor(a))
    pre = ad.from_covariance(arr(cov))
    L = as_np(pre.scale)
    np.testing.assert_allclose(L @ L.T if dense else L * L, cov, rtol=1e-5)
    if dense:
        assert np.allclose(L, np.tril(L))
    u = arr(np.array([0.3, -1.2, 2.0]))
    theta = ad.to_theta(pre, u)
    np.testing.assert_allclose(as_np(theta), (L if dense else np.diag(L)) @ as_np(u), rtol=1e-5)
    np.testing.assert_allclose(as_np(ad.to_u(pre, theta)), as_np(u), rtol=1e-5, atol=1e-6)
    ident = ad.identity(3, dense, u)
    np.testing.assert_array_equal(as_np(ad.to_theta(ident, u)), as_np(u))
    np.testing.assert_array_equal(as_np(ad.to_u(ident, u)), as_np(u))


def test_not_positive_definite_gives_nan_not_exception() -> None:
    bad = [[1.0, 2.0], [2.0, 1.0]]
    assert np.isnan(as_np(ad.from_covariance(torch.tensor(bad)).scale)).any()
    assert np.isnan(as_np(ad.from_covariance(jnp.asarray(bad)).scale)).any()


A = np.array([[3.0, 1.0, 0.5], [1.0, 2.0, -0.4], [0.5, -0.4, 1.5]])  # U(θ) = ½ (θ-b)ᵀ A (θ-b)
B = np.array([1.0, -2.0, 0.5])


@pytest.mark.parametrize("dense", [False, True])
def test_pullback_equals_jax_autodiff(dense: bool) -> None:
    A_, b_ = jnp.asarray(A, jnp.float32), jnp.asarray(B, jnp.float32)
    per_example = jnp.asarray(np.arange(12.0).reshape(4, 3) / 7, jnp.float32)

    def U(theta: jax.Array) -> jax.Array:
        return 0.5 * (theta - b_) @ A_ @ (theta - b_)

    def grad_fn(theta: jax.Array) -> StochasticGradient:
        g = jax.grad(U)(theta)
        return StochasticGradient(U(theta), g, -g / 10, per_example * theta)

    pre = ad.from_covariance(jnp.asarray(COV3 if dense else np.diag(COV3), jnp.float32))
    u = jnp.array([0.4, -0.7, 1.1])
    got = jax.jit(lambda u: ad.pullback_grad_fn(pre, grad_fn)(u))(u)
    theta = ad.to_theta(pre, u)
    expected = jax.grad(lambda u: U(ad.to_theta(pre, u)))(u)
    np.testing.assert_allclose(as_np(got.grad), as_np(expected), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(as_np(got.score), -as_np(expected) / 10, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(float(got.energy), float(U(theta)), rtol=1e-6)
    # each per-example row r_i ↦ Lᵀ r_i (the chain rule, row by row): the matrix R L
    L = as_np(pre.scale) if dense else np.diag(as_np(pre.scale))
    rows = as_np(per_example * theta)
    np.testing.assert_allclose(as_np(got.per_example), rows @ L, rtol=1e-5, atol=1e-6)
    assert got.per_example.shape == (4, 3)
    none = ad.pullback_grad_fn(pre, lambda t: StochasticGradient(U(t), t, -t))(u)
    assert none.per_example is None


@pytest.mark.parametrize("dense", [False, True])
def test_pullback_equals_torch_autograd(dense: bool) -> None:
    A_, b_ = torch.tensor(A), torch.tensor(B)

    def U(theta: torch.Tensor) -> torch.Tensor:
        return 0.5 * (theta - b_) @ A_ @ (theta - b_)

    def grad_fn(theta: torch.Tensor) -> StochasticGradient:
        g = A_ @ (theta - b_)
        return StochasticGradient(U(theta), g, -g, torch.stack([g, 2 * g]))

    pre = ad.from_covariance(torch.tensor(COV3 if dense else np.diag(COV3)))
    u = torch.tensor([0.4, -0.7, 1.1], dtype=torch.float64, requires_grad=True)
    got = ad.pullback_grad_fn(pre, grad_fn)(u.detach())
    (expected,) = torch.autograd.grad(U(ad.to_theta(pre, u)), u)
    np.testing.assert_allclose(as_np(got.grad), as_np(expected), rtol=1e-12)
    np.testing.assert_allclose(as_np(got.score), -as_np(expected), rtol=1e-12)
    np.testing.assert_allclose(as_np(got.per_example), np.stack([as_np(expected), 2 * as_np(expected)]), rtol=1e-12)


# --- SGLD in u on an ill-conditioned Gaussian ----------------------------------------------------------------
ANGLE = math.pi / 6
ROT = np.array([[math.cos(ANGLE), -math.sin(ANGLE)], [math.sin(ANGLE), math.cos(ANGLE)]])
SIGMA = ROT @ np.diag([1.0, 1e-4]) @ ROT.T  # condition number 10⁴, correlation ≈ 0.9998
MU = np.array([1.0, -2.0])


def test_preconditioned_sgld_samples_ill_conditioned_gaussian() -> None:
    assert np.isclose(np.linalg.cond(SIGMA), 1e4)
    precision = np.linalg.inv(SIGMA)
    h, chains, burn, samples = 0.05, 4, 300, 20_000
    assert h > 2 / np.linalg.eigvalsh(precision).max() * 100  # 250× SGLD's stability limit in θ
    prec_, mu_ = jnp.asarray(precision, jnp.float32), jnp.asarray(MU, jnp.float32)

    def grad_fn(theta: jax.Array) -> StochasticGradient:
        g = prec_ @ (theta - mu_)
        return StochasticGradient(0.5 * (theta - mu_) @ g, g, -g)

    pre = ad.from_covariance(jnp.asarray(SIGMA, jnp.float32))
    grad_u = ad.pullback_grad_fn(pre, grad_fn)

    def run(key: jax.Array, step_grad_fn: object, steps: int) -> jax.Array:
        x0 = jnp.zeros(2)
        noise = jax.random.normal(key, (steps, 2))

        def body(x: jax.Array, z: jax.Array) -> tuple[jax.Array, jax.Array]:
            x, _, _ = sgld.step(x, sgld.init(x, z), step_grad_fn, z, step_size=h)
            return x, x

        return jax.lax.scan(body, x0, noise)[1]

    keys = jax.random.split(jax.random.key(0), chains)
    u_draws = jax.jit(jax.vmap(lambda k: run(k, grad_u, burn + samples)))(keys)[:, burn:]
    theta = np.asarray(jax.vmap(jax.vmap(lambda u: ad.to_theta(pre, u)))(u_draws), np.float64)  # (chains, samples, d)
    assert np.isfinite(theta).all()

    # the same step size without preconditioning diverges
    plain = jax.jit(lambda k: run(k, grad_fn, 30))(keys[0])
    assert not np.all(np.abs(np.asarray(plain[-1])) < 1e6)

    # SGLD in u on N(L⁻¹μ, I) without gradient noise: stationary covariance S_u (exact for this linear chain)
    S_u = predicted_cov_sgld(np.eye(2), np.zeros((2, 2)), h)
    np.testing.assert_allclose(S_u, np.eye(2) / (1 - h / 2), rtol=1e-10)
    L = np.linalg.cholesky(SIGMA)
    S_theta = L @ S_u @ L.T
    assert_small_bias("preconditioned SGLD covariance", np.diag(S_theta - SIGMA), np.diag(SIGMA), 0.03)

    mean, mcse = mean_and_mcse(theta)
    assert_mc_close("mean", mean, MU, mcse)
    cov, cov_mcse = cov_and_mcse(theta)
    assert_mc_close("cov", cov, SIGMA, cov_mcse, allowance=S_theta - SIGMA)
    # the pooled temperature of both coordinates (sharp on the thin direction): E[(θ-μ)ᵀΣ⁻¹(θ-μ)] = tr(Σ⁻¹S)
    m = mahalanobis(theta, MU, SIGMA)[..., None]
    m_mean, m_mcse = mean_and_mcse(m)
    target = np.trace(precision @ S_theta)
    assert_mc_close("mahalanobis", m_mean, 2.0, m_mcse, allowance=target - 2.0, k=K_SIGMA)


# --- the Laplace preconditioner --------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_from_hessian_dense_whitens(backend: str) -> None:
    H = np.linalg.inv(COV3)
    arr = (lambda a: jnp.asarray(a, jnp.float32)) if backend == "jax" else (lambda a: torch.tensor(a))
    pre, curvature = ad.from_hessian(arr(H), dense=True)
    L, L_inv = as_np(pre.scale), as_np(pre.inverse)
    np.testing.assert_allclose(L.T @ H @ L, np.eye(3), atol=1e-4)
    np.testing.assert_allclose(L @ L.T, COV3, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(L_inv @ L, np.eye(3), atol=1e-5)
    assert float(curvature) == pytest.approx(1.0, abs=1e-5)


def test_from_hessian_negative_curvature_and_floor() -> None:
    # a saddle: the negative eigenvalue of the equilibrated Hessian is taken by its magnitude; a flat direction
    # is floored
    Q = np.linalg.qr(np.random.default_rng(3).normal(size=(3, 3)))[0]
    H = Q @ np.diag([4.0, -1.0, 0.0]) @ Q.T
    pre, curvature = ad.from_hessian(torch.tensor(H), dense=True)
    L = as_np(pre.scale)
    root = np.sqrt(np.abs(np.diag(H)))
    eigenvalues, V = np.linalg.eigh(H / np.outer(root, root))
    floored = np.maximum(np.abs(eigenvalues), ad.HESSIAN_FLOOR * np.abs(eigenvalues).max())
    expected = np.outer(root, root) * (V @ np.diag(floored) @ V.T)
    assert np.sum(floored == ad.HESSIAN_FLOOR * np.abs(eigenvalues).max()) == 1  # the flat direction
    np.testing.assert_allclose(np.linalg.inv(L @ L.T), expected, rtol=1e-6, atol=1e-9)
    assert float(curvature) == pytest.approx(1.0)
    assert np.isfinite(L).all()


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_from_hessian_badly_scaled_in_float32(backend: str) -> None:
    # a regression whose coefficients' scales differ by 10⁴ and 10⁻² (an intercept of an outcome in dollars, a log
    # scale), correlated at 0.995: the eigenvalues of H span 10¹³, beyond float32 and the floor; equilibrated by
    # its diagonal first, the preconditioner still whitens it
    scales = np.array([1e4, 1e2, 1e-2])
    corr = np.array([[1.0, -0.995, 0.05], [-0.995, 1.0, 0.0], [0.05, 0.0, 1.0]])
    H = np.linalg.inv(np.outer(scales, scales) * corr)
    arr = (lambda a: jnp.asarray(a, jnp.float32)) if backend == "jax" else (lambda a: torch.tensor(a, dtype=torch.float32))
    pre, curvature = ad.from_hessian(arr(H), dense=True)
    L = as_np(pre.scale).astype(np.float64)
    np.testing.assert_allclose(L.T @ H @ L, np.eye(3), atol=1e-3)
    assert float(curvature) == pytest.approx(1.0, abs=1e-3)


def test_from_hessian_diagonal_is_jacobi() -> None:
    H = np.linalg.inv(COV3)
    pre, curvature = ad.from_hessian(jnp.asarray(H, jnp.float32), dense=False)
    scale = as_np(pre.scale)
    np.testing.assert_allclose(scale, 1 / np.sqrt(np.diag(H)), rtol=1e-5)
    np.testing.assert_allclose(as_np(pre.inverse), np.sqrt(np.diag(H)), rtol=1e-5)
    # the curvature left in u: the largest eigenvalue of diag(H)^(-1/2) H diag(H)^(-1/2)
    D = np.diag(scale)
    assert float(curvature) == pytest.approx(np.linalg.eigvalsh(D @ H @ D).max(), rel=1e-4)
    only_diagonal, unknown = ad.from_hessian(jnp.asarray(np.diag(H), jnp.float32), dense=False)
    np.testing.assert_allclose(as_np(only_diagonal.scale), scale, rtol=1e-6)
    assert np.isnan(float(unknown))
    with pytest.raises(ValueError, match="needs the \\(d, d\\) Hessian"):
        ad.from_hessian(jnp.ones(3), dense=True)


@pytest.mark.parametrize("dense", [False, True])
def test_rescale(dense: bool) -> None:
    pre = ad.from_covariance(torch.tensor(COV3 if dense else np.diag(COV3)))
    factor = torch.tensor([2.0, 0.5, 1.0], dtype=torch.float64)
    new = ad.rescale(pre, factor)
    u = torch.tensor([0.3, -1.2, 2.0], dtype=torch.float64)
    # θ = L diag(f) u: the coordinate u_k stretched by f_k
    np.testing.assert_allclose(as_np(ad.to_theta(new, u)), as_np(ad.to_theta(pre, factor * u)), rtol=1e-12)
    np.testing.assert_allclose(as_np(ad.to_u(new, ad.to_theta(new, u))), as_np(u), rtol=1e-12, atol=1e-12)


# --- the tuned step size and adapt_step ----------------------------------------------------------------------
def test_tuned_step_size() -> None:
    v = jnp.array([100.0, 400.0, 0.0])
    assert float(ad.tuned_step_size(v, 0.1, 1.0, 1.0)) == pytest.approx(2 * 0.1 / 400)
    assert float(ad.tuned_step_size(v, 0.1, 3.0, 1.0)) == pytest.approx(2 * 3 * 0.1 / 400)  # temperature τ
    assert float(ad.tuned_step_size(v, 0.1, 1.0, 1e-4)) == pytest.approx(1e-4)  # the cap
    assert float(ad.tuned_step_size(jnp.zeros(3), 0.1, 1.0, 0.2)) == pytest.approx(0.2)  # no noise: the cap
    assert float(ad.tuned_step_size(torch.tensor([100.0, 400.0]), 0.1, 1.0, 1.0)) == pytest.approx(5e-4)


NUM_WARMUP = 2000


@functools.partial(jax.jit, static_argnames=("adapt_mass", "tune", "steps"))
def _adapt_scan(state: ad.AdaptState, xs: jax.Array, terms: jax.Array, ends: jax.Array, *, adapt_mass: bool,
                tune: bool, steps: int) -> tuple[ad.AdaptState, tuple[jax.Array, jax.Array]]:  # fmt: skip
    """adapt_step over the first ``steps`` rows of ``xs`` and ``terms``: compiled once per shape and options, so
    that a test calling it on many draws of one shape compiles it once."""

    def body(s: ad.AdaptState, t: jax.Array) -> tuple[ad.AdaptState, tuple[jax.Array, jax.Array]]:
        u = ad.to_u(s.preconditioner, xs[t])
        s, _ = ad.adapt_step(s, u, xs[t], 0.0, terms[t], True, t, ends, adapt_mass=adapt_mass,
                             tune_step_size=tune, target=0.1, temperature=1.0, max_step_size=0.5)  # fmt: skip
        scale = s.preconditioner.scale
        return s, (s.step_size, scale[(0,) * scale.ndim])  # the first diagonal entry, of a dense L too

    return jax.lax.scan(body, state, jnp.arange(steps))


def run_adaptation(draws: np.ndarray, noise_terms: np.ndarray, dense: bool, *, adapt_mass: bool = True,
                   tune: bool = True, steps: int = NUM_WARMUP) -> tuple[ad.AdaptState, np.ndarray, np.ndarray]:  # fmt: skip
    """adapt_step over ``steps`` steps (a warm-up of NUM_WARMUP): the final state, and the step size and the
    preconditioner's first scale after each step."""
    d = draws.shape[1]
    xs, terms = jnp.asarray(draws, jnp.float32), jnp.asarray(noise_terms, jnp.float32)
    ends = ad.window_ends(ad.adaptation_schedule(NUM_WARMUP), xs)
    state = ad.adapt_init(ad.identity(d, dense, xs), 0.01, 1.0, xs[0], 0.0)
    state, (step_sizes, scales) = _adapt_scan(state, xs, terms, ends, adapt_mass=adapt_mass, tune=tune, steps=steps)
    return state, np.asarray(step_sizes), np.asarray(scales)


@pytest.mark.parametrize("dense", [True, False])
def test_adapt_step_tunes_at_window_ends(dense: bool) -> None:
    rng = np.random.default_rng(4)
    draws = rng.normal(size=(NUM_WARMUP, 3))
    # noise terms whose window means are known: the largest coordinate's mean is 50 before step 1000, then 200
    terms = np.ones((NUM_WARMUP, 3)) * np.array([10.0, 50.0, 1.0])
    terms[1000:, 1] = 200.0
    state, step_sizes, _ = run_adaptation(draws, terms, dense, adapt_mass=False)
    ends = [end for _, end in ad.adaptation_schedule(NUM_WARMUP)]  # 300, 400, 600, 1000, 1800, 2000
    # the step size is set every 2.5 % of the warm-up (50 steps) from the noisiest 50-step period since the slow
    # window began: 2·0.1/50 from step 49; the period [1000, 1050) is the first with noise 200
    changes = [t for t in range(1, NUM_WARMUP) if step_sizes[t] != step_sizes[t - 1]]
    assert changes == [50 - 1, 1050 - 1]
    np.testing.assert_allclose(step_sizes[50 - 1 : 1050 - 1], 2 * 0.1 / 50, rtol=1e-5)
    np.testing.assert_allclose(step_sizes[1050 - 1 :], 2 * 0.1 / 200, rtol=1e-5)
    assert int(state.window_index) == len(ends)
    # frozen after the warm-up, whatever comes
    steps = NUM_WARMUP + 50
    draws, terms = np.concatenate([draws, 100 * np.ones((50, 3))]), np.concatenate([terms, 1e6 * np.ones((50, 3))])
    final, steps_after, scales_after = run_adaptation(draws, terms, dense, steps=steps)
    assert np.all(steps_after[NUM_WARMUP:] == steps_after[NUM_WARMUP - 1])
    assert np.all(scales_after[NUM_WARMUP:] == scales_after[NUM_WARMUP - 1])
    assert int(final.window_index) == len(ends)


def test_adapt_step_raises_the_step_size_at_most_twofold_a_retuning() -> None:
    """When the noise falls twentyfold (as a control-variate gradient's does at a small step), the step size climbs
    to the new noise's step by doublings, one re-tuning at a time, instead of jumping there: the noise was measured
    at the old step, and a control variate's noise grows with the step."""
    draws = np.random.default_rng(6).normal(size=(NUM_WARMUP, 3))
    terms = np.ones((NUM_WARMUP, 3)) * np.array([10.0, 200.0, 1.0])
    terms[1000:, 1] = 2.0  # from step 1000 the noisiest coordinate is the first (10)
    _, step_sizes, _ = run_adaptation(draws, terms, False, adapt_mass=False)
    before, after = 2 * 0.1 / 200, 2 * 0.1 / 10
    # the slow window [1000, 1800) keeps its noisiest period (it began with the previous window's last, 200) until
    # it closes; then the end buffer re-tunes every 50 steps (2.5 % of the warm-up) and at its end
    changes = [t for t in range(1000, NUM_WARMUP) if step_sizes[t] != step_sizes[t - 1]]
    assert changes == [1800 - 1, 1850 - 1, 1900 - 1, 1950 - 1, 2000 - 1]
    np.testing.assert_allclose(step_sizes[1800 - 2], before, rtol=1e-5)
    np.testing.assert_allclose(step_sizes[changes[:4]], before * 2.0 ** np.arange(1, 5), rtol=1e-5)
    np.testing.assert_allclose(step_sizes[-1], after, rtol=1e-5)  # 20x in five re-tunings, the last one partial


@functools.partial(jax.jit, static_argnames=("growth", "noise_growth"))
def _retune_with_growing_noise(xs: jax.Array, ends: jax.Array, *, growth: float, noise_growth: float) -> jax.Array:
    """The step sizes of a warm-up whose noise grows with the step size as SVRG's does, ``v = 400 h^growth`` (its
    noisiest coordinate), tuned with ``noise_growth``."""
    state = ad.adapt_init(ad.identity(3, False, xs), 0.01, 1.0, xs[0], 0.0)

    def body(s: ad.AdaptState, t: jax.Array) -> tuple[ad.AdaptState, jax.Array]:
        term = 400.0 * s.step_size**growth * jnp.array([1.0, 0.5, 0.1])
        s, _ = ad.adapt_step(s, ad.to_u(s.preconditioner, xs[t]), xs[t], 0.0, term, True, t, ends, adapt_mass=False,
                             tune_step_size=True, target=0.1, temperature=1.0, max_step_size=0.5,
                             noise_growth=noise_growth)  # fmt: skip
        return s, s.step_size

    return jax.lax.scan(body, state, jnp.arange(xs.shape[0]))[1]


@pytest.mark.parametrize("growth", [1.0, 2.0])
def test_adapt_step_meets_the_target_when_the_noise_grows_with_the_step(growth: float) -> None:
    """SVRG's noise grows with the step size (``∝ h`` to ``h²``): tuned as if it did not, the step size overshoots
    and undershoots in turn and the warm-up ends anywhere on that cycle; with ``noise_growth=2`` (what the kernels
    give an SVRG estimator) the re-tunings converge to the target ratio for both growths."""
    xs = jax.random.normal(jax.random.key(0), (NUM_WARMUP, 3))
    ends = ad.window_ends(ad.adaptation_schedule(NUM_WARMUP), xs)

    def ratios(noise_growth: float) -> np.ndarray:
        h = np.asarray(_retune_with_growing_noise(xs, ends, growth=growth, noise_growth=noise_growth), np.float64)
        return h * 400.0 * h**growth / 2  # the noise ratio h v / (2τ) at each step's step size

    tuned = ratios(2.0)
    np.testing.assert_allclose(tuned[-1], 0.1, rtol=0.02)
    np.testing.assert_allclose(tuned[NUM_WARMUP // 2 :], 0.1, rtol=0.2)
    if growth == 2.0:  # the power: tuned as for a noise that does not grow, the ratio cycles over fiftyfold
        last_half = ratios(0.0)[NUM_WARMUP // 2 :]
        assert last_half.max() / last_half.min() > 50


@pytest.mark.parametrize("dense", [True, False])
def test_adapt_step_rescales_from_effective_draws(dense: bool) -> None:
    rng = np.random.default_rng(5)
    # coordinate 0: independent draws of variance 4 (many effective draws); 1: a slow trend (few); 2: sd 1
    draws = np.stack([2 * rng.normal(size=NUM_WARMUP), np.linspace(-3, 3, NUM_WARMUP), rng.normal(size=NUM_WARMUP)], 1)
    state, _, scales = run_adaptation(draws, np.ones((NUM_WARMUP, 3)), dense, tune=False)
    L = as_np(state.preconditioner.scale)
    scale = np.diag(L) if dense else L
    # the first slow window [300, 400) rescales u₀ by about 2 (shrunk a little, clipped to [1/3, 3]); later windows
    # see u₀ with unit variance and leave it near 2
    assert scales[300 - 2] == 1.0 and 1.6 < scales[400 - 1] < 2.2
    assert 1.7 < scale[0] < 2.3
    assert scale[1] == 1.0  # never enough effective draws: kept
    assert 0.8 < scale[2] < 1.25


def test_adapt_step_rescaling_is_continuous_in_what_it_measured() -> None:
    """A coordinate's rescaling at a window's end is a continuous function of its draws: across the effective
    draw counts where it is phased in (from 3/4 of MIN_EFFECTIVE to all of it) a small change of the draws moves
    the scale a little, never by a jump (a hard threshold would jump from 1 to the window's full rescaling)."""
    rng = np.random.default_rng(6)
    noise, trend = rng.normal(size=NUM_WARMUP), np.zeros(NUM_WARMUP)
    trend[300:400] = np.linspace(-1, 1, 100)  # across the first slow window
    scales, effective = [], []
    for a in np.linspace(0.0, 3.0, 31):  # a growing trend: fewer and fewer effective draws, a larger variance
        draws = np.stack([noise + a * trend, noise], 1)
        window = draws[300:400]  # the first slow window
        effective.append(float(ad.window_variance(moments_of(window))[1][0]))
        state, _, _ = run_adaptation(draws, np.ones((NUM_WARMUP, 2)), False, tune=False, steps=400)
        scales.append(float(state.preconditioner.scale[0]))
    effective, scales = np.array(effective), np.array(scales)
    phased = (effective > 0.75 * ad.MIN_EFFECTIVE) & (effective < ad.MIN_EFFECTIVE)
    assert phased.sum() >= 3 and effective.min() < 0.75 * ad.MIN_EFFECTIVE < ad.MIN_EFFECTIVE < effective.max()
    assert np.max(np.abs(np.diff(np.log(scales)))) < 0.1, (effective, scales)


def test_adapt_step_vmap_and_torch_agree() -> None:
    schedule = ad.adaptation_schedule(400)
    rng = np.random.default_rng(6)
    draws = (rng.normal(size=(3, 400, 3)) * np.array([2.0, 1.0, 0.5])).astype(np.float32)
    terms = rng.exponential(size=(3, 400, 3)).astype(np.float32) * 100
    xs, ts = jnp.asarray(draws), jnp.asarray(terms)
    ends = ad.window_ends(schedule, xs)
    kwargs = dict(adapt_mass=True, tune_step_size=True, target=0.1, temperature=1.0, max_step_size=0.5)

    def chain(x: jax.Array, term: jax.Array) -> ad.AdaptState:
        def body(s: ad.AdaptState, t: jax.Array) -> tuple[ad.AdaptState, None]:
            return ad.adapt_step(s, ad.to_u(s.preconditioner, x[t]), x[t], 0.0, term[t], True, t, ends, **kwargs)[0], None

        return jax.lax.scan(body, ad.adapt_init(ad.identity(3, True, x), 0.01, 1.0, x[0], 0.0), jnp.arange(400))[0]

    states = jax.jit(jax.vmap(chain))(xs, ts)
    t_ends = ad.window_ends(schedule, torch.zeros(1))
    for c in range(3):
        t_state = ad.adapt_init(ad.identity(3, True, torch.zeros(1)), 0.01, 1.0, torch.zeros(3), 0.0)
        for t in range(400):
            theta = torch.tensor(draws[c, t])
            u = ad.to_u(t_state.preconditioner, theta)
            t_state, _ = ad.adapt_step(t_state, u, theta, 0.0, torch.tensor(terms[c, t]), True, t, t_ends, **kwargs)
        np.testing.assert_allclose(as_np(t_state.preconditioner.scale), as_np(states.preconditioner.scale[c]),
                                   rtol=1e-4, atol=1e-6)  # fmt: skip
        np.testing.assert_allclose(float(t_state.step_size), float(states.step_size[c]), rtol=1e-5)
        assert int(t_state.window_index) == int(states.window_index[c]) == len(schedule)


# --- the noise's axes ---------------------------------------------------------------------------------------
def _noise_with_a_silent_plane(rng: np.random.Generator, m: int = 64) -> np.ndarray:
    """``m`` gradients in 5 coordinates whose noise is correlated and leaves a plane without any noise (as a
    hierarchical model's hyperparameters under a dense metric)."""
    mixing = rng.normal(size=(3, 5))
    return (rng.normal(size=(m, 3)) @ mixing).astype(np.float32)


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_align_noise_diagonalises_the_noise_and_keeps_the_metric(backend: str) -> None:
    rng = np.random.default_rng(7)
    grads = _noise_with_a_silent_plane(rng)
    L = np.linalg.cholesky(np.eye(5) + 0.3)  # a dense metric
    def xp_array(a: np.ndarray) -> object:
        return jnp.asarray(a, jnp.float32) if backend == "jax" else torch.tensor(a, dtype=torch.float32)

    pre = ad.Preconditioner(xp_array(L), xp_array(np.linalg.inv(L)))
    aligned = ad.align_noise(pre, xp_array(grads))
    scale, inverse = as_np(aligned.scale), as_np(aligned.inverse)
    np.testing.assert_allclose(scale @ scale.T, L @ L.T, atol=1e-4)  # the metric is unchanged
    np.testing.assert_allclose(scale @ inverse, np.eye(5), atol=1e-4)
    Q = np.linalg.inv(L) @ scale  # the rotation, orthogonal
    np.testing.assert_allclose(Q.T @ Q, np.eye(5), atol=1e-4)
    noise = np.cov(grads @ Q, rowvar=False)  # the gradients in the new coordinates: u' = Qᵀu, g' = Qᵀg
    off = noise - np.diag(np.diag(noise))
    assert np.max(np.abs(off)) < 1e-3 * np.max(np.diag(noise)), noise
    before = np.cov(grads, rowvar=False)
    assert np.max(np.abs(before - np.diag(np.diag(before)))) > 0.3 * np.max(np.diag(before))  # it was correlated


def test_align_noise_is_continuous_in_the_gradients() -> None:
    """A rounding-level change of the gradients (as between rows sharded over devices or not) leaves the axes
    where they were, also in the plane without noise, where only the tie-break decides them."""
    rng = np.random.default_rng(8)
    grads = _noise_with_a_silent_plane(rng)
    nudged = grads * (1 + 1e-6 * rng.normal(size=grads.shape)).astype(np.float32)
    pre = ad.identity(5, dense=True, like=jnp.zeros(5, jnp.float32))
    first, second = (as_np(ad.align_noise(pre, jnp.asarray(g)).scale) for g in (grads, nudged))
    np.testing.assert_allclose(first, second, atol=1e-3)  # the signs too (``_eigh``)


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_the_coordinates_do_not_depend_on_the_signs_eigh_returns(backend: str, monkeypatch) -> None:
    """LAPACK and cuSOLVER may return an eigenvector with either sign: the Laplace and noise-aligned coordinates
    (hence a chain's draws) must not follow it, or a seed gives another chain on the GPU."""
    from array_api_compat import array_namespace

    rng = np.random.default_rng(9)
    grads = _noise_with_a_silent_plane(rng)
    H = np.linalg.inv(COV3)
    arr = (lambda a: jnp.asarray(a, jnp.float32)) if backend == "jax" else (lambda a: torch.tensor(a, dtype=torch.float32))

    def coordinates() -> list[np.ndarray]:
        laplace = ad.from_hessian(arr(H), dense=True)[0]
        aligned = ad.align_noise(ad.Preconditioner(arr(np.eye(5)), arr(np.eye(5))), arr(grads))
        return [as_np(part) for pre in (laplace, aligned) for part in pre]

    before = coordinates()
    linalg = array_namespace(arr(H)).linalg
    eigh = linalg.eigh

    def flipped(A):
        values, vectors = eigh(A)
        signs = arr(np.where(np.arange(vectors.shape[1]) % 2 == 0, -1.0, 1.0))
        return values, vectors * signs[None, :]

    monkeypatch.setattr(linalg, "eigh", flipped)
    after = coordinates()
    assert not np.allclose(as_np(flipped(arr(H))[1]), as_np(eigh(arr(H))[1]))  # the patch flips
    for a, b in zip(before, after):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_align_noise_needs_a_dense_preconditioner() -> None:
    with pytest.raises(ValueError, match="dense preconditioner"):
        ad.align_noise(ad.identity(2, dense=False, like=jnp.zeros(2)), jnp.ones((8, 2)))
