"""Stochastic gradient Langevin dynamics (Welling & Teh, ICML 2011).

Update, with step size ``h`` (Welling & Teh's ``ε/2``) and temperature ``τ``::

    θ ← θ - h ∇Ũ_t(θ) + sqrt(2 h τ) ζ,        ζ ~ N(0, I)
"""

from typing import NamedTuple


class SGLDState(NamedTuple):
    """SGLD carries no auxiliary state."""


def init(position, noise, temperature=1.0):
    """Return the (empty) SGLD state."""
    del position, noise, temperature
    return SGLDState()


def step(position, state, grad_fn, noise, step_size, temperature=1.0):
    """One SGLD step; the gradient is taken at the current position."""
    gradient = grad_fn(position)
    position = position - step_size * gradient.grad + (2 * step_size * temperature) ** 0.5 * noise
    return position, state, gradient
