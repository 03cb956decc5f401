"""Unit tests of the SGFS update rule (``ppl_sgmcmc.rules.sgfs``, Algorithm 1 of Ahn, Korattikara &
Welling 2012, restated in ALGORITHMS.md).

The rule is checked against an independent float64 NumPy restatement (general solves, no Cholesky
tricks), run on NumPy, ``jax.numpy`` and ``torch`` inputs (the two float32 backends must agree along a
trajectory), and in its two limits: ``α = 0`` (``ε = ∞``) is noise-free stochastic Fisher scoring, and
as ``ε → 0`` a step approaches SGLD preconditioned by ``B⁻¹`` at rate ``O(ε)``.
"""

import math

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from array_api_compat import array_namespace

from ppl_sgmcmc import rules
from ppl_sgmcmc.algorithms import call_kwargs
from ppl_sgmcmc.rules import StochasticGradient, sgfs

# --- a fixed minibatch of n per-datum log-likelihoods, position dependent and non-linear -----------------
# ℓ_i(x) = -½ Σ_k a_ik (x_k - m_ik)² - Σ_k x_k⁴/40, prior N(0, I), data size N: g_i = ∇ℓ_i,
# Ũ(x) = ½|x|² - (N/n) Σ_i ℓ_i(x).
N_DATA, N_BATCH, DIM = 500, 8, 3
_rng = np.random.default_rng(0)
A_COEF = _rng.uniform(0.5, 2.0, size=(N_BATCH, DIM))
M_COEF = _rng.normal(size=(N_BATCH, DIM))
X0 = np.array([0.7, -1.2, 0.4])
B_VECTOR = np.array([0.5, 2.0, 1.0])
_L = np.array([[1.0, 0, 0], [0.4, 0.8, 0], [-0.3, 0.2, 1.1]])
B_MATRIX = _L @ _L.T


def scores_np(x):
    return -A_COEF * (x - M_COEF) - x**3 / 10


def force_np(x):
    """``∇ log p(x) + N ḡ = -∇Ũ``."""
    return -x + N_DATA * scores_np(x).mean(0)


def make_grad_fn(x_like, calls=None):
    """``grad_fn`` in the namespace and dtype of ``x_like``, returning ``per_example``."""
    xp = array_namespace(x_like)
    a, m = (xp.asarray(v, dtype=x_like.dtype) for v in (A_COEF, M_COEF))

    def grad_fn(x):
        if calls is not None:
            calls.append(x)
        per_example = -a * (x - m) - x * x * x / 10
        loglik = -0.5 * a * (x - m) ** 2 - x**4 / 40
        energy = 0.5 * xp.sum(x * x) - N_DATA / N_BATCH * xp.sum(loglik)
        grad = x - N_DATA / N_BATCH * xp.sum(per_example, axis=0)
        return StochasticGradient(energy, grad, xp.mean(per_example, axis=0), per_example)

    return grad_fn


# --- Algorithm 1 restated in NumPy ------------------------------------------------------------------------
def ref_step(
    x, fisher_prev, count_prev, t_prev, zeta, eps, fisher="full", B="fisher", ridge=0.0, num_warmup=0, window=None
):
    """One step of Algorithm 1: returns ``(x, Î, count, t)``."""
    G = scores_np(x)
    n = G.shape[0]
    full = fisher == "full"
    V = np.cov(G.T, ddof=1) if full else G.var(0, ddof=1)
    t, count = t_prev + 1, count_prev + 1
    if window is not None and t <= num_warmup:
        count = min(count, window)
    kappa = 1 / count
    I_hat = (1 - kappa) * fisher_prev + kappa * V
    gamma = (n + N_DATA) / n
    F = I_hat + ridge * np.diag(np.diag(I_hat)) if full else I_hat * (1 + ridge)
    if not full:
        F = np.diag(F)
    if isinstance(B, str):
        Bm = gamma * N_DATA * F if B == "fisher" else np.eye(DIM)
    else:
        Bm = np.diag(np.broadcast_to(B, (DIM,))) if np.ndim(B) < 2 else B
    inv_eps = 4 / eps
    P = gamma * N_DATA * F + inv_eps * Bm
    eta = math.sqrt(inv_eps) * np.linalg.cholesky(Bm) @ zeta
    return x + 2 * np.linalg.solve(P, force_np(x) + eta), I_hat, count, t


