"""Unit tests of the pure update rules in ``ppl_sgmcmc.rules``.

Each rule is checked on hand-computable steps against the equations of ``ALGORITHMS.md``, written out
again below in plain NumPy (float64) independently of the library, and then run on ``jax.numpy`` and
``torch`` inputs over a short trajectory with a fixed gradient function and a fixed noise sequence:
the two backends must agree to float32 precision.
"""

import math

import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
import torch

from ppl_sgmcmc.algorithms import call_kwargs
from ppl_sgmcmc.rules import StochasticGradient, psgld, sghmc, sgld, sgnht

# --- a fixed, position-dependent stochastic gradient ------------------------------------------------
# U(x) = Σ a x²/2 + x⁴/16 + c x; the "score" (mean per-datum log-likelihood gradient, used by pSGLD)
# is set to a different function on purpose, so that a rule that read ``grad`` instead would fail.
A_COEF = np.array([1.5, 0.5, 2.0])
C_COEF = np.array([0.3, -0.2, 0.1])


def gradient_np(x):
    return A_COEF * x + x**3 / 4 + C_COEF


def score_np(x):
    return -0.5 * gradient_np(x) + 0.1


def make_grad_fn(x_like, calls=None):
    """``grad_fn`` in the namespace of ``x_like`` (NumPy, JAX or torch), counting its calls."""
    if isinstance(x_like, torch.Tensor):
        a, c = (torch.tensor(v, dtype=x_like.dtype) for v in (A_COEF, C_COEF))
    elif isinstance(x_like, jnp.ndarray):
        a, c = (jnp.asarray(v, dtype=x_like.dtype) for v in (A_COEF, C_COEF))
    else:
        a, c = A_COEF, C_COEF

    def grad_fn(x):
        if calls is not None:
            calls.append(x)
        grad = a * x + x * x * x / 4 + c
        energy = (a * x * x / 2 + x * x * x * x / 16 + c * x).sum()
        return StochasticGradient(energy, grad, -0.5 * grad + 0.1)

    return grad_fn


X0 = np.array([0.7, -1.2, 0.4])
P0 = np.array([0.5, 1.1, -0.8])


def noise_sequence(num_steps, seed=0):
    return np.random.default_rng(seed).normal(size=(num_steps, X0.size))


# --- the rules of ALGORITHMS.md, restated in NumPy ---------------------------------------------------
def ref_sgld(x, zeta, h, tau=1.0):
    return x - h * gradient_np(x) + math.sqrt(2 * h * tau) * zeta


def ref_sghmc_euler(x, p, zeta, h, A, tau=1.0):
    x = x + h * p
    p = p - h * gradient_np(x) - h * A * p + np.sqrt(2 * A * h * tau) * zeta
    return x, p


def ref_sghmc_splitting(x, p, zeta, h, A, tau=1.0):
    x = x + h / 2 * p
    p = np.exp(-A * h / 2) * p
    p = p - h * gradient_np(x) + np.sqrt(2 * A * h * tau) * zeta
    p = np.exp(-A * h / 2) * p
    x = x + h / 2 * p
    return x, p


def _excess(p, thermostat, tau):
    if thermostat == "matrix":
        return np.outer(p, p) - tau * np.eye(p.size)
    return (p * p if thermostat == "multivariate" else np.mean(p * p)) - tau


def _friction(xi, p):
    return xi @ p if np.ndim(xi) == 2 else xi * p


def _damp(xi, p, t):
    return scipy.linalg.expm(-xi * t) @ p if np.ndim(xi) == 2 else np.exp(-xi * t) * p


def ref_sgnht_euler(x, p, xi, zeta, h, D, thermostat="multivariate", tau=1.0):
    x_new = x + h * p
    p_new = p - h * gradient_np(x_new) - h * _friction(xi, p) + math.sqrt(2 * D * h * tau) * zeta
    xi_new = xi + h * _excess(p_new, thermostat, tau)
    return x_new, p_new, xi_new


