"""Health checks of a running chain: the failures a run can show while it runs, and their warnings.

A chain can go wrong without raising: a step-size schedule that turns non-positive or non-finite, a
storm of steps rejected as non-finite, a chain, momentum or thermostat running off to huge values, a step
size too large for the gradient noise (the noise ratio of :mod:`ppl_sgmcmc.noise` above the algorithm's
limit), a chain that stops moving, a preconditioner that changes along the chain faster than the rule allows
(pSGLD's).
The kernels evaluate :func:`check` after every draw (a few reductions, on ``jax.numpy`` or ``torch``
arrays alike) and, when a check fails, the backend turns it into one Python warning per run and kind
(:func:`message`), naming what was seen and the fix. Nothing here changes the chain.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any, NamedTuple

import numpy as np
from array_api_compat import array_namespace, device

#: A run in which more than this fraction of the steps so far was rejected is reported (from
#: :data:`MIN_STEPS` steps on).
REJECTED_FRACTION = 0.5
MIN_STEPS = 100
#: A position or auxiliary variable (momentum, thermostat) beyond this magnitude is reported.
RUNAWAY = 1e8

#: A chain whose position moved by less than this (relative to its magnitude) over at least
#: :data:`FROZEN_STEPS` steps is reported as frozen.
FROZEN_TOLERANCE = 1e-6
FROZEN_STEPS = 128

#: A rule that drops the correction term of a changing preconditioner (pSGLD) is reported when, between two
#: checks after the warm-up, its preconditioner changed by more than this factor along some coordinate.
PRECONDITIONER_CHANGE = 3.0

#: The checks: :func:`check`'s flags, then :func:`update`'s frozen-chain and preconditioner flags.
KINDS = ("step_size", "rejections", "runaway", "noise", "restarts", "frozen", "preconditioner")
#: Kinds whose warning does not name the run's whole failure: the end-of-run verdict still judges the run after them,
#: where any other kind's warning (the draws are not a sample at all) stands for the verdict. A warm-up that ran off
#: and recovered may leave right draws; a noise ratio above the limit biases the draws' spread but says nothing of
#: whether the chains met (on a neural network it fired on runs whose chains had not met, where a smaller step made
#: things worse: the verdict's diagnosis and fixes are the ones that help there).
ADVISORY = frozenset({"restarts", "noise"})
#: The values kept per kind (:class:`HealthState`'s ``values`` columns).
VALUES = ("step_size", "steps", "rejected", "largest", "noise_ratio", "restarts", "since", "preconditioner_change")
#: Kinds that fail only when two checks in a row find them: the noise ratio is a running estimate over
#: :data:`ppl_sgmcmc.noise.HORIZON` steps, and a few minibatches holding a rare feature's rows can lift it above the
#: limit at one check in a run whose draws are right. Until the second check, the kind's ``values`` row holds the last
#: check's values where it failed alone (zeros where it passed).
PERSISTENT = frozenset({"noise"})


def check(
    i: Any,
    num_diverging: Any,
    step_size: Any,
    position: Any,
    rule_state: Any,
    noise_ratio: Any = float("nan"),
    noise_limit: float = float("inf"),
    restarts: Any = 0,
) -> tuple[Any, Any]:
    """The health flags of a chain after ``i`` steps, and the values behind them.

    :param i: the steps taken; ``num_diverging``: how many of them were rejected.
    :param step_size: the step size of the last step.
    :param position: the flat position; ``rule_state``: the rule's state (its array leaves are checked).
    :param noise_ratio: the chain's noise ratio (:mod:`ppl_sgmcmc.noise`; NaN while not measured), reported
        above ``noise_limit``.
    :param restarts: how many times the warm-up returned the chain after it ran off
        (:func:`ppl_sgmcmc.adaptation.ran_off`).
    :return: ``(flags, values)``: boolean flags for :data:`KINDS` but the last and the floats
        ``(step_size, i, num_diverging, largest magnitude, noise ratio, restarts)``, as arrays of the position's
        namespace.

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc import health
        >>> flags, values = health.check(jnp.array(200), jnp.array(150), jnp.array(-0.1), jnp.zeros(2), (), 3.0, 0.5)
        >>> flags.tolist()
        [True, True, False, True, False]
    """
    xp, dtype, dev = array_namespace(position), position.dtype, device(position)
    h = xp.asarray(step_size, dtype=dtype, device=dev)
    steps = xp.asarray(i, dtype=dtype, device=dev)
    rejected = xp.asarray(num_diverging, dtype=dtype, device=dev)
    leaves = [position] + [leaf for leaf in rule_state if leaf is not None and hasattr(leaf, "shape")]
    largest = xp.max(xp.stack([xp.astype(xp.max(xp.abs(xp.reshape(leaf, (-1,)))), dtype) for leaf in leaves if leaf.size]))
    ratio = xp.asarray(noise_ratio, dtype=dtype, device=dev)
    restarted = xp.asarray(restarts, dtype=dtype, device=dev)
    flags = xp.stack(
        [
            ~(h > 0),  # NaN, zero or negative (+inf is SGFS's α = 0)
            (steps >= MIN_STEPS) & (rejected > REJECTED_FRACTION * steps),
            largest > RUNAWAY,
            ratio > noise_limit,  # NaN: not measured
            restarted > 0,
        ]
    )
    return flags, xp.stack([h, steps, rejected, largest, ratio, restarted])


def passed_power_of_two(before: Any, after: Any) -> Any:
    """Whether a step count that went from ``before`` to ``after`` (``after > before >= 0``) passed a power
    of two (``before < 2^k <= after``): the moments at which the backends run :func:`check`, so that it
    costs nothing per step and still runs ``log2`` times in a run.

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.health import passed_power_of_two
        >>> [bool(passed_power_of_two(jnp.array(t - 5), jnp.array(t))) for t in (5, 10, 15, 20, 35)]
        [True, True, False, True, True]
        >>> [bool(passed_power_of_two(t - 1, t)) for t in (5, 6, 8, 9)]
        [False, False, True, False]
    """
    # a power of two lies in (before, after] exactly when `after`'s highest set bit is above `before`'s
    return (after ^ before) > before


#: The checks a compiled run makes between two powers of two of its step count (:func:`passed_check`).
CHECKS_PER_DOUBLING = 16


def passed_check(before: Any, after: Any) -> Any:
    """Whether a step count that went from ``before`` to ``after`` (``after > before >= 0``, below ``2**32``)
    passed a moment of the finer schedule on which the NumPyro kernels run :func:`update` inside a compiled
    run: :data:`CHECKS_PER_DOUBLING` evenly spaced steps in each doubling ``[2^k, 2^(k+1))`` (the multiples of
    ``2^k / 16`` there; every step below 32). Every power of two is one of them. A run is checked about
    ``16 log2`` times, the last check at most a sixteenth of its steps before its end, so that a failure late
    in a run that nothing checks after its end (``numpyro.infer.MCMC``) is still reported.

    **Example**::

        >>> from ppl_sgmcmc.health import passed_check
        >>> [t for t in range(30, 160) if passed_check(t - 1, t)]  # doctest: +NORMALIZE_WHITESPACE
        [30, 31, 32, 34, 36, 38, 40, 42, 44, 46, 48, 50, 52, 54, 56, 58, 60, 62, 64, 68, 72, 76, 80, 84, 88, 92, 96,
         100, 104, 108, 112, 116, 120, 124, 128, 136, 144, 152]
    """
    spacing = (before // CHECKS_PER_DOUBLING) | 1
    for shift in (1, 2, 4, 8, 16):  # the highest set bit of `spacing`, smeared down, then isolated
        spacing = spacing | (spacing >> shift)
    spacing = spacing - (spacing >> 1)
    return after // spacing > before // spacing


class HealthState(NamedTuple):
    """What a chain's checks found so far: ``flags`` (booleans for :data:`KINDS`, each set once a check
    fails), ``values`` (one row per kind: the :data:`VALUES` behind it when its check first failed),
    ``anchor``/``anchor_step``, the position at the previous check and its step (to see a frozen chain), and
    ``low``/``high``, the elementwise range since the previous check of the array through which a rule's
    preconditioner changes (pSGLD's ``V``; ``None`` for a rule whose preconditioner does not change: see
    :func:`track`). The NumPyro kernels keep it in their state, so that a compiled run needs no host callback
    (which would slow every call of a compiled step); the host reports it (:class:`Reporter`)."""

    flags: Any
    values: Any
    anchor: Any
    anchor_step: Any
    low: Any = None
    high: Any = None


def init(like: Any, tracked: Any = None) -> HealthState:
    """No failure seen, anchored at the chain's start ``like`` (its namespace and dtype); with ``tracked`` (the
    array a changing preconditioner depends on), an empty range for :func:`track`.

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc import health
        >>> health.init(jnp.zeros(3)).flags.tolist()
        [False, False, False, False, False, False, False]
    """
    xp, dev = array_namespace(like), device(like)
    low = high = None
    if tracked is not None:
        low, high = _empty_range(tracked)
    return HealthState(
        xp.zeros((len(KINDS),), dtype=xp.bool, device=dev),
        xp.zeros((len(KINDS), len(VALUES)), dtype=like.dtype, device=dev),
        like,
        xp.zeros((), dtype=like.dtype, device=dev),
        low,
        high,
    )


def _empty_range(like: Any) -> tuple[Any, Any]:
    xp = array_namespace(like)
    return xp.full_like(like, float("inf")), xp.full_like(like, -float("inf"))


def track(state: HealthState, tracked: Any) -> HealthState:
    """``state`` with ``tracked`` (this step's value of the array a changing preconditioner depends on) added to
    its range ``[low, high]``: two elementwise extrema per step, for a rule whose preconditioner changes along
    the chain (:meth:`~ppl_sgmcmc.algorithms.Algorithm._changing_preconditioner`).

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc import health
        >>> state = health.init(jnp.zeros(2), tracked=jnp.zeros(2))
        >>> for v in ([1.0, 4.0], [2.0, 3.0]):
        ...     state = health.track(state, jnp.array(v))
        >>> state.low.tolist(), state.high.tolist()
        ([1.0, 3.0], [2.0, 4.0])
    """
    xp = array_namespace(tracked)
    return state._replace(low=xp.minimum(state.low, tracked), high=xp.maximum(state.high, tracked))


def update(
    state: HealthState,
    i: Any,
    num_diverging: Any,
    step_size: Any,
    position: Any,
    rule_state: Any,
    noise_ratio: Any = float("nan"),
    noise_limit: float = float("inf"),
    restarts: Any = 0,
    preconditioner_change: Any = float("nan"),
    new_window: Any = True,
    exploring: Any = False,
) -> HealthState:
    """``state`` after the checks of :func:`check` at step ``i``, the frozen-chain check (the position
    moved by less than :data:`FROZEN_TOLERANCE` relative to its magnitude since the anchor, at least
    :data:`FROZEN_STEPS` steps ago; not where ``exploring``: a cyclical kernel's exploration stage is an optimiser's
    descent, which may settle at a mode exactly) and the preconditioner check (``preconditioner_change``, the largest
    factor by which a rule's changing preconditioner changed since the anchor, above
    :data:`PRECONDITIONER_CHANGE`; NaN: not measured): failed checks are added to ``flags`` (those of
    :data:`PERSISTENT` kinds when the previous check failed too), each kind's row of ``values`` is kept from its first
    failure and, with ``new_window`` (a bool, or a boolean array), the anchor
    moves to this check and the tracked range starts again. Checks between two windows' ends (those of
    :func:`passed_check` that are not powers of two) leave the window as it is, so that the frozen-chain and
    preconditioner checks still compare over the steps since the last power of two.

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc import health
        >>> state = health.update(health.init(jnp.ones(2)), 200, 150, 0.1, jnp.ones(2), ())
        >>> state.flags.tolist()  # most steps rejected, and the chain did not move
        [False, True, False, False, False, True, False]
        >>> state.values[1].tolist()  # the rejections' values
        [0.10000000149011612, 200.0, 150.0, 1.0, nan, 0.0, 200.0, nan]
    """
    xp = array_namespace(position)
    flags, values = check(i, num_diverging, step_size, position, rule_state, noise_ratio, noise_limit, restarts)
    steps = xp.asarray(i, dtype=position.dtype, device=device(position))
    since = steps - state.anchor_step
    moved = xp.max(xp.abs(position - state.anchor))
    frozen = (since >= FROZEN_STEPS) & (moved <= FROZEN_TOLERANCE * (1 + xp.max(xp.abs(state.anchor))))
    frozen = frozen & ~xp.asarray(exploring, dtype=xp.bool, device=device(position))
    change = xp.asarray(preconditioner_change, dtype=position.dtype, device=device(position))
    failing = xp.concat([flags, xp.stack([frozen, change > PRECONDITIONER_CHANGE])])
    values = xp.broadcast_to(xp.concat([values, xp.stack([since, change])]), state.values.shape)
    persistent = xp.asarray([kind in PERSISTENT for kind in KINDS], device=device(position))
    open_ = persistent & ~state.flags  # a persistent kind not reported yet: its row holds the last check's failure
    # (its `steps`: positive where it failed, and before this check: a state checked twice is one check)
    flags = failing & (~persistent | ((state.values[:, 1] > 0) & (state.values[:, 1] < steps)))
    first = flags & ~state.flags  # the kinds failing for the first time keep this check's values
    values = xp.where((first | (open_ & failing))[:, None], values,
                      xp.where(open_[:, None], xp.zeros_like(values), state.values))  # fmt: skip
    if new_window is True:
        low, high = (None, None) if state.low is None else _empty_range(state.low)
        return HealthState(state.flags | flags, values, position, steps, low, high)
    new = xp.asarray(new_window, device=device(position))
    low, high = state.low, state.high
    if low is not None:
        empty_low, empty_high = _empty_range(low)
        low, high = xp.where(new, empty_low, low), xp.where(new, empty_high, high)
    anchor, anchor_step = xp.where(new, position, state.anchor), xp.where(new, steps, state.anchor_step)
    return HealthState(state.flags | flags, values, anchor, anchor_step, low, high)


#: Said with the failures a step size too large for the model's own coordinates causes.
_TUNED_HINT = (
    " (A `step_size` recorded by a run that tuned it is a step size in the coordinates of that run's preconditioner: "
    "give it with the preconditioner, `**kernel.tuned_options(state)`.)"
)


#: How the gradient noise biases a chain whose rule does not absorb it (Langevin dynamics, SGHMC): the noise-ratio
#: warning's diagnosis, unless the algorithm gives its own (:attr:`~ppl_sgmcmc.algorithms.Algorithm.noise_bias`).
_NOISE_BIAS = (
    "spread wider than the posterior along the noisiest directions and, where the chain left the region in which its "
    "step was tuned (a neural network's curvature and noise change along the chain), possibly too narrow elsewhere"
)


def message(
    kernel: str, kind: str, values: Any, tuned: bool = False, reducible: bool = False, step_fix: str | None = None,
    noise_bias: str | None = None,
) -> str:
    """The warning for a failed check ``kind`` with the ``values`` of :func:`check` (``tuned``: the warm-up chose the
    step size; ``reducible``: the kernel uses the plain minibatch gradient of a model with subsampled plates, so that
    a variance-reduced estimator of :mod:`ppl_sgmcmc.gradients` could remove its noise; ``step_fix``: how the kernel
    takes a smaller step, where that is not a smaller ``step_size``
    (:attr:`~ppl_sgmcmc.algorithms.Algorithm.step_fix`); all change the fix; ``noise_bias``: how the noise biases this
    kernel's draws, where not as it biases a Langevin or SGHMC chain's (:attr:`~ppl_sgmcmc.algorithms.Algorithm.noise_bias`)).

    **Example**::

        >>> from ppl_sgmcmc import health
        >>> print(health.message("SGLD", "rejections", [1e-3, 200, 150, 1.0, 0.1, 0, 72, float("nan")]))
        SGLD: 150 of the first 200 steps were rejected as non-finite ...
    """
    h, steps, rejected, largest, ratio, restarts, since, change = (float(v) for v in values)
    if kind == "step_size":
        return (
            f"{kernel}: the step size reached h = {h:g} by step {int(steps)}; steps with a non-positive or NaN "
            "step size are rejected, so the chain stands still. Fix the `step_size` schedule (it must stay "
            "positive for every step of the run, warm-up included)."
        )
    # a kernel whose smaller step is not a smaller step size (SGFS's `alpha`) names its own fix, and no step size
    too_large = "step size is probably too large" if step_fix is None else "step is probably too large"
    hint = _TUNED_HINT if step_fix is None else ""
    if kind == "rejections":
        return (
            f"{kernel}: {int(rejected)} of the first {int(steps)} steps were rejected as non-finite "
            f"({rejected / max(steps, 1):.0%}); the draws are not a sample of the posterior. The {too_large} for the "
            f"model's curvature or gradient noise ({step_fix or 'try 10x smaller'}), or the chain starts in or "
            "reaches a region where the model is undefined (check the initial values)." + hint
        )
    if kind == "runaway":
        smaller = "Reduce the step size" if step_fix is None else f"Take a smaller step: {step_fix}"
        return (
            f"{kernel}: after {int(steps)} steps the chain's position, momentum or thermostat reached a magnitude "
            f"of {largest:.3g} (over {RUNAWAY:g}): the chain is diverging. {smaller}; for SGNHT also "
            "check that the warm-up lets the thermostat settle." + hint
        )
    if kind == "noise":
        fix = (
            "Ask the warm-up for a smaller step: a `target_noise_ratio` below the kernel's default (the step size "
            "falls in proportion), or a longer warm-up where the chain still travels at its end"
            if tuned
            else "Use a smaller step size, or leave `step_size` unset for the warm-up to choose it"
        )
        if reducible:  # the noise itself can go, where a smaller step only trades bias for mixing
            fix = (
                "Remove most of the noise with a variance-reduced gradient, `gradient=\"svrg\"` (two minibatch "
                "gradients a step and a full-data one per epoch; see the user guide's 'Gradient estimators'), or "
                + fix[0].lower()
                + fix[1:]
            )
        return (
            f"{kernel}: after {int(steps)} steps the noise ratio is {ratio:.3g} at h = {h:g}, at two checks in a "
            f"row: the stochastic gradient's noise (with the discretisation's error) adds about {ratio:.3g} times the "
            f"variance the kernel injects (ppl_sgmcmc.noise), so the draws are probably biased: {noise_bias or _NOISE_BIAS}. "
            f"{fix}; a larger `subsample_size` also helps. Read it with the chains' agreement (r_hat, the end-of-run "
            "verdict): chains that have not met are a failure of their own, which a smaller step does not fix."
            + ("" if tuned else _TUNED_HINT)
        )
    if kind == "restarts":
        return (
            f"{kernel}: during the warm-up the chain ran off {int(restarts)} time(s) (its minibatch energy rose by "
            "orders of magnitude in a few steps) and was returned to its last window's position with the step size "
            f"divided by 4 (now h = {h:g}): the posterior's curvature varies more than the chain's start showed (a "
            "neural network's often does). The draws are usable, but check that the chains agree (r_hat) and that "
            "the noise ratio in sample_stats stays small; `dense_mass=True` or a longer warm-up may help."
        )
    if kind == "frozen":
        return (
            f"{kernel}: the chain has not moved in the {int(since)} steps before step {int(steps)} (its position "
            f"changed by less than {FROZEN_TOLERANCE:g} of its magnitude): the draws are one point, not a sample. "
            "A thermostat or friction grown huge, a step size far too small, or every step rejected freezes a "
            "chain: check `rule_state.thermostat`, the step size and `num_diverging`, and the initial values."
        )
    if kind == "preconditioner":
        return (
            f"{kernel}: in the {int(since)} steps before step {int(steps)} its preconditioner changed by a factor of "
            f"{change:.3g} along some coordinate (over {PRECONDITIONER_CHANGE:g}): the rule drops the correction "
            "term of a changing preconditioner, which is small only while it changes slowly, so the draws are "
            "probably biased along those coordinates: a coordinate whose gradient comes in rare large kicks (a rare "
            "feature's weight) or whose curvature changes along the chain (a neural network's) gets steps too large "
            "just after a kick and too small between them. Use SGLD or SGHMC, whose warm-up preconditioner is "
            "fixed after the warm-up, or make the preconditioner change more slowly (`alpha=0.999`, or a larger "
            "`eps`)."
        )
    raise ValueError(f"unknown health check {kind!r}")


class Reporter:
    """Warns once per run and kind: the backends call :meth:`report` with the flags of :func:`check` and
    :meth:`reset` when a run starts.

    **Example**::

        >>> import warnings
        >>> from ppl_sgmcmc.health import Reporter
        >>> reporter = Reporter("SGLD")
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     for _ in range(3):
        ...         reporter.report([False, True] + [False] * 5, [[1e-3, 200, 150, 1.0, 0.1, 0, 72, 1.0]] * 7)
        >>> len(caught)
        1
    """

    def __init__(self, kernel: str, tuned: bool = False, reducible: bool = False, step_fix: str | None = None,
                 noise_bias: str | None = None) -> None:  # fmt: skip
        # `tuned`: the warm-up chooses the step size; `reducible`: a variance-reduced gradient could serve; `step_fix`:
        # how to take a smaller step where that is not a smaller step size; `noise_bias`: the kernel's (`message`)
        self.kernel, self.tuned, self.reducible, self.step_fix = kernel, tuned, reducible, step_fix
        self.noise_bias = noise_bias
        self.reported: set[str] = set()

    def reset(self) -> None:
        """Forget what was reported: a new run warns again."""
        self.reported = set()

    @property
    def named_failure(self) -> bool:
        """Whether a warning of this run named its failure (a kind not in :data:`ADVISORY`): the end-of-run verdict
        then stays silent, since it would say less."""
        return bool(self.reported - ADVISORY)

    def report(self, flags: Any, values: Any) -> None:
        """Warn for each failed check not yet reported in this run (``flags``, ``values``: a
        :class:`HealthState`'s, with or without a leading chain axis; see :func:`failures`)."""
        caller = sys._getframe(1)
        advice = (self.tuned, self.reducible, self.step_fix, self.noise_bias)
        for kind, text in failures(self.kernel, flags, values, *advice).items():
            if kind not in self.reported:
                # not `warnings.warn`: its registry shows a text once per code location, so a later run that fails
                # the same way would be silent; once per run and kind is decided here (filters still apply)
                warnings.warn_explicit(
                    text, RuntimeWarning, caller.f_code.co_filename, caller.f_lineno,
                    module=caller.f_globals.get("__name__"), registry=None, module_globals=caller.f_globals,
                )  # fmt: skip
                self.reported.add(kind)  # after the warning: one a filter raised as an error is raised again


def failures(
    kernel: str, flags: Any, values: Any, tuned: bool = False, reducible: bool = False, step_fix: str | None = None,
    noise_bias: str | None = None,
) -> dict[str, str]:
    """``{kind: message}`` for the failed checks of a :class:`HealthState`'s ``flags`` and ``values``; with a
    leading chain axis, each kind's message gives the values of the first chain in which it failed (``tuned``,
    ``reducible``, ``step_fix``, ``noise_bias``: see :func:`message`).

    **Example** (two chains: the second rejected most of its steps)::

        >>> import numpy as np
        >>> from ppl_sgmcmc import health
        >>> flags = np.zeros((2, len(health.KINDS)), bool)
        >>> flags[1, 1] = True
        >>> values = np.zeros((2, len(health.KINDS), len(health.VALUES)))
        >>> values[1, 1] = [1e-3, 200, 150, 1.0, 0.1, 0, 72, 1.0]
        >>> for kind, text in health.failures("SGLD", flags, values).items():
        ...     print(kind, "|", text)
        rejections | SGLD: 150 of the first 200 steps were rejected as non-finite (75%); ...
    """
    flags, values = np.asarray(flags, bool), np.asarray(values)
    if flags.ndim == 2:  # chains: per kind, the first chain in which it failed
        first = np.argmax(flags, axis=0)
        flags, values = flags.any(axis=0), values[first, np.arange(len(KINDS))]
    return {
        kind: message(kernel, kind, row, tuned, reducible, step_fix, noise_bias)
        for kind, flag, row in zip(KINDS, flags, values)
        if flag
    }
