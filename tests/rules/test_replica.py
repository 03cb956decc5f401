"""Unit tests of the replica-exchange rule :mod:`ppl_sgmcmc.rules.replica` (reSGLD / reSGHMC).

1. Exact energies: the swap is accepted with the Metropolis probability ``min(1, exp(a ΔU))`` of two replicas
   with known energies.
2. Gaussian energy noise of known variance ``s²``: the corrected swap satisfies detailed balance in the mean over
   the noise (``P(swap | μ) = e^μ P(swap | -μ)``, ``μ = a ΔU``), its acceptance is the closed form of the penalty
   method, and the corrected ratio ``S̃`` is unbiased for ``e^μ``; the uncorrected swap violates both.
3. The energy difference's noise variance ``ŝ² = δᵀ V̂ δ``: ``V̂`` (the cold walker's consecutive gradients) is
   right on a potential whose minibatch noise is linear in ``θ``.
4. Without swaps every slot moves as SGLD / SGHMC at its temperature; jax.numpy and torch agree.

Tolerances: ``K_SIGMA`` Monte Carlo standard errors (binomial or batch-means), seeds fixed.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats
import torch

from ppl_sgmcmc.rules import StochasticGradient, replica, sghmc, sgld
from tests.helpers import K_SIGMA

jax.config.update("jax_enable_x64", False)
DRAWS = 40_000
TAUS = (1.0, 3.0)
A = 1 / TAUS[0] - 1 / TAUS[1]


def two_slots(integrator="langevin"):
    """A state with the cold slot at x = 0 and the hot one at x = 1 (their energies come from the grad_fn)."""
    state = replica.init(jnp.zeros(1), jnp.zeros((2, 3)), num_replicas=2, ladder=TAUS, integrator=integrator)
    return state._replace(replicas=jnp.ones((1, 1)), count=jnp.asarray(1000, jnp.int32))


def energy_grad_fn(energies, key=None, sd=0.0):
    """``x -> StochasticGradient`` with energy ``energies[x]`` (x = 0 or 1) plus N(0, sd²) noise per call, zero gradient."""
    calls = []

    def grad_fn(x):
        index = len(calls)
        calls.append(index)
        energy = jnp.where(x[0] < 0.5, energies[0], energies[1])
        if key is not None:
            energy = energy + sd * jax.random.normal(jax.random.fold_in(key, index))
        return StochasticGradient(energy=energy, grad=jnp.zeros_like(x), score=None)

    return grad_fn


def swap_frequency(energies, sd=0.0, energy_variance=0.0, seed=0):
    """The fraction of ``DRAWS`` independent swap attempts accepted, and the mean of ``swap_probability``."""
    state = two_slots()

    def attempt(key):
        key_noise, key_energy = jax.random.split(key)
        noise = jax.random.normal(key_noise, (2, 3))
        grad_fn = energy_grad_fn(energies, key_energy if sd else None, sd)
        _, new, _ = replica.step(jnp.zeros(1), state, grad_fn, noise, 1e-3, num_replicas=2,
                                 energy_variance=energy_variance)  # fmt: skip
        return new.swapped[0], new.swap_probability[0]

    swapped, probability = jax.vmap(attempt)(jax.random.split(jax.random.PRNGKey(seed), DRAWS))
    return float(np.mean(swapped)), np.asarray(probability)


def binomial_se(p, n=DRAWS):
    return math.sqrt(max(p * (1 - p), 1e-12) / n)


@pytest.mark.parametrize("energies", [(2.0, 1.0), (1.0, 2.5), (0.3, 0.3)])
def test_exact_energies_swap_with_the_metropolis_probability(energies):
    exact = min(1.0, math.exp(A * (energies[0] - energies[1])))
    rate, probability = swap_frequency(energies)
    assert abs(rate - exact) < K_SIGMA * binomial_se(exact)
    np.testing.assert_allclose(probability, exact, rtol=1e-5)


def penalty_acceptance(mu, v):
    """``E min(1, exp(X - v/2))``, ``X ~ N(mu, v)``: the corrected swap's acceptance under Gaussian noise."""
    sd = math.sqrt(v)
    return scipy.stats.norm.cdf((mu - v / 2) / sd) + math.exp(mu) * scipy.stats.norm.cdf((-mu - v / 2) / sd)


