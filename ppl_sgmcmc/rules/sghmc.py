"""Stochastic gradient Hamiltonian Monte Carlo (Chen, Fox & Guestrin, ICML 2014) with identity
mass, and its symmetric-splitting integrator (Chen, Ding & Carin, NeurIPS 2015; Li et al., AAAI 2016).

The momentum integrators below take a general ``friction`` (a scalar or a vector the size of
``θ``) and ``diffusion`` ``D``; SGHMC is the case ``D = friction = A``, and the thermostat
rules of :mod:`ppl_sgmcmc.rules.sgnht` call them with the thermostat ``ξ`` as friction.

Euler (first order)::

    θ ← θ + h p
    p ← p - h ∇Ũ_t(θ) - h A ⊙ p + sqrt(2 D h τ) ζ

Symmetric splitting A-B-O-B-A (second order, one gradient per step)::

    A: θ ← θ + (h/2) p
    B: p ← exp(-A h/2) ⊙ p
    O: p ← p - h ∇Ũ_t(θ) + sqrt(2 D h τ) ζ
    B: p ← exp(-A h/2) ⊙ p
    A: θ ← θ + (h/2) p
"""

from typing import NamedTuple

from array_api_compat import array_namespace


class SGHMCState(NamedTuple):
    """The momentum ``p`` (identity mass)."""

    momentum: object


def init(position, noise, friction=None, integrator="splitting", temperature=1.0):
    """Draw the initial momentum ``p ~ N(0, τ I)`` from the standard normal ``noise``."""
    del position, friction, integrator
    return SGHMCState(temperature**0.5 * noise)


def euler(position, momentum, grad_fn, noise, step_size, friction, diffusion, temperature):
    """First-order Euler move of ``(θ, p)``; returns ``(θ, p, gradient)``."""
    position = position + step_size * momentum
    gradient = grad_fn(position)
    momentum = (
        momentum
        - step_size * gradient.grad
        - step_size * friction * momentum
        + (2 * diffusion * step_size * temperature) ** 0.5 * noise
    )
    return position, momentum, gradient


def splitting(position, momentum, grad_fn, noise, step_size, friction, diffusion, temperature):
    """Second-order symmetric-splitting move (A-B-O-B-A) of ``(θ, p)``; returns ``(θ, p, gradient)``."""
    xp = array_namespace(position)
    half = step_size / 2
    damping = xp.exp(xp.asarray(-friction * half))
    position = position + half * momentum
    momentum = damping * momentum
    gradient = grad_fn(position)
    momentum = momentum - step_size * gradient.grad + (2 * diffusion * step_size * temperature) ** 0.5 * noise
    momentum = damping * momentum
    position = position + half * momentum
    return position, momentum, gradient


INTEGRATORS = {"euler": euler, "splitting": splitting}


def step(position, state, grad_fn, noise, step_size, friction, integrator="splitting", temperature=1.0):
    """One SGHMC step with friction ``A`` (the diffusion equals the friction)."""
    position, momentum, gradient = INTEGRATORS[integrator](
        position, state.momentum, grad_fn, noise, step_size, friction, friction, temperature
    )
    return position, SGHMCState(momentum), gradient