def ref_sgnht_splitting(x, p, xi, zeta, h, D, thermostat="multivariate", tau=1.0):
    x = x + h / 2 * p
    xi = xi + h / 2 * _excess(p, thermostat, tau)
    p = _damp(xi, p, h / 2)
    p = p - h * gradient_np(x) + math.sqrt(2 * D * h * tau) * zeta
    p = _damp(xi, p, h / 2)
    x = x + h / 2 * p
    xi = xi + h / 2 * _excess(p, thermostat, tau)
    return x, p, xi


def ref_psgld(x, V, zeta, h, alpha, lam, tau=1.0):
    g_bar = score_np(x)
    V = alpha * V + (1 - alpha) * g_bar * g_bar
    G = 1 / (lam + np.sqrt(V))
    x = x - h * G * gradient_np(x) + np.sqrt(2 * h * tau * G) * zeta
    return x, V


def f32(*arrays):
    return tuple(jnp.asarray(a, dtype=jnp.float32) for a in arrays)


def close(actual, expected, rtol=2e-6, atol=2e-6):
    np.testing.assert_allclose(np.asarray(actual, dtype=np.float64), expected, rtol=rtol, atol=atol)


# --- hand-computed numbers -----------------------------------------------------------------------------
def test_sgld_literal_step():
    # θ=1, ∇Ũ=2θ=2, h=0.1, ζ=0.5, τ=1: 1 - 0.1·2 + sqrt(0.2)·0.5 = 1.0236068
    grad_fn = lambda x: StochasticGradient(x * x, 2 * x, -2 * x)  # noqa: E731
    x, state, gradient = sgld.step(jnp.array([1.0]), sgld.init(jnp.array([1.0]), None), grad_fn, jnp.array([0.5]), 0.1)
    close(x, [1.0236068])
    close(gradient.grad, [2.0])
    # τ = 4 doubles the noise: 1 - 0.2 + sqrt(0.8)·0.5 = 1.2472136
    x, _, _ = sgld.step(jnp.array([1.0]), state, grad_fn, jnp.array([0.5]), 0.1, temperature=4.0)
    close(x, [1.2472136])


def test_sghmc_literal_steps():
    # θ=1, p=0.5, ∇Ũ(θ)=2θ, h=0.1, A=2, ζ=-1, τ=1
    grad_fn = lambda x: StochasticGradient(x * x, 2 * x, -2 * x)  # noqa: E731
    state = sghmc.SGHMCState(jnp.array([0.5]))
    # Euler: θ' = 1.05; p' = 0.5 - 0.1·2.1 - 0.1·2·0.5 + sqrt(0.4)·(-1) = 0.19 - 0.63245553
    x, new, _ = sghmc.step(jnp.array([1.0]), state, grad_fn, jnp.array([-1.0]), 0.1, friction=2.0, integrator="euler")
    close(x, [1.05])
    close(new.momentum, [0.19 - math.sqrt(0.4)])
    # splitting: θ½ = 1.025; p = e^{-0.1}·0.5; p -= 0.1·2.05; p += sqrt(0.4)·(-1); p *= e^{-0.1};
    # θ = θ½ + 0.05 p
    e = math.exp(-0.1)
    p = e * ((e * 0.5) - 0.205 - math.sqrt(0.4))
    x, new, _ = sghmc.step(jnp.array([1.0]), state, grad_fn, jnp.array([-1.0]), 0.1, friction=2.0)
    close(new.momentum, [p])
    close(x, [1.025 + 0.05 * p])


