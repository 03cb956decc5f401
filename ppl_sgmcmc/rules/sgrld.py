"""Stochastic gradient Riemannian Langevin dynamics (Patterson & Teh, NeurIPS 2013) with the
expanded-mean preconditioner ``G(θ) = diag(θ)`` (the inverse of the Riemannian metric) on positive latents,
and mirroring at 0.

General SGRLD with preconditioner ``G`` (the inverse metric) and ``Γ_i(θ) = Σ_j ∂G_ij/∂θ_j``, temperature ``τ``::

    θ ← θ - h (G(θ) ∇Ũ_t(θ) - τ Γ(θ)) + sqrt(2 h τ G(θ)) ζ

With ``G = diag(θ)`` (so ``Γ = 1``) and the mirrored proposal of the paper::

    θ ← | θ - h (θ ⊙ ∇Ũ_t(θ) - τ) + sqrt(2 h τ θ) ⊙ ζ |

``θ`` and ``∇Ũ_t`` are in the latents' own, positive space: no log transform and no Jacobian. For
LDA in the expanded-mean parametrisation (``θ_kw ~ Gamma(β, 1)``, ``π_k = θ_k / Σ_w θ_kw``) the drift
``-(θ ⊙ ∇Ũ_t - 1)`` is ``β - θ_kw + (D/|S_t|) Σ_{d∈S_t} E_{z_d}[n_dkw - π_kw n_dk·]``, the update of
``ALGORITHMS.md``.
"""

from typing import NamedTuple

from array_api_compat import array_namespace


class SGRLDState(NamedTuple):
    """SGRLD carries no auxiliary state."""


def init(position, noise, temperature=1.0):
    """Return the (empty) SGRLD state."""
    del position, noise, temperature
    return SGRLDState()


def step(position, state, grad_fn, noise, step_size, temperature=1.0):
    """One mirrored SGRLD step with ``G = diag(θ)``; the gradient is taken at the current (positive) position."""
    xp = array_namespace(position)
    gradient = grad_fn(position)
    drift = position * gradient.grad - temperature
    position = xp.abs(position - step_size * drift + xp.sqrt(2 * step_size * temperature * position) * noise)
    return position, state, gradient