def ref_trajectory(zetas, eps, **hyper):
    x, I_hat, count, t = X0, np.zeros((DIM, DIM) if hyper.get("fisher", "full") == "full" else DIM), 0, 0
    out = []
    for zeta in zetas:
        x, I_hat, count, t = ref_step(x, I_hat, count, t, zeta, eps, **hyper)
        out.append((x, I_hat, count, t))
    return out


def rule_trajectory(zetas, eps, to_array, **hyper):
    x = to_array(X0)
    state = sgfs.init(x, None, **call_kwargs(sgfs.init, hyper))
    grad_fn = make_grad_fn(x)
    out = []
    for zeta in zetas:
        x, state, _ = sgfs.step(x, state, grad_fn, to_array(zeta), eps, data_size=N_DATA, **hyper)
        out.append((x, *state))
    return out


def noise(num_steps, seed=0):
    return np.random.default_rng(seed).normal(size=(num_steps, DIM))


def as_np(a):
    return a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else np.asarray(a)


CASES = {
    "full-fisher": dict(eps=4.0),
    "full-fisher-alpha0": dict(eps=math.inf),
    "full-identity": dict(eps=0.01, B="identity"),
    "full-scalar": dict(eps=0.003, B=np.array(2.0)),
    "full-vector": dict(eps=0.01, B=B_VECTOR),
    "full-matrix": dict(eps=0.01, B=B_MATRIX),
    "full-ridge-window": dict(eps=4.0, ridge=0.05, num_warmup=6, window=3),
    "diagonal-fisher": dict(eps=4.0, fisher="diagonal"),
    "diagonal-fisher-alpha0": dict(eps=math.inf, fisher="diagonal"),
    "diagonal-vector": dict(eps=0.01, fisher="diagonal", B=B_VECTOR),
    "diagonal-ridge-window": dict(eps=0.01, fisher="diagonal", B="identity", ridge=0.1, num_warmup=6, window=2),
}


def _hyper(case):
    hyper = dict(CASES[case])
    eps = hyper.pop("eps")
    if "window" in hyper:
        hyper["fisher_window"] = hyper.pop("window")
    return eps, hyper


def _ref_hyper(case):
    hyper = dict(CASES[case])
    hyper.pop("eps")
    return hyper


@pytest.mark.parametrize("case", list(CASES))
def test_trajectory_matches_reference_float64(case):
    """12 steps on float64 NumPy arrays follow the restatement to rounding error (the Fisher
    average, ``count``, ``t`` and the position)."""
    eps, hyper = _hyper(case)
    zetas = noise(12, seed=1)
    ref = ref_trajectory(zetas, eps, **_ref_hyper(case))
    got = rule_trajectory(zetas, eps, np.asarray, **hyper)
    for step, ((x, I_hat, count, t), (x_r, I_r, count_r, t_r)) in enumerate(zip(got, ref)):
        np.testing.assert_allclose(x, x_r, rtol=1e-10, atol=1e-12, err_msg=f"{case}: step {step}")
        np.testing.assert_allclose(I_hat, I_r, rtol=1e-10, atol=1e-12, err_msg=f"{case}: step {step}")
        assert (int(count), int(t)) == (count_r, t_r)
    assert np.abs(got[-1][0] - X0).max() > 0.1  # the chain moved


def test_fisher_average_schedule():
    """``κ_t = 1/t`` makes ``Î_t`` the plain mean of the minibatch Fisher matrices seen so far; the
    warm-up window caps the count during warm-up only, then counting resumes from it."""
    zetas = noise(10, seed=2)
    traj = rule_trajectory(zetas, 0.01, np.asarray)
    xs = [X0] + [row[0] for row in traj[:-1]]
    mean_V = np.mean([np.cov(scores_np(x).T, ddof=1) for x in xs], axis=0)
    np.testing.assert_allclose(traj[-1][1], mean_V, rtol=1e-10)
    assert [int(row[2]) for row in traj] == list(range(1, 11))
    windowed = rule_trajectory(zetas, 0.01, np.asarray, num_warmup=6, fisher_window=3)
    assert [int(row[2]) for row in windowed] == [1, 2, 3, 3, 3, 3, 4, 5, 6, 7]
    assert [int(row[3]) for row in windowed] == list(range(1, 11))
    # without warm-up the window has no effect: exactly the paper's schedule
    no_warmup = rule_trajectory(zetas, 0.01, np.asarray, num_warmup=0, fisher_window=3)
    np.testing.assert_array_equal(no_warmup[-1][1], traj[-1][1])