def test_sgnht_literal_steps():
    # θ=1, p=2, ξ=D=1.5, ∇Ũ=2θ, h=0.1, ζ=0, τ=1, d=1 (the three thermostats coincide)
    grad_fn = lambda x: StochasticGradient(x * x, 2 * x, -2 * x)  # noqa: E731
    for thermostat in ("multivariate", "scalar", "matrix"):
        state = sgnht.init(jnp.array([1.0]), jnp.array([2.0]), diffusion=1.5, thermostat=thermostat)
        close(state.momentum, [2.0])
        close(state.thermostat, {"scalar": 1.5, "multivariate": [1.5], "matrix": [[1.5]]}[thermostat])
        # Euler: θ' = 1.2; p' = 2 - 0.1·2.4 - 0.1·1.5·2 = 1.46; ξ' = 1.5 + 0.1·(1.46² - 1) = 1.61316
        x, new, _ = sgnht.step(
            jnp.array([1.0]), state, grad_fn, jnp.array([0.0]), 0.1, diffusion=1.5,
            thermostat=thermostat, integrator="euler",
        )  # fmt: skip
        close(x, [1.2])
        close(new.momentum, [1.46])
        close(np.ravel(new.thermostat), [1.61316])
        # splitting: θ½ = 1.1, ξ½ = 1.5 + 0.05·3 = 1.65; p = e^{-0.0825}·(e^{-0.0825}·2 - 0.22);
        # θ = 1.1 + 0.05 p; ξ = 1.65 + 0.05 (p² - 1)
        e = math.exp(-0.0825)
        p = e * (e * 2 - 0.22)
        x, new, _ = sgnht.step(
            jnp.array([1.0]), state, grad_fn, jnp.array([0.0]), 0.1, diffusion=1.5, thermostat=thermostat
        )
        close(new.momentum, [p])
        close(x, [1.1 + 0.05 * p])
        close(np.ravel(new.thermostat), [1.65 + 0.05 * (p * p - 1)])


def test_psgld_literal_steps():
    # θ=1, ∇Ũ=2θ=2, ḡ=-0.5 (a score unrelated to the gradient), α=0.9, λ=0.01, h=0.1, ζ=1
    grad_fn = lambda x: StochasticGradient(x * x, 2 * x, -0.5 * x)  # noqa: E731
    state = psgld.init(jnp.array([1.0]), None)
    close(state.square_avg, [0.0])
    # V = 0.1·0.25 = 0.025; G = 1/(0.01 + 0.158113883) = 5.948326; θ = 1 - 0.1·G·2 + sqrt(0.2·G)
    x, new, _ = psgld.step(jnp.array([1.0]), state, grad_fn, jnp.array([1.0]), 0.1, alpha=0.9, eps=0.01)
    G = 1 / (0.01 + math.sqrt(0.025))
    close(new.square_avg, [0.025])
    close(x, [1 - 0.2 * G + math.sqrt(0.2 * G)])


# --- one step on vectors against the NumPy restatement -------------------------------------------------
ZETA = noise_sequence(1, seed=1)[0]


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_sgld_step(temperature):
    x, _, gradient = sgld.step(*f32(X0), sgld.SGLDState(), make_grad_fn(jnp.zeros(3)), *f32(ZETA), 0.05, temperature)
    close(x, ref_sgld(X0, ZETA, 0.05, temperature))
    close(gradient.grad, gradient_np(X0), rtol=1e-6)


@pytest.mark.parametrize("temperature", [1.0, 2.0])
@pytest.mark.parametrize("integrator", ["euler", "splitting"])
def test_sghmc_step(integrator, temperature):
    ref = {"euler": ref_sghmc_euler, "splitting": ref_sghmc_splitting}[integrator]
    x, state, _ = sghmc.step(
        *f32(X0), sghmc.SGHMCState(*f32(P0)), make_grad_fn(jnp.zeros(3)), *f32(ZETA), 0.1,
        friction=1.7, integrator=integrator, temperature=temperature,
    )  # fmt: skip
    x_ref, p_ref = ref(X0, P0, ZETA, 0.1, 1.7, temperature)
    close(x, x_ref)
    close(state.momentum, p_ref)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("thermostat", sgnht.THERMOSTATS)
