"""Preconditioned SGLD with an RMSprop preconditioner (Li, Chen, Carlson & Carin, AAAI 2016).

With the mean per-datum score ``ḡ_t``, decay ``α`` and regulariser ``λ`` (``eps``)::

    V ← α V + (1 - α) ḡ_t ⊙ ḡ_t
    G = 1 ⊘ (λ + sqrt(V))
    θ ← θ - h G ⊙ ∇Ũ_t(θ) + sqrt(2 h τ G) ⊙ ζ

The curvature correction ``Γ(θ)`` is dropped, as in the paper's experiments.
"""

from typing import NamedTuple

from array_api_compat import array_namespace


class PSGLDState(NamedTuple):
    """The running average ``V`` of squared mean scores."""

    square_avg: object


def init(position, noise, alpha=0.99, eps=1e-5, temperature=1.0):
    """Start the average at ``V = 0`` (the first step sets it to ``(1 - α) ḡ⊙ḡ``)."""
    del noise, alpha, eps, temperature
    xp = array_namespace(position)
    return PSGLDState(xp.zeros_like(position))


def step(position, state, grad_fn, noise, step_size, alpha=0.99, eps=1e-5, temperature=1.0):
    """One pSGLD step; the preconditioner is updated before it is used."""
    xp = array_namespace(position)
    gradient = grad_fn(position)
    square_avg = alpha * state.square_avg + (1 - alpha) * gradient.score * gradient.score
    preconditioner = 1 / (eps + xp.sqrt(square_avg))
    position = (
        position
        - step_size * preconditioner * gradient.grad
        + xp.sqrt(2 * step_size * temperature * preconditioner) * noise
    )
    return position, PSGLDState(square_avg), gradient
