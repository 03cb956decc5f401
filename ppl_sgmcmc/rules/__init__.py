"""Pure SG-MCMC update rules, shared by the NumPyro and the Pyro backend.

Every algorithm is a module with two functions over flat parameter vectors:

``init(position, noise, **hyper) -> state``
    The auxiliary state of the chain (momentum, thermostat, preconditioner).

``step(position, state, grad_fn, noise, step_size, **hyper) -> (position, state, gradient)``
    One move of the chain. ``grad_fn(x)`` returns a :class:`StochasticGradient` of the
    minibatch potential ``Ũ_t`` at ``x`` and is called exactly once; ``noise`` is a standard
    normal draw of the shape of ``position``; ``step_size`` is the scalar ``h_t``.

The rules hold no PPL code, no random-number generation and no data-dependent Python control
flow: they use arithmetic and the array-API namespace of their inputs only, so the same lines
run on ``jax.numpy`` and ``torch`` arrays. Each module's docstring states its rule and cites its paper.

Each module declares what it reads from the gradient, ``NEEDS``: ``"gradient"`` (the energy and
``∇Ũ_t``), ``"score"`` (also the mean per-datum score ``ḡ_t``) or ``"per_example"`` (also the ``n×d``
per-datum scores); the backends compute no more than that. ``init`` and ``step`` take, as keyword
arguments, only the hyper-parameters they use; ``step`` may also take ``step_index`` (the chain's
0-based step count). Shared pieces: :mod:`~ppl_sgmcmc.rules.rms` (the RMSprop average).

**Example** (the same rule on ``jax.numpy`` and on ``torch`` arrays; no noise: a gradient step)::

    >>> import jax.numpy as jnp, torch
    >>> from ppl_sgmcmc.rules import StochasticGradient, array_namespace, sgld
    >>> def grad_fn(x):  # U(x) = |x|²/2
    ...     return StochasticGradient(energy=(x * x).sum() / 2, grad=x, score=-x)
    >>> for x in (jnp.array([1.0, -2.0]), torch.tensor([1.0, -2.0])):
    ...     x, state, gradient = sgld.step(x, sgld.init(x, 0 * x), grad_fn, 0 * x, step_size=0.5)
    ...     print(array_namespace(x).__name__, x.tolist(), float(gradient.energy))
    jax.numpy [0.5, -1.0] 2.5
    array_api_compat.torch [0.5, -1.0] 2.5
"""

from typing import Any, NamedTuple, cast

from array_api_compat import array_namespace

from ppl_sgmcmc.rules import csgld, psgld, recipe, replica, rms, santa, sgfs, sghmc, sgld, sgnht, sgrld
from ppl_sgmcmc.rules._types import Array, RuleStateT, Scalar


class StochasticGradient(NamedTuple):
    """What ``grad_fn`` returns at a point ``x``.

    ``energy``: the minibatch potential ``Ũ_t(x)`` (a noisy, unbiased estimate of ``U(x)``).
    ``grad``: ``∇Ũ_t(x)``.
    ``score``: the mean per-datum log-likelihood gradient ``ḡ_t = (1/n) Σ_{i∈S_t} ∇ log p(x_i|x)``
    (used by preconditioned rules; equal to ``-grad`` for targets without data), or ``None`` where the
    rule does not read it (``NEEDS = "gradient"``).
    ``per_example``: the ``n×d`` matrix of per-datum log-likelihood gradients ``∇ log p(x_i|x)``,
    ``i ∈ S_t`` (rows average to ``score``), or ``None``. Backends compute it only for rule modules
    that declare ``NEEDS = "per_example"`` (SGFS); it costs a per-datum gradient pass.

    **Example** (at ``x`` for ``U(x) = |x|²/2``, a target without data)::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.rules import StochasticGradient
        >>> x = jnp.array([1.0, -2.0])
        >>> g = StochasticGradient(energy=(x * x).sum() / 2, grad=x, score=-x)
        >>> float(g.energy), g.grad.tolist(), g.per_example is None
        (2.5, [1.0, -2.0], True)
    """

    energy: Array
    grad: Array
    score: Array | None
    per_example: Array | None = None


def has_momentum(state: tuple[Any, ...]) -> bool:
    """Whether a rule's state carries a momentum ``p`` (SGHMC, SGNHT, CSGHMC; not SGLD, CSGLD, ...)."""
    return getattr(state, "momentum", None) is not None


def refresh_momentum(state: RuleStateT, noise: Array, temperature: Scalar = 1.0) -> RuleStateT:
    """``state`` with its momentum redrawn from the momentum's stationary marginal ``p ~ N(0, τ I)``
    (``p = sqrt(τ) ζ``, as ``init`` draws it); other fields (a thermostat, CSGHMC's ``θ``) are kept.

    Redrawing ``p`` alone is a Gibbs step on ``p``: it leaves the joint stationary distribution of
    ``(θ, p)`` invariant. The kernels apply it when they reject a non-finite step: the rejected move's
    momentum is what made it diverge, and a chain that kept it would repeat the move and stay stuck.

    :param state: a rule's state with a ``momentum`` field (see :func:`has_momentum`).
    :param noise: ``ζ``, a standard normal draw of the shape of the momentum.
    :param temperature: ``τ`` (default 1).

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.rules import refresh_momentum, sgnht
        >>> state = sgnht.SGNHTState(momentum=jnp.array([40.0, -75.0]), thermostat=jnp.array([3.0, 5.0]))
        >>> fresh = refresh_momentum(state, jnp.array([0.5, -1.0]), temperature=4.0)
        >>> fresh.momentum.tolist(), fresh.thermostat.tolist()
        ([1.0, -2.0], [3.0, 5.0])
    """
    fields: Any = state  # a rule's NamedTuple with a `momentum` field, which `tuple` (the bound) does not name
    return cast(RuleStateT, fields._replace(momentum=temperature**0.5 * noise))


__all__ = [
    "StochasticGradient",
    "array_namespace",
    "csgld",
    "has_momentum",
    "psgld",
    "recipe",
    "refresh_momentum",
    "replica",
    "rms",
    "santa",
    "sgfs",
    "sghmc",
    "sgld",
    "sgnht",
    "sgrld",
]