@pytest.mark.parametrize("integrator", ["euler", "splitting"])
def test_sgnht_step(integrator, thermostat, temperature):
    ref = {"euler": ref_sgnht_euler, "splitting": ref_sgnht_splitting}[integrator]
    # a matrix thermostat with off-diagonal terms, symmetric and positive definite
    xi0 = {"multivariate": np.array([0.9, 1.3, 0.6]), "scalar": np.float64(1.1),
           "matrix": np.array([[0.9, 0.3, -0.2], [0.3, 1.3, 0.4], [-0.2, 0.4, 0.6]])}[thermostat]  # fmt: skip
    x, state, _ = sgnht.step(
        *f32(X0), sgnht.SGNHTState(*f32(P0, xi0)), make_grad_fn(jnp.zeros(3)), *f32(ZETA), 0.1,
        diffusion=0.8, thermostat=thermostat, integrator=integrator, temperature=temperature,
    )  # fmt: skip
    x_ref, p_ref, xi_ref = ref(X0, P0, xi0, ZETA, 0.1, 0.8, thermostat, temperature)
    close(x, x_ref)
    close(state.momentum, p_ref)
    close(state.thermostat, xi_ref)
    assert np.shape(state.thermostat) == np.shape(xi0)


@pytest.mark.parametrize("temperature", [1.0, 3.0])
def test_psgld_steps(temperature):
    # two steps, so that the running average V is checked after it has been non-zero
    x, state = f32(X0)[0], psgld.init(*f32(X0), None)
    x_ref, V_ref = X0, np.zeros(3)
    for zeta in noise_sequence(2, seed=2):
        x, state, _ = psgld.step(
            x, state, make_grad_fn(x), *f32(zeta), 0.01, alpha=0.95, eps=1e-3, temperature=temperature
        )
        x_ref, V_ref = ref_psgld(x_ref, V_ref, zeta, 0.01, 0.95, 1e-3, temperature)
        close(state.square_avg, V_ref)
        close(x, x_ref)


# --- initial states ------------------------------------------------------------------------------------
def test_initial_states():
    x, z = f32(X0, P0)
    assert sgld.init(x, z) == sgld.SGLDState()
    close(sghmc.init(x, z, temperature=4.0).momentum, 2 * P0)
    state = sgnht.init(x, z, diffusion=0.75, temperature=0.25)
    close(state.momentum, 0.5 * P0)
    close(state.thermostat, [0.75] * 3)
    assert state.thermostat.dtype == jnp.float32
    state = sgnht.init(x, z, diffusion=0.75, thermostat="scalar")
    assert state.thermostat.shape == ()
    close(state.thermostat, 0.75)
    close(sgnht.init(x, z, diffusion=0.75, thermostat="matrix").thermostat, 0.75 * np.eye(3))
    close(psgld.init(x, z).square_avg, np.zeros(3))


# --- one gradient per step, at the point the rule says ----------------------------------------------------
@pytest.mark.parametrize(
    "rule, state, hyper, where",
    [
        (sgld, sgld.SGLDState(), {}, lambda h: X0),
        (psgld, psgld.PSGLDState(jnp.zeros(3)), {}, lambda h: X0),
        (sghmc, sghmc.SGHMCState(jnp.asarray(P0)), dict(friction=1.0, integrator="euler"), lambda h: X0 + h * P0),
        (sghmc, sghmc.SGHMCState(jnp.asarray(P0)), dict(friction=1.0), lambda h: X0 + h / 2 * P0),
        (
            sgnht,
            sgnht.SGNHTState(jnp.asarray(P0), jnp.ones(3)),
            dict(diffusion=1.0, integrator="euler"),
            lambda h: X0 + h * P0,
        ),
        (sgnht, sgnht.SGNHTState(jnp.asarray(P0), jnp.ones(3)), dict(diffusion=1.0), lambda h: X0 + h / 2 * P0),
    ],
    ids=["sgld", "psgld", "sghmc-euler", "sghmc-splitting", "sgnht-euler", "sgnht-splitting"],
)
def test_one_gradient_per_step_at_the_right_point(rule, state, hyper, where):
    calls = []
    rule.step(*f32(X0), state, make_grad_fn(jnp.zeros(3), calls), *f32(ZETA), 0.2, **hyper)
    assert len(calls) == 1
    close(calls[0], where(0.2))