def naive_acceptance(mu, v):
    """``E min(1, exp(X))``, ``X ~ N(mu, v)``: the uncorrected swap's."""
    sd = math.sqrt(v)
    return scipy.stats.norm.cdf(mu / sd) + math.exp(mu + v / 2) * scipy.stats.norm.cdf(-mu / sd - sd)


def test_corrected_swap_keeps_detailed_balance_under_gaussian_energy_noise():
    sd = 1.0  # each energy's noise: the difference has s² = 2
    s2 = 2 * sd**2
    v = A * A * s2
    energies = (1.5, 0.0)
    mu = A * (energies[0] - energies[1])
    forward, _ = swap_frequency(energies, sd, energy_variance=s2, seed=1)
    backward, _ = swap_frequency(energies[::-1], sd, energy_variance=s2, seed=2)
    assert abs(forward - penalty_acceptance(mu, v)) < K_SIGMA * binomial_se(forward)
    assert abs(backward - penalty_acceptance(-mu, v)) < K_SIGMA * binomial_se(backward)
    # detailed balance of the swap: P(swap | μ) / P(swap | -μ) = e^μ (log ratio, delta method)
    log_ratio = math.log(forward / backward)
    se = math.sqrt(binomial_se(forward) ** 2 / forward**2 + binomial_se(backward) ** 2 / backward**2)
    assert abs(log_ratio - mu) < K_SIGMA * se
    # the uncorrected swap: too many swaps, and detailed balance broken by far more than the Monte Carlo error
    naive_forward, _ = swap_frequency(energies, sd, energy_variance=0.0, seed=1)
    naive_backward, _ = swap_frequency(energies[::-1], sd, energy_variance=0.0, seed=2)
    assert abs(naive_backward - naive_acceptance(-mu, v)) < K_SIGMA * binomial_se(naive_backward)
    assert abs(math.log(naive_forward / naive_backward) - mu) > 10 * se


def test_corrected_swap_ratio_is_unbiased():
    rng = np.random.default_rng(0)
    s2, delta = 2.0, 1.0
    noisy = delta + math.sqrt(s2) * rng.standard_normal(DRAWS)
    corrected = np.exp(np.asarray(replica.log_swap_ratio(noisy, 0.0, TAUS[0], TAUS[1], s2)))
    naive = np.exp(np.asarray(replica.log_swap_ratio(noisy, 0.0, TAUS[0], TAUS[1], 0.0)))
    exact = math.exp(A * delta)
    se = corrected.std(ddof=1) / math.sqrt(DRAWS)
    assert abs(corrected.mean() - exact) < K_SIGMA * se
    assert naive.mean() - exact > 10 * naive.std(ddof=1) / math.sqrt(DRAWS)  # biased by e^{a² s²/2}


def test_energy_variance_is_the_gradient_noise_along_the_replicas_difference():
    """A minibatch-like potential ``Ũ_t(x) = |x|²/2 + b_t·x``, ``b_t ~ N(0, diag v)`` shared by the replicas of a
    step: the energy difference's noise is ``b_t·δ`` exactly, of variance ``δᵀ diag(v) δ``. The running ``V̂`` matches
    ``v`` plus the predicted drift term (``E (Δ∇U)²/2 ≈ h τ`` per coordinate for SGLD on a unit Gaussian), to its
    batch-means error, and ``ŝ²`` is ``Σ V̂ δ²`` at the pair's points."""
    v, steps, h = jnp.array([4.0, 1.0, 0.25]), 20_000, 0.01
    d = v.shape[0]
    state = replica.init(jnp.zeros(d), jnp.zeros((2, d + 2)), num_replicas=2, ladder=TAUS)

    def one(carry, key):
        position, state = carry
        key_noise, key_batch = jax.random.split(key)
        b = jnp.sqrt(v) * jax.random.normal(key_batch, (d,))

        def grad_fn(x):
            return StochasticGradient(energy=jnp.sum(x * x) / 2 + b @ x, grad=x + b, score=None)

        noise = jax.random.normal(key_noise, (2, d + 2))
        before = jnp.concatenate([position[None], state.replicas])
        position, state, _ = replica.step(position, state, grad_fn, noise, h, num_replicas=2)
        delta = before[0] - before[1]
        return (position, state), (state.gradient_noise, state.energy_variance[0], jnp.sum(state.gradient_noise * delta**2))

    keys = jax.random.split(jax.random.PRNGKey(3), steps)
    _, (noise, s2, predicted) = jax.lax.scan(one, (jnp.zeros(d), state), keys)
    series = np.asarray(noise)[1000:]
    batches = series.reshape(19, -1, d).mean(axis=1)  # batches much longer than the estimate's memory (100 steps)
    se = batches.std(axis=0, ddof=1) / math.sqrt(len(batches))
    drift = h * TAUS[0]  # (Δ∇U)²/2 = (Δx)²/2, Δx ~ sqrt(2 h τ) ξ on U = |x|²/2
    np.testing.assert_array_less(np.abs(series.mean(axis=0) - (np.asarray(v) + drift)), K_SIGMA * se)
    assert np.all(se < 0.05 * np.asarray(v))
    np.testing.assert_allclose(np.asarray(s2)[1000:], np.asarray(predicted)[1000:], rtol=1e-5)