def test_one_gradient_per_step_at_the_current_point():
    calls = []
    x = jnp.asarray(X0, jnp.float32)
    state = sgfs.init(x, None)
    sgfs.step(x, state, make_grad_fn(x, calls), jnp.asarray(noise(1)[0], jnp.float32), 0.01, data_size=N_DATA)
    assert len(calls) == 1
    np.testing.assert_allclose(np.asarray(calls[0]), X0, rtol=1e-7)


@pytest.mark.parametrize("fisher", ["full", "diagonal"])
def test_alpha_zero_is_noise_free_fisher_scoring(fisher):
    """``ε = ∞`` (``α = 0``): no injected noise; ``θ ← θ + 2 (γ N Î)⁻¹ (∇ log p + N ḡ)`` whatever ``B``."""
    x = X0
    G = scores_np(x)
    V = np.cov(G.T, ddof=1) if fisher == "full" else np.diag(G.var(0, ddof=1))
    gamma_n = (N_BATCH + N_DATA) / N_BATCH * N_DATA
    expected = x + 2 * np.linalg.solve(gamma_n * V, force_np(x))
    for B in ("fisher", "identity", B_VECTOR):
        for zeta in noise(2, seed=3):
            state = sgfs.init(x, None, fisher=fisher, B=B)
            new, _, _ = sgfs.step(x, state, make_grad_fn(x), zeta, math.inf, data_size=N_DATA, fisher=fisher, B=B)
            np.testing.assert_allclose(new, expected, rtol=1e-12)


@pytest.mark.parametrize(
    "fisher, B",
    [("full", "fisher"), ("full", "identity"), ("full", B_MATRIX), ("diagonal", "fisher"), ("diagonal", B_VECTOR)],
    ids=["full-fisher", "full-identity", "full-matrix", "diagonal-fisher", "diagonal-vector"],
)
def test_small_step_is_preconditioned_sgld(fisher, B):
    """As ``ε → 0`` one step tends to SGLD preconditioned by ``C = B⁻¹`` with step size ``ε``:
    ``θ + (ε/2) C (∇ log p + N ḡ) + sqrt(ε) L_B⁻ᵀ ζ`` (noise covariance ``ε C``), with relative error
    ``O(ε γ N Î / B)``: checked separately for the drift (``ζ = 0``) and the noise part, whose
    relative errors must fall by 100× when ``ε`` does."""
    x, zeta = X0, noise(1, seed=4)[0]
    G = scores_np(x)
    gamma_n = (N_BATCH + N_DATA) / N_BATCH * N_DATA
    V = np.cov(G.T, ddof=1) if fisher == "full" else np.diag(G.var(0, ddof=1))
    if isinstance(B, str):
        Bm = gamma_n * V if B == "fisher" else np.eye(DIM)
    else:
        Bm = B if np.ndim(B) == 2 else np.diag(B)
    L = np.linalg.cholesky(Bm)
    scale = np.linalg.norm(gamma_n * V, 2) / np.linalg.norm(Bm, 2)  # the error is about ε·scale/4
    state = sgfs.init(x, None, fisher=fisher, B=B)
    errors = []
    for eps in np.array([1e-2, 1e-4, 1e-6]) / scale:
        hyper = dict(data_size=N_DATA, fisher=fisher, B=B)
        drift, _, _ = sgfs.step(x, state, make_grad_fn(x), np.zeros(DIM), eps, **hyper)
        full_step, _, _ = sgfs.step(x, state, make_grad_fn(x), zeta, eps, **hyper)
        drift_ref = eps / 2 * np.linalg.solve(Bm, force_np(x))
        noise_ref = math.sqrt(eps) * np.linalg.solve(L.T, zeta)
        drift_err = np.linalg.norm(drift - x - drift_ref) / np.linalg.norm(drift_ref)
        noise_err = np.linalg.norm(full_step - drift - noise_ref) / np.linalg.norm(noise_ref)
        errors.append((drift_err, noise_err))
    errors = np.array(errors)
    assert np.all(errors[-1] < 1e-5), errors
    ratios = errors[:-1] / errors[1:]
    assert np.all((ratios > 50) & (ratios < 200)), (errors, ratios)