# --- SGHMC is SGNHT with a frozen thermostat --------------------------------------------------------------
@pytest.mark.parametrize("integrator", ["euler", "splitting"])
def test_sghmc_is_sgnht_with_frozen_thermostat(integrator):
    """With ``D = A`` and the thermostat held at ``A`` where the rule uses it, mSGNHT's ``(θ, p)`` follow SGHMC's.

    Euler uses ``ξ_t`` itself; splitting uses ``ξ_{t+½} = ξ_t + (h/2)(p_t⊙p_t - 1)``, so there the
    thermostat is reset to ``A - (h/2)(p_t⊙p_t - 1)`` before each step.
    """
    h, A = 0.1, np.array([1.2, 0.4, 2.5])
    grad_fn = make_grad_fn(jnp.zeros(3))
    x_hmc, s_hmc = f32(X0)[0], sghmc.SGHMCState(*f32(P0))
    x_nht, p_nht = f32(X0)[0], f32(P0)[0]
    for zeta in noise_sequence(20, seed=3):
        (zeta,) = f32(zeta)
        x_hmc, s_hmc, _ = sghmc.step(x_hmc, s_hmc, grad_fn, zeta, h, friction=jnp.asarray(A), integrator=integrator)
        xi = A if integrator == "euler" else A - h / 2 * (np.asarray(p_nht, np.float64) ** 2 - 1)
        x_nht, s_nht, _ = sgnht.step(
            x_nht, sgnht.SGNHTState(p_nht, *f32(xi)), grad_fn, zeta, h, diffusion=jnp.asarray(A), integrator=integrator
        )
        p_nht = s_nht.momentum
        np.testing.assert_allclose(np.asarray(x_nht), np.asarray(x_hmc), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(p_nht), np.asarray(s_hmc.momentum), rtol=1e-5, atol=1e-6)
    # and the thermostat really moves when it is not reset
    _, s_free, _ = sgnht.step(x_nht, sgnht.SGNHTState(p_nht, *f32(A)), grad_fn, zeta, h, diffusion=1.0)
    assert not np.allclose(np.asarray(s_free.thermostat), A)


# --- the same rule on jax.numpy and on torch ---------------------------------------------------------------
TRAJECTORY_CASES = {
    "sgld": (sgld, dict(temperature=1.0), 0.05),
    "sgld-tempered": (sgld, dict(temperature=0.3), 0.05),
    "sghmc-euler": (sghmc, dict(friction=1.5, integrator="euler"), 0.1),
    "sghmc-splitting": (sghmc, dict(friction=1.5, integrator="splitting", temperature=2.0), 0.1),
    "sgnht-euler": (sgnht, dict(diffusion=1.0, integrator="euler"), 0.1),
    "sgnht-splitting": (sgnht, dict(diffusion=1.0, integrator="splitting"), 0.1),
    "sgnht-scalar-euler": (sgnht, dict(diffusion=0.5, thermostat="scalar", integrator="euler"), 0.1),
    "sgnht-scalar-splitting": (sgnht, dict(diffusion=0.5, thermostat="scalar", temperature=0.5), 0.1),
    "sgnht-matrix-euler": (sgnht, dict(diffusion=0.5, thermostat="matrix", integrator="euler"), 0.1),
    "sgnht-matrix-splitting": (sgnht, dict(diffusion=0.5, thermostat="matrix", temperature=0.5), 0.1),
    "psgld": (psgld, dict(alpha=0.9, eps=1e-3), 0.01),
}


