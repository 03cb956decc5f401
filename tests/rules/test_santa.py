"""The Santa rule (:mod:`ppl_sgmcmc.rules.santa`) against a NumPy restatement of its module docstring, on
``jax.numpy`` and ``torch``, and its annealing schedule.

The restatement (float64) follows the docstring line by line; the rule in float32 must follow it over a
trajectory that explores, then refines, and both array libraries must give the same trajectory.
"""

import math

import jax.numpy as jnp
import numpy as np
import pytest
import torch

from ppl_sgmcmc.rules import StochasticGradient, santa
from tests.rules.test_rules import X0, as_np, close, f32, gradient_np, make_grad_fn, noise_sequence


def ref_santa(x, p, xi, V, zeta, h, beta, exploring, decay, eps, N, curvature_term=False):
    """One step of the module docstring's rule in NumPy (float64)."""
    f = gradient_np(x)
    scaled = f / N
    V_prev = np.where(V == 0, scaled * scaled, V)
    V = decay * V_prev + (1 - decay) * scaled * scaled
    g_prev, g = 1 / np.sqrt(eps + np.sqrt(V_prev)), 1 / np.sqrt(eps + np.sqrt(V))
    T = 1 / beta if exploring else 0.0
    xi = xi + h * (p * p - T)
    p_new = (1 - h * xi) * p - h * g * f + np.sqrt(2 * h * T * g_prev) * zeta
    if curvature_term and exploring:
        p_new = p_new + T * (1 - g_prev / g) / p
    return x + h * g * p_new, p_new, xi, V


HYPER = dict(decay=0.9, eps=1e-3, data_size=2.0)


BETA = santa.annealing(scale=5.0)  # slower than the default, so that T stays sizeable over the 20 exploring steps


def run(to_array, num_steps=30, num_exploration=20, curvature_term=False, beta=BETA):
    """The rule's trajectory ``[(x, p, ξ, V), ...]`` on the arrays of ``to_array``, with a fixed noise sequence."""
    noises = noise_sequence(num_steps + 1, seed=7).astype(np.float32)
    x = to_array(X0.astype(np.float32))
    state = santa.init(x, to_array(noises[0]), initial_thermostat=0.7, inverse_temperature=beta(0))
    grad_fn = make_grad_fn(x)
    out = []
    for t, zeta in enumerate(noises[1:]):
        x, state, _ = santa.step(
            x, state, grad_fn, to_array(zeta), 0.1, inverse_temperature=beta(t), num_exploration=num_exploration,
            step_index=t, curvature_term=curvature_term, **HYPER,
        )  # fmt: skip
        out.append((x, *state))
    return out


@pytest.mark.parametrize("curvature_term", [False, True], ids=["default", "curvature-term"])
def test_trajectory_matches_reference(curvature_term):
    """30 float32 steps (20 exploring, then 10 refining) follow the float64 restatement."""
    traj = run(jnp.asarray, curvature_term=curvature_term)
    noises = noise_sequence(31, seed=7).astype(np.float32).astype(np.float64)
    beta = BETA
    x, p, xi, V = X0, math.sqrt(1 / beta(0)) * noises[0], np.full(3, 0.7), np.zeros(3)
    for t, (zeta, row) in enumerate(zip(noises[1:], traj)):
        x, p, xi, V = ref_santa(x, p, xi, V, zeta, 0.1, beta(t), t < 20, curvature_term=curvature_term,
                                decay=HYPER["decay"], eps=HYPER["eps"], N=HYPER["data_size"])  # fmt: skip
        for got, expected in zip(row, (x, p, xi, V)):
            close(got, expected, rtol=1e-4, atol=1e-5)
    assert np.abs(x - X0).max() > 0.1  # it moved


