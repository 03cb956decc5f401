"""Gradient estimators: the layer between a model's stochastic potential and the update rules.

Each step, a kernel draws a minibatch and builds ``minibatch_grad_fn(x)``, the
:class:`~ppl_sgmcmc.rules.StochasticGradient` of the minibatch potential
``Ũ_t(x) = -log p(x) - (N/n) Σ_{i∈S_t} log p(y_i|x)`` at any point ``x``. An estimator turns it into the
``grad_fn`` that the update rule calls (once), and may keep a state across steps, which lives in the
chain's state (``gradient_state``)::

    state = estimator.init(position, full_grad_fn)            # at the chain's start
    grad_fn, state = estimator.estimate(state, position, minibatch_grad_fn, step_index)

``full_grad_fn(x)`` is the :class:`~ppl_sgmcmc.rules.StochasticGradient` of the *full-data* potential ``U``
at ``x`` (its energy, gradient and mean per-datum score, by one pass over the data), which the kernel gives
only to estimators with :attr:`GradientEstimator.needs_full_gradient` (``None`` otherwise). An estimator
with :attr:`GradientEstimator.refresh_every` set is re-initialised at the chain's position every that many
steps (``0``: one epoch, ``N/n`` steps of the largest subsampled plate).

Estimators are backend-neutral: they use only arithmetic on what ``minibatch_grad_fn`` returns, so the
same estimator runs on ``jax.numpy`` and ``torch`` arrays, and they never touch a rule or a kernel (as
BlackJAX's ``grad_estimator`` and ``control_variates``).

* :func:`minibatch`: ``∇Ũ_t`` itself (Welling & Teh, ICML 2011), the default of every kernel but SGHMC and SGNHT
  with a tuned step size (``Algorithm.tuned_gradient``).
* :func:`control_variates`: ``∇Ũ_t(x) - ∇Ũ_t(ĉ) + ∇U(ĉ)`` around a fixed centre ``ĉ`` (Baker, Fearnhead, Fox &
  Nemeth, "Control variates for stochastic gradient MCMC", Statistics and Computing 2019).
* :func:`svrg`: the same with the centre moved to the chain's position every epoch (Dubey, Reddi, Williamson,
  Póczos, Smola & Xing, "Variance Reduction in Stochastic Gradient Langevin Dynamics", NeurIPS 2016); the default
  of SGHMC and SGNHT with a tuned step size, where the model's data is on the device.

Both variance-reduced estimators are unbiased for ``∇U(x)``, and their noise is that of the *difference*
of the minibatch gradients at ``x`` and ``ĉ``, which vanishes as ``x → ĉ``: near a mode of a posterior that
concentrates, it is far smaller than the minibatch estimator's. They cost two minibatch gradients per step
(at ``x`` and at ``ĉ``, on the same minibatch) and a full-data gradient at each new centre.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

from array_api_compat import array_namespace, device

from ppl_sgmcmc.rules import StochasticGradient

__all__ = ["ESTIMATORS", "GradFn", "GradientEstimator", "control_variates", "minibatch", "svrg"]

GradFn = Callable[[Any], StochasticGradient]


class GradientEstimator(NamedTuple):
    """A pair of pure functions, optax style, and what the kernel must give them.

    - **init** ``(position, full_grad_fn) -> state``: the estimator's state at the chain's start
      (``full_grad_fn`` is ``None`` unless :attr:`needs_full_gradient`).
    - **estimate** ``(state, position, minibatch_grad_fn, step_index) -> (grad_fn, state)``: the gradient
      function the rule calls at step ``step_index`` (from ``position``), and the new state.
    - **needs_full_gradient**: whether ``init`` calls ``full_grad_fn``.
    - **refresh_every**: re-initialise at the chain's position every that many steps (``None``: never; ``0``:
      every epoch, ``N/n`` steps of the largest subsampled plate).
    - **name**: what messages call it.
    - **centre**: the fixed centre given to :func:`control_variates` (``None``: the chain's start).

    Both functions must pickle (module-level functions, or ``functools.partial`` of them): kernels travel to
    Pyro's worker processes and into checkpoints.
    """

    init: Callable[[Any, GradFn | None], Any]
    estimate: Callable[[Any, Any, GradFn, Any], tuple[GradFn, Any]]
    needs_full_gradient: bool = False
    refresh_every: int | None = None
    name: str = "minibatch"
    centre: Any = None


def minibatch() -> GradientEstimator:
    """The plain minibatch estimator: ``∇Ũ_t`` itself, unbiased for ``∇U`` (Welling & Teh, ICML 2011).
    It keeps no state.

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.gradients import minibatch
        >>> from ppl_sgmcmc.rules import StochasticGradient
        >>> estimator = minibatch()
        >>> state = estimator.init(jnp.zeros(2), None)
        >>> grad_fn, state = estimator.estimate(state, jnp.zeros(2), lambda x: StochasticGradient(0.0, x, -x), 0)
        >>> grad_fn(jnp.ones(2)).grad.tolist(), state
        ([1.0, 1.0], ())
    """
    return GradientEstimator(_no_state, _minibatch_estimate)


class Centre(NamedTuple):
    """The state of the variance-reduced estimators: the centre ``ĉ`` and the full-data ``U(ĉ)``, ``∇U(ĉ)``
    and mean per-datum score there."""

    position: Any
    energy: Any
    grad: Any
    score: Any


def control_variates(centre: Any = None) -> GradientEstimator:
    """Control variates around a fixed centre ``ĉ`` (Baker, Fearnhead, Fox & Nemeth, "Control variates for
    stochastic gradient MCMC", Statistics and Computing 2019)::

        ∇Û(x) = ∇Ũ_t(x) - ∇Ũ_t(ĉ) + ∇U(ĉ)

    on the step's minibatch ``S_t``, with the full-data gradient ``∇U(ĉ)`` computed once. The energy and the
    mean per-datum score are corrected the same way; the ``n×d`` per-datum scores are not defined (SGFS, which
    draws its diffusion from the minibatch noise, refuses the estimator). Unbiased; for a posterior that
    concentrates around ``ĉ`` its noise shrinks with ``|x - ĉ|`` instead of staying of order ``N²/n`` times
    the per-datum scores' variance.

    :param centre: the flat (unconstrained) centre; ``None`` (default): the chain's start, which the warm-up's
        optimiser puts at an approximate mode.

    **Example** (``U_t(x) = (x - b_t)²/2`` with a noisy ``b_t``: the corrected gradient is exact)::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.gradients import control_variates
        >>> from ppl_sgmcmc.rules import StochasticGradient
        >>> def minibatch_grad_fn(b):
        ...     return lambda x: StochasticGradient(((x - b) ** 2).sum() / 2, x - b, b - x)
        >>> estimator = control_variates()
        >>> def full_grad_fn(x):  # U(x) = x²/2
        ...     return StochasticGradient((x**2).sum() / 2, x, -x)
        >>> state = estimator.init(jnp.array([1.0]), full_grad_fn)
        >>> grad_fn, state = estimator.estimate(state, jnp.array([3.0]), minibatch_grad_fn(jnp.array([0.7])), 0)
        >>> grad_fn(jnp.array([3.0])).grad.tolist()  # ∇U(3) = 3, whatever b_t
        [3.0]
    """
    return GradientEstimator(
        partial(_centre_init, centre), _control_variates_estimate, True, None, "control_variates", centre
    )


def svrg(epoch_length: int | None = None) -> GradientEstimator:
    """Stochastic variance-reduced gradients (Dubey, Reddi, Williamson, Póczos, Smola & Xing, "Variance
    Reduction in Stochastic Gradient Langevin Dynamics", NeurIPS 2016): :func:`control_variates` whose centre
    moves to the chain's position every ``epoch_length`` steps, at the price of a full-data gradient there.

    :param epoch_length: steps between centres, a positive integer, or ``None`` (default): one epoch of the
        largest subsampled plate, ``N/n`` steps. A kernel makes it the nearest multiple or divisor of its
        ``steps_per_sample``: the centre moves between draws, or between equal groups of a draw's steps.

    **Example**::

        >>> from ppl_sgmcmc.gradients import svrg
        >>> svrg().refresh_every, svrg(500).refresh_every, svrg().needs_full_gradient
        (0, 500, True)
        >>> svrg(0)
        Traceback (most recent call last):
            ...
        ValueError: svrg: `epoch_length` must be a positive number of steps (or None for one epoch, N/n steps), got 0.
    """
    if epoch_length is not None and (isinstance(epoch_length, bool) or not isinstance(epoch_length, int)
                                     or epoch_length <= 0):  # fmt: skip
        raise ValueError(
            f"svrg: `epoch_length` must be a positive number of steps (or None for one epoch, N/n steps), got "
            f"{epoch_length!r}."
        )
    every = 0 if epoch_length is None else epoch_length
    return GradientEstimator(partial(_centre_init, None), _control_variates_estimate, True, every, "svrg")


#: The estimators a kernel's ``gradient`` option names.
ESTIMATORS: dict[str, Callable[[], GradientEstimator]] = {
    "minibatch": minibatch,
    "control_variates": control_variates,
    "svrg": svrg,
}


# module-level functions (or functools.partial of them) keep estimators picklable, as Pyro's worker
# processes and checkpoints need
def _no_state(position: Any, full_grad_fn: Any) -> tuple:
    del position, full_grad_fn
    return ()


def _minibatch_estimate(state: Any, position: Any, minibatch_grad_fn: GradFn, step_index: Any) -> tuple[GradFn, Any]:
    del position, step_index
    return minibatch_grad_fn, state


def _centre_init(centre: Any, position: Any, full_grad_fn: GradFn) -> Centre:
    """The centre (``position`` unless one was given, as an array of ``position``'s namespace, dtype and device)
    and the full-data gradient there."""
    if centre is None:
        centre = position
    else:
        centre = array_namespace(position).asarray(centre, dtype=position.dtype, device=device(position))
    full = full_grad_fn(centre)
    return Centre(centre, full.energy, full.grad, full.score)


def _corrected(at_x: StochasticGradient, at_centre: StochasticGradient, centre: Centre) -> StochasticGradient:
    """The control-variate correction of a minibatch gradient at ``x`` by the same minibatch's at the centre."""

    def fix(value: Any, centre_value: Any, full: Any) -> Any:
        return None if value is None or full is None else value - centre_value + full

    return StochasticGradient(
        fix(at_x.energy, at_centre.energy, centre.energy),
        fix(at_x.grad, at_centre.grad, centre.grad),
        fix(at_x.score, at_centre.score, centre.score),
    )


def _control_variates_estimate(
    state: Centre, position: Any, minibatch_grad_fn: GradFn, step_index: Any
) -> tuple[GradFn, Centre]:
    del position, step_index

    def grad_fn(x: Any) -> StochasticGradient:
        return _corrected(minibatch_grad_fn(x), minibatch_grad_fn(state.position), state)

    return grad_fn, state