def run_trajectory(rule, hyper, step_size, to_array, num_steps=30):
    """States after each step; ``to_array`` turns float32 NumPy arrays into the backend's arrays."""
    noises = noise_sequence(num_steps + 1, seed=4).astype(np.float32)
    x = to_array(X0.astype(np.float32))
    state = rule.init(x, to_array(noises[0]), **call_kwargs(rule.init, hyper))
    grad_fn = make_grad_fn(x)
    out = []
    for zeta in noises[1:]:
        x, state, gradient = rule.step(x, state, grad_fn, to_array(zeta), step_size, **hyper)
        out.append([x, gradient.grad, *state])
    return out


def as_np(a):
    return a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else np.asarray(a)


@pytest.mark.parametrize("case", list(TRAJECTORY_CASES))
def test_jax_and_torch_trajectories_agree(case):
    rule, hyper, step_size = TRAJECTORY_CASES[case]
    traj_jax = run_trajectory(rule, hyper, step_size, jnp.asarray)
    traj_torch = run_trajectory(rule, hyper, step_size, torch.from_numpy)
    for step, (row_jax, row_torch) in enumerate(zip(traj_jax, traj_torch)):
        assert len(row_jax) == len(row_torch)
        for a_jax, a_torch in zip(row_jax, row_torch):
            assert isinstance(a_torch, torch.Tensor), f"{case}: torch inputs gave {type(a_torch).__name__}"
            assert a_torch.dtype == torch.float32 and a_jax.dtype == jnp.float32
            np.testing.assert_allclose(
                as_np(a_torch), as_np(a_jax), rtol=2e-5, atol=2e-6, err_msg=f"{case}: step {step}"
            )
    # the trajectory moved: the comparison is not between two unchanged arrays
    assert np.abs(as_np(traj_jax[-1][0]) - X0).max() > 0.1


@pytest.mark.parametrize("case", list(TRAJECTORY_CASES))
def test_trajectory_matches_reference(case):
    """The 30-step float32 trajectory follows the float64 NumPy restatement."""
    rule, hyper, step_size = TRAJECTORY_CASES[case]
    traj = run_trajectory(rule, hyper, step_size, jnp.asarray)
    noises = noise_sequence(31, seed=4).astype(np.float32).astype(np.float64)
    tau = hyper.get("temperature", 1.0)
    x = X0
    if rule is sgld:
        for zeta, row in zip(noises[1:], traj):
            x = ref_sgld(x, zeta, step_size, tau)
            close(row[0], x, rtol=1e-4, atol=1e-5)
    elif rule is psgld:
        V = np.zeros(3)
        for zeta, row in zip(noises[1:], traj):
            x, V = ref_psgld(x, V, zeta, step_size, hyper["alpha"], hyper["eps"], tau)
            close(row[0], x, rtol=1e-4, atol=1e-5)
    elif rule is sghmc:
        ref = {"euler": ref_sghmc_euler, "splitting": ref_sghmc_splitting}[hyper["integrator"]]
        p = np.sqrt(tau) * noises[0]
        for zeta, row in zip(noises[1:], traj):
            x, p = ref(x, p, zeta, step_size, hyper["friction"], tau)
            close(row[0], x, rtol=1e-4, atol=1e-5)
            close(row[2], p, rtol=1e-4, atol=1e-5)
    else:
        thermostat = hyper.get("thermostat", "multivariate")
        ref = {"euler": ref_sgnht_euler, "splitting": ref_sgnht_splitting}[hyper.get("integrator", "splitting")]
        p = np.sqrt(tau) * noises[0]
        D = hyper["diffusion"]
        xi = {"multivariate": np.full(3, D), "scalar": np.float64(D), "matrix": D * np.eye(3)}[thermostat]
        for zeta, row in zip(noises[1:], traj):
            x, p, xi = ref(x, p, xi, zeta, step_size, D, thermostat, tau)
            close(row[0], x, rtol=1e-4, atol=1e-5)
            close(row[2], p, rtol=1e-4, atol=1e-5)
            close(row[3], xi, rtol=1e-4, atol=1e-5)