def never_swapping(state):
    """A state whose huge energy variance makes every swap's corrected ratio 0."""
    return state._replace(energy_variance=jnp.full_like(state.energy_variance, 1e30))


@pytest.mark.parametrize("integrator", replica.INTEGRATORS)
def test_without_swaps_every_slot_moves_by_its_own_rule(integrator):
    def grad_fn(x):
        return StochasticGradient(energy=jnp.sum(x**4) / 4, grad=x**3, score=None)

    x, hot = jnp.array([0.5, -1.0]), jnp.array([[1.5, 0.3]])
    noise = jnp.array([[0.3, -0.2, 0.0, 0.0], [1.0, 0.5, 0.0, 0.0]])
    state = replica.init(x, jnp.ones((2, 4)), num_replicas=2, ladder=TAUS, integrator=integrator)
    state = never_swapping(state._replace(replicas=hot, count=jnp.asarray(50, jnp.int32)))
    friction = None if integrator == "langevin" else 0.7
    new_x, new_state, gradient = replica.step(x, state, grad_fn, noise, 0.1, num_replicas=2, integrator=integrator,
                                              friction=friction)  # fmt: skip
    assert not bool(new_state.swapped[0])
    for slot, (start, tau) in enumerate(((x, TAUS[0]), (hot[0], TAUS[1]))):
        if integrator == "langevin":
            expected, _, _ = sgld.step(start, sgld.SGLDState(), grad_fn, noise[slot, :2], 0.1, temperature=tau)
        else:
            momentum = state.momentum if slot == 0 else state.replica_momentum[0]
            expected, expected_p, _ = sghmc.INTEGRATORS[integrator](start, momentum, grad_fn, noise[slot, :2], 0.1,
                                                                    0.7, 0.7, tau)  # fmt: skip
            got_p = new_state.momentum if slot == 0 else new_state.replica_momentum[0]
            np.testing.assert_allclose(got_p, expected_p, rtol=1e-6)
        got = new_x if slot == 0 else new_state.replicas[0]
        np.testing.assert_allclose(got, expected, rtol=1e-6)
    assert float(gradient.energy) == pytest.approx(float(grad_fn(new_state.points[0]).energy))


