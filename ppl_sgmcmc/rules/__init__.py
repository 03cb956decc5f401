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
run on ``jax.numpy`` and ``torch`` arrays. The equations are those of ``ALGORITHMS.md``; each
module's docstring restates its rule and cites its paper.

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

from typing import NamedTuple

from array_api_compat import array_namespace

from ppl_sgmcmc.rules import psgld, sghmc, sgld, sgnht
from ppl_sgmcmc.rules import sgfs
from ppl_sgmcmc.rules import csgld
from ppl_sgmcmc.rules import sgrld


class StochasticGradient(NamedTuple):
    """What ``grad_fn`` returns at a point ``x``.

    ``energy``: the minibatch potential ``Ũ_t(x)`` (a noisy, unbiased estimate of ``U(x)``).
    ``grad``: ``∇Ũ_t(x)``.
    ``score``: the mean per-datum log-likelihood gradient ``ḡ_t = (1/n) Σ_{i∈S_t} ∇ log p(x_i|x)``
    (used by preconditioned rules; equal to ``-grad`` for targets without data).
    ``per_example``: the ``n×d`` matrix of per-datum log-likelihood gradients ``∇ log p(x_i|x)``,
    ``i ∈ S_t`` (rows average to ``score``), or ``None``. Backends compute it only for rule modules
    that declare ``PER_EXAMPLE_SCORES = True`` (SGFS); it costs a per-datum gradient pass.

    **Example** (at ``x`` for ``U(x) = |x|²/2``, a target without data)::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.rules import StochasticGradient
        >>> x = jnp.array([1.0, -2.0])
        >>> g = StochasticGradient(energy=(x * x).sum() / 2, grad=x, score=-x)
        >>> float(g.energy), g.grad.tolist(), g.per_example is None
        (2.5, [1.0, -2.0], True)
    """

    energy: object
    grad: object
    score: object
    per_example: object = None


__all__ = ["StochasticGradient", "array_namespace", "csgld", "psgld", "sgfs", "sghmc", "sgld", "sgnht", "sgrld"]
