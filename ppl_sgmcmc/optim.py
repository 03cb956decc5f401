"""Santa as an optax optimiser, for training without a model or ``MCMC`` (a Flax network, a loss of your own).

:func:`santa` runs exactly the update rule of the kernels (:mod:`ppl_sgmcmc.rules.santa`) on the flattened
parameters, with the gradient optax hands it: Santa's step takes its gradient at the current parameters, as
an optax transformation receives it. Its randomness comes from a JAX key in its state, as in
``optax.add_noise``. With a model, use the kernel :class:`ppl_sgmcmc.numpyro.Santa` instead: it draws the
minibatches, scales the gradients by the data size and handles constrained latents.

Reference: C. Chen, D. Carlson, Z. Gan, C. Li and L. Carin. *Bridging the Gap between Stochastic Gradient MCMC
and Stochastic Optimization.* AISTATS 2016.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.flatten_util import ravel_pytree

from ppl_sgmcmc.rules import StochasticGradient
from ppl_sgmcmc.rules import santa as santa_rule

__all__ = ["SantaOptState", "santa"]


class SantaOptState(NamedTuple):
    """The state of :func:`santa`: the number of steps taken ``t``, Santa's rule state (a
    :class:`~ppl_sgmcmc.rules.santa.SantaState` over the flattened parameters) and the JAX key of the noise.

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.optim import santa
        >>> state = santa(0.1, num_exploration=100).init({"w": jnp.zeros(3)})
        >>> int(state.steps), state.rule_state.momentum.shape
        (0, (3,))
    """

    steps: jax.Array
    rule_state: santa_rule.SantaState
    key: jax.Array


def santa(
    step_size: float | Callable[[Any], Any],
    *,
    num_exploration: int | float,
    inverse_temperature: float | Callable[[Any], Any] | None = None,
    decay: float = 0.999,
    eps: float = 1e-8,
    initial_thermostat: float = 5.0,
    data_size: int = 1,
    curvature_term: bool = False,
    seed: int = 0,
) -> optax.GradientTransformation:
    """Santa (Chen, Carlson, Gan, Li & Carin, AISTATS 2016), Euler scheme, as an optax
    ``GradientTransformation``: the update moves the parameters to Santa's next position, ``θ ← θ + h g⊙p``
    (the rule: :mod:`ppl_sgmcmc.rules.santa`). The transformation needs ``params`` in ``update``.

    :param step_size: ``h`` (the paper's learning rate is ``η = h²``), or a schedule of the step count.
    :param num_exploration: the steps of the exploration, after which Santa refines (at temperature 0);
        ``math.inf`` never refines.
    :param inverse_temperature: ``β_t``, a number or a schedule of the step count; default
        :func:`ppl_sgmcmc.rules.santa.annealing` ``()``.
    :param decay: the RMSprop decay ``σ`` (default 0.999).
    :param eps: the regulariser ``λ`` (default 1e-8).
    :param initial_thermostat: ``C``: the thermostat starts at ``ξ_0 = C sqrt(N)`` (default 5).
    :param data_size: ``N``: the gradients in the RMSprop average are divided by it, so that with a loss
        summed over ``N`` data (scaled up from a minibatch) they are per datum, as in the paper (default 1).
    :param curvature_term: add the paper's finite-difference drift of the preconditioner (see
        :class:`ppl_sgmcmc.algorithms.Santa`; default ``False``).
    :param seed: the seed of the noise's JAX key (default 0).
    :return: the ``optax.GradientTransformation``.

    **Example** (the double-well ``U(x) = (x+4)(x+1)(x-1)(x-3)/14 + 0.5`` from its local mode near 2.2: RMSprop
    stays there, Santa finds the global mode near -2.9; over seeds: the Santa page of the docs)::

        >>> import jax, jax.numpy as jnp, optax
        >>> from ppl_sgmcmc.optim import santa
        >>> from ppl_sgmcmc.rules.santa import annealing
        >>> def U(x):
        ...     return jnp.sum((x + 4) * (x + 1) * (x - 1) * (x - 3) / 14 + 0.5)
        >>> def minimise(optimiser, steps=8000):
        ...     def step(carry, _):
        ...         x, state = carry
        ...         updates, state = optimiser.update(jax.grad(U)(x), state, x)
        ...         return (optax.apply_updates(x, updates), state), None
        ...     x = jnp.array([2.2])
        ...     return jax.lax.scan(step, (x, optimiser.init(x)), length=steps)[0][0]
        >>> round(float(minimise(optax.rmsprop(0.01))[0]), 2)
        2.22
        >>> optimiser = santa(0.1, num_exploration=6000, inverse_temperature=annealing(scale=1000.0), seed=1)
        >>> round(float(minimise(optimiser)[0]), 2)
        -2.94
    """
    beta = santa_rule.annealing() if inverse_temperature is None else inverse_temperature
    if not (num_exploration == math.inf or (isinstance(num_exploration, int) and num_exploration >= 0)):
        raise ValueError(f"santa: `num_exploration` must be an integer >= 0 or math.inf, got {num_exploration!r}.")

    def at(value: Any, count: Any) -> Any:
        return value(count) if callable(value) else value

    def init(params: Any) -> SantaOptState:
        flat, _ = ravel_pytree(params)
        key, key_init = jax.random.split(jax.random.PRNGKey(seed))
        noise = jax.random.normal(key_init, flat.shape, flat.dtype)
        rule_state = santa_rule.init(flat, noise, initial_thermostat, at(beta, 0), data_size)
        return SantaOptState(jnp.zeros((), jnp.int32), rule_state, key)

    def update(updates: Any, state: SantaOptState, params: Any = None) -> tuple[Any, SantaOptState]:
        if params is None:
            raise ValueError("santa: `update` needs `params` (Santa's step moves the parameters themselves).")
        flat, unravel = ravel_pytree(params)
        grad = ravel_pytree(updates)[0]
        key, key_noise = jax.random.split(state.key)
        noise = jax.random.normal(key_noise, flat.shape, flat.dtype)
        count = state.steps
        new, rule_state, _ = santa_rule.step(
            flat, state.rule_state, lambda x: StochasticGradient(jnp.zeros((), flat.dtype), grad, None), noise,
            at(step_size, count), inverse_temperature=at(beta, count), num_exploration=num_exploration,
            step_index=count, decay=decay, eps=eps, data_size=data_size, curvature_term=curvature_term,
        )  # fmt: skip
        return unravel(new - flat), SantaOptState(count + 1, rule_state, key)

    return optax.GradientTransformation(init, update)
