"""Stochastic gradient Riemannian Langevin dynamics (Patterson & Teh, NeurIPS 2013) with the
expanded-mean preconditioner ``G(θ) = diag(θ)`` (the inverse of the Riemannian metric) on positive latents,
and mirroring at 0.

General SGRLD with preconditioner ``G`` (the inverse metric) and ``Γ_i(θ) = Σ_j ∂G_ij/∂θ_j``, temperature ``τ``::

    θ ← θ - h (G(θ) ∇Ũ_t(θ) - τ Γ(θ)) + sqrt(2 h τ G(θ)) ζ

With ``G = diag(θ)`` (so ``Γ = 1``) and the mirrored proposal of the paper::

    θ ← | θ - h (θ ⊙ ∇Ũ_t(θ) - τ) + sqrt(2 h τ θ) ⊙ ζ |

``θ`` and ``∇Ũ_t`` are in the latents' own, positive space: no log transform and no Jacobian. For
LDA in the expanded-mean parametrisation (``θ_kw ~ Gamma(β, 1)``, ``π_k = θ_k / Σ_w θ_kw``) the drift
``-(θ ⊙ ∇Ũ_t - 1)`` is ``β - θ_kw + (D/|S_t|) Σ_{d∈S_t} E_{z_d}[n_dkw - π_kw n_dk·]``, Patterson & Teh's update.
"""

from typing import NamedTuple

from array_api_compat import array_namespace

NEEDS = "gradient"  # what the rule reads from the gradient (see ppl_sgmcmc.rules)


class SGRLDState(NamedTuple):
    """SGRLD carries no auxiliary state: an empty tuple.

    **Example**::

        >>> from ppl_sgmcmc.rules import sgrld
        >>> sgrld.SGRLDState(), len(sgrld.SGRLDState())
        (SGRLDState(), 0)
    """


def init(position, noise):
    """Return the (empty) SGRLD state.

    :param position: the chain's (positive) start ``θ_0`` (unused); also ``noise``.
    :return: :class:`SGRLDState` ``()``.

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.rules import sgrld
        >>> sgrld.init(jnp.ones(3), jnp.zeros(3))
        SGRLDState()
    """
    del position, noise
    return SGRLDState()


def step(position, state, grad_fn, noise, step_size, temperature=1.0):
    """One mirrored SGRLD step with ``G = diag(θ)``; the gradient is taken at the current (positive) position::

        θ ← | θ - h (θ ⊙ ∇Ũ_t(θ) - τ) + sqrt(2 h τ θ) ⊙ ζ |

    :param position: ``θ > 0``, a flat array (``jax.numpy`` or ``torch``) in the latents' own space.
    :param state: the :class:`SGRLDState` (empty).
    :param grad_fn: ``θ -> StochasticGradient`` of the minibatch potential in that space (no Jacobian).
    :param noise: ``ζ``, a standard normal draw of the shape of ``position``.
    :param step_size: ``h``.
    :param temperature: ``τ`` (default 1).
    :return: ``(new position, state, gradient at the old position)``; the new position is positive.

    **Example** (a half-normal, ``U(x) = |x|²/2`` on ``x > 0``: the first coordinate's move below 0 is mirrored)::

        >>> import jax.numpy as jnp, torch
        >>> from ppl_sgmcmc.rules import StochasticGradient, sgrld
        >>> def grad_fn(x):  # U(x) = |x|²/2: ∇U = x; no data, so the score is -∇U
        ...     return StochasticGradient(energy=(x * x).sum() / 2, grad=x, score=-x)
        >>> x, noise = jnp.array([0.5, 2.0]), jnp.array([-3.0, 0.5])
        >>> x, state, _ = sgrld.step(x, sgrld.init(x, noise), grad_fn, noise, step_size=0.1)
        >>> [round(v, 4) for v in x.tolist()]  # |0.5 + 0.075 - 3 sqrt(0.1)|, 2 - 0.3 + 0.5 sqrt(0.4)
        [0.3737, 2.0162]
        >>> t = torch.tensor([0.5, 2.0])
        >>> sgrld.step(t, sgrld.init(t, t), grad_fn, torch.tensor([-3.0, 0.5]), step_size=0.1)[0]
        tensor([0.3737, 2.0162])
    """
    xp = array_namespace(position)
    gradient = grad_fn(position)
    drift = position * gradient.grad - temperature
    position = xp.abs(position - step_size * drift + xp.sqrt(2 * step_size * temperature * position) * noise)
    return position, state, gradient
