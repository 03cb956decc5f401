"""Tests of :mod:`ppl_sgmcmc.noise`: the gradient-noise estimate from consecutive gradients, on ``jax.numpy``
and ``torch``, and the noise ratio."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from ppl_sgmcmc import noise
from tests.helpers import K_SIGMA


def run(gradients: np.ndarray, accepted: np.ndarray, xp: str = "jax", scale: float = 1.0) -> tuple:
    arr = (lambda a: jnp.asarray(a, jnp.float32)) if xp == "jax" else (lambda a: torch.tensor(a, dtype=torch.float32))
    state = noise.init(arr(gradients[0]))
    terms = []
    for g, ok in zip(gradients, accepted):
        state, term = noise.update(state, arr(g), scale, bool(ok))
        terms.append(np.asarray(term))
    return state, np.stack(terms)


def test_estimate_of_independent_noise() -> None:
    rng = np.random.default_rng(0)
    V = np.array([4.0, 100.0, 0.25])
    gradients = np.array([1.0, -2.0, 3.0]) + rng.normal(size=(4000, 3)) * np.sqrt(V)
    state, terms = run(gradients, np.ones(4000, bool))
    # (g_t - g_{t-1})²/2 has mean V and variance 2V² (the difference of two independent N(0, V))
    mean = terms[1:].mean(0)
    assert np.all(np.abs(mean - V) < K_SIGMA * np.sqrt(2) * V / math.sqrt(3999)), mean
    # the running estimate, an exponential average over about HORIZON steps: within its own spread
    sd = np.sqrt(2) * V * math.sqrt(1 / (2 * noise.HORIZON))
    assert np.all(np.abs(np.asarray(state.variance) - V) < K_SIGMA * sd), np.asarray(state.variance)
    assert int(state.count) == 3999


def test_first_and_rejected_gradients_are_not_differences() -> None:
    gradients = np.array([[0.0], [2.0], [100.0], [4.0]])
    accepted = np.array([True, True, False, True])
    state, terms = run(gradients, accepted)
    # the first has no predecessor, the third is rejected: the differences are 2 - 0 and 4 - 2
    assert terms[:, 0].tolist() == [0.0, 2.0, 0.0, 2.0]
    assert float(state.variance[0]) == pytest.approx(2.0) and int(state.count) == 2
    np.testing.assert_array_equal(np.asarray(state.previous), [4.0])


def test_scale_and_same_numbers_on_torch() -> None:
    rng = np.random.default_rng(1)
    gradients = rng.normal(size=(300, 4)) * 3
    accepted = rng.uniform(size=300) > 0.1
    jax_state, jax_terms = run(gradients, accepted, "jax", scale=0.5)
    torch_state, torch_terms = run(gradients, accepted, "torch", scale=0.5)
    np.testing.assert_allclose(jax_terms, torch_terms, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(jax_state.variance), torch_state.variance.numpy(), rtol=1e-5)
    unscaled, _ = run(gradients, accepted, "jax")
    np.testing.assert_allclose(np.asarray(jax_state.variance), 0.5 * np.asarray(unscaled.variance), rtol=1e-5)


def test_update_under_jit_and_vmap() -> None:
    gradients = jnp.asarray(np.random.default_rng(2).normal(size=(2, 50, 3)), jnp.float32)

    def chain(g: jax.Array) -> noise.NoiseState:
        def body(state: noise.NoiseState, g_t: jax.Array) -> tuple[noise.NoiseState, None]:
            return noise.update(state, g_t, 1.0, True)[0], None

        return jax.lax.scan(body, noise.init(g[0]), g)[0]

    states = jax.jit(jax.vmap(chain))(gradients)
    for c in range(2):
        single, _ = run(np.asarray(gradients[c]), np.ones(50, bool))
        np.testing.assert_allclose(np.asarray(states.variance[c]), np.asarray(single.variance), rtol=1e-5)


def test_rescale_and_ratio() -> None:
    state = noise.NoiseState(jnp.ones(2), jnp.array([4.0, 1.0]), jnp.array(10, jnp.int32))
    same = noise.rescale(state, jnp.ones(2))
    assert int(same.count) == 10 and same.variance.tolist() == [4.0, 1.0]
    new = noise.rescale(state, jnp.array([0.5, 2.0]))
    assert int(new.count) == -1 and new.variance.tolist() == [1.0, 4.0]
    assert float(noise.ratio(state, 1e-3, 2.0)) == pytest.approx(1e-3)
    assert np.isnan(float(noise.ratio(new, 1e-3, 2.0)))  # no difference measured in the new coordinates