@pytest.mark.parametrize("curvature_term", [False, True], ids=["default", "curvature-term"])
def test_jax_and_torch_trajectories_agree(curvature_term):
    traj_jax = run(jnp.asarray, curvature_term=curvature_term)
    traj_torch = run(torch.from_numpy, curvature_term=curvature_term)
    atol = 1e-5 if curvature_term else 2e-6  # the curvature term divides by p (~0.02 here): round-off grows
    for step, (row_jax, row_torch) in enumerate(zip(traj_jax, traj_torch)):
        for a_jax, a_torch in zip(row_jax, row_torch):
            assert isinstance(a_torch, torch.Tensor) and a_torch.dtype == torch.float32
            np.testing.assert_allclose(as_np(a_torch), as_np(a_jax), rtol=2e-5, atol=atol, err_msg=f"step {step}")


def test_literal_steps():
    """One exploring and one refining step by hand: θ=1, ∇Ũ=2θ, N=1, σ=0.5, λ=0 (so g = |f|^{-1/2}), h=0.1."""
    grad_fn = lambda x: StochasticGradient(x * x, 2 * x, None)  # noqa: E731
    state = santa.SantaState(*(jnp.array([v]) for v in (0.5, 2.0, 0.0)))
    # V' = 4 (seeded), V = 4: g' = g = 1/sqrt(2); β = 4: T = 0.25; ξ = 2 + 0.1 (0.25 - 0.25) = 2;
    # p = (1 - 0.2)·0.5 - 0.1·2/sqrt(2) + sqrt(2·0.1·0.25/sqrt(2))·1; θ = 1 + 0.1 p/sqrt(2)
    x, new, _ = santa.step(jnp.array([1.0]), state, grad_fn, jnp.array([1.0]), 0.1, inverse_temperature=4.0,
                           num_exploration=1, step_index=0, decay=0.5, eps=0.0)  # fmt: skip
    p = 0.4 - 0.2 / math.sqrt(2) + math.sqrt(0.05 / math.sqrt(2))
    close(new.thermostat, [2.0])
    close(new.momentum, [p])
    close(x, [1 + 0.1 * p / math.sqrt(2)])
    # refining (step 1 >= num_exploration): T = 0, no noise; ξ = 2 + 0.1 p², V = 0.5·4 + 0.5·4 x'²
    x2, new2, _ = santa.step(x, new, grad_fn, jnp.array([1.0]), 0.1, inverse_temperature=4.0,
                             num_exploration=1, step_index=1, decay=0.5, eps=0.0)  # fmt: skip
    x1 = 1 + 0.1 * p / math.sqrt(2)
    g = 1 / math.sqrt(math.sqrt(2 + 2 * x1 * x1))
    xi = 2 + 0.1 * p * p
    close(new2.thermostat, [xi])
    close(new2.momentum, [(1 - 0.1 * xi) * p - 0.1 * g * 2 * x1])
    close(x2, [x1 + 0.1 * g * ((1 - 0.1 * xi) * p - 0.1 * g * 2 * x1)])


def test_one_gradient_at_the_position():
    calls = []
    x, zeta = f32(X0, noise_sequence(1)[0])
    santa.step(x, santa.init(x, zeta), make_grad_fn(x, calls), zeta, 0.2, num_exploration=5)
    assert len(calls) == 1 and calls[0] is x


def test_initial_state():
    x, zeta = f32(X0, noise_sequence(1)[0])
    state = santa.init(x, zeta, initial_thermostat=3.0, inverse_temperature=4.0)
    close(state.momentum, 0.5 * noise_sequence(1)[0])
    close(state.thermostat, [3.0] * 3)
    close(state.square_avg, [0.0] * 3)
    assert state.thermostat.dtype == jnp.float32


def test_annealing_schedule():
    beta = santa.annealing()
    assert [beta(t) for t in (0, 3, 8)] == [1.0, 2.0, 3.0]  # the paper's t^0.5 of the 1-based t
    assert santa.annealing(rate=1.0, scale=10.0)(20) == 3.0
    assert float(beta(jnp.asarray(3))) == 2.0  # traced step indices too
    with pytest.raises(ValueError, match="`rate` must be positive"):
        santa.annealing(rate=0.0)
    with pytest.raises(ValueError, match="`scale` must be positive"):
        santa.annealing(scale=-1.0)
