"""Gradient estimators: the layer between a model's stochastic potential and the update rules.

Each step, a kernel draws a minibatch and builds ``minibatch_grad_fn(x)``, the
:class:`~ppl_sgmcmc.rules.StochasticGradient` of the minibatch potential
``Ũ_t(x) = -log p(x) - (N/n) Σ_{i∈S_t} log p(y_i|x)`` at any point ``x``. An estimator turns it into the
``grad_fn`` that the update rule calls (once), and may keep a state across steps, which lives in the
chain's state (``gradient_state``)::

    state = estimator.init(position)
    grad_fn, state = estimator.estimate(state, position, minibatch_grad_fn, step_index)

Estimators are backend-neutral: they use only arithmetic on what ``minibatch_grad_fn`` returns, so the
same estimator runs on ``jax.numpy`` and ``torch`` arrays, and they never touch a rule or a kernel. The
plain minibatch estimator below is the default; variance-reduced estimators (control variates, SVRG)
plug in here, in the style of BlackJAX's ``grad_estimator`` and ``control_variates``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from ppl_sgmcmc.rules import StochasticGradient

GradFn = Callable[[Any], StochasticGradient]


class GradientEstimator(NamedTuple):
    """A pair of pure functions, optax style.

    - **init** ``(position) -> state``: the estimator's state at the chain's start.
    - **estimate** ``(state, position, minibatch_grad_fn, step_index) -> (grad_fn, state)``: the
      gradient function the rule calls at step ``step_index`` (from ``position``), and the new state.

    Both must pickle (module-level functions, or ``functools.partial`` of them): kernels travel to
    Pyro's worker processes and into checkpoints.
    """

    init: Callable[[Any], Any]
    estimate: Callable[[Any, Any, GradFn, Any], tuple[GradFn, Any]]


def minibatch() -> GradientEstimator:
    """The plain minibatch estimator: ``∇Ũ_t`` itself, unbiased for ``∇U`` (Welling & Teh, ICML 2011).
    It keeps no state.

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.gradients import minibatch
        >>> from ppl_sgmcmc.rules import StochasticGradient
        >>> estimator = minibatch()
        >>> state = estimator.init(jnp.zeros(2))
        >>> grad_fn, state = estimator.estimate(state, jnp.zeros(2), lambda x: StochasticGradient(0.0, x, -x), 0)
        >>> grad_fn(jnp.ones(2)).grad.tolist(), state
        ([1.0, 1.0], ())
    """

    return GradientEstimator(_no_state, _minibatch_estimate)


# module-level functions (or functools.partial of them) keep estimators picklable, as Pyro's worker
# processes and checkpoints need
def _no_state(position: Any) -> tuple:
    del position
    return ()


def _minibatch_estimate(state: Any, position: Any, minibatch_grad_fn: GradFn, step_index: Any) -> tuple[GradFn, Any]:
    del position, step_index
    return minibatch_grad_fn, state