# --- the same rule on jax.numpy and on torch (float32) -------------------------------------------------------
@pytest.mark.parametrize("case", list(CASES))
def test_jax_and_torch_trajectories_agree(case):
    eps, hyper = _hyper(case)
    zetas = noise(30, seed=5).astype(np.float32)
    f32 = lambda a: np.asarray(a, np.float32)  # noqa: E731
    if "B" in hyper and not isinstance(hyper["B"], str):
        hyper["B"] = f32(hyper["B"])
    traj_jax = rule_trajectory(zetas, eps, lambda a: jnp.asarray(f32(a)), **hyper)
    traj_torch = rule_trajectory(zetas, eps, lambda a: torch.from_numpy(f32(a)), **hyper)
    for step, (row_jax, row_torch) in enumerate(zip(traj_jax, traj_torch)):
        for a_jax, a_torch in zip(row_jax, row_torch):
            assert isinstance(a_torch, torch.Tensor), f"{case}: torch inputs gave {type(a_torch).__name__}"
            np.testing.assert_allclose(
                as_np(a_torch), as_np(a_jax), rtol=2e-5, atol=2e-6, err_msg=f"{case}: step {step}"
            )
        assert row_jax[0].dtype == jnp.float32 and row_torch[0].dtype == torch.float32
        assert row_jax[1].dtype == jnp.float32 and row_torch[1].dtype == torch.float32
    # and both follow the float64 restatement
    ref = ref_trajectory(zetas.astype(np.float64), eps, **_ref_hyper(case))
    for (x, I_hat, *_), (x_r, I_r, *_) in zip(traj_jax, ref):
        np.testing.assert_allclose(as_np(x), x_r, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(as_np(I_hat), I_r, rtol=1e-4, atol=1e-5)
    assert np.abs(as_np(traj_jax[-1][0]) - X0).max() > 0.1


# --- the state and its declared needs ----------------------------------------------------------------------
def test_initial_state_and_declaration():
    state = sgfs.init(jnp.zeros(3), None)
    assert state.fisher.shape == (3, 3) and state.fisher.dtype == jnp.float32
    assert int(state.count) == 0 and int(state.t) == 0
    assert sgfs.init(torch.zeros(3, dtype=torch.float64), None, fisher="diagonal").fisher.dtype == torch.float64
    assert sgfs.init(jnp.zeros(3), None, fisher="diagonal").fisher.shape == (3,)
    assert sgfs.NEEDS == "per_example"
    for name in ("sgld", "psgld", "sghmc", "sgnht"):
        assert getattr(rules, name).NEEDS != "per_example"
    assert rules.StochasticGradient(1.0, 2.0, 3.0).per_example is None


def test_alpha_to_step_size():
    assert sgfs.alpha_to_step_size(0) == math.inf
    assert sgfs.alpha_to_step_size(4.0) == 0.25  # α = 2/sqrt(ε)


@pytest.mark.parametrize(
    "hyper, match",
    [
        (dict(fisher="block"), "unknown fisher"),
        (dict(B="eye"), "unknown B"),
        (dict(B=np.ones(4)), "does not fit the 3 parameters"),
        (dict(B=np.eye(2)), "does not fit the 3 parameters"),
        (dict(B=np.eye(3), fisher="diagonal"), "needs a diagonal B"),
        (dict(max_full_dim=2), "fisher='diagonal'"),
    ],
)
def test_configuration_errors(hyper, match):
    with pytest.raises(sgfs.SGFSConfigError, match=match):
        sgfs.init(jnp.zeros(3), None, **call_kwargs(sgfs.init, hyper))


def test_too_large_full_fisher_raises_before_allocating():
    # d = 10⁶ would need 4 TB for the d×d state: the check comes first
    with pytest.raises(sgfs.SGFSConfigError, match="diagonal"):
        sgfs.init(np.zeros(1_000_000, np.float32), None)
    assert sgfs.init(np.zeros(1_000_000, np.float32), None, fisher="diagonal").fisher.shape == (1_000_000,)


def test_missing_per_example_scores():
    x = jnp.zeros(3)
    grad_fn = lambda x: StochasticGradient(0.0, x, -x)  # noqa: E731
    with pytest.raises(ValueError, match="per_example"):
        sgfs.step(x, sgfs.init(x, None), grad_fn, x, 0.1)
