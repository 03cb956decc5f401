"""Tests of :mod:`ppl_sgmcmc.adaptation`: Stan's windowed mass-matrix adaptation, backend-neutral.

* the schedule against NumPyro's ``build_adaptation_schedule`` (exactly, inclusive ends converted);
* Welford's estimator against NumPy's ``var`` / ``cov`` (``ddof=1``) and NumPyro's ``welford_covariance``,
  on ``jax.numpy`` and ``torch``, under ``jax.jit`` and ``jax.vmap``;
* the change of variables ``θ = L u``: round trips, the pulled-back gradient against autodiff of
  ``U(L u)`` (JAX and torch), and SGLD in ``u`` on a Gaussian of condition number 10⁴ with a step size
  2.5·10² times SGLD's stability limit in ``θ`` (moments within Monte Carlo error, with the predicted
  discretisation bias as the documented allowance);
* :func:`adapt_step` over a 1000-step warm-up of exact Gaussian draws: the final preconditioner is the
  regularised covariance of the last slow window (exactly) and matches the true covariance within that
  window's Monte Carlo error; it is frozen after warm-up.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from numpyro.infer.hmc_util import build_adaptation_schedule
from numpyro.infer.hmc_util import welford_covariance as numpyro_welford

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


def gaussian_samples(n: int, cov: np.ndarray, seed: int, mean: np.ndarray | None = None) -> np.ndarray:
    rng = np.random.default_rng(seed)
    draws = rng.normal(size=(n, cov.shape[0])) @ np.linalg.cholesky(cov).T
    return draws + (0.0 if mean is None else mean)


COV3 = np.array([[4.0, 1.2, -0.6], [1.2, 1.0, 0.3], [-0.6, 0.3, 0.5]])


# --- the schedule ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("num_steps", [150, 151, 174, 175, 200, 299, 1000, 5000])
def test_schedule_matches_numpyro(num_steps: int) -> None:
    ours = ad.adaptation_schedule(num_steps)
    theirs = [(int(w.start), int(w.end) + 1) for w in build_adaptation_schedule(num_steps)]  # inclusive end
    assert ours == theirs


def test_schedule_matches_numpyro_on_every_length() -> None:
    for num_steps in range(150, 3000):
        theirs = [(int(w.start), int(w.end) + 1) for w in build_adaptation_schedule(num_steps)]
        assert ad.adaptation_schedule(num_steps) == theirs, num_steps


@pytest.mark.parametrize("num_steps,buffers", [(1000, (75, 50, 25)), (417, (10, 20, 7)), (64, (0, 0, 8))])
def test_schedule_structure(num_steps: int, buffers: tuple[int, int, int]) -> None:
    init_buffer, term_buffer, base_window = buffers
    windows = ad.adaptation_schedule(num_steps, init_buffer, term_buffer, base_window)
    assert windows[0] == (0, init_buffer) and windows[-1] == (num_steps - term_buffer, num_steps)
    assert all(a[1] == b[0] for a, b in zip(windows, windows[1:]))  # contiguous
    sizes = [end - start for start, end in windows[1:-1]]
    assert len(sizes) >= 1 and sizes[0] >= base_window
    assert all(b == 2 * a for a, b in zip(sizes[:-2], sizes[1:-1]))  # doubling, but for the stretched last
    assert sizes[-1] >= (sizes[-2] * 2 if len(sizes) > 1 else base_window)


def test_schedule_too_short() -> None:
    assert ad.minimum_warmup_steps() == 150
    assert ad.minimum_warmup_steps(init_buffer=10, term_buffer=5, base_window=5) == 20
    assert ad.adaptation_schedule(150) == [(0, 75), (75, 100), (100, 150)]
    with pytest.raises(ValueError, match=r"at least 150 warm-up steps .*got 149; .*adapt_mass=False"):
        ad.adaptation_schedule(149)
    with pytest.raises(ValueError, match="at least 20 warm-up steps"):
        ad.adaptation_schedule(19, init_buffer=10, term_buffer=5, base_window=5)
    with pytest.raises(ValueError, match="base_window"):
        ad.adaptation_schedule(1000, base_window=0)


def test_window_ends() -> None:
    schedule = ad.adaptation_schedule(1000)
    expected = [75, 100, 150, 250, 450, 950, 1000]
    assert ad.window_ends(schedule, jnp.zeros(1)).tolist() == expected
    ends = ad.window_ends(schedule, torch.zeros(1, dtype=torch.float64))
    assert ends.tolist() == expected and ends.dtype == torch.int32


# --- Welford ---------------------------------------------------------------------------------------------
def run_welford(xs: object, dense: bool) -> ad.WelfordState:
    state = ad.welford_init(xs.shape[1], dense, xs)  # type: ignore[attr-defined]
    for x in xs:  # type: ignore[attr-defined]
        state = ad.welford_update(state, x)
    return state


@pytest.mark.parametrize("dense", [False, True])
def test_welford_equals_numpy(dense: bool) -> None:
    draws = gaussian_samples(60, COV3, seed=1, mean=np.array([10.0, -3.0, 0.5]))
    expected = np.cov(draws.T, ddof=1) if dense else np.var(draws, axis=0, ddof=1)
    t_state = run_welford(torch.tensor(draws), dense)  # float64
    np.testing.assert_allclose(as_np(ad.welford_covariance(t_state, regularize=False)), expected, rtol=1e-12)
    np.testing.assert_allclose(as_np(t_state.mean), draws.mean(0), rtol=1e-12)
    assert int(t_state.count) == 60
    j_state = run_welford(jnp.asarray(draws, jnp.float32), dense)  # float32
    np.testing.assert_allclose(as_np(ad.welford_covariance(j_state, regularize=False)), expected, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("dense", [False, True])
def test_welford_regularisation_and_numpyro(dense: bool) -> None:
    draws = gaussian_samples(40, COV3, seed=2)
    n = 40
    cov = np.cov(draws.T, ddof=1) if dense else np.var(draws, axis=0, ddof=1)
    eye = np.eye(3) if dense else np.ones(3)
    expected = n / (n + 5) * cov + 1e-3 * 5 / (n + 5) * eye  # Stan's shrinkage
    state = run_welford(torch.tensor(draws), dense)
    np.testing.assert_allclose(as_np(ad.welford_covariance(state)), expected, rtol=1e-12)
    # NumPyro's estimator, same regularisation
    init_fn, update_fn, final_fn = numpyro_welford(diagonal=not dense)
    np_state = init_fn(3)
    for x in jnp.asarray(draws, jnp.float32):
        np_state = update_fn(x, np_state)
    ours = ad.welford_covariance(run_welford(jnp.asarray(draws, jnp.float32), dense))
    np.testing.assert_allclose(as_np(ours), as_np(final_fn(np_state, regularize=True)[0]), rtol=1e-5, atol=1e-7)


def test_welford_few_samples_is_finite() -> None:
    for n in (0, 1):
        state = run_welford(jnp.ones((n, 2)), dense=True)
        expected = 1e-3 * 5 / (n + 5) * np.eye(2)
        np.testing.assert_allclose(as_np(ad.welford_covariance(state)), expected, rtol=1e-6)


@pytest.mark.parametrize("dense", [False, True])
def test_welford_jax_torch_same_numbers(dense: bool) -> None:
    draws = gaussian_samples(30, COV3, seed=3).astype(np.float32)
    j = run_welford(jnp.asarray(draws), dense)
    t = run_welford(torch.tensor(draws), dense)
    for a, b in zip(j, t):
        np.testing.assert_allclose(as_np(a), as_np(b), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(as_np(ad.welford_covariance(j)), as_np(ad.welford_covariance(t)), rtol=1e-5)


@pytest.mark.parametrize("dense", [False, True])
def test_welford_jit_and_vmap(dense: bool) -> None:
    chains = np.stack([gaussian_samples(50, COV3, seed=10 + c) for c in range(4)]).astype(np.float32)
    xs = jnp.asarray(chains)  # (chains, samples, d)

    @jax.jit
    def estimate(xs: jax.Array) -> jax.Array:
        def one_chain(x: jax.Array) -> jax.Array:
            state = ad.welford_init(3, dense, x)
            state, _ = jax.lax.scan(lambda s, xi: (ad.welford_update(s, xi), None), state, x)
            return ad.welford_covariance(state, regularize=False)

        return jax.vmap(one_chain)(xs)

    covs = estimate(xs)
    for c in range(4):
        expected = np.cov(chains[c].T, ddof=1) if dense else np.var(chains[c], axis=0, ddof=1)
        np.testing.assert_allclose(as_np(covs[c]), expected, rtol=2e-5, atol=2e-6)


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


# --- adapt_step ----------------------------------------------------------------------------------------------
NUM_WARMUP = 1000
LAST_WINDOW = (450, 950)


def run_adaptation(draws: np.ndarray, dense: bool) -> tuple[ad.AdaptState, list[int]]:
    xs = jnp.asarray(draws, jnp.float32)
    ends = ad.window_ends(ad.adaptation_schedule(NUM_WARMUP), xs)

    @jax.jit
    def scan(state: ad.AdaptState) -> tuple[ad.AdaptState, jax.Array]:
        def body(s: ad.AdaptState, t: jax.Array) -> tuple[ad.AdaptState, jax.Array]:
            s = ad.adapt_step(s, xs[t], t, ends, dense)
            return s, s.window_index

        return jax.lax.scan(body, state, jnp.arange(NUM_WARMUP))

    state, window_index = scan(ad.adapt_init(draws.shape[1], dense, xs))
    return state, np.asarray(window_index).tolist()


@pytest.mark.parametrize("dense", [True, False])
def test_adapt_step_estimates_covariance(dense: bool) -> None:
    draws = gaussian_samples(NUM_WARMUP, COV3, seed=7)
    state, window_index = run_adaptation(draws, dense)
    # window_index steps up at the last step of each slow window
    changes = [t for t in range(1, NUM_WARMUP) if window_index[t] != window_index[t - 1]]
    assert window_index[0] == 0 and changes == [99, 149, 249, 449, 949] and window_index[-1] == 5
    # exactly the regularised covariance of the last slow window's draws
    window = draws[LAST_WINDOW[0] : LAST_WINDOW[1]]
    n = len(window)
    sample = np.cov(window.T, ddof=1) if dense else np.var(window, axis=0, ddof=1)
    eye = np.eye(3) if dense else np.ones(3)
    L = as_np(state.preconditioner.scale)
    estimate = L @ L.T if dense else L * L
    np.testing.assert_allclose(estimate, n / (n + 5) * sample + 1e-3 * 5 / (n + 5) * eye, rtol=1e-4, atol=1e-6)
    # ... and the true covariance within the Monte Carlo error of n = 500 iid draws: E = (n/(n+5)) Σ + shrinkage,
    # sd of a sample covariance entry: sqrt((Σ_ii Σ_jj + Σ_ij²) / (n - 1))
    var = np.diag(COV3)
    target = n / (n + 5) * (COV3 if dense else var) + 1e-3 * 5 / (n + 5) * eye
    sd = np.sqrt((np.outer(var, var) + COV3**2) / (n - 1)) if dense else np.sqrt(2 * var**2 / (n - 1))
    assert_mc_close("adapted covariance", estimate, target, n / (n + 5) * sd)
    # the estimator restarted after the last window; nothing entered it in the terminal buffer
    assert int(state.welford.count) == 0


@pytest.mark.parametrize("dense", [True, False])
def test_adapt_step_frozen_after_warmup_and_in_buffers(dense: bool) -> None:
    draws = gaussian_samples(NUM_WARMUP, COV3, seed=8)
    state, _ = run_adaptation(draws, dense)
    ends = ad.window_ends(ad.adaptation_schedule(NUM_WARMUP), jnp.zeros(1))
    step = jax.jit(ad.adapt_step, static_argnames="dense")
    for t in (NUM_WARMUP, NUM_WARMUP + 1, 5 * NUM_WARMUP):
        after = step(state, jnp.asarray([100.0, -50.0, 3.0]), t, ends, dense=dense)
        for a, b in zip(jax.tree.leaves(after), jax.tree.leaves(state)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # the initial buffer: nothing changes either
    fresh = ad.adapt_init(3, dense, jnp.zeros(1))
    for t in (0, 74):
        after = step(fresh, jnp.ones(3), t, ends, dense=dense)
        for a, b in zip(jax.tree.leaves(after), jax.tree.leaves(fresh)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    after = step(fresh, jnp.ones(3), 75, ends, dense=dense)  # the first slow window's first step
    assert int(after.welford.count) == 1


def test_adapt_step_vmap_and_torch_agree() -> None:
    schedule = ad.adaptation_schedule(200)  # slow windows [75, 100), [100, 150)
    draws = np.stack([gaussian_samples(200, COV3, seed=20 + c) for c in range(3)]).astype(np.float32)
    xs = jnp.asarray(draws)
    ends = ad.window_ends(schedule, xs)

    def chain(x: jax.Array) -> ad.AdaptState:
        body = lambda s, t: (ad.adapt_step(s, x[t], t, ends, True), None)  # noqa: E731
        return jax.lax.scan(body, ad.adapt_init(3, True, x), jnp.arange(200))[0]

    states = jax.jit(jax.vmap(chain))(xs)
    t_ends = ad.window_ends(schedule, torch.zeros(1))
    for c in range(3):
        t_state = ad.adapt_init(3, True, torch.zeros(1))
        for t in range(200):
            t_state = ad.adapt_step(t_state, torch.tensor(draws[c, t]), t, t_ends, True)
        np.testing.assert_allclose(as_np(t_state.preconditioner.scale), as_np(states.preconditioner.scale[c]),
                                   rtol=1e-4, atol=1e-6)  # fmt: skip
        assert int(t_state.window_index) == int(states.window_index[c]) == 2
        window = draws[c, 100:150].astype(np.float64)
        n = 50
        expected = n / (n + 5) * np.cov(window.T) + 1e-3 * 5 / (n + 5) * np.eye(3)
        L = as_np(t_state.preconditioner.scale)
        np.testing.assert_allclose(L @ L.T, expected, rtol=1e-4, atol=1e-6)


def test_adapt_step_keeps_preconditioner_when_estimate_not_positive_definite() -> None:
    ends = ad.window_ends(ad.adaptation_schedule(150), torch.zeros(1))
    state = ad.adapt_init(2, True, torch.zeros(1))
    broken = ad.WelfordState(torch.tensor(24, dtype=torch.int32), torch.zeros(2), -torch.ones(2, 2) * 100)
    after = ad.adapt_step(state._replace(welford=broken), torch.zeros(2), 99, ends, True)  # the window's last step
    np.testing.assert_array_equal(as_np(after.preconditioner.scale), np.eye(2))
    assert int(after.window_index) == 1 and int(after.welford.count) == 0


def test_adapt_step_dense_mismatch() -> None:
    ends = ad.window_ends(ad.adaptation_schedule(150), jnp.zeros(1))
    with pytest.raises(ValueError, match="dense=False"):
        ad.adapt_step(ad.adapt_init(2, True, jnp.zeros(1)), jnp.zeros(2), 80, ends, dense=False)
