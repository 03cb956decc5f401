"""Preconditioned SGLD with an RMSprop preconditioner (Li, Chen, Carlson & Carin, AAAI 2016).

With the mean per-datum score ``ḡ_t``, decay ``α`` and regulariser ``λ`` (``eps``)::

    V ← α V + (1 - α) ḡ_t ⊙ ḡ_t
    G = 1 ⊘ (λ + sqrt(V))
    θ ← θ - h G ⊙ ∇Ũ_t(θ) + sqrt(2 h τ G) ⊙ ζ

The curvature correction ``Γ(θ)`` is dropped, as in the paper's experiments. The average ``V`` is the
shared RMSprop transform :mod:`ppl_sgmcmc.rules.rms`.
"""

from typing import NamedTuple

from array_api_compat import array_namespace

from ppl_sgmcmc.rules import rms
from ppl_sgmcmc.rules._types import Array

NEEDS = "score"  # the rule reads the mean per-datum score ḡ_t (see ppl_sgmcmc.rules)


class PSGLDState(NamedTuple):
    """The running average ``V`` of squared mean scores (``square_avg``, the shape of ``θ``).

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.rules import psgld
        >>> psgld.PSGLDState(square_avg=jnp.zeros(2)).square_avg.shape
        (2,)
    """

    square_avg: Array


def init(position, noise):
    """Start the average at ``V = 0`` (the first step sets it to ``(1 - α) ḡ⊙ḡ``).

    :param position: the chain's start ``θ_0``, a flat array; ``V`` takes its shape and dtype.
    :param noise: unused (no random state).
    :return: :class:`PSGLDState` with ``square_avg = 0``.

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.rules import psgld
        >>> psgld.init(jnp.ones(3), None).square_avg.tolist()
        [0.0, 0.0, 0.0]
    """
    del noise
    return PSGLDState(rms.init(position))


def step(position, state, grad_fn, noise, step_size, alpha=0.99, eps=1e-5, temperature=1.0):
    """One pSGLD step; the preconditioner is updated before it is used::

        V ← α V + (1 - α) ḡ_t ⊙ ḡ_t;  G = 1 ⊘ (λ + sqrt(V));  θ ← θ - h G ⊙ ∇Ũ_t(θ) + sqrt(2 h τ G) ⊙ ζ

    :param position: ``θ``, a flat array (``jax.numpy`` or ``torch``).
    :param state: the :class:`PSGLDState` (``V``).
    :param grad_fn: ``θ -> StochasticGradient``; its ``score`` is the mean per-datum score ``ḡ_t``.
    :param noise: ``ζ``, a standard normal draw of the shape of ``position``.
    :param step_size: ``h``.
    :param alpha: the decay ``α`` of the average (default 0.99).
    :param eps: the regulariser ``λ`` (default 1e-5).
    :param temperature: ``τ`` (default 1).
    :return: ``(new position, new state, gradient at the old position)``.

    **Example** (one step on ``U(x) = |x|²/2``, with ``jax.numpy`` and with ``torch`` arrays)::

        >>> import jax.numpy as jnp, torch
        >>> from ppl_sgmcmc.rules import StochasticGradient, psgld
        >>> def grad_fn(x):  # U(x) = |x|²/2: ∇U = x; no data, so the score is -∇U
        ...     return StochasticGradient(energy=(x * x).sum() / 2, grad=x, score=-x)
        >>> x, noise = jnp.array([1.0, -2.0]), jnp.array([0.5, -0.5])
        >>> x, state, _ = psgld.step(x, psgld.init(x, noise), grad_fn, noise, step_size=0.01)
        >>> [round(v, 4) for v in x.tolist()], [round(v, 4) for v in state.square_avg.tolist()]  # V = 0.01 x²
        ([1.1236, -2.0581], [0.01, 0.04])
        >>> t = torch.tensor([1.0, -2.0])
        >>> psgld.step(t, psgld.init(t, t), grad_fn, torch.tensor([0.5, -0.5]), step_size=0.01)[0]
        tensor([ 1.1236, -2.0581])
    """
    xp = array_namespace(position)
    gradient = grad_fn(position)
    square_avg = rms.update(state.square_avg, gradient.score, alpha)
    preconditioner = 1 / (eps + xp.sqrt(square_avg))
    position = (
        position
        - step_size * preconditioner * gradient.grad
        + xp.sqrt(2 * step_size * temperature * preconditioner) * noise
    )
    return position, PSGLDState(square_avg), gradient