def test_jax_and_torch_agree():
    def grad_fn(x):
        xp = jnp if isinstance(x, jax.Array) else torch
        return StochasticGradient(energy=(x * x).sum() / 2 + xp.sin(x).sum(), grad=x + xp.cos(x), score=None)

    rng = np.random.default_rng(0)
    x, hot, noise = rng.normal(size=3), rng.normal(size=(2, 3)), rng.normal(size=(3, 5))
    out = []
    for to in (lambda a: jnp.asarray(a, jnp.float32), lambda a: torch.tensor(a, dtype=torch.float32)):
        state = replica.init(to(x), to(noise), num_replicas=3, integrator="splitting")
        state = state._replace(replicas=to(hot))
        position, state, _ = replica.step(to(x), state, grad_fn, to(noise), 0.1, num_replicas=3,
                                          integrator="splitting", friction=1.0, energy_variance=0.5)  # fmt: skip
        out.append([np.asarray(position), np.asarray(state.replicas), np.asarray(state.walkers)])
    for a, b in zip(*out):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_anchored_swaps_read_the_exact_energies_whatever_the_minibatch():
    """Variance-reduced energies (Deng et al., ICLR 2021): two slots at their anchors, whose full-data energies are
    exact, under a minibatch noise ``b_t·x`` of sd 3 per coordinate that the plain estimates carry: ``Ũ_t(y) - Ũ_t(a) +
    U(a)`` is exact, ``ŝ² = 0``, and the swap is accepted with the Metropolis probability of the exact energies, to its
    binomial error; the anchors (and their energies) travel with their walkers."""
    energies = jnp.array([1.0, 2.5])
    points = jnp.array([[0.0], [1.0]])
    state = replica.anchor(two_slots()._replace(anchors=points, anchor_energies=jnp.zeros(2), anchored=False),
                           points, energies)  # fmt: skip

    def attempt(key):
        key_noise, key_batch = jax.random.split(key)
        b = 3.0 * jax.random.normal(key_batch)

        def grad_fn(x):  # the exact energy at the slots' points, plus the minibatch's noise b x
            return StochasticGradient(energy=jnp.where(x[0] < 0.5, energies[0], energies[1]) + b * x[0],
                                      grad=jnp.zeros_like(x), score=None)  # fmt: skip

        _, new, _ = replica.step(jnp.zeros(1), state, grad_fn, jax.random.normal(key_noise, (2, 3)), 1e-3,
                                 num_replicas=2)  # fmt: skip
        return new.swapped[0], new.energy_variance[0], new.anchors[:, 0], new.anchor_energies

    swapped, variance, anchors, anchor_energies = jax.vmap(attempt)(jax.random.split(jax.random.PRNGKey(5), DRAWS))
    exact = math.exp(A * (1.0 - 2.5))
    frequency = float(np.mean(swapped))
    assert abs(frequency - exact) < K_SIGMA * binomial_se(exact), (frequency, exact)
    assert float(jnp.max(jnp.abs(variance))) == 0.0
    swapped = np.asarray(swapped)
    np.testing.assert_array_equal(np.asarray(anchors)[swapped], np.tile([1.0, 0.0], (int(swapped.sum()), 1)))
    np.testing.assert_array_equal(np.asarray(anchor_energies)[~swapped], np.tile([1.0, 2.5], (int((~swapped).sum()), 1)))


def test_anchored_energy_variance_is_the_noise_along_the_offsets_from_the_anchors():
    """With anchors, ``ŝ² = Σ V̂ ((y_0 - a_0) - (y_1 - a_1))²``: two replicas 4 apart, each 0.1 from its anchor, have
    the variance of replicas 0.2 apart, not 4; unset anchors (``anchored`` false) give the plain ``Σ V̂ (y_0 - y_1)²``."""
    state = replica.init(jnp.zeros(1), jnp.zeros((2, 3)), num_replicas=2, ladder=TAUS, anchored=True)
    state = state._replace(replicas=jnp.full((1, 1), 4.0), count=jnp.asarray(1000, jnp.int32),
                           gradient_noise=jnp.ones(1), points=jnp.array([[0.0], [4.0]]))  # fmt: skip
    anchored = replica.anchor(state, jnp.array([[-0.1], [4.1]]), jnp.zeros(2))

    def grad_fn(x):
        return StochasticGradient(energy=jnp.sum(x), grad=jnp.zeros_like(x), score=None)

    def variance(state):
        _, new, _ = replica.step(jnp.zeros(1), state, grad_fn, jnp.zeros((2, 3)), 1e-6, num_replicas=2)
        return float(new.energy_variance[0])

    noise = float(replica.step(jnp.zeros(1), state, grad_fn, jnp.zeros((2, 3)), 1e-6, num_replicas=2)[1].gradient_noise[0])
    assert variance(anchored) == pytest.approx(noise * 0.2**2, rel=1e-5)
    assert variance(state) == pytest.approx(noise * 4.0**2, rel=1e-5)
