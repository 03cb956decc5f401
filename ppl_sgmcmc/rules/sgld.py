"""Stochastic gradient Langevin dynamics (Welling & Teh, ICML 2011).

Update, with step size ``h`` (Welling & Teh's ``ε/2``) and temperature ``τ``::

    θ ← θ - h ∇Ũ_t(θ) + sqrt(2 h τ) ζ,        ζ ~ N(0, I)
"""

from typing import NamedTuple

#: What the rule reads from the gradient: ``"gradient"`` (``energy`` and ``grad``), ``"score"`` (also the
#: mean per-datum score) or ``"per_example"`` (also the ``n×d`` per-datum scores).
NEEDS = "gradient"


class SGLDState(NamedTuple):
    """SGLD carries no auxiliary state: an empty tuple.

    **Example**::

        >>> from ppl_sgmcmc.rules import sgld
        >>> sgld.SGLDState(), len(sgld.SGLDState())
        (SGLDState(), 0)
    """


def init(position, noise):
    """Return the (empty) SGLD state.

    :param position: the chain's start ``θ_0``, a flat array (unused).
    :param noise: a standard normal draw of the shape of ``position`` (unused).
    :return: :class:`SGLDState` ``()``.

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.rules import sgld
        >>> sgld.init(jnp.zeros(3), jnp.zeros(3))
        SGLDState()
    """
    del position, noise
    return SGLDState()


def step(position, state, grad_fn, noise, step_size, temperature=1.0):
    """One SGLD step, ``θ ← θ - h ∇Ũ_t(θ) + sqrt(2 h τ) ζ``; the gradient is taken at the current position.

    :param position: ``θ``, a flat array (``jax.numpy`` or ``torch``).
    :param state: the :class:`SGLDState` (empty).
    :param grad_fn: ``θ -> StochasticGradient`` of the minibatch potential; called once.
    :param noise: ``ζ``, a standard normal draw of the shape of ``position``.
    :param step_size: ``h`` (Welling & Teh's ``ε/2``).
    :param temperature: ``τ`` (default 1).
    :return: ``(new position, state, gradient at the old position)``.

    **Example** (one step on ``U(x) = |x|²/2``, with ``jax.numpy`` and with ``torch`` arrays)::

        >>> import jax.numpy as jnp, torch
        >>> from ppl_sgmcmc.rules import StochasticGradient, sgld
        >>> def grad_fn(x):  # U(x) = |x|²/2: ∇U = x; no data, so the score is -∇U
        ...     return StochasticGradient(energy=(x * x).sum() / 2, grad=x, score=-x)
        >>> x, noise = jnp.array([1.0, -2.0]), jnp.array([0.5, -0.5])
        >>> x, state, gradient = sgld.step(x, sgld.init(x, noise), grad_fn, noise, step_size=0.1)
        >>> [round(v, 4) for v in x.tolist()], float(gradient.energy)  # 0.9 x + sqrt(0.2) ζ; U at the old x
        ([1.1236, -2.0236], 2.5)
        >>> t = torch.tensor([1.0, -2.0])
        >>> sgld.step(t, sgld.init(t, t), grad_fn, torch.tensor([0.5, -0.5]), step_size=0.1)[0]
        tensor([ 1.1236, -2.0236])
    """
    gradient = grad_fn(position)
    position = position - step_size * gradient.grad + (2 * step_size * temperature) ** 0.5 * noise
    return position, state, gradient
