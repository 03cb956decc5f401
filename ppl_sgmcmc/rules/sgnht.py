"""Stochastic gradient Nosé-Hoover thermostats: SGNHT (Ding et al., NeurIPS 2014) and the
multivariate mSGNHT with the Euler (mSGNHT-E) and symmetric-splitting (mSGNHT-S) integrators of
Li, Chen, Fan & Carin, *High-Order Stochastic Gradient Thermostats* (AAAI 2016).

State ``(θ, p, ξ)`` with diffusion ``D``; ``ξ`` starts at ``D``. The thermostat measures the
kinetic energy by ``k(p) = p ⊙ p`` (multivariate, ``ξ ∈ R^d``) or ``k(p) = pᵀp / d`` (scalar).

Euler (mSGNHT-E)::

    θ_{t+1} = θ_t + h p_t
    p_{t+1} = p_t - h ∇Ũ_t(θ_{t+1}) - h ξ_t ⊙ p_t + sqrt(2 D h τ) ζ
    ξ_{t+1} = ξ_t + h (k(p_{t+1}) - τ)

Symmetric splitting (mSGNHT-S)::

    A: θ_{t+½} = θ_t + (h/2) p_t               ξ_{t+½} = ξ_t + (h/2)(k(p_t) - τ)
    B: p ← exp(-ξ_{t+½} h/2) ⊙ p_t
    O: p ← p - h ∇Ũ_t(θ_{t+½}) + sqrt(2 D h τ) ζ
    B: p_{t+1} = exp(-ξ_{t+½} h/2) ⊙ p
    A: θ_{t+1} = θ_{t+½} + (h/2) p_{t+1}        ξ_{t+1} = ξ_{t+½} + (h/2)(k(p_{t+1}) - τ)

The ``(θ, p)`` moves are those of :mod:`ppl_sgmcmc.rules.sghmc` with the thermostat as friction.
"""

from typing import NamedTuple

from array_api_compat import array_namespace

from ppl_sgmcmc.rules import sghmc


class SGNHTState(NamedTuple):
    """The momentum ``p`` and the thermostat ``ξ`` (a vector, or a scalar for SGNHT)."""

    momentum: object
    thermostat: object


def kinetic(momentum, multivariate):
    """The thermostat's measure of kinetic energy: ``p ⊙ p`` or ``pᵀp / d``."""
    xp = array_namespace(momentum)
    squared = momentum * momentum
    return squared if multivariate else xp.mean(squared)


def init(position, noise, diffusion, multivariate=True, integrator="splitting", temperature=1.0):
    """Momentum ``p ~ N(0, τ I)`` and thermostat ``ξ = D``."""
    del integrator
    xp = array_namespace(position)
    shape = position.shape if multivariate else ()
    thermostat = xp.full(shape, diffusion, dtype=position.dtype)
    return SGNHTState(temperature**0.5 * noise, thermostat)


def step(
    position, state, grad_fn, noise, step_size, diffusion, multivariate=True, integrator="splitting", temperature=1.0
):
    """One (m)SGNHT step with the Euler or the symmetric-splitting integrator."""
    momentum, thermostat = state
    if integrator == "euler":
        position, momentum, gradient = sghmc.euler(
            position, momentum, grad_fn, noise, step_size, thermostat, diffusion, temperature
        )
        thermostat = thermostat + step_size * (kinetic(momentum, multivariate) - temperature)
    else:
        half = step_size / 2
        thermostat = thermostat + half * (kinetic(momentum, multivariate) - temperature)
        position, momentum, gradient = sghmc.splitting(
            position, momentum, grad_fn, noise, step_size, thermostat, diffusion, temperature
        )
        thermostat = thermostat + half * (kinetic(momentum, multivariate) - temperature)
    return position, SGNHTState(momentum, thermostat), gradient
