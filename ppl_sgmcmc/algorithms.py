"""The SG-MCMC algorithms, each defined once for both backends.

An algorithm here is everything about a sampler that does not depend on the PPL: its constructor's
signature and argument checks, its update rule (a module of :mod:`ppl_sgmcmc.rules`, which declares
what it needs from the gradient in ``NEEDS``), which hyper-parameters may follow a schedule, what it
does with the warm-up, what it checks on the model, which per-draw statistics it records and its
progress line. The NumPyro and Pyro kernels are one line each, the algorithm mixed into the
backend's base class, which adds only what differs between the PPLs (tracing, log density, keys or
generators, compilation, the MCMC driver's protocol)::

    class SGNHT(algorithms.SGNHT, SGMCMCKernel):   # ppl_sgmcmc/numpyro/kernels.py
        ...

The algorithm pages of the documentation derive each update rule; the developer guide shows how to
add an algorithm (one rule module, one class here, one line per backend).
"""

from __future__ import annotations

import functools
import inspect
import math
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar, Generic, NamedTuple, cast

import numpy as np
from array_api_compat import array_namespace, device

from ppl_sgmcmc import _checks, adaptation, gradients, low_rank, noise, schedules
from ppl_sgmcmc.rules import StochasticGradient, has_momentum, refresh_momentum
from ppl_sgmcmc.rules import csgld as csgld_rule
from ppl_sgmcmc.rules import psgld as psgld_rule
from ppl_sgmcmc.rules import recipe as recipe_rule
from ppl_sgmcmc.rules import replica as replica_rule
from ppl_sgmcmc.rules import santa as santa_rule
from ppl_sgmcmc.rules import sgfs as sgfs_rule
from ppl_sgmcmc.rules import sghmc as sghmc_rule
from ppl_sgmcmc.rules import sgld as sgld_rule
from ppl_sgmcmc.rules import sgnht as sgnht_rule
from ppl_sgmcmc.rules import sgrld as sgrld_rule
from ppl_sgmcmc.rules._types import (
    Array,
    ChainState,
    Flag,
    GradFn,
    RuleModule,
    RuleStateT,
    Scalar,
    Schedule,
    StepIndex,
    Target,
)

if TYPE_CHECKING:
    from ppl_sgmcmc.health import HealthState
    from ppl_sgmcmc.noise import NoiseState

#: The adaptation state a chain carries: :class:`~ppl_sgmcmc.adaptation.AdaptState`, or
#: :class:`~ppl_sgmcmc.adaptation.NoAdaptation` when its warm-up adapts nothing.
AdaptationState = adaptation.AdaptState | adaptation.NoAdaptation

__all__ = [
    "CSGHMC",
    "CSGLD",
    "FIND_MODE_STEPS",
    "INTEGRATORS",
    "MAX_DENSE_DIM",
    "PSGLD",
    "ReSGHMC",
    "ReSGLD",
    "Recipe",
    "ReplicaFields",
    "SGFS",
    "SGHMC",
    "SGLD",
    "SGNHT",
    "SGRLD",
    "Santa",
    "Algorithm",
    "ContourFields",
    "Cycles",
    "EXPLORATION_FRACTION",
    "GibbsOptions",
]

INTEGRATORS = ("splitting", "euler")  # SGHMC's, SGNHT's and CSGHMC's momentum integrators

#: The optimiser steps of ``find_mode=True``.
FIND_MODE_STEPS = 1000
#: The most latent coordinates a dense preconditioner (``dense_mass=True``) accepts.
MAX_DENSE_DIM = 5000
#: With ``dense_mass=None`` (the default), the preconditioner is dense up to this many latent coordinates and
#: diagonal beyond: a dense metric mixes along correlated directions that a diagonal one crosses slowly, and costs
#: three ``d × d`` matrix-vector products a step, which stay cheap against a minibatch gradient up to about here.
AUTO_DENSE_MAX = 256
#: The ``dense_mass`` value that asks for a low-rank-plus-diagonal preconditioner (:mod:`ppl_sgmcmc.low_rank`).
LOW_RANK = "low_rank"


class GibbsOptions(NamedTuple):
    """A kernel's local Gibbs sites, checked (see the user guide's "Local Gibbs sites" page).

    - **sites**: the names of the local latent sites inside the subsampled plate.
    - **fn**: one conditional sweep of those sites for the minibatch.
    - **sweeps**: ``(burn_in, kept)`` sweeps per stochastic gradient.
    - **init**: the sweeps' starting point from the prior draw, or ``None``.

    **Example**::

        >>> from ppl_sgmcmc.algorithms import GibbsOptions
        >>> GibbsOptions(sites=("z",), fn=print, sweeps=(5, 5), init=None).sweeps
        (5, 5)
    """

    sites: tuple[str, ...]
    fn: Callable[..., Any]
    sweeps: tuple[int, int]
    init: Callable[..., Any] | None


#: The default fraction ``β`` of a cycle that explores (:class:`Cycles`).
EXPLORATION_FRACTION = 0.5


class Cycles(NamedTuple):
    """The cycles of cyclical SG-MCMC (Zhang, Li, Zhang, Chen & Wilson, "Cyclical Stochastic Gradient MCMC for
    Bayesian Deep Learning", ICLR 2020), a kernel's ``cycle_length`` and ``exploration_fraction``, in draws.

    After a warm-up of ``W`` steps, the steps run in cycles of ``L k`` steps (``L = length`` draws of ``k =
    steps_per_sample`` steps). At step ``i >= W``, with ``r = mod(i - W, L k) / (L k)`` the position in its cycle
    and ``h`` the tuned step size (or the given one), the step size is the cosine cycle's::

        h_i = h (cos(π r) + 1) / 2

    so ``h`` is the cycle's peak. The first ``exploration`` draws of a cycle (``β L`` rounded, ``r < exploration /
    L``) are its **exploration stage**: the rule runs without injected noise (``ζ = 0``: SGLD is then gradient
    descent, SGHMC gradient descent with momentum, as in the paper's Algorithm 1), moving fast to a mode; the rest
    is its **sampling stage**, the sampler's own step, whose draws are the posterior draws. The warm-up runs the
    sampler with its tuned step size, before the first cycle. Each draw lies in one stage.

    - **length**: the draws per cycle, ``L``.
    - **exploration**: the exploring draws at the start of each cycle, ``0 <= exploration < length``.

    **Example** (cycles of 10 draws of 2 steps after a warm-up of 4 steps, 3 draws exploring)::

        >>> from ppl_sgmcmc.algorithms import Cycles
        >>> cycles = Cycles.of(10, 0.3, 0.1, True, "SGLD")
        >>> cycles
        Cycles(length=10, exploration=3)
        >>> [cycles.sampling(i, 4, 2) for i in (3, 4, 9, 10, 23, 24)]
        [True, False, False, True, True, False]
        >>> [round(cycles.factor(i, 4, 2), 3) for i in (3, 4, 14, 23)]
        [1.0, 1.0, 0.5, 0.006]
    """

    length: int
    exploration: int

    @classmethod
    def of(cls, length: int | None, fraction: float | None, step_size: object, samples_posterior: bool,
           kernel: str) -> Cycles | None:  # fmt: skip
        """A kernel's cycles from its ``cycle_length`` and ``exploration_fraction`` (checked; ``None`` without a
        ``cycle_length``)."""
        if length is None:
            if fraction is not None:
                raise ValueError(f"{kernel}: `exploration_fraction` is the fraction of each cycle that explores; give "
                                 "`cycle_length` (the draws per cycle) too, or leave it unset.")  # fmt: skip
            return None
        if not samples_posterior:
            raise ValueError(f"{kernel}: `cycle_length` alternates exploration and sampling stages, but {kernel} is an "
                             "optimiser (its draws anneal to a mode), which has no sampling stage.")  # fmt: skip
        if callable(step_size):
            raise ValueError(
                f"{kernel}: `cycle_length` sets the step size along each cycle (the cosine cycle from its peak); give "
                "the peak as a number, or step_size=None to use the tuned step size as the peak, not a schedule."
            )
        length = _checks.positive_int("cycle_length", length, kernel)
        fraction = EXPLORATION_FRACTION if fraction is None else fraction
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 <= fraction < 1:
            raise ValueError(f"{kernel}: `exploration_fraction` must be a number in [0, 1), got {fraction!r}.")
        exploration = round(fraction * length)
        if exploration >= length:
            raise ValueError(
                f"{kernel}: exploration_fraction={fraction} of cycle_length={length} draws leaves no sampling draw in a "
                f"cycle; lengthen the cycle or lower the fraction."
            )
        return cls(length, exploration)

    def sampling(self, i: StepIndex | np.ndarray, warmup_steps: int, steps_per_sample: int) -> Flag | np.ndarray:
        """Whether step ``i`` (0-based, warm-up included; an int or an integer array) runs with noise: a warm-up or
        sampling-stage step. A bool for an int, a boolean array for an array."""
        steps = self.length * steps_per_sample
        return (i < warmup_steps) | ((i - warmup_steps) % steps >= self.exploration * steps_per_sample)

    def factor(self, i: StepIndex, warmup_steps: int, steps_per_sample: int) -> Scalar:
        """Step ``i``'s step size over the peak: ``(cos(π r) + 1)/2``
        (:func:`ppl_sgmcmc.schedules.cosine_cycle`), 1 in the warm-up."""
        steps = self.length * steps_per_sample
        if isinstance(i, int):
            return 1.0 if i < warmup_steps else schedules.cosine_cycle(((i - warmup_steps) % steps) / steps)
        xp = array_namespace(i)
        r = ((i - warmup_steps) % steps) / steps
        factor: Array = xp.where(i < warmup_steps, 1.0, schedules.cosine_cycle(r, xp))
        return factor


@functools.cache
def _parameters(fn: Callable[..., Any]) -> frozenset[str] | None:
    """The keyword names ``fn`` accepts (``None``: any, it takes ``**kwargs``)."""
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return frozenset(p.name for p in params)


def call_kwargs(fn: Callable[..., Any], options: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of ``options`` that ``fn`` takes as arguments: a rule's ``init`` and ``step`` receive
    only the hyper-parameters they declare.

    **Example**::

        >>> from ppl_sgmcmc.algorithms import call_kwargs
        >>> from ppl_sgmcmc.rules import sgld
        >>> call_kwargs(sgld.step, {"temperature": 2.0, "friction": 1.0, "step_index": 3})
        {'temperature': 2.0}
    """
    names = _parameters(fn)
    return dict(options) if names is None else {k: v for k, v in options.items() if k in names}


def _low_rank_option(dense_mass: object, available: bool, kernel: str) -> bool:
    """Whether ``dense_mass`` asks for a low-rank-plus-diagonal preconditioner (:data:`LOW_RANK`); another string,
    or the request from an algorithm without one, is refused."""
    if not isinstance(dense_mass, str):
        return False
    if dense_mass != LOW_RANK:
        raise TypeError(
            f"{kernel}: `dense_mass` must be True or False (a dense or a diagonal metric), {LOW_RANK!r} (a diagonal "
            f"plus a low-rank correction) or None (chosen by the dimension), got {dense_mass!r}."
        )
    if not available:
        raise ValueError(
            f"{kernel}: dense_mass={LOW_RANK!r} is available for SGLD, SGHMC and SGNHT; use dense_mass=True or False."
        )
    return True


def _given_preconditioner(
    value: object, step_size: object, adapt_mass_matrix: bool | None, dense_mass: bool | str | None, can_adapt: bool,
    reason: str, kernel: str,
) -> adaptation.Preconditioner | None:  # fmt: skip
    """The fixed preconditioner of ``inverse_mass_matrix`` (NumPy float64 arrays), or ``None``: a
    :class:`~ppl_sgmcmc.adaptation.Preconditioner` (a run's ``adapt_state.preconditioner``, of one chain), or ``Σ``,
    a vector of positive variances or a symmetric positive-definite matrix."""
    if value is None:
        return None
    if not can_adapt:
        raise ValueError(f"{kernel}: `inverse_mass_matrix` is not available: {reason}")
    if step_size is None:
        raise ValueError(
            f"{kernel}: `inverse_mass_matrix` fixes the preconditioner, and the step size goes with it: give the "
            "`step_size` of its coordinates too (a tuned run's `step_size`; `kernel.tuned_options(state)` gives both)."
        )
    if adapt_mass_matrix or dense_mass is not None:
        raise ValueError(
            f"{kernel}: `inverse_mass_matrix` fixes the preconditioner and its form; leave `adapt_mass_matrix` and "
            "`dense_mass` unset."
        )

    def numpy(x: Any) -> np.ndarray:
        x = x.detach().cpu() if hasattr(x, "detach") else x
        return np.asarray(x, dtype=np.float64)

    if hasattr(value, "scale") and hasattr(value, "inverse"):
        scale, inverse = numpy(value.scale), numpy(value.inverse)
        # one chain's: a diagonal (d,) or a square (d, d), with its inverse (a loose test: it tells a stack of
        # chains' diagonals (C, d), which vectorized chains keep, from a dense (d, d))
        square = scale.ndim == 2 and scale.shape[0] == scale.shape[1]
        packed = scale.ndim == 3 and scale.shape[0] == 2  # low-rank plus diagonal (ppl_sgmcmc.low_rank)
        one = scale.shape == inverse.shape and (scale.ndim == 1 or square or packed)
        if one and packed:
            probe = np.linspace(-1.0, 1.0, scale.shape[1])
            round_trip = low_rank.apply(cast(Any, inverse), low_rank.apply(cast(Any, scale), cast(Any, probe)))
            one = bool(np.allclose(round_trip, probe, atol=0.1))
        elif one:
            product = scale @ inverse if square else scale * inverse
            one = bool(np.allclose(product, np.eye(len(scale)) if square else 1.0, atol=0.1))
        if not one:
            raise ValueError(
                f"{kernel}: `inverse_mass_matrix` is not the preconditioner of one chain (scale of shape "
                f"{scale.shape}, inverse of shape {inverse.shape}, not inverses of each other); a state of several "
                "vectorized chains holds one per chain: take one, e.g. `kernel.tuned_options(state, chain=0)`."
            )
        return adaptation.Preconditioner(cast(Any, scale), cast(Any, inverse))
    cov = _checks.positive_definite("inverse_mass_matrix", value, kernel)
    if cov.ndim == 0:
        raise ValueError(
            f"{kernel}: `inverse_mass_matrix` must be a vector of the d variances or a d×d covariance of the "
            f"unconstrained latents, got a scalar {float(cov)!r}."
        )
    return adaptation.from_covariance(cov)


class Algorithm(Generic[RuleStateT]):
    """What every algorithm shares: the sampler's common arguments, checked, and the hooks through
    which the backends' base classes run it.

    :param model: a model (NumPyro or Pyro, by backend); its plates with ``subsample_size`` set are
        subsampled.
    :param potential_fn: instead of a model, an energy ``potential_fn(z)``, or a stochastic estimate
        ``potential_fn(z, rng)`` (``rng``: a JAX key or the chain's ``torch.Generator``).
    :param step_size: ``h``: a positive float, or a schedule ``t -> h_t`` of the 0-based step index ``t``
        (warm-up included; see :mod:`ppl_sgmcmc.schedules`), or ``None`` (default): the warm-up chooses it
        from the gradient noise it measures, aiming at ``target_noise_ratio`` (see the user guide's
        "Warm-up and tuning"). A given step size switches the tuning off.
    :param temperature: ``τ``; the target is ``exp(-U/τ)``. A positive float or a schedule of ``t``.
    :param replace: draw minibatch indices with replacement (default), or reshuffle each epoch.
    :param steps_per_sample: SG-MCMC steps per draw that ``MCMC`` counts (default 1): with ``k`` here,
        ``k (W + S)`` steps are taken and every ``k``-th state kept. It amortises the drivers' per-draw
        cost (progress bar, copying the sample).
    :param init_strategy: the PPL's init strategy (default: its ``init_to_uniform``).
    :param gibbs_sites: names of local latent sites inside the subsampled plate that ``gibbs_fn``
        updates for each minibatch; the stochastic gradient then averages the log joint's gradient
        over their sweeps (Fisher identity). See the user guide's "Local Gibbs sites".
    :param gibbs_fn: ``gibbs_fn(rng, gibbs_sites, hmc_sites, subsample_indices) -> gibbs_sites``, one
        conditional sweep of the local sites of the minibatch (data by closure, as for ``HMCGibbs``).
    :param gibbs_sweeps: ``(burn_in, kept)`` sweeps per gradient (default ``(5, 5)``).
    :param gibbs_init: optional ``gibbs_init(rng, gibbs_sites, hmc_sites, subsample_indices)`` giving the
        sweeps' starting point from the local sites' prior draw.
    :param find_mode: before sampling, move the chain from the init strategy's point to an approximate mode
        of the posterior with an optimiser (Adam, a cosine-decaying learning rate) on the same minibatch
        potential: ``True`` (:data:`FIND_MODE_STEPS` steps), a number of steps, or ``False``. Default: on when
        the step size is tuned. The optimiser runs when the chain starts, in addition to the warm-up.
    :param adapt_mass_matrix: adapt a preconditioner (a mass matrix): the Laplace approximation ``Σ = H⁻¹``
        at the chain's start (its Hessian ``H``, over the data in chunks), refined in windows of the warm-up
        by the variances of the draws (:mod:`ppl_sgmcmc.adaptation`). The rule runs in the coordinates
        ``u = L⁻¹ θ`` (``L Lᵀ = Σ``): SGLD is then the Langevin dynamics preconditioned by ``Σ``, SGHMC and
        SGNHT the dynamics with mass matrix ``Σ⁻¹``; the target is unchanged. Frozen after the warm-up, so
        the post-warm-up chain is a fixed Markov kernel. Default: on when the step size is tuned (which
        needs it). Needs at least :func:`~ppl_sgmcmc.adaptation.minimum_warmup_steps` warm-up steps.
    :param dense_mass: a dense ``Σ`` (``True``) or a diagonal one (``False``), as NumPyro's NUTS, or
        ``"low_rank"``: a diagonal plus a low-rank correction estimated from the slow windows' draws and gradients
        (:mod:`ppl_sgmcmc.low_rank`; SGLD, SGHMC and SGNHT). ``None`` (default): dense for at most
        :data:`AUTO_DENSE_MAX` latent coordinates, diagonal beyond.
    :param inverse_mass_matrix: a fixed preconditioner instead of an adapted one, as NUTS takes it: a run's
        ``adapt_state.preconditioner`` (:class:`~ppl_sgmcmc.adaptation.Preconditioner`; the whole of it is
        :meth:`tuned_options`), or ``Σ`` itself, a ``(d,)`` vector of variances or a ``(d, d)`` covariance of the
        unconstrained latents. The rule runs in its coordinates ``u = L⁻¹ θ`` with the given ``step_size``,
        which is a step size in those coordinates: a tuned run's ``step_size`` with its preconditioner
        reproduces that run's kernel. Nothing adapts in the warm-up.
    :param target_noise_ratio: the noise ratio (:mod:`ppl_sgmcmc.noise`) the tuned step size aims at; the
        default is the algorithm's (:attr:`default_noise_ratio`). Smaller values mean less bias and slower
        mixing.
    :param gradient: the gradient estimator (:mod:`ppl_sgmcmc.gradients`): ``"minibatch"``,
        ``"control_variates"`` (around the chain's start, which ``find_mode`` then puts at an approximate mode),
        ``"svrg"`` (the centre moved every epoch), or an estimator such as
        ``ppl_sgmcmc.gradients.control_variates(centre=...)`` or ``svrg(epoch_length=...)``. The variance-reduced
        estimators need a model with subsampled plates and cost two minibatch gradients per step and a
        full-data gradient per centre; the noise they remove lets the tuned step size grow. ``None`` (default):
        the algorithm's :attr:`tuned_gradient` when the step size is tuned and the model allows a variance-reduced
        estimator (subsampled plates over data on the device, no local Gibbs sites), else ``"minibatch"``.
    :param cycle_length: run in the cycles of cyclical SG-MCMC (Zhang, Li, Zhang, Chen & Wilson, "Cyclical
        Stochastic Gradient MCMC for Bayesian Deep Learning", ICLR 2020) after the warm-up, each of
        ``cycle_length`` draws (of ``steps_per_sample`` steps); ``None`` (default): no cycles. See :class:`Cycles`
        for the step size and the stages; only the sampling stages' draws are posterior draws. The kernel records
        each draw's step count ``i`` (``sample_stats``), which tells its stage (:meth:`sampling_stage`):
        ``ppl_sgmcmc.numpyro.MCMC`` and both backends' ``to_inference_data`` keep only the sampling stages' draws;
        a ``numpyro.infer.MCMC`` or ``pyro.infer.MCMC`` run, whose draws include the exploration stages', warns so.
    :param exploration_fraction: ``β ∈ [0, 1)``, the fraction of each cycle that explores (no injected noise),
        rounded to whole draws (default 0.5); only with ``cycle_length``.
    :param max_warmup: the longest warm-up, in draws, that the adapting warm-up may run to (default: the driver's
        warm-up, no longer): while the preconditioner it ends with does not fit its last slow window
        (:func:`~ppl_sgmcmc.adaptation.settled`), the warm-up runs again from where it ended, its windows from
        the start (:meth:`warmup_replays`): under ``ppl_sgmcmc.numpyro.MCMC``, and on Pyro within the warm-up's
        last draw. ``numpyro.infer.MCMC`` counts its calls to the kernel, so it runs none. Either way a failed
        end-of-run verdict says what the warm-up's last window found.

    A subclass names its ``rule`` and validates its own arguments into ``self._options`` (the rule's
    keyword arguments); ``schedulable`` lists the options that may be schedules of the step index.

    **Hooks.** The class is generic in its rule's state (``RuleStateT``: ``class PSGLD(Algorithm[PSGLDState])``),
    so that the hooks a subclass overrides receive its rule's ``NamedTuple``; arrays are
    :data:`~ppl_sgmcmc.rules._types.Array` (a ``jax.Array`` or a ``torch.Tensor``), step counts
    :data:`~ppl_sgmcmc.rules._types.StepIndex`. The hooks, by concern, each documented where it is defined (the
    developer guide's "Adding an algorithm" says which a new algorithm must and may define):

    - *the rule*: ``rule``, ``hyperparameters``, ``schedulable``, ``temperature_at``, ``noise_shape``;
    - *the warm-up*: ``noise_scale``, ``_step_cap``, ``_warm_start``, ``_rescale_rule_state``,
      ``_place_rule_state``, ``_restart_rule_state``, ``_absorbs_noise_per_coordinate``, ``_set_warmup``,
      ``_measure_noise``, ``_adapt``, and the class attributes ``can_adapt_mass``, ``rescales_mass``, ``widens_mass``,
      ``default_noise_ratio``, ``max_step_size``;
    - *health*: ``_watched_state``, ``_changing_preconditioner``, ``_preconditioner_change``, ``noise_ratio_limit``,
      ``noise_bias``, ``step_fix``;
    - *checks on the model*: ``_check_target``, ``_check_dimension``, ``_check_scores``, ``constrained``;
    - *full-data passes*: ``_anchor_length``, ``_anchor`` (a rule that reads full-data energies at its own points);
    - *what is recorded and shown*: ``sample_stats_fields``, ``final_state_fields``, ``samples_posterior``,
      ``progress``, ``verdict_advice``.

    Each backend's base class defines ``step_size_at`` and ``_is_positive_support``, and calls the rest.
    """

    rule: RuleModule  # the update rule, a module of ppl_sgmcmc.rules
    #: True: the chain moves the latents in their own support (no transforms; SGRLD).
    constrained: ClassVar[bool] = False
    #: State fields recorded with every kept draw (ArviZ ``sample_stats``): the rule state's (CSGLD's), and the step
    #: count ``i`` of a cyclical kernel (which tells a draw's stage: :meth:`sampling_stage`).
    sample_stats_fields: tuple[str, ...] = ()
    #: Rule-state fields reported once per chain, at its end.
    final_state_fields: ClassVar[tuple[str, ...]] = ()
    #: Options that may be a schedule ``t -> value`` of the step index.
    schedulable: ClassVar[tuple[str, ...]] = ("temperature",)
    #: The name of the MCMC driver's warm-up argument, for messages (set by the backends).
    warmup_arg: ClassVar[str] = "num_warmup"
    #: Whether the warm-up's windows rescale an adapted preconditioner by the spread of the chain's draws (else it stays
    #: the Laplace approximation at the start).
    rescales_mass: ClassVar[bool] = True
    #: Whether those windows may also widen a coordinate's scale (else they only narrow it: a chain that jumps between
    #: modes spreads over them, which is no local scale, while a spread narrower than the scale still is one).
    widens_mass: ClassVar[bool] = True
    #: Whether the warm-up may adapt a low-rank-plus-diagonal preconditioner (``dense_mass="low_rank"``): a rule whose
    #: state holds nothing in the coordinates ``u``
    #: but a momentum, which the preconditioner's replacement at a slow window's end redraws.
    low_rank_metric: ClassVar[bool] = False
    #: ``branch(pred, fn, operand)``: ``fn(operand)`` if ``pred``, else ``operand``, as the backend branches (see
    #: :func:`~ppl_sgmcmc.adaptation.adapt_step`); ``None``: both evaluated and selected.
    _branch: ClassVar[Any] = None
    #: Whether the rule can run in coordinates preconditioned by an adapted mass matrix.
    can_adapt_mass: ClassVar[bool] = True
    can_adapt_mass_reason: ClassVar[str] = ""
    #: The noise ratio a tuned step size aims at (see :mod:`ppl_sgmcmc.noise`): about the relative
    #: variance the gradient noise adds, for the rules that do not absorb it.
    default_noise_ratio: float = 0.1
    #: A run whose noise ratio exceeds this gets a warning (the step size is too large for the noise).
    noise_ratio_limit: float = 0.5
    #: The gradient estimator (a name of :data:`ppl_sgmcmc.gradients.ESTIMATORS`) of a tuned step size where the
    #: model allows a variance-reduced one (``gradient=None``).
    tuned_gradient: ClassVar[str] = "minibatch"
    #: The largest tuned step size at unit curvature (the discretisation's cap, in preconditioned coordinates).
    max_step_size: ClassVar[float] = 0.2
    #: Whether a run's draws are a sample to judge at its end (:mod:`ppl_sgmcmc.verdict`); not an optimiser's.
    samples_posterior: ClassVar[bool] = True
    #: Set by a driver that judges the whole run after it ends (``ppl_sgmcmc.numpyro.MCMC``,
    #: :func:`ppl_sgmcmc.checkpoint.run`): the kernel then judges nothing itself.
    _judged_after_run: bool = False

    def __init__(
        self,
        model: Callable[..., Any] | None = None,
        potential_fn: Callable[..., Any] | None = None,
        *,
        step_size: float | Schedule | None = None,
        temperature: float | Schedule = 1.0,
        replace: bool = True,
        steps_per_sample: int = 1,
        init_strategy: Callable[..., Any] | None = None,
        gibbs_sites: list[str] | tuple[str, ...] | None = None,
        gibbs_fn: Callable[..., Any] | None = None,
        gibbs_sweeps: tuple[int, int] = (5, 5),
        gibbs_init: Callable[..., Any] | None = None,
        find_mode: bool | int | None = None,
        adapt_mass_matrix: bool | None = None,
        dense_mass: bool | str | None = None,
        inverse_mass_matrix: adaptation.Preconditioner | Array | np.ndarray | None = None,
        target_noise_ratio: float | None = None,
        gradient: str | gradients.GradientEstimator | None = None,
        cycle_length: int | None = None,
        exploration_fraction: float | None = None,
        max_warmup: int | None = None,
    ) -> None:
        name = self.name
        if (model is None) == (potential_fn is None):
            raise ValueError(f"{name}: give exactly one of `model` and `potential_fn`.")
        for arg, fn in (("model", model), ("potential_fn", potential_fn)):
            if fn is not None and not callable(fn):
                raise TypeError(f"{name}: `{arg}` must be callable, got {type(fn).__name__}.")
        self._tune = step_size is None
        self._step_size: float | Schedule | None = None if self._tune else _checks.step_size(step_size, name)
        self._temperature: float | Schedule = _checks.schedule_or(_checks.positive, "temperature", temperature, name)
        self._steps_per_sample = _checks.positive_int("steps_per_sample", steps_per_sample, name)
        gibbs = _checks.gibbs_options(
            gibbs_sites, gibbs_fn, gibbs_sweeps, name, has_model=model is not None, gibbs_init=gibbs_init
        )
        self._gibbs = None if gibbs is None else GibbsOptions(*gibbs)
        self._model = model
        self._potential_fn = potential_fn
        self._replace = _checks.boolean("replace", replace, name)
        self._init_strategy = init_strategy
        self._options: dict[str, Any] = {}  # the algorithm's own rule arguments, set by subclasses
        self._fixed_mass = _given_preconditioner(
            inverse_mass_matrix, step_size, adapt_mass_matrix, dense_mass, self.can_adapt_mass,
            self.can_adapt_mass_reason, name,
        )  # fmt: skip
        self._low_rank_requested = _low_rank_option(dense_mass, self.low_rank_metric, name)
        self._adapt_mass, self._dense_mass = _checks.mass_options(
            adapt_mass_matrix, True if self._low_rank_requested else dense_mass, self._tune, self.can_adapt_mass,
            self.can_adapt_mass_reason, name,
        )  # fmt: skip
        if self._low_rank_requested:  # the Laplace start is diagonal; the windows add the low-rank part
            self._dense_mass = False
        # by default the tuned step size's estimator, settled for the model's plates in `_check_target`
        self._gradient_by_default = gradient is None and self._tune and model is not None and self._gibbs is None
        self._estimator: gradients.GradientEstimator = _checks.estimator(
            self.tuned_gradient if self._gradient_by_default else gradient or "minibatch", gradients.ESTIMATORS,
            gradients.GradientEstimator, name,
        )  # fmt: skip
        if self._estimator.needs_full_gradient and potential_fn is not None:
            raise ValueError(
                f"{name}: gradient={self._estimator.name!r} needs the full-data gradient at its centre, which a "
                "`potential_fn` does not give; declare a model with a subsampled plate, or use gradient='minibatch'."
            )
        if self._estimator.needs_full_gradient and self._gibbs is not None:
            raise ValueError(
                f"{name}: gradient={self._estimator.name!r} compares the minibatch gradients at the chain and at a "
                "centre, but with local Gibbs sites each gradient averages over its own sweeps; use "
                "gradient='minibatch' with gibbs_sites."
            )
        # a centre-based estimator's default centre is the chain's start: at an approximate mode
        wants_mode = self._tune or (self._estimator.needs_full_gradient and self._estimator.refresh_every is None)
        self._find_mode_steps: int = _checks.find_mode(find_mode, wants_mode, FIND_MODE_STEPS, name)
        self._target_noise_ratio = (
            self.default_noise_ratio if target_noise_ratio is None
            else _checks.positive("target_noise_ratio", target_noise_ratio, name)
        )  # fmt: skip
        if target_noise_ratio is not None and not self._tune:
            raise ValueError(
                f"{name}: `target_noise_ratio` sets the tuned step size, but a `step_size` was given; leave "
                "step_size=None to tune it."
            )
        self._cycles = Cycles.of(cycle_length, exploration_fraction, step_size, self.samples_posterior, name)
        self._max_warmup = None if max_warmup is None else _checks.positive_int("max_warmup", max_warmup, name)
        if self._cycles is not None:  # the step count after each draw tells its stage
            self.sample_stats_fields = (*self.sample_stats_fields, "i")
        #: Set by a driver that keeps only the sampling stages' draws of a cyclical kernel (``ppl_sgmcmc.numpyro.MCMC``).
        self._keeps_sampling_stage = False
        self._window_ends: list[tuple[int, int]] | None = None  # the adaptation windows, set from the warm-up
        self._num_warmup_steps = 0
        # see `_rule_kwargs`
        self._kwargs_cache: dict[Callable[..., Any], tuple[dict[str, Any], tuple[str, ...], bool]] = {}
        self._start_warning: str | None = None  # said when a new chain starts (see `_set_warmup`)

    @property
    def name(self) -> str:
        """The kernel's class name, used in messages."""
        return type(self).__name__

    @property
    def gradient_estimator(self) -> gradients.GradientEstimator:
        """The gradient estimator the kernel steps with (:mod:`ppl_sgmcmc.gradients`): the given one, or the default
        of ``gradient=None`` (:attr:`tuned_gradient`), which a run settles for the model's plates at its start."""
        return self._estimator

    @property
    def variance_reducible(self) -> bool:
        """Whether a variance-reduced gradient (:mod:`ppl_sgmcmc.gradients`) could replace this kernel's: it takes the
        plain minibatch gradient of a model (whose full-data gradient a centre needs), without local Gibbs sites. The
        noise-ratio warning then names one as the fix (:func:`ppl_sgmcmc.health.message`)."""
        return self._estimator.name == "minibatch" and self._model is not None and self._gibbs is None

    @property
    def step_fix(self) -> str | None:
        """How this kernel takes a smaller step, where that is not a smaller ``step_size``, for the health checks'
        warnings of rejected and diverging steps (:func:`ppl_sgmcmc.health.message`); ``None``: a smaller
        ``step_size``."""
        return None

    @property
    def noise_bias(self) -> str | None:
        """How the gradient noise biases this kernel's draws, for the noise-ratio warning
        (:func:`ppl_sgmcmc.health.message`), where not as it biases a chain whose rule leaves it in the draws
        (Langevin dynamics, SGHMC: wider along the noisiest directions); ``None``: as those."""
        return None

    # --- the rule's arguments -----------------------------------------------------------------------
    def hyperparameters(self) -> dict[str, Any]:
        """The rule's keyword arguments besides ``step_size`` (``temperature`` included), as validated;
        a schedule stays a callable.

        **Example**::

            >>> from ppl_sgmcmc.numpyro import SGHMC
            >>> SGHMC(potential_fn=lambda z: 0.0, step_size=0.1, friction=2.0).hyperparameters()
            {'temperature': 1.0, 'friction': 2.0, 'integrator': 'splitting'}
        """
        return {"temperature": self._temperature, **self._options}

    def hyperparameters_at(self, i: StepIndex) -> dict[str, Any]:
        """:meth:`hyperparameters` at step ``i``: each schedule evaluated at ``i``, and ``step_index = i``
        for rules that read it.

        **Example**::

            >>> from ppl_sgmcmc.numpyro import SGLD
            >>> SGLD(potential_fn=lambda z: 0.0, step_size=0.1, temperature=lambda t: 1.0 + t).hyperparameters_at(4)
            {'temperature': 5.0, 'step_index': 4}
        """
        hyper = self.hyperparameters()
        for key in self.schedulable:
            if callable(hyper.get(key)):
                hyper[key] = hyper[key](i)
        hyper["step_index"] = i
        return hyper

    def _rule_kwargs(self, fn: Callable[..., Any], i: StepIndex) -> dict[str, Any]:
        """What :meth:`hyperparameters_at` gives ``fn`` (a rule's ``init`` or ``step``) at step ``i``: the
        arguments it declares are filtered once and cached (Pyro calls this every step, in Python); only
        the schedules and the step index are filled in per step. The cache is dropped whenever the
        hyper-parameters can change (the warm-up and the model are set)."""
        cached = self._kwargs_cache.get(fn)
        if cached is None:
            static = call_kwargs(fn, {**self.hyperparameters(), "step_index": None})
            scheduled = tuple(key for key in self.schedulable if callable(static.get(key)))
            cached = self._kwargs_cache[fn] = (static, scheduled, "step_index" in static)
        static, scheduled, takes_index = cached
        kwargs = dict(static)
        for key in scheduled:
            kwargs[key] = kwargs[key](i)
        if takes_index:
            kwargs["step_index"] = i
        return kwargs

    def rule_init(self, position: Array, noise: Array, i: StepIndex = 0) -> RuleStateT:
        """The rule's initial state at ``position``, with the arguments its ``init`` declares."""
        return cast(RuleStateT, self.rule.init(position, noise, **self._rule_kwargs(self.rule.init, i)))

    def rule_step(
        self, position: Array, state: RuleStateT, grad_fn: GradFn, noise: Array, step_size: Scalar, i: StepIndex,
        measured: NoiseState | None = None,
    ) -> tuple[Array, RuleStateT, StochasticGradient]:
        """One move of the rule with step size ``step_size`` at step ``i``: ``(new position, new rule state,
        gradient)``. ``measured``: the chain's running estimate of the gradient noise (:mod:`ppl_sgmcmc.noise`), for a
        rule that corrects for it (:class:`SGHMC`'s ``B̂``); the others ignore it."""
        hyper = self._rule_kwargs(self.rule.step, i)
        return self.rule.step(position, state, grad_fn, noise, step_size, **hyper)

    def _rule_step_recorded(
        self, position: Array, state: RuleStateT, grad_fn: GradFn, noise: Array, step_size: Scalar, i: StepIndex,
        measured: NoiseState,
    ) -> tuple[Array, RuleStateT, StochasticGradient, bool]:
        """:meth:`rule_step`, and whether the rule took its gradient at ``position`` itself (a Python bool,
        known when the step is traced: SGLD, pSGLD, SGFS and SGRLD pass their position to ``grad_fn``
        unchanged), which decides where a rejected step returns."""
        at: list[Array] = []

        def recorded(x: Array) -> StochasticGradient:
            at.append(x)
            return grad_fn(x)

        position_new, state, gradient = self.rule_step(position, state, recorded, noise, step_size, i, measured)
        return position_new, state, gradient, at[0] is position

    def step_size_at(self, i: StepIndex) -> Scalar:  # pragma: no cover - each backend defines it
        """The step size ``h_i`` of step ``i``, as the backend's arrays want it."""
        raise NotImplementedError

    @staticmethod
    def _is_positive_support(support: Any) -> bool:  # pragma: no cover - each backend defines it (Any: its constraint)
        """Whether a latent's support is the positive reals, in the backend's constraints."""
        raise NotImplementedError

    def temperature_at(self, i: StepIndex) -> Scalar:
        """The temperature ``τ`` at step ``i``."""
        return self._temperature(i) if callable(self._temperature) else self._temperature

    def _same_step_after_warmup(self) -> bool:
        """Whether every step after the warm-up applies one function to the chain's arrays, which a backend may
        then compile once: a fixed step size (given or tuned), no schedule of a hyper-parameter, a temperature
        that does not change along the chain (Santa's anneals), and a rule that does not read the step index (a
        variance-reduced gradient estimator's centre is an input of that function, moved between steps).

        **Example**::

            >>> from ppl_sgmcmc.pyro import SGLD, Santa
            >>> SGLD(potential_fn=lambda z: 0.0, step_size=0.1)._same_step_after_warmup()
            True
            >>> SGLD(potential_fn=lambda z: 0.0, step_size=lambda t: 0.1 / (1 + t))._same_step_after_warmup()
            False
            >>> Santa(potential_fn=lambda z: 0.0, step_size=0.1)._same_step_after_warmup()
            False
        """
        hyper = self.hyperparameters()
        return not (
            callable(self._step_size)
            or any(callable(hyper.get(key)) for key in self.schedulable)
            or type(self).temperature_at is not Algorithm.temperature_at
            or "step_index" in call_kwargs(self.rule.step, {"step_index": None})
            or self._cycles is not None
        )

    def warmup_replays(self) -> int:
        """How many times the warm-up may run again (see ``max_warmup``): ``max_warmup // num_warmup - 1`` of the
        last recorded warm-up; ``0`` without ``max_warmup``, or for a kernel whose warm-up adapts no preconditioner
        from its draws.

        **Example**::

            >>> from ppl_sgmcmc.numpyro import SGLD
            >>> default, longer = SGLD(potential_fn=lambda z: 0.0), SGLD(potential_fn=lambda z: 0.0, max_warmup=5000)
            >>> for kernel in (default, longer):
            ...     kernel._set_warmup(1000)
            >>> default.warmup_replays(), longer.warmup_replays()
            (0, 4)
        """
        warmup = self._num_warmup_steps // self._steps_per_sample
        if self._window_ends is None or not (self._adapt_mass and self.rescales_mass) or warmup == 0:
            return 0
        return 0 if self._max_warmup is None else max(0, self._max_warmup // warmup - 1)

    # --- hooks the backends call ------------------------------------------------------------------
    def _set_warmup(self, num_warmup: int, steps: int | None = None) -> None:
        """Record the warm-up of ``num_warmup`` draws (``steps_per_sample`` steps each, unless ``steps`` gives
        their number: a continued chain's own warm-up); raise if it is too short for the algorithm, or set
        ``_start_warning`` for what a new chain should be told."""
        self._num_warmup_steps = int(num_warmup) * self._steps_per_sample if steps is None else int(steps)
        self._kwargs_cache = {}
        self._window_ends = None
        self._start_warning = None
        if self.adapts and self._num_warmup_steps == 0:
            task, fix = (("tune the step size and adapt the preconditioner", "give `step_size`") if self._tune
                         else ("adapt the preconditioner", "set `adapt_mass_matrix=False`"))  # fmt: skip
            self._start_warning = (
                f"{self.name}: {self.warmup_arg}=0 leaves no warm-up to {task}. That is right when continuing a chain "
                "from its state (what the warm-up chose is in the state); a new chain would sample untuned: set "
                f"`{self.warmup_arg}` (at least {adaptation.minimum_warmup_steps()} steps), or {fix}."
            )
        if self._cycles is not None and not self._keeps_sampling_stage:
            self._start_warning = " ".join(filter(None, (self._start_warning, self._stages_mixed_in())))
            # the driver's draws mix the stages: no end-of-run verdict of the kernel's own (Pyro's) judges them
            self._judged_after_run = True
        if self.adapts and self._num_warmup_steps > 0:  # 0: a chain continued with its adapted state
            try:
                self._window_ends = adaptation.adaptation_schedule(self._num_warmup_steps)
            except ValueError as err:
                raise ValueError(f"{self.name}: {err} ({self.warmup_arg} counts draws of {self._steps_per_sample} "
                                 "step(s) each).") from None

    def sampling_stage_only(self, idata: Any) -> Any:  # Any: InferenceData, whose groups its types do not declare
        """An ``arviz.InferenceData`` of a run (with the step counts ``i`` in its ``sample_stats``) with only the
        sampling stages' draws of a cyclical kernel (:meth:`sampling_stage`); unchanged without cycles. Both
        backends' ``to_inference_data`` return it."""
        if self._cycles is None:
            return idata
        keep = self.sampling_stage(idata.sample_stats["i"].values[0])  # every chain's stages are the same
        return idata.isel(draw=np.flatnonzero(keep))

    def _stages_mixed_in(self) -> str:
        """What a cyclical kernel says when its driver's draws include the exploration stages' draws: which draws
        they are and what leaves them out."""
        cycles = cast(Cycles, self._cycles)
        return (
            f"{self.name}: the draws of this driver (get_samples, summary) include the {cycles.exploration} draws of "
            f"each cycle's exploration stage (of {cycles.length}), an optimiser's path, not posterior draws. "
            "`ppl_sgmcmc.numpyro.MCMC` (the same class and arguments as numpyro.infer.MCMC) keeps only the sampling "
            "stages' draws, and so does `to_inference_data` of either backend; else keep the draws "
            "`kernel.sampling_stage(i)` marks, `i` being the step counts recorded with them (extra field or "
            "sample_stats `i`)."
        )

    # --- the warm-up's adaptation (ppl_sgmcmc.adaptation) ---------------------------------------------------
    @property
    def adapts(self) -> bool:
        """Whether the warm-up adapts the preconditioner or the step size.

        **Example**::

            >>> from ppl_sgmcmc.numpyro import SGLD
            >>> SGLD(potential_fn=lambda z: 0.0).adapts, SGLD(potential_fn=lambda z: 0.0, step_size=0.1).adapts
            (True, False)
        """
        return self._adapt_mass or self._tune

    @property
    def find_mode_steps(self) -> int:
        """The optimiser steps that move a new chain to an approximate mode before it samples (0: none)."""
        return self._find_mode_steps

    def noise_shape(self, dim: int) -> tuple[int, ...]:
        """The shape of the standard normal draw that the rule's ``init`` and ``step`` take on a chain of ``dim``
        coordinates: ``(dim,)``; a rule with more randomness asks for more (replica exchange: a row per replica).

        **Example**::

            >>> from ppl_sgmcmc.numpyro import SGLD
            >>> SGLD(potential_fn=lambda z: 0.0, step_size=0.1).noise_shape(3)
            (3,)
        """
        return (dim,)

    def noise_scale(self, rule_state: RuleStateT, i: StepIndex, position: Array) -> Scalar:
        """``c``, the rule's scale of the gradient noise in its step at step ``i``, which took its gradient at
        ``position`` (``θ``, flat; see :mod:`ppl_sgmcmc.noise`): the noise ratio is ``h max_k c_k V_kk / (2τ)``.
        1 for SGLD; the algorithms with friction, a preconditioner, a gradient multiplier or a metric override it."""
        return 1.0

    # --- health: what the checks watch (ppl_sgmcmc.health) ----------------------------------------------------------
    def _watched_state(self, rule_state: RuleStateT) -> tuple[Array | None, ...]:
        """The rule state's auxiliary variables whose size the health checks watch for a chain running off
        (:func:`ppl_sgmcmc.health.check`: momentum, thermostat, preconditioner; ``None`` leaves are skipped).
        All of them by default; an algorithm that also keeps running sums (CSGLD's energy statistics) leaves
        those out."""
        return rule_state

    def _changing_preconditioner(self, rule_state: RuleStateT) -> Array | None:
        """The array through which the rule's own preconditioner changes along the chain (pSGLD's ``V``), whose
        range between two health checks (:func:`ppl_sgmcmc.health.track`) :meth:`_preconditioner_change` turns
        into the factor by which the preconditioner changed; ``None`` (the default) for a rule whose
        preconditioner is fixed after the warm-up."""
        return None

    def _preconditioner_change(self, low: Array, high: Array, start: StepIndex) -> Array:
        """The largest factor, over the coordinates, by which the preconditioner changed while the array of
        :meth:`_changing_preconditioner` ranged over ``[low, high]`` since step ``start`` (NaN: not measured)."""
        raise NotImplementedError(f"{self.name} has no changing preconditioner")

    def _measured_change(self, health_state: HealthState) -> Scalar:
        """The preconditioner change that the health check reports (:func:`ppl_sgmcmc.health.update`): NaN
        without a changing preconditioner, or while the steps since the previous check overlap the warm-up
        (which sets and rescales the preconditioner)."""
        if health_state.low is None:
            return math.nan
        xp = array_namespace(health_state.low)
        start = health_state.anchor_step
        change = self._preconditioner_change(health_state.low, health_state.high, start)
        measured: Array = xp.where(start >= self._num_warmup_steps, change, xp.full_like(change, math.nan))
        return measured

    # --- warm-up: the rule's state and step size as the adaptation sees them ----------------------------------------
    @property
    def _absorbs_noise_per_coordinate(self) -> bool:
        """Whether the rule absorbs the gradient noise coordinate by coordinate (mSGNHT's thermostat): a dense
        preconditioner's coordinates are then turned to the noise's principal axes at the chain's start
        (:func:`~ppl_sgmcmc.adaptation.align_noise`), where the noise has no covariances for it to miss. The rules
        that do not absorb the noise are left in the Laplace coordinates."""
        return False

    def _probe_batches(self, dim: int) -> int:
        """The minibatch gradients of a tuned chain's noise probe at its start, for ``dim`` latent coordinates:
        :data:`~ppl_sgmcmc.adaptation.PROBE_BATCHES`, or enough for the noise's axes
        (:data:`~ppl_sgmcmc.adaptation.ALIGN_PROBES_PER_COORDINATE` per coordinate) where a dense metric of up to
        :data:`AUTO_DENSE_MAX` coordinates is aligned with them."""
        if self._absorbs_noise_per_coordinate and self._adapt_mass and self._dense(dim) and dim <= AUTO_DENSE_MAX:
            return max(adaptation.PROBE_BATCHES, adaptation.ALIGN_PROBES_PER_COORDINATE * dim)
        return adaptation.PROBE_BATCHES

    def _step_cap(self, rule_state: RuleStateT) -> Scalar:
        """The cap of a tuned step size at unit curvature: :attr:`max_step_size` (pSGLD scales it by its
        preconditioner)."""
        return self.max_step_size

    def _warm_start(self, rule_state: RuleStateT, probe: StochasticGradient) -> RuleStateT:
        """The rule's state at the start of a tuned chain, given the probe's gradients (rows of
        ``probe.grad`` and ``probe.score`` in the rule's coordinates): unchanged, but for a rule that keeps a
        running average of gradients (pSGLD), which the probe fills."""
        return rule_state

    def _rescale_rule_state(self, rule_state: RuleStateT, factor: Array) -> RuleStateT:
        """The rule's state when the coordinates ``u`` are rescaled (``u' = u ⊘ factor``, gradients
        ``factor ⊙ g``): unchanged, but for running averages of gradients (pSGLD). A momentum is kept: it has
        the right distribution in any coordinates the friction or thermostat equilibrates."""
        return rule_state

    @property
    def _preconditioned(self) -> bool:
        """Whether the rule runs in the coordinates of a preconditioner: adapted, or given (``inverse_mass_matrix``)."""
        return self._adapt_mass or self._fixed_mass is not None

    # --- the step size in force, the tuned options and the cycles' stages -------------------------------------------
    def tuned_options(self, state: object, chain: int | None = None) -> dict[str, Any]:
        """The options that give a new kernel this run's kernel after its warm-up: ``step_size`` (the tuned one,
        which is a step size in the coordinates of the adapted preconditioner, or the given one),
        ``inverse_mass_matrix`` (the preconditioner) and, for a variance-reduced gradient, ``gradient``.
        ``SGLD(model, **kernel.tuned_options(state))`` then runs the chain the run ran after its warm-up, from any
        start, without a warm-up; the ``step_size`` the run recorded passed alone would run the rule in the model's own
        coordinates, where it is not a step size of the posterior (often far too large).

        :param state: the run's state after the warm-up: NumPyro's ``mcmc.last_state`` (or
            ``post_warmup_state``), Pyro's ``kernel.last_state``.
        :param chain: which chain, for a state of several vectorised chains (each adapted its own).

        **Example**::

            >>> import jax, jax.numpy as jnp
            >>> from numpyro.infer import MCMC
            >>> from ppl_sgmcmc.numpyro import SGLD
            >>> def potential(z):
            ...     return 0.5 * jnp.sum(z["x"] ** 2 * jnp.array([1.0, 100.0]))
            >>> mcmc = MCMC(SGLD(potential_fn=potential), num_warmup=300, num_samples=10, progress_bar=False)
            >>> mcmc.run(jax.random.PRNGKey(0), init_params={"x": jnp.ones(2)})
            >>> options = mcmc.sampler.tuned_options(mcmc.last_state)
            >>> sorted(options), options["inverse_mass_matrix"].scale.shape
            (['inverse_mass_matrix', 'step_size'], (2, 2))
            >>> again = MCMC(SGLD(potential_fn=potential, **options), num_warmup=0, num_samples=10, progress_bar=False)
            >>> again.run(jax.random.PRNGKey(1), init_params={"x": jnp.ones(2)})
        """
        state = getattr(state, "state", state)  # Pyro's ChainState holds the chain's state
        adapt_state = getattr(state, "adapt_state", None)
        if not isinstance(adapt_state, adaptation.AdaptState):
            raise ValueError(
                f"{self.name}: the run adapted nothing (a `step_size` was given and adapt_mass_matrix=False): its "
                "options are the kernel's own; build the new kernel with the same `step_size`."
            )
        pre, step_size = adapt_state.preconditioner, adapt_state.step_size
        if np.ndim(step_size) > 0:
            if chain is None:
                raise ValueError(
                    f"{self.name}: the state holds {np.shape(step_size)[0]} chains, each with its own tuned step size "
                    "and preconditioner; pass `chain=k` to take chain k's."
                )
            pre, step_size = adaptation.Preconditioner(pre.scale[chain], pre.inverse[chain]), step_size[chain]
        options: dict[str, Any] = {"step_size": float(step_size) if self._tune else self._step_size,
                                   "inverse_mass_matrix": pre}  # fmt: skip
        if self._estimator.name != "minibatch":  # which a kernel given a step size does not take by default
            options["gradient"] = self._estimator
        return options

    def step_size_in(self, adapt_state: AdaptationState, i: StepIndex) -> Scalar:
        """The step size of step ``i``: the tuned one of ``adapt_state``, or the given one (a schedule at ``i``); with
        cycles, that times the cycle's factor (:meth:`Cycles.factor`)."""
        step_size = cast(adaptation.AdaptState, adapt_state).step_size if self._tune else self.step_size_at(i)
        if self._cycles is None:
            return step_size
        return step_size * self._cycles.factor(i, self._num_warmup_steps, self._steps_per_sample)

    def _exploring(self, i: StepIndex) -> Flag:
        """Whether the step that brought a chain to the step count ``i`` explored (a cyclical kernel's exploration
        stage, :class:`Cycles`); ``False`` without cycles. The frozen-chain check skips such steps
        (:func:`ppl_sgmcmc.health.update`)."""
        if self._cycles is None:
            return False
        sampling = self._cycles.sampling(i - 1, self._num_warmup_steps, self._steps_per_sample)
        if isinstance(sampling, bool):
            return not sampling
        exploring: Array = array_namespace(sampling).logical_not(sampling)
        return exploring

    @property
    def cycles(self) -> Cycles | None:
        """The kernel's cycles (:class:`Cycles`), or ``None``."""
        return self._cycles

    def sampling_stage(self, step_count: Array | np.typing.ArrayLike) -> np.ndarray:
        """Which draws are posterior draws, by the step count ``i`` the chain's state had after each draw (the
        ``i`` a cyclical kernel records in ``sample_stats``): all of them without cycles; with cycles, those the
        sampling stages made (:meth:`Cycles.sampling`); the warm-up's are sampling draws too.

        :param step_count: the recorded step counts, any shape (NumPy, JAX or torch).
        :return: a NumPy boolean array of that shape.

        **Example** (cycles of 4 draws, the first 2 exploring, after 2 warm-up draws of one step)::

            >>> from ppl_sgmcmc.numpyro import SGLD
            >>> kernel = SGLD(potential_fn=lambda z: 0.0, step_size=0.1, cycle_length=4)
            >>> kernel._set_warmup(2)
            >>> kernel.sampling_stage([3, 4, 5, 6, 7, 8, 9, 10]).tolist()
            [False, False, True, True, False, False, True, True]
        """
        steps = np.asarray(step_count.detach().cpu() if hasattr(step_count, "detach") else step_count, np.int64)
        if self._cycles is None:
            return np.ones(steps.shape, bool)
        return np.asarray(self._cycles.sampling(steps - 1, self._num_warmup_steps, self._steps_per_sample), bool)

    # --- warm-up: the chain's start and each step (the backends call these) -----------------------------------------
    def _laplace(self, hessian: Array) -> tuple[adaptation.Preconditioner, Array]:
        """The Laplace preconditioner of a new chain's Hessian and its curvature in ``u``
        (:func:`~ppl_sgmcmc.adaptation.from_hessian`, dense or diagonal by ``dense_mass``, or by the dimension for
        ``dense_mass=None``); ``hessian`` may be only the diagonal (then the curvature is NaN: the backend measures
        it)."""
        return adaptation.from_hessian(hessian, self._dense(hessian.shape[0]) and hessian.ndim == 2)

    def _low_rank(self, dim: int) -> bool:
        """Whether a chain of ``dim`` latent coordinates gets a low-rank-plus-diagonal preconditioner."""
        return self._adapt_mass and self.low_rank_metric and self._low_rank_requested

    def _dense(self, dim: int) -> bool:
        """Whether a chain of ``dim`` latent coordinates gets a dense preconditioner."""
        return self._dense_mass if self._dense_mass is not None else self._adapt_mass and dim <= AUTO_DENSE_MAX

    def _exact_hessian(self, dim: int, limit: int) -> bool:
        """Whether a new chain's Hessian is computed whole (``d`` Hessian-vector products per minibatch): with a
        dense preconditioner, or up to ``limit`` coordinates; else only its diagonal is estimated. A dense
        preconditioner is refused beyond :data:`MAX_DENSE_DIM` coordinates."""
        if self._dense_mass is True and dim > MAX_DENSE_DIM:
            raise ValueError(
                f"{self.name}: dense_mass=True for {dim} latent coordinates needs a {dim}×{dim} Hessian and a "
                f"matrix-vector product of that size at every step; the limit is {MAX_DENSE_DIM}. Use the diagonal "
                "preconditioner (dense_mass=False)."
            )
        return self._dense(dim) or dim <= limit

    def _initial_adaptation(self, position: Array, laplace: tuple[adaptation.Preconditioner, Scalar] | None,
                            probe: StochasticGradient | None, rule_state: RuleStateT,
                            energy: Scalar | None) -> tuple[AdaptationState, RuleStateT]:  # fmt: skip
        """The adaptation's state at a chain's start and the rule's state, warm-started.

        :param position: the chain's start ``θ`` (flat), with minibatch energy ``energy``.
        :param laplace: ``(preconditioner, curvature)`` of :meth:`_laplace`, with ``adapt_mass_matrix``.
        :param probe: with a tuned step size, :class:`~ppl_sgmcmc.rules.StochasticGradient` of several
            minibatches at ``position`` (rows), in ``θ``; their spread gives the first step size.
        :return: ``(AdaptState or NoAdaptation(), rule_state)``; ``NoAdaptation()`` when nothing adapts.
        """
        if self._fixed_mass is not None:  # a given preconditioner: nothing adapts, the rule runs in its coordinates
            xp, dev = array_namespace(position), device(position)
            fixed = (xp.asarray(a, dtype=position.dtype, device=dev) for a in self._fixed_mass)
            pre = adaptation.Preconditioner(*fixed)
            rule_state = self._place_rule_state(rule_state, adaptation.to_u(pre, position))
            energy = float("nan") if energy is None else energy
            return adaptation.adapt_init(pre, 0.0, 1.0, position, energy), rule_state
        if not self.adapts:
            return adaptation.NoAdaptation(), rule_state
        laplace = cast("tuple[adaptation.Preconditioner, Scalar]", laplace)  # given with adapt_mass_matrix
        pre, curvature = laplace if self._adapt_mass else (adaptation.identity(position.shape[0], False, position), 1.0)
        if self._low_rank(position.shape[0]):  # the diagonal Laplace start in the packed form the windows replace
            pre = adaptation.Preconditioner(*low_rank.from_diagonal(pre.scale, pre.inverse))
        step_size: Scalar = 0.0
        if self._tune:
            xp = array_namespace(position)
            pulled = adaptation.pullback_grad_fn(pre, lambda _: probe)(position)
            rows = pulled.grad.shape[0]  # diag V: the spread of single gradients (none for an exact potential)
            if (self._adapt_mass and self._absorbs_noise_per_coordinate and pre.scale.ndim == 2
                    and rows >= adaptation.ALIGN_PROBES_PER_COORDINATE * position.shape[0]):  # fmt: skip
                pre = adaptation.align_noise(pre, pulled.grad)
                pulled = adaptation.pullback_grad_fn(pre, lambda _: probe)(position)
            rule_state = self._warm_start(rule_state, pulled)
            variance = xp.var(pulled.grad, axis=0, correction=1) if rows > 1 else xp.zeros_like(position)
            variance = self.noise_scale(rule_state, 0, position) * variance
            if self._adapt_mass:
                floor = adaptation.capped_noise(self._target_noise_ratio, self.temperature_at(0),
                                                self._step_cap(rule_state) / curvature)  # fmt: skip
                pre, variance, factor = adaptation.equalize_noise(pre, variance, floor)
                rule_state = self._rescale_rule_state(rule_state, factor)
            step_size = adaptation.tuned_step_size(
                variance, self._target_noise_ratio, self.temperature_at(0), self._step_cap(rule_state) / curvature
            )
        rule_state = self._place_rule_state(rule_state, adaptation.to_u(pre, position))
        return adaptation.adapt_init(pre, step_size, curvature, position, energy), rule_state

    def _move(self, position: Array, rule_state: RuleStateT, grad_fn: GradFn, noise: Array, step_size: Scalar,
              i: StepIndex, adapt_state: AdaptationState,
              measured: NoiseState) -> tuple[Array, RuleStateT, StochasticGradient, bool]:  # fmt: skip
        """One move of the rule from ``position`` with step size ``step_size``, in the preconditioned
        coordinates ``u = L⁻¹ θ`` with ``adapt_mass_matrix`` (``θ`` then moves by ``L (u' - u)``): ``(new position,
        rule state, gradient (in the rule's coordinates), whether the rule took its gradient at the position)`` (see
        :meth:`_rule_step_recorded`). A cyclical kernel's exploration stage injects no noise (``ζ = 0``).
        ``measured``: the chain's noise estimate (:meth:`rule_step`), in the rule's coordinates."""
        if self._cycles is not None:
            noise = noise * self._cycles.sampling(i, self._num_warmup_steps, self._steps_per_sample)  # type: ignore[assignment]
        if not self._preconditioned:
            return self._rule_step_recorded(position, rule_state, grad_fn, noise, step_size, i, measured)
        pre = cast(adaptation.AdaptState, adapt_state).preconditioner  # a preconditioned rule's warm-up adapts
        u = adaptation.to_u(pre, position)
        new_u, rule_state, gradient, at_start = self._rule_step_recorded(
            u, rule_state, adaptation.pullback_grad_fn(pre, grad_fn), noise, step_size, i, measured
        )
        # θ moves by L (u' - u), not to L u': the stored L and L⁻¹ are inverses only to float32's precision (L L⁻¹ =
        # I + E, E up to ~1e-5 for an ill-conditioned Laplace metric), and θ ← L L⁻¹ θ + ... at every step multiplies
        # the position by I + E, a drift at a rate independent of h that outgrows the dynamics' pull (∝ h ∝ n/N) at
        # large N
        return position + adaptation.to_theta(pre, new_u - u), rule_state, gradient, at_start

    def _measure_noise(self, noise_state: NoiseState, gradient: StochasticGradient, rule_state: RuleStateT,
                       accepted: Flag, i: StepIndex, position: Array) -> tuple[NoiseState, Array, Flag]:  # fmt: skip
        """The gradient-noise estimate after a step that took its gradient at ``position``
        (:func:`ppl_sgmcmc.noise.update`): ``(noise state, term, whether the term measured the noise)``."""
        valid = (noise_state.count >= 0) & accepted
        scale = self.noise_scale(rule_state, i, position)
        noise_state, term = noise.update(noise_state, gradient.grad, scale, accepted)
        return noise_state, term, valid

    def _adapt(self, adapt_state: AdaptationState, noise_state: NoiseState, rule_state: RuleStateT, position: Array,
               energy: Scalar, term: Array, valid: Flag, i: StepIndex,
               fresh_noise: Array) -> tuple[AdaptationState, NoiseState, RuleStateT, Array]:  # fmt: skip
        """The warm-up's adaptation after step ``i`` ended at ``position`` (``θ``) with minibatch energy
        ``energy`` and the noise ``term`` of :meth:`_measure_noise`: ``(adapt state, noise state, rule state,
        position)``.

        With a tuned step size, a step that ran off (:func:`~ppl_sgmcmc.adaptation.ran_off`) returns the chain
        to its restore point with the rule restarted there (:meth:`_restart_rule_state`, ``fresh_noise`` a
        standard normal draw for a momentum) and the step size divided by
        :data:`~ppl_sgmcmc.adaptation.RESTART_SHRINK` (a given step size is not changed: its chain runs off
        and the health check reports it), which also becomes the tuned step size's cap (the run-off showed more
        curvature than the start did), and the noise measured since the step size was last set, which holds the
        run-off's, is dropped; otherwise :func:`~ppl_sgmcmc.adaptation.adapt_step` runs, and the
        noise estimate and the rule state are re-expressed when the coordinates change (a low-rank preconditioner
        replaced at a slow window's end restarts the rule's state in the new coordinates, a momentum redrawn from
        ``fresh_noise``)."""
        if not self.adapts or self._window_ends is None:
            return adapt_state, noise_state, rule_state, position
        adapt_state = cast(adaptation.AdaptState, adapt_state)  # the warm-up adapts
        xp = array_namespace(position)
        off = adaptation.ran_off(adapt_state, energy) & self._tune
        position = xp.where(off, adapt_state.restore, position)
        ends = adaptation.window_ends(self._window_ends, like=position)
        u = adaptation.to_u(adapt_state.preconditioner, position)
        restarted = self._restart_rule_state(rule_state, u, fresh_noise, i)
        rule_state = type(rule_state)(*(  # type: ignore[arg-type]  # a NamedTuple takes its fields positionally
            None if new is None else xp.where(off, new, old) for new, old in zip(restarted, rule_state)
        ))  # fmt: skip
        old_scale = adapt_state.preconditioner.scale
        cap = self._step_cap(rule_state)  # the step size's cap at unit curvature
        adapt_state, factor = adaptation.adapt_step(
            adapt_state, u, position, energy, term, valid & ~off, i, ends, adapt_mass=self._adapt_mass and self.rescales_mass,
            tune_step_size=self._tune, target=self._target_noise_ratio, temperature=self.temperature_at(i),
            max_step_size=cap, gradient=noise_state.previous, branch=self._branch,
            widen=self.widens_mass, noise_growth=self._noise_growth(),
        )  # fmt: skip
        if old_scale.ndim == 3:  # a low-rank preconditioner replaced: the rule restarts in the new coordinates
            replaced = xp.any(adapt_state.preconditioner.scale != old_scale)
            moved = self._restart_rule_state(rule_state, adaptation.to_u(adapt_state.preconditioner, position),
                                             fresh_noise, i)  # fmt: skip
            rule_state = type(rule_state)(*(  # type: ignore[arg-type]  # a NamedTuple takes its fields positionally
                None if new is None else xp.where(replaced, new, old) for new, old in zip(moved, rule_state)
            ))  # fmt: skip
            noise_state = noise_state._replace(  # the noise's last gradient is of the old coordinates
                count=xp.where(replaced, xp.full_like(noise_state.count, -1), noise_state.count)
            )
        shrunk = adapt_state.step_size / adaptation.RESTART_SHRINK
        adapt_state = adapt_state._replace(
            step_size=xp.where(off, shrunk, adapt_state.step_size),
            restarts=adapt_state.restarts + xp.astype(off, adapt_state.restarts.dtype),
            # the run-off showed more curvature than the start did: no later re-tuning returns above the shrunk step
            curvature=xp.where(off, xp.maximum(adapt_state.curvature, cap / shrunk),
                               adapt_state.curvature),  # fmt: skip
            # the noise measured since the step size was last set includes the run-off's steps: dropped
            noise_sum=xp.where(off, xp.zeros_like(adapt_state.noise_sum), adapt_state.noise_sum),
            noise_count=xp.where(off, xp.zeros_like(adapt_state.noise_count), adapt_state.noise_count),
        )
        if self._adapt_mass:
            noise_state = noise.rescale(noise_state, factor)
            rule_state = self._rescale_rule_state(rule_state, factor)
        noise_state = noise_state._replace(count=xp.where(off, xp.full_like(noise_state.count, -1), noise_state.count))
        return adapt_state, noise_state, rule_state, position

    def _place_rule_state(self, rule_state: RuleStateT, u: Array) -> RuleStateT:
        """The rule's state of a chain at ``u`` in the rule's coordinates: unchanged, but for a rule that keeps
        its own position (CSGLD), which the rule's ``init`` set in the model's coordinates."""
        return rule_state

    def _restart_rule_state(self, rule_state: RuleStateT, u: Array, fresh_noise: Array, i: StepIndex) -> RuleStateT:
        """The rule's state of a chain restarted at ``u`` (the rule's coordinates) during the warm-up: placed
        there (:meth:`_place_rule_state`), a momentum redrawn (:func:`~ppl_sgmcmc.rules.refresh_momentum`), the
        rest kept."""
        rule_state = self._place_rule_state(rule_state, u)
        if has_momentum(rule_state):
            return refresh_momentum(rule_state, fresh_noise, self.temperature_at(i))
        return rule_state

    # --- checks on the model ----------------------------------------------------------------------------------------
    def _check_target(self, target: Target) -> None:
        """Check the model's stochastic potential as soon as it is built, before anything is compiled,
        and ask it for what the rule needs from the gradient (``rule.NEEDS``)."""
        self._kwargs_cache = {}
        if self.rule.NEEDS == "per_example":
            target.enable_per_example_scores()
        if self._gradient_by_default:  # a variance-reduced default needs plates whose rows the device holds
            allowed = target.plate_sizes and not target.streamed
            self._estimator = gradients.ESTIMATORS[self.tuned_gradient if allowed else "minibatch"]()
        if self._estimator.needs_full_gradient and not target.plate_sizes:
            raise ValueError(
                f"{self.name}: gradient={self._estimator.name!r} reduces the minibatch noise of a model's subsampled "
                "plates, but this model has none (every step already uses all the data); use gradient='minibatch'."
            )

    def _check_dimension(self, target: Target, dim: int) -> None:
        """Check the options against the number ``dim`` of flattened latents (and, with ``gradient``'s centre,
        its shape)."""
        fixed = self._fixed_mass
        given = None if fixed is None else fixed.scale.shape[1 if fixed.scale.ndim == 3 else 0]  # packed: (2, d, r + 1)
        if given is not None and given != dim:
            raise ValueError(
                f"{self.name}: `inverse_mass_matrix` is a preconditioner of {given} coordinates, but the "
                f"model has {dim} unconstrained latent coordinates; give the one of a run of this model."
            )
        centre = self._estimator.centre
        if centre is not None and tuple(getattr(centre, "shape", ())) != (dim,):
            raise ValueError(
                f"{self.name}: the control variates' `centre` has shape {tuple(getattr(centre, 'shape', ()))}, but the "
                f"model has {dim} unconstrained latent coordinates: give a flat array of {dim} (the latents in "
                "sorted site order, unconstrained, as jax.flatten_util.ravel_pytree lays them out)."
            )

    def _noise_growth(self) -> float:
        """``q`` where the gradient estimator's noise grows with the step size as ``h^q``
        (:func:`~ppl_sgmcmc.adaptation.tuned_step_size`): 2 for an estimator whose centre moves with the chain (SVRG:
        the variance of the difference of the minibatch gradients at the chain and at the centre grows with the
        squared distance the chain travels in an epoch, ``∝ h²`` for a momentum rule and ``∝ h`` for Langevin
        dynamics; with ``q = 2`` the re-tunings converge for both), else 0."""
        return 2.0 if self._estimator.refresh_every is not None else 0.0

    def _epoch_length(self, target: Target) -> int | None:
        """Steps between the centres of a refreshing gradient estimator (SVRG): its ``refresh_every``, or one
        epoch ``N/n`` of the largest subsampled plate, made a multiple or a divisor of ``steps_per_sample`` (the
        nearest), so that the centres move between draws or between equal groups of a draw's steps, where the NumPyro
        backend's accelerator step moves them without a branch; ``None`` for an estimator that does not refresh."""
        every: int | None = self._estimator.refresh_every
        if every is None:
            return None
        return _aligned(every or _epoch(target), self._steps_per_sample)

    def _anchor_length(self, target: Target) -> int | None:
        """Steps between the rule's full-data anchors (:meth:`_anchor`), or ``None`` (the default: the rule reads no
        full-data quantity)."""
        del target
        return None

    def _anchor(self, rule_state: RuleStateT, position: Array, adapt_state: AdaptationState,
                full_energy: Callable[[Array], Scalar]) -> RuleStateT:  # fmt: skip
        """The rule's state with its anchors set where the chain is (``position``, ``θ``, and the rule state's own
        points), given ``full_energy(θ)``, the full-data potential at a flat ``θ`` (one pass over the data). The kernels
        call it at every :meth:`_anchor_length`-th step, from the first, before the step's move."""
        del position, adapt_state, full_energy
        return rule_state

    def _check_scores(self, per_example: Array, sites: list[str]) -> None:
        """Check the per-datum scores of one minibatch at the chain's start (``n×d``; the site of each flat
        coordinate in ``sites``), for rules that read them (``NEEDS = "per_example"``)."""

    # --- display ----------------------------------------------------------------------------------------------------
    def verdict_advice(self, rule_state: RuleStateT | None) -> tuple[str, ...]:
        """Fixes of the algorithm's own that a failed end-of-run verdict gives first (:mod:`ppl_sgmcmc.verdict`), from
        the rule's final state (a leading chain axis for vectorised chains; ``None``: unknown): none by default."""
        del rule_state
        return ()

    def progress(self, state: ChainState[RuleStateT]) -> dict[str, Any]:
        """The progress line's items at ``state`` (read from the device): the minibatch energy ``Ũ_t``,
        the step size, the number of rejected steps, and the algorithm's own.

        **Example**::

            >>> import jax, jax.numpy as jnp
            >>> from ppl_sgmcmc.numpyro import SGNHT
            >>> kernel = SGNHT(potential_fn=lambda z: 0.5 * jnp.sum(z["x"] ** 2), step_size=0.1, diffusion=2.0)
            >>> state = kernel.init(jax.random.PRNGKey(0), num_warmup=0, init_params={"x": jnp.ones(3)})
            >>> kernel.progress(state)
            {'Ũ_t': '1.5', 'h': '1.00e-01', 'div': 0, 'ξ̄': '2'}
        """
        return {
            "Ũ_t": f"{float(state.potential_energy):.4g}",
            "h": f"{float(state.step_size):.2e}",
            "div": int(state.num_diverging),
        }


# --- Langevin and Hamiltonian samplers ------------------------------------------------------------------
class SGLD(Algorithm[sgld_rule.SGLDState]):
    """Stochastic gradient Langevin dynamics (Welling & Teh, "Bayesian Learning via Stochastic Gradient
    Langevin Dynamics", ICML 2011)::

        θ ← θ - h ∇Ũ_t(θ) + sqrt(2 h τ) ζ

    :param step_size: ``h`` (Welling & Teh's ``ε/2``), a float or a schedule; typically 1e-6 to 1e-3
        for a potential scaled to N data points.
    :param temperature: ``τ`` (default 1).

    Other arguments: see :class:`Algorithm`.
    """

    rule = sgld_rule
    low_rank_metric = True


def _sghmc_options(friction: Any, integrator: str, name: str) -> dict[str, Any]:
    """The SGHMC integrator's ``friction`` ``A > 0`` and ``integrator``, checked."""
    return {
        "friction": _checks.schedule_or(_checks.positive, "friction", friction, name),
        "integrator": _checks.choice("integrator", integrator, INTEGRATORS, name),
    }


class _SGHMCMoves(Algorithm[RuleStateT]):
    """An algorithm whose chain moves by the SGHMC integrator (:class:`SGHMC`, :class:`CSGHMC`, :class:`ReSGHMC`):
    its ``friction`` ``A > 0`` (default 1.0, also the injected noise's diffusion; a float or a schedule) and its
    ``integrator`` (``"splitting"``, the default, or ``"euler"``), besides the algorithm's own arguments."""

    schedulable = ("temperature", "friction")
    max_step_size = 0.5

    def __init__(
        self,
        model: Callable[..., Any] | None = None,
        potential_fn: Callable[..., Any] | None = None,
        *,
        step_size: float | Schedule | None = None,
        friction: float | Schedule = 1.0,
        integrator: str = "splitting",
        **kwargs: Any,
    ) -> None:
        super().__init__(model, potential_fn, step_size=step_size, **kwargs)
        self._options = _sghmc_options(friction, integrator, self.name)
        self.integrator = self._options["integrator"]


#: The noise-ratio limit of a rule that absorbs the gradient noise's variance coordinate by coordinate (mSGNHT's
#: multivariate thermostat, SGHMC with ``absorb_noise``): what is left biases the draws only through the noise's
#: correlations between coordinates and to second order in the step.
ABSORBED_NOISE_LIMIT = 5.0

#: What a rule that absorbs the noise coordinate by coordinate leaves of it, for the noise-ratio warning.
_CORRELATIONS_LEFT = (
    "the noise's variance along each coordinate of the metric but not its correlations between coordinates, which "
    "spread the draws too wide along some directions and too narrow along others (SGNHT(thermostat=\"matrix\") "
    "absorbs the correlations too, for an eigendecomposition of a d × d matrix a step: up to a few hundred coordinates)"
)
#: The noise-ratio warning's diagnosis for SGHMC with ``absorb_noise`` (:attr:`SGHMC.noise_bias`).
_ABSORBED_NOISE_BIAS = "the friction absorbs (B̂) " + _CORRELATIONS_LEFT


class SGHMC(_SGHMCMoves[sghmc_rule.SGHMCState]):
    """Stochastic gradient HMC (Chen, Fox & Guestrin, "Stochastic Gradient Hamiltonian Monte Carlo",
    ICML 2014) with identity mass, integrated by Euler or by the second-order symmetric splitting of
    Chen, Ding & Carin ("On the Convergence of Stochastic Gradient MCMC Algorithms with High-Order
    Integrators", NeurIPS 2015), with the friction ``C = A + B̂``.

    Euler::

        θ ← θ + h p
        p ← p - h ∇Ũ_t(θ) - h C p + sqrt(2 A h τ) ζ

    Splitting (A-B-O-B-A)::

        θ ← θ + (h/2) p;  p ← exp(-C h/2) p;  p ← p - h ∇Ũ_t(θ) + sqrt(2 A h τ) ζ;
        p ← exp(-C h/2) p;  θ ← θ + (h/2) p

    ``B̂`` is Chen, Fox & Guestrin's estimate of the stochastic gradient's own diffusion: their update injects
    ``2(C - B̂)hτ`` for a friction ``C``, so that the injected noise and the gradient's together match the friction.
    With ``absorb_noise`` it is ``B̂_k = h V̂_kk/(2τ)`` per coordinate of the metric, from the chain's running estimate
    ``V̂`` of the gradient noise's variances (:mod:`ppl_sgmcmc.noise`, whose noise ratio is then about ``max_k B̂_k/A``;
    less the share of the chain's own motion in that estimate, :meth:`rule_step`), and the friction grows to absorb
    it; without, ``B̂ = 0`` and the noise the gradient adds is left in the draws (the algorithm as most of its users
    run it).

    :param step_size: ``h``, a float or a schedule. In SGD-with-momentum terms, learning rate ``h²``
        and momentum decay ``1 - A h``.
    :param friction: ``A > 0`` (default 1.0), which is also the injected noise's diffusion; a float
        or a schedule.
    :param integrator: ``"splitting"`` (default) or ``"euler"``.
    :param absorb_noise: whether the friction absorbs the measured gradient noise (``B̂`` above). ``None``
        (default): when the step size is tuned. The tuned step keeps SGHMC's target noise ratio (at the thermostat's
        larger one the correction over-absorbs a network's noise and the draws come out too narrow), and the
        noise-ratio warning takes the limit of a rule that absorbs the noise's variances (:class:`SGNHT`'s
        multivariate thermostat, which absorbs them in its own way).
    :param temperature: ``τ`` (default 1).

    Other arguments: see :class:`Algorithm`.
    """

    rule = sghmc_rule
    low_rank_metric = True
    # the friction's injected noise does not make up for the minibatch noise's correlations, which on a network grow
    # where the chain travels; SVRG removes most of that noise, and the step it lets the tuning take pays its cost
    tuned_gradient = "svrg"

    def __init__(
        self,
        model: Callable[..., Any] | None = None,
        potential_fn: Callable[..., Any] | None = None,
        *,
        step_size: float | Schedule | None = None,
        friction: float | Schedule = 1.0,
        integrator: str = "splitting",
        absorb_noise: bool | None = None,
        **kwargs: Any,
    ) -> None:
        self._absorb_noise = step_size is None if absorb_noise is None else _checks.boolean(
            "absorb_noise", absorb_noise, type(self).__name__
        )
        if self._absorb_noise:  # the bias left is that of the noise's correlations, as for mSGNHT's thermostat
            self.noise_ratio_limit = ABSORBED_NOISE_LIMIT
        super().__init__(model, potential_fn, step_size=step_size, friction=friction, integrator=integrator, **kwargs)

    def noise_scale(self, rule_state: sghmc_rule.SGHMCState, i: StepIndex, position: Array) -> Scalar:
        """``1/A``: the injected noise's variance is ``2Ahτ``."""
        return cast(Scalar, 1 / self.hyperparameters_at(i)["friction"])

    def rule_step(
        self, position: Array, state: sghmc_rule.SGHMCState, grad_fn: GradFn, noise: Array, step_size: Scalar,
        i: StepIndex, measured: NoiseState | None = None,
    ) -> tuple[Array, sghmc_rule.SGHMCState, StochasticGradient]:  # fmt: skip
        """:meth:`Algorithm.rule_step` with ``B̂_k = h (A (c ⊙ diag V̂)_k - h² τ/2)₊ / (2τ)`` (``c = 1/A``,
        :meth:`noise_scale`) from the running estimate ``measured``, where ``absorb_noise``; 0 before it measured
        anything. The estimate differences consecutive gradients (:mod:`ppl_sgmcmc.noise`), which also differ by the
        exact gradient's change between their points, ``H h p``: ``h² τ/2`` a coordinate at the unit curvature of the
        metric's coordinates is that share, taken off so that a step at the discretisation's cap, where the noise is
        small, does not absorb its own motion and cool the draws."""
        hyper = self._rule_kwargs(self.rule.step, i)
        if self._absorb_noise and measured is not None:
            xp = array_namespace(measured.variance)
            tau = hyper["temperature"]
            excess = hyper["friction"] * measured.variance - step_size**2 * tau / 2
            b_hat = step_size * xp.clip(excess, 0.0, None) / (2 * tau)
            hyper["gradient_noise"] = xp.where(measured.count > 0, b_hat, xp.zeros_like(b_hat))
        rule: RuleModule = self.rule
        return cast(
            "tuple[Array, sghmc_rule.SGHMCState, StochasticGradient]",
            rule.step(position, state, grad_fn, noise, step_size, **hyper),
        )

    @property
    def noise_bias(self) -> str | None:
        """With ``absorb_noise``, what the friction leaves of the noise: its correlations."""
        return _ABSORBED_NOISE_BIAS if self._absorb_noise else None

    def tuned_options(self, state: object, chain: int | None = None) -> dict[str, Any]:
        """:meth:`Algorithm.tuned_options`, and ``absorb_noise=True`` where the run absorbed the noise (a kernel given
        a step size does not by default)."""
        options = super().tuned_options(state, chain)
        if self._absorb_noise:
            options["absorb_noise"] = True
        return options


#: The noise-ratio warning's diagnosis for each of SGNHT's thermostats (:attr:`SGNHT.noise_bias`).
_THERMOSTAT_NOISE_BIAS = {
    "multivariate": "the thermostat absorbs " + _CORRELATIONS_LEFT,
    "scalar": "the scalar thermostat absorbs the noise's mean variance over the coordinates, which spreads the draws "
    "too wide along the noisiest coordinates and too narrow along the quietest (the default "
    "`thermostat=\"multivariate\"` absorbs each coordinate's)",
    "matrix": "the matrix thermostat absorbs the noise to first order in the step; at this ratio the excess it leaves "
    "spreads the draws wider than the posterior along the noisiest directions",
}


class SGNHT(Algorithm[sgnht_rule.SGNHTState]):
    """Stochastic gradient Nosé-Hoover thermostat: the multivariate mSGNHT of Li, Chen, Fan & Carin
    ("High-Order Stochastic Gradient Thermostats for Bayesian Learning of Deep Models", AAAI 2016)
    with the symmetric-splitting (mSGNHT-S, default) or Euler (mSGNHT-E) integrator, or the
    scalar-thermostat SGNHT of Ding et al. ("Bayesian Sampling Using Stochastic Gradient
    Thermostats", NeurIPS 2014).

    mSGNHT-S, with ``k(p) = p⊙p`` (multivariate), ``pᵀp/d`` (scalar) or ``p pᵀ`` (matrix, less ``τ I``)::

        θ ← θ + (h/2) p;  ξ ← ξ + (h/2)(k(p) - τ);  p ← exp(-ξ h/2) ⊙ p
        p ← p - h ∇Ũ_t(θ) + sqrt(2 D h τ) ζ
        p ← exp(-ξ h/2) ⊙ p;  θ ← θ + (h/2) p;  ξ ← ξ + (h/2)(k(p) - τ)

    mSGNHT-E::

        θ ← θ + h p;  p ← p - h ∇Ũ_t(θ) - h ξ ⊙ p + sqrt(2 D h τ) ζ;  ξ ← ξ + h (k(p) - τ)

    The thermostat ``ξ`` starts at ``D`` and adapts the friction so that ``k(p)`` matches ``τ``,
    absorbing the unknown gradient-noise variance: at equilibrium ``ξ ≈ D + B`` where ``B`` is the
    gradient noise's diffusion. Collect it with ``extra_fields=("rule_state.thermostat",)``.

    The thermostat learns at rate ``h``: on a stiff posterior (curvature ``≫ 1/h``) it takes ``O(1/h)``
    steps or more to settle, so make the warm-up long enough that ``ξ`` has stopped drifting. The Euler
    integrator is stable only while ``h ξ < 2``; the splitting integrator damps by ``exp(-ξ h)`` and
    has no such limit (see the algorithm page).

    :param step_size: ``h``, a float or a schedule.
    :param diffusion: ``D > 0`` (default 1.0), the injected noise's diffusion; a float or a schedule.
    :param thermostat: ``"multivariate"`` (default, ``ξ ∈ R^d``), ``"scalar"``, or ``"matrix"``: a symmetric
        ``Ξ ∈ R^{d×d}`` updated by ``Ξ ← Ξ + (h/2)(p pᵀ - τ I)``, whose friction ``Ξ p`` and damping ``exp(-Ξ h/2) p``
        replace the products with ``ξ``. The multivariate thermostat settles at ``ξ_k ≈ D + h V_kk/2`` and absorbs
        only the variances of the gradient noise (covariance ``V``); the matrix one settles at ``Ξ ≈ D I + h V/2``
        and absorbs its covariances too, which a network's minibatch noise has. It costs ``d²`` numbers of state and
        an eigendecomposition of ``Ξ`` a step (``O(d³)``): meant for up to a few hundred coordinates.
    :param integrator: ``"splitting"`` (default) or ``"euler"``.
    :param temperature: ``τ`` (default 1).

    Other arguments: see :class:`Algorithm`.
    """

    rule = sgnht_rule
    low_rank_metric = True
    schedulable = ("temperature", "diffusion")
    max_step_size = 0.5
    # the thermostat absorbs the gradient noise (ξ ≈ D + h V/2), so the tuned step may let it exceed the
    # injected noise; far beyond, the multivariate thermostat's per-coordinate correction misses correlated noise
    default_noise_ratio, noise_ratio_limit = 1.0, ABSORBED_NOISE_LIMIT
    tuned_gradient = "svrg"  # as SGHMC's: the multivariate thermostat absorbs the noise's variances, not its correlations

    def noise_scale(self, rule_state: sgnht_rule.SGNHTState, i: StepIndex, position: Array) -> Scalar:
        """``1/D``: the injected noise's variance is ``2Dhτ`` (the thermostat absorbs the gradient noise)."""
        return cast(Scalar, 1 / self._options["diffusion"])

    @property
    def noise_bias(self) -> str:
        """What the thermostat leaves of the noise (Li, Chen, Fan & Carin's multivariate thermostat absorbs each
        coordinate's variance, Ding et al.'s scalar one their mean, the matrix one the whole covariance to first
        order), and so how the draws come out."""
        return _THERMOSTAT_NOISE_BIAS[self._options["thermostat"]]

    @property
    def _absorbs_noise_per_coordinate(self) -> bool:
        """The multivariate thermostat does (its friction ``ξ_k`` settles at ``D + h V_kk/2``); the scalar one
        absorbs only the noise's mean variance, the matrix one its whole covariance (in any coordinates)."""
        return bool(self._options["thermostat"] == "multivariate")

    def _restart_rule_state(
        self, rule_state: sgnht_rule.SGNHTState, u: Array, fresh_noise: Array, i: StepIndex
    ) -> sgnht_rule.SGNHTState:
        """A momentum redrawn and the thermostat back at ``D``: a thermostat that ran off with the chain would
        freeze it."""
        thermostat = sgnht_rule.start(u, self._options["diffusion"], self._options["thermostat"])
        return refresh_momentum(rule_state, fresh_noise, self.temperature_at(i))._replace(thermostat=thermostat)

    def __init__(
        self,
        model: Callable[..., Any] | None = None,
        potential_fn: Callable[..., Any] | None = None,
        *,
        step_size: float | Schedule | None = None,
        diffusion: float | Schedule = 1.0,
        thermostat: str = "multivariate",
        integrator: str = "splitting",
        **kwargs: Any,
    ) -> None:
        super().__init__(model, potential_fn, step_size=step_size, **kwargs)
        name = self.name
        if callable(diffusion):
            raise ValueError(
                f"{name}: `diffusion` must be a number: it is also the thermostat's starting value. Schedule "
                "`temperature` or `step_size` instead."
            )
        self._options = {
            "diffusion": _checks.positive("diffusion", diffusion, name),
            "thermostat": _checks.choice("thermostat", thermostat, sgnht_rule.THERMOSTATS, name),
            "integrator": _checks.choice("integrator", integrator, INTEGRATORS, name),
        }

    def progress(self, state: ChainState[sgnht_rule.SGNHTState]) -> dict[str, Any]:
        """The base items and the mean thermostat ``ξ̄`` (of the matrix thermostat's diagonal)."""
        thermostat = state.rule_state.thermostat
        mean = thermostat.diagonal().mean() if thermostat.ndim == 2 else thermostat.mean()
        return {**super().progress(state), "ξ̄": f"{float(mean):.3g}"}


class PSGLD(Algorithm[psgld_rule.PSGLDState]):
    """Preconditioned SGLD with an RMSprop preconditioner (Li, Chen, Carlson & Carin, "Preconditioned
    Stochastic Gradient Langevin Dynamics for Deep Neural Networks", AAAI 2016)::

        V ← α V + (1 - α) ḡ_t ⊙ ḡ_t;   G = 1 ⊘ (λ + sqrt(V))
        θ ← θ - h G ⊙ ∇Ũ_t(θ) + sqrt(2 h τ G) ⊙ ζ

    ``ḡ_t`` is the mean per-datum log-likelihood gradient of the minibatch. The ``Γ(θ)`` term is
    dropped, as in the paper. A latent that the likelihood does not inform (its mean score is 0) gets
    ``G = 1/λ``: choose ``step_size`` with ``h/λ`` in mind, or raise ``eps``, for models with such
    latents. With the warm-up's preconditioner (``adapt_mass_matrix``, on when the step size is tuned) the rule
    runs in coordinates where the posterior has unit scale, and there the mean score of ``n`` of ``N`` rows has
    a root mean square of at most about ``1/sqrt(n N)``: that is ``λ``'s default then, so that ``G`` stays within
    a factor 2 of its typical value. Otherwise a feature present in a handful of rows (one-hot data) keeps
    ``V ≈ 0`` between the minibatches that hold one of its rows, ``G ≈ 1/λ`` is orders of magnitude above the
    other coordinates', and the rare minibatch that holds the row kicks the chain by ``h G`` times ``N/n`` times
    its score: a chain much wider than the posterior in those coordinates, with a small noise ratio (the kicks
    are rare). ``V`` averages over about ``1/(1-α)`` minibatches, so at the default ``α = 0.99`` the
    preconditioner follows the minibatch noise of ``ḡ_t`` and, with ``Γ`` dropped, the chain carries a
    bias that does not vanish as ``h → 0``; a larger ``α`` (0.999) reduces it (see the algorithm page).

    :param step_size: ``h``, a float or a schedule.
    :param alpha: the RMSprop decay ``α ∈ (0, 1)`` (default 0.99).
    :param eps: the regulariser ``λ > 0`` (default ``1/sqrt(n N)`` with ``adapt_mass_matrix`` on a model with a
        subsampled plate of ``n`` of ``N`` rows, else 1e-5).
    :param temperature: ``τ`` (default 1).

    Other arguments: see :class:`Algorithm`.
    """

    rule = psgld_rule
    #: ``λ`` without the warm-up's preconditioner (or without a subsampled plate), unless given.
    default_eps: ClassVar[float] = 1e-5

    def _preconditioner(self, rule_state: psgld_rule.PSGLDState) -> Array:
        """pSGLD's ``G = 1 ⊘ (λ + sqrt(V))``."""
        xp = array_namespace(rule_state.square_avg)
        return cast(Array, 1 / (self._options["eps"] + xp.sqrt(rule_state.square_avg)))

    def noise_scale(self, rule_state: psgld_rule.PSGLDState, i: StepIndex, position: Array) -> Scalar:
        """``G``: the gradient and the injected noise pass through the preconditioner."""
        return self._preconditioner(rule_state)

    def _changing_preconditioner(self, rule_state: psgld_rule.PSGLDState) -> Array | None:
        """``V``: ``G`` follows the minibatch scores along the chain, and the rule drops the ``Γ`` term of that
        change (the health checks report a ``G`` that changes by more than
        :data:`~ppl_sgmcmc.health.PRECONDITIONER_CHANGE` between two checks)."""
        return rule_state.square_avg

    def _preconditioner_change(self, low: Array, high: Array, start: StepIndex) -> Array:
        """``max_k G(low_k) / G(high_k)``; NaN until ``V`` has forgotten its start (``10/(1-α)`` steps)."""
        xp = array_namespace(low)
        eps = self._options["eps"]
        change = xp.max((eps + xp.sqrt(high)) / (eps + xp.sqrt(low)))
        settled = xp.asarray(start, dtype=low.dtype, device=device(low)) >= 10 / (1 - self._options["alpha"])
        return cast(Array, xp.where(settled, change, xp.full_like(change, math.nan)))

    def _step_cap(self, rule_state: psgld_rule.PSGLDState) -> Scalar:
        """:attr:`max_step_size` for the preconditioned step ``h G``."""
        xp = array_namespace(rule_state.square_avg)
        return cast(Scalar, self.max_step_size / xp.max(self._preconditioner(rule_state)))

    def _warm_start(self, rule_state: psgld_rule.PSGLDState, probe: StochasticGradient) -> psgld_rule.PSGLDState:
        """``V`` starts at the probe's mean squared score instead of 0 (whose ``G = 1/λ`` would take huge
        first steps)."""
        xp = array_namespace(probe.score)
        return rule_state._replace(square_avg=xp.mean(probe.score * probe.score, axis=0))

    def _rescale_rule_state(self, rule_state: psgld_rule.PSGLDState, factor: Array) -> psgld_rule.PSGLDState:
        """``V ⊙ factor²``: scores in the new coordinates are ``factor ⊙`` those in the old."""
        return rule_state._replace(square_avg=rule_state.square_avg * factor * factor)

    def __init__(
        self,
        model: Callable[..., Any] | None = None,
        potential_fn: Callable[..., Any] | None = None,
        *,
        step_size: float | Schedule | None = None,
        alpha: float = 0.99,
        eps: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, potential_fn, step_size=step_size, **kwargs)
        self._eps_given = eps is not None
        self._options = {
            "alpha": _checks.in_unit_interval("alpha", alpha, self.name),
            "eps": self.default_eps if eps is None else _checks.positive("eps", eps, self.name),
        }

    def _check_target(self, target: Target) -> None:
        """``λ = 1/sqrt(n N)`` unless given, with the preconditioner in force (see the class docstring)."""
        super()._check_target(target)
        if not self._eps_given and self._preconditioned and target.plate_sizes:
            size, n = max(target.plate_sizes.values())
            self._options["eps"] = 1.0 / math.sqrt(n * size)


class SGRLD(Algorithm[sgrld_rule.SGRLDState]):
    """Stochastic gradient Riemannian Langevin dynamics (Patterson & Teh, "Stochastic Gradient Riemannian
    Langevin Dynamics on the Probability Simplex", NeurIPS 2013) with the expanded-mean preconditioner
    ``G(θ) = diag(θ)`` (the inverse metric) and mirroring, for positive latents::

        θ ← | θ - h (θ ⊙ ∇Ũ_t(θ) - τ) + sqrt(2 h τ θ) ⊙ ζ |

    The chain moves the latents in their own positive space: ``θ`` and ``∇Ũ_t`` are those of the model
    as declared, without a log transform or its Jacobian. Every latent must have a positive support
    (``Gamma``, ``Exponential``, ``HalfNormal``, ``LogNormal``, ...); a model with another latent gets a
    ``ValueError`` naming it. With ``potential_fn`` the energy is a function of the positive values
    themselves, and the initial values must be positive.

    This is the sampler of Patterson & Teh for LDA in the expanded-mean parametrisation: topics
    ``θ_kw ~ Gamma(β, 1)``, ``π_k = θ_k / Σ_w θ_kw``, the topic assignments as local Gibbs sites
    (``models/lda.py``).

    :param step_size: ``h``, a float or a schedule.
    :param temperature: ``τ`` (default 1).

    Other arguments: see :class:`Algorithm`.
    """

    rule = sgrld_rule
    constrained = True

    def noise_scale(self, rule_state: sgrld_rule.SGRLDState, i: StepIndex, position: Array) -> Scalar:
        """``θ``: the step moves coordinate ``k`` by ``h θ_k`` times the gradient, and injects noise of variance
        ``2hτθ_k``, so the gradient noise adds ``h θ_k V_kk / (2τ)`` of it."""
        return position

    can_adapt_mass = False
    can_adapt_mass_reason = "SGRLD's preconditioner is diag(θ), fixed by the Riemannian metric."

    def _check_target(self, target: Target) -> None:
        super()._check_target(target)
        _checks.positive_latents(target.latent_supports, self._is_positive_support, self.name)


# --- contour SG-MCMC (CSGLD / CSGHMC) ------------------------------------------------------------------
class ContourFields:
    """The contour quantities of a CSGLD/CSGHMC rule state (:class:`ppl_sgmcmc.rules.csgld.CSGLDState`)
    as attributes of the kernel's state, so that the MCMC drivers collect them under clean names and
    ArviZ puts them in ``sample_stats``: ``log_weight`` and ``partition`` (collected by default),
    ``multiplier``, ``theta`` (the partition weights), ``energy_min``, ``energy_gap``. Each backend's
    ``ContourState`` mixes it into its state class.
    """

    __slots__ = ()
    rule_state: sgrld_rule.SGRLDState

    log_weight = property(lambda self: self.rule_state.log_weight, doc="log importance weight of the sample")
    partition = property(lambda self: self.rule_state.partition, doc="0-based energy bin of the sample")
    multiplier = property(lambda self: self.rule_state.multiplier, doc="gradient multiplier used at the sample")
    theta = property(lambda self: self.rule_state.theta, doc="the learned partition weights θ")
    energy_min = property(lambda self: self.rule_state.energy_min, doc="the grid's u_min")
    energy_gap = property(lambda self: self.rule_state.energy_gap, doc="the grid's Δu")


@dataclass(frozen=True, eq=False)
class Contour:
    """CSGLD's (and CSGHMC's) contour arguments, checked; ``energy_gap``/``energy_min`` ``None`` for
    ``"auto"``, ``calibration_steps`` ``None`` for the default, ``initial_theta`` normalised."""

    adapt_theta: str
    num_partitions: int
    energy_gap: float | None
    energy_min: float | None
    zeta: float
    sa_step_size: float | Schedule  # a float in (0, 1) or a schedule
    weight: str
    calibration_steps: int | None
    initial_theta: np.ndarray | None

    @property
    def auto_grid(self) -> bool:
        """Whether the energy grid is chosen from the warm-up."""
        return self.energy_min is None or self.energy_gap is None

    def windows(self, steps: int, warmup_draws: int, warmup_arg: str, kernel: str) -> tuple[int, int | None]:
        """The rule's ``(calibration_steps, adaptation_steps)`` for a warm-up of ``steps`` steps
        (``warmup_draws`` draws, the driver's ``warmup_arg``, for the messages)."""
        if not self.auto_grid:
            calibration = 0
        elif self.calibration_steps is not None:
            if self.calibration_steps > steps:
                raise ValueError(
                    f"{kernel}: `calibration_steps` ({self.calibration_steps}) exceeds the warm-up "
                    f"({steps} steps): draws taken before the grid is set carry no valid weight. "
                    f"Lengthen `{warmup_arg}` or shorten `calibration_steps`."
                )
            calibration = self.calibration_steps
        elif steps == 0:
            calibration = 0  # a chain continued from its state keeps the grid it calibrated
        else:
            calibration = steps // 2
            if calibration < 2:
                raise ValueError(
                    f"{kernel}: `energy_min`/`energy_gap` \"auto\" choose the energy grid during the warm-up, "
                    f"but {warmup_arg}={warmup_draws} gives too few steps. Set `{warmup_arg}` (hundreds of steps or "
                    "more), or give `energy_min` and `energy_gap` explicitly."
                )
        if self.adapt_theta == "warmup":
            if steps <= calibration:
                raise ValueError(
                    f"{kernel}: with adapt_theta=\"warmup\" the partition weights are learned during the warm-up after "
                    f"the grid is set, but the warm-up ({steps} steps) leaves no step for it. Lengthen `{warmup_arg}`."
                )
            return calibration, steps
        return calibration, 0 if self.adapt_theta == "never" else None


class CSGLD(Algorithm[csgld_rule.CSGLDState]):
    """Contour stochastic gradient Langevin dynamics (Deng, Lin & Liang, "A Contour Stochastic Gradient
    Langevin Dynamics Algorithm for Simulations of Multi-modal Distributions", NeurIPS 2020): SGLD on
    the flattened density ``ϖ ∝ π / Ψ_θ(U)^ζ``, with importance weights that restore ``π``.

    With the energy grid ``u_min + k Δu`` (``m`` bins, 0-based bin ``j`` of the minibatch energy
    ``Ũ_t(x)``, ``j⁻ = max(j-1, 0)``), at each step::

        θ(i) ← θ(i) + ω_k θ(j)^ζ (1[i = j] - θ(i))                        (stochastic approximation)
        x ← x - h [1 + (ζ τ / Δu)(log θ(j) - log θ(j⁻))] ∇Ũ_t(x) + sqrt(2 h τ) ξ

    and the sample ``x`` gets the log weight ``ζ log Ψ_θ(Ũ_t(x))`` (eq. (5) of the paper, log ``θ``
    interpolated linearly across the bin) or, with ``weight="bin"``, the paper's ``ζ log θ(j)``.
    The full rule, and why each sample is the point of its own gradient, are in
    :mod:`ppl_sgmcmc.rules.csgld`. Only the minibatch energy that comes with the gradient is used.

    **Output.** Every draw carries ``log_weight`` and ``partition`` (the 0-based bin), which the ArviZ
    converters put in ``sample_stats``. Weighted expectations and importance resampling into ordinary
    draws: :mod:`ppl_sgmcmc.importance`. The learned ``θ``, ``energy_min`` and ``energy_gap`` are in the
    chain's final state; a resumed run continues with them.

    **Energy grid.** ``energy_min="auto"`` (default) sets ``u_min`` to the smallest minibatch energy of
    the first ``calibration_steps`` steps (default: the first half of the warm-up); ``energy_gap="auto"``
    (default) sets ``Δu`` to the standard deviation of the minibatch energies over the second half of
    those steps (the energy's per-step fluctuation). While the grid is calibrated ``θ`` stays uniform,
    so the chain is plain SGLD. Both need a warm-up, long enough that the chain has reached its typical
    set within its first quarter. A ``u_min`` below every energy the chain visits leaves the lowest bin
    empty: its ``θ`` decays to 0 and the multiplier explodes in the first occupied bin; a ``Δu`` much
    finer than the energy's fluctuation amplifies the noise of ``log θ``. The grid, ``m Δu`` above
    ``u_min``, should reach well over the energy barriers between modes and over the energies the
    flattened chain climbs to. Each chain calibrates its own grid. The algorithm page has the
    measurements behind this advice.

    :param step_size: ``h`` (the paper's ``ε``), a float or a schedule. The flattened drift's multiplier
        (up to ``1 + ζτ/Δu·|Δ log θ|``) amplifies SGLD's discretisation bias, and the weights do not correct
        it: check that importance-weighted results are stable when ``h`` is halved.
    :param int num_partitions: ``m >= 2`` energy bins (default 100).
    :param energy_gap: ``Δu > 0``, or ``"auto"`` (default).
    :param energy_min: ``u_min``, or ``"auto"`` (default).
    :param float zeta: the flattening strength ``ζ >= 0`` (default 0.75, the paper's); ``ζ = 0`` is SGLD.
    :param sa_step_size: ``ω_k``, a float in (0, 1) or a schedule of the 1-based update count ``k``;
        default ``1 / (k^0.6 + 100)``.
    :param str weight: ``"interpolated"`` (default; the exact weight of the density sampled) or ``"bin"``
        (the paper's ``θ(j)^ζ``, which biases mode masses at coarse grids).
    :param calibration_steps: the steps that calibrate an ``"auto"`` grid (default: half the warm-up steps);
        at least 2 and at most the warm-up.
    :param str adapt_theta: ``"always"`` (default, the paper's algorithm: ``θ`` keeps learning while
        sampling, which biases the weighted estimates by ``O(ω_k)``), ``"warmup"`` (``θ`` is frozen after
        the warm-up: the draws are an ordinary Markov chain on the flattened density and the weights are
        exact for it) or ``"never"`` (``θ`` stays at ``initial_theta``, required: the paper's KSGLD).
    :param initial_theta: ``θ``'s starting value instead of the uniform one: ``m`` positive finite weights
        of the bins of the given grid (normalised to sum to 1). Needs explicit ``energy_min`` and
        ``energy_gap``.
    :param temperature: ``τ`` (default 1).

    Other arguments: see :class:`Algorithm`.
    """

    rule = csgld_rule
    sample_stats_fields = ("log_weight", "partition")

    def _place_rule_state(self, rule_state: csgld_rule.CSGLDState, u: Array) -> csgld_rule.CSGLDState:
        """The integrator's own position (one move ahead of the sample) at ``u``."""
        return rule_state._replace(position=u)

    def _rescale_rule_state(self, rule_state: csgld_rule.CSGLDState, factor: Array) -> csgld_rule.CSGLDState:
        """The integrator's own position (one move ahead of the sample) in the rescaled coordinates, ``u ⊘ factor``:
        the rule moves from it, not from the position the kernel passes, so it must follow every change of
        coordinates the warm-up makes."""
        return rule_state._replace(position=rule_state.position / factor)

    def _watched_state(self, rule_state: csgld_rule.CSGLDState) -> tuple[Array | None, ...]:
        """Not the energy grid and statistics (energies, and a running sum of their squared deviations, grow
        with ``N`` and the run) nor the last sample's log-weight."""
        fields: Any = rule_state  # its NamedTuple's fields are arrays; the health checks skip `None` leaves
        watched: tuple[Array | None, ...] = fields._replace(
            energy_min=None, energy_gap=None, energy_mean=None, energy_m2=None, log_weight=None
        )
        return watched

    def noise_scale(self, rule_state: csgld_rule.CSGLDState, i: StepIndex, position: Array) -> Scalar:
        """The squared gradient multiplier (divided by CSGHMC's friction): the flattening scales the
        gradient, noise included, but not the injected noise."""
        scale = rule_state.multiplier * rule_state.multiplier
        return scale / self.hyperparameters_at(i)["friction"] if "friction" in self._options else scale
    final_state_fields = ("theta", "energy_min", "energy_gap")
    integrator = "langevin"

    def __init__(
        self,
        model: Callable[..., Any] | None = None,
        potential_fn: Callable[..., Any] | None = None,
        *,
        step_size: float | Schedule | None = None,
        num_partitions: int = 100,
        energy_gap: float | str = "auto",
        energy_min: float | str = "auto",
        zeta: float = 0.75,
        sa_step_size: float | Schedule = csgld_rule.default_sa_step_size,
        weight: str = "interpolated",
        calibration_steps: int | None = None,
        adapt_theta: str = "always",
        initial_theta: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, potential_fn, step_size=step_size, **kwargs)
        self._contour = _contour(
            num_partitions, energy_gap, energy_min, zeta, sa_step_size, weight, calibration_steps, adapt_theta,
            initial_theta, self.name,
        )  # fmt: skip
        self._calibration_steps: int = 0  # set from the warm-up
        self._adaptation_steps: int | None = None

    @property
    def auto_grid(self) -> bool:
        """Whether the energy grid is chosen from the warm-up: ``True`` unless both ``energy_min`` and
        ``energy_gap`` are given.

        **Example**::

            >>> from ppl_sgmcmc.numpyro import CSGLD
            >>> CSGLD(potential_fn=lambda z: 0.0, step_size=0.1, energy_min=0.0).auto_grid  # Δu is still "auto"
            True
            >>> CSGLD(potential_fn=lambda z: 0.0, step_size=0.1, energy_min=0.0, energy_gap=1.0).auto_grid
            False
        """
        return self._contour.auto_grid

    def hyperparameters(self) -> dict[str, Any]:
        """The rule's keyword arguments besides ``step_size``: ``temperature``; the contour arguments
        ``num_partitions``, ``energy_min``, ``energy_gap`` (``None`` while ``"auto"``), ``zeta``,
        ``sa_step_size``, ``weight`` and ``initial_theta``; the windows ``calibration_steps`` and
        ``adaptation_steps`` (``None``: ``θ`` never stops learning), which the warm-up fixes; and the
        ``integrator`` (``"langevin"``, or CSGHMC's).

        **Example** (an ``"auto"`` grid, calibrated over half the warm-up: 50 draws × 4 steps / 2)::

            >>> import jax, jax.numpy as jnp
            >>> from ppl_sgmcmc.numpyro import CSGLD
            >>> kernel = CSGLD(potential_fn=lambda z: jnp.sum(z["x"] ** 2) / 2, step_size=0.1, steps_per_sample=4)
            >>> _ = kernel.init(jax.random.PRNGKey(0), num_warmup=50, init_params={"x": jnp.zeros(2)})
            >>> hp = kernel.hyperparameters()
            >>> hp["energy_min"], hp["calibration_steps"], hp["adaptation_steps"], hp["integrator"]
            (None, 100, None, 'langevin')
        """
        contour = self._contour
        return {
            **super().hyperparameters(),
            "num_partitions": contour.num_partitions,
            "energy_min": contour.energy_min,
            "energy_gap": contour.energy_gap,
            "zeta": contour.zeta,
            "sa_step_size": contour.sa_step_size,
            "calibration_steps": self._calibration_steps,
            "adaptation_steps": self._adaptation_steps,
            "weight": contour.weight,
            "initial_theta": contour.initial_theta,
            "integrator": self.integrator,
        }

    def _set_warmup(self, num_warmup: int, steps: int | None = None) -> None:
        super()._set_warmup(num_warmup, steps)
        self._calibration_steps, self._adaptation_steps = self._contour.windows(
            self._num_warmup_steps, num_warmup, self.warmup_arg, self.name
        )
        if self._contour.auto_grid and self._calibration_steps == 0:
            self._start_warning = (
                f"{self.name}: `energy_min`/`energy_gap` \"auto\" choose the energy grid during the warm-up, but "
                f"{self.warmup_arg}=0 leaves no step for it. That is right when continuing a chain from its state "
                "(its grid is in the state); a new chain would use the placeholder grid u_min = 0, Δu = 1: set "
                f"`{self.warmup_arg}`, or give `energy_min` and `energy_gap` explicitly."
            )

    def progress(self, state: ChainState[csgld_rule.CSGLDState]) -> dict[str, Any]:
        """The base items, the sample's 0-based energy bin and its gradient multiplier."""
        rule = state.rule_state
        return {**super().progress(state), "bin": int(rule.partition), "mult": f"{float(rule.multiplier):.3g}"}


def _contour(
    num_partitions: Any,
    energy_gap: Any,
    energy_min: Any,
    zeta: Any,
    sa_step_size: Any,
    weight: Any,
    calibration_steps: Any,
    adapt_theta: Any,
    initial_theta: Any,
    kernel: str,
) -> Contour:
    """CSGLD's contour arguments, checked in the order the messages are tested in (``Any``: the user's values,
    before their checks)."""
    adapt_theta = _checks.choice("adapt_theta", adapt_theta, ("always", "warmup", "never"), kernel)
    num_partitions = _checks.int_at_least("num_partitions", num_partitions, 2, kernel)
    energy_gap = None if energy_gap == "auto" else _checks.positive("energy_gap", energy_gap, kernel)
    energy_min = None if energy_min == "auto" else _checks.finite("energy_min", energy_min, kernel)
    zeta = _checks.non_negative("zeta", zeta, kernel)
    if not callable(sa_step_size):
        sa_step_size = _checks.in_unit_interval("sa_step_size", sa_step_size, kernel)
    weight = _checks.choice("weight", weight, csgld_rule.WEIGHTS, kernel)
    if calibration_steps is not None:
        calibration_steps = _checks.int_at_least("calibration_steps", calibration_steps, 2, kernel)
    contour = Contour(
        adapt_theta, num_partitions, energy_gap, energy_min, zeta, sa_step_size, weight, calibration_steps, None
    )
    if initial_theta is not None:
        initial_theta = _checks.initial_theta(initial_theta, num_partitions, contour.auto_grid, kernel)
        contour = replace(contour, initial_theta=initial_theta)
    elif adapt_theta == "never":
        raise ValueError(
            f"{kernel}: adapt_theta=\"never\" keeps θ at `initial_theta`; give `initial_theta` (with the "
            "uniform θ the chain would be plain SGLD)."
        )
    return contour


class CSGHMC(_SGHMCMoves[csgld_rule.CSGLDState], CSGLD):
    """Contour SGHMC (Deng, Lin & Liang, NeurIPS 2020, §4.2): the energy flattening and importance
    weights of :class:`CSGLD` inside the SGHMC momentum integrator of :class:`SGHMC` (identity mass),
    the gradient ``∇Ũ_t`` replaced by ``[1 + (ζ τ / Δu)(log θ(j) - log θ(j⁻))] ∇Ũ_t``.

    With the splitting integrator the gradient, and so the energy and the weight, is taken at the
    midpoint ``θ + (h/2) p``: the draws are those midpoints (see :mod:`ppl_sgmcmc.rules.csgld`).

    :param step_size: ``h``, a float or a schedule. In the paper's SGD-with-momentum terms, learning
        rate ``h²`` and momentum ``1 - A h`` (the paper uses momentum 0.9).
    :param friction: ``A > 0`` (default 1.0), also the injected noise's diffusion.
    :param integrator: ``"splitting"`` (default) or ``"euler"``.

    The contour arguments are those of :class:`CSGLD`.
    """


# --- SGFS -------------------------------------------------------------------------------------------------
class SGFS(Algorithm[sgfs_rule.SGFSState]):
    """Stochastic gradient Fisher scoring (Ahn, Korattikara & Welling, "Bayesian Posterior Sampling via
    Stochastic Gradient Fisher Scoring", ICML 2012), Algorithm 1.

    With the minibatch's per-datum scores ``g_i = ∇ log p(x_i | θ)`` (``n`` of them, mean ``ḡ``), ``N`` the
    subsampled plate's size, ``γ = (n + N)/n`` and step size ``ε``::

        V_t = (1/(n-1)) Σ_i (g_i - ḡ)(g_i - ḡ)ᵀ
        Î_t = (1 - κ_t) Î_{t-1} + κ_t V_t,      κ_t = 1/t
        θ ← θ + 2 (γ N Î_t + 4B/ε)⁻¹ (∇ log p(θ) + N ḡ + η),      η ~ N(0, 4B/ε)

    ``∇ log p(θ) + N ḡ = -∇Ũ_t(θ)``, in unconstrained space. The paper reports ``α = 2/sqrt(ε)``:
    ``α = 0`` (``ε = ∞``) adds no noise beyond the minibatch's and samples the Bernstein–von Mises
    Gaussian ``N(θ₀, I_N⁻¹)`` at the fastest mixing (one step moves ``2/γ ≈ 2n/N`` of a Fisher-scoring
    step towards the mode); larger ``α`` takes smaller steps and, as ``ε → 0``, becomes SGLD
    preconditioned by ``B⁻¹`` (exact for non-Gaussian posteriors, slow). Give ``step_size=ε`` or
    ``alpha=α``, or neither: then ``α = 0`` and the chain starts at the approximate mode that ``find_mode``'s
    optimiser finds (``find_mode=False`` starts it at the init strategy's point instead).

    The per-datum scores come from the model (one gradient per datum of the minibatch, batched); the
    model needs exactly one plate with ``subsample_size = n ≥ 2`` around its observed sites (the paper
    recommends ``n ≥ 100`` so that the minibatch gradient is Gaussian).

    **Fisher state.** ``Î_t`` is part of the chain's rule state (a :class:`~ppl_sgmcmc.rules.sgfs.SGFSState`:
    ``fisher``, ``count = 1/κ_t``), so a resumed run continues the same average; ``γ N Î`` approximates
    the posterior precision of the unconstrained, flattened latents.

    **Warm-up.** ``κ_t = 1/t`` averages over the whole run, and scores far from the mode are much larger
    than at the mode, so a chain started far away would keep an inflated ``Î`` and nearly freeze. During
    warm-up the average therefore forgets, ``κ_t = 1/min(t, fisher_window)``; after warm-up the paper's
    ``1/t`` averaging takes over, counting the warm-up estimate as ``min(warm-up steps, fisher_window)``
    minibatches. ``fisher_window=None`` (or no warm-up) is the paper's ``κ_t = 1/t`` throughout.
    Warm-up should span several relaxation times, ``≫ N/n`` steps.

    :param step_size: ``ε > 0``, a float, ``float("inf")`` (``α = 0``) or a schedule ``t -> ε_t``.
    :param alpha: instead of ``step_size``, the paper's ``α = 2/sqrt(ε) ≥ 0``. Neither: ``α = 0``.
    :param fisher: ``"full"`` (SGFS-f, default): a ``d×d`` ``Î`` and a Cholesky solve, O(n d² + d³) per
        step and d² memory, allowed up to ``max_full_dim`` parameters; or ``"diagonal"`` (SGFS-d): only
        ``diag Î``, O(n d). SGFS-d mixes fast but, at large ``ε``, samples a too narrow Gaussian where the
        posterior is correlated (its means are fine); at small ``ε`` it is preconditioned SGLD.
    :param B: the noise matrix, any symmetric positive-definite ``B``: ``"fisher"`` (default, the paper's
        ``B = γ N Î_t``), ``"identity"``, a positive scalar, a vector of ``d`` positive diagonal entries,
        or (full form) a ``d×d`` matrix; ``d`` counts the unconstrained latents, flattened in sorted site
        order.
    :param ridge: the preconditioner uses ``Î + ridge·Diag(Î)`` (default ``1e-4``; 0 for Algorithm 1
        literally): keeps the Cholesky factor defined. If ``n ≤ d``, ``Î`` is singular for the first
        ``~d/n`` steps: raise it to 1e-2 or more (initialisation warns) or use ``fisher="diagonal"``. Every
        latent must enter the likelihood (its Fisher must be positive) unless ``B`` is fixed and ``ε`` finite.
    :param fisher_window: the warm-up averaging window (default 100), or ``None``.
    :param max_full_dim: the largest ``d`` for ``fisher="full"`` (default
        :data:`~ppl_sgmcmc.rules.sgfs.MAX_FULL_DIM`); above it, initialisation raises and points to
        ``fisher="diagonal"``. The algorithm page gives measured costs per step.

    ``temperature`` must stay 1: Algorithm 1 has none. Other arguments: see :class:`Algorithm`.
    """

    rule = sgfs_rule
    can_adapt_mass = False

    def noise_scale(self, rule_state: sgfs_rule.SGFSState, i: StepIndex, position: Array) -> Scalar:
        """Not measured (NaN): SGFS builds the gradient noise into its preconditioner and noise by design."""
        return math.nan
    can_adapt_mass_reason = "SGFS preconditions by its own Fisher estimate, which the warm-up already adapts."

    @property
    def step_fix(self) -> str:
        """SGFS's step shrinks as ``α = 2/sqrt(ε)`` grows: its default ``α = 0`` takes the largest."""
        return ("a larger `alpha` (SGFS's step shrinks as α = 2/sqrt(ε) grows; the default α = 0 takes the largest), "
                "or a smaller `step_size` ε")  # fmt: skip

    def __init__(
        self,
        model: Callable[..., Any] | None = None,
        potential_fn: Callable[..., Any] | None = None,
        *,
        step_size: float | Schedule | None = None,
        alpha: float | None = None,
        fisher: str = "full",
        B: Any = "fisher",
        ridge: float = 1e-4,
        fisher_window: int | None = 100,
        max_full_dim: int = sgfs_rule.MAX_FULL_DIM,
        **kwargs: Any,
    ) -> None:
        name = type(self).__name__
        if potential_fn is not None:
            raise ValueError(
                f"{name}: SGFS needs the per-datum scores of a model's subsampled plate; give `model`, not "
                "`potential_fn`."
            )
        if step_size is not None and alpha is not None:
            raise ValueError(f"{name}: give one of `step_size` (ε) and `alpha` (α = 2/sqrt(ε)), not both.")
        if step_size is None and alpha is None:  # the defaults: α = 0 from an approximate mode
            alpha = 0.0
            kwargs.setdefault("find_mode", True)
        if alpha is not None:
            step_size = sgfs_rule.alpha_to_step_size(_checks.non_negative("alpha", alpha, name))
        if kwargs.get("temperature", 1.0) != 1.0:
            raise ValueError(f"{name}: `temperature` must be 1; SGFS (Algorithm 1) has no temperature.")
        if kwargs.get("gradient", "minibatch") != "minibatch":
            raise ValueError(
                f"{name}: SGFS takes its diffusion from the minibatch gradient's noise (and its Fisher estimate from "
                "the per-datum scores), which a variance-reduced estimator removes; use gradient='minibatch'."
            )
        if kwargs.get("gibbs_sites"):
            raise NotImplementedError(
                f"{name}: SGFS with local Gibbs sites is not supported (per-datum scores would have to average "
                "over the sweeps); marginalise the local sites or use another kernel."
            )
        assert step_size is not None  # one of step_size and alpha was given
        infinite = not callable(step_size) and isinstance(step_size, (int, float)) and step_size == math.inf
        super().__init__(model, potential_fn, step_size=1.0 if infinite else step_size, **kwargs)
        if infinite:
            self._step_size = math.inf
        fisher = _checks.choice("fisher", fisher, sgfs_rule.FISHER_FORMS, name)
        if isinstance(B, str):
            B = _checks.choice("B", B, ("fisher", "identity"), name)
        else:
            B = _checks.positive_definite("B", B, name)
            if fisher == "diagonal" and B.ndim == 2:
                raise ValueError(
                    f"{name}: fisher='diagonal' needs a diagonal `B` (a scalar or a vector), got a matrix; use "
                    "fisher='full' or pass its diagonal."
                )
        self._options = {
            "fisher": fisher,
            "B": B,
            "ridge": _checks.non_negative("ridge", ridge, name),
            "fisher_window": None if fisher_window is None else _checks.positive_int("fisher_window", fisher_window, name),
            "max_full_dim": _checks.positive_int("max_full_dim", max_full_dim, name),
        }
        self._data_size: int | None = None  # N, from the model

    def hyperparameters(self) -> dict[str, Any]:
        """The rule's keyword arguments besides ``step_size``: ``fisher``, ``B``, ``ridge``, ``fisher_window``
        and ``max_full_dim`` as validated, ``data_size`` (``N``, the subsampled plate's size; ``None``
        until the model is known) and ``num_warmup`` (in steps); no ``temperature``.

        **Example** (``num_warmup`` counts steps: 50 draws × 2)::

            >>> import jax, jax.numpy as jnp, numpyro, numpyro.distributions as dist
            >>> from ppl_sgmcmc.numpyro import SGFS
            >>> def model(x):
            ...     loc = numpyro.sample("loc", dist.Normal(0, 10))
            ...     scale = numpyro.sample("scale", dist.HalfNormal(5))
            ...     with numpyro.plate("data", x.shape[0], subsample_size=50):
            ...         numpyro.sample("x", dist.Normal(loc, scale), obs=numpyro.subsample(x, event_dim=0))
            >>> kernel = SGFS(model, step_size=1.0, fisher="diagonal", steps_per_sample=2)
            >>> kernel.hyperparameters()["data_size"] is None  # before the model is seen
            True
            >>> init_params = {"loc": jnp.array(0.0), "scale": jnp.array(0.0)}  # unconstrained: scale = 1
            >>> _ = kernel.init(jax.random.PRNGKey(0), 50, init_params, model_args=(jnp.ones(500),))
            >>> hp = kernel.hyperparameters()
            >>> hp["fisher"], hp["data_size"], hp["num_warmup"], "temperature" in hp
            ('diagonal', 500, 100, False)
        """
        return dict(self._options, data_size=self._data_size, num_warmup=self._num_warmup_steps)

    def _check_target(self, target: Target) -> None:
        super()._check_target(target)
        self._data_size = target.data_size

    def _check_scores(self, per_example: Array | np.ndarray, sites: list[str]) -> None:
        """With ``B="fisher"``, every latent must enter the likelihood: a coordinate whose per-datum scores are
        all zero has no Fisher information, and the preconditioner ``(γ N Î + 4B/ε)⁻¹`` is singular along it
        (the chain freezes or takes huge steps there). A latent that enters only through the prior (a
        hierarchical model's group mean and scale) gets a clear error instead."""
        if not (isinstance(self._options["B"], str) and self._options["B"] == "fisher"):
            return
        per_example = np.asarray(per_example)
        silent = np.flatnonzero(~np.any(per_example != 0, axis=0))
        if silent.size:
            names = sorted({sites[k] for k in silent})
            raise ValueError(
                f"{self.name}: the per-datum scores of {silent.size} coordinate(s) of the latent site(s) "
                f"{', '.join(map(repr, names))} are zero in all {per_example.shape[0]} rows of a minibatch near the "
                "start: these coordinates do not enter the likelihood (a latent only in the prior, such as a "
                "hierarchical model's group mean or scale), or only through rows that minibatches rarely contain "
                "(sparse features). Either way SGFS's Fisher estimate, which ignores the prior, is singular or "
                "nearly so along them, and its steps there are unbounded. Use another kernel (SGNHT, SGLD), or "
                "give a positive definite `B` and a finite `step_size`."
            )

    def _check_dimension(self, target: Target, dim: int) -> None:
        super()._check_dimension(target, dim)
        options = self._options
        try:
            sgfs_rule.check(dim, options["fisher"], options["B"], options["max_full_dim"])
        except sgfs_rule.SGFSConfigError as err:
            raise ValueError(f"{self.name}: {err}") from None
        ((_, (_, n)),) = target.plate_sizes.items()
        if options["fisher"] == "full" and n <= dim and options["ridge"] < 1e-2:
            warnings.warn(
                f"{self.name}: the minibatch (n = {n}) is not larger than the number of parameters "
                f"(d = {dim}), so the Fisher estimate is singular for the first ~d/n steps and, with ridge = "
                f"{options['ridge']:g}, steps along its null space are huge (rejected as divergent). Use ridge=1e-2 "
                "or more, a larger subsample_size, or fisher='diagonal'.",
                stacklevel=3,
            )


# --- Santa ------------------------------------------------------------------------------------------------
class Santa(Algorithm[santa_rule.SantaState]):
    """Santa, the stochastic annealing thermostat with adaptive momentum (Chen, Carlson, Gan, Li & Carin,
    "Bridging the Gap between Stochastic Gradient MCMC and Stochastic Optimization", AISTATS 2016):
    mSGNHT preconditioned by RMSprop at inverse temperatures ``β_t → ∞``, an optimiser that starts as a
    sampler. Euler scheme (the paper's Algorithm 1), with ``f = ∇Ũ_t(θ)``, the RMSprop average ``V`` of ``f/N``
    (``N`` the data size), ``g = 1 ⊘ sqrt(λ + sqrt(V))`` (``g'`` before this step's update of ``V``), and the
    temperature ``T_t = 1/β_t`` while the chain explores, ``T_t = 0`` once it refines::

        ξ ← ξ + h (p⊙p - T_t);  p ← (1 - h ξ)⊙p - h g⊙f + sqrt(2 h T_t g') ⊙ ζ;  θ ← θ + h g⊙p

    The rule in full, how it maps to the paper's ``η = h²``, ``u = h p``, ``α = h ξ``, and where it departs
    from the listing (the noise's power of ``η``, the curvature term, the refinement's thermostat):
    :mod:`ppl_sgmcmc.rules.santa`. Exploration samples ``exp(-β_t U)`` while ``β_t`` grows; refinement, from
    step ``num_exploration`` on, is the deterministic optimiser at zero temperature, which converges to the
    mode the exploration ended near.

    **Output.** Through ``MCMC`` the draws are the annealed trajectory, not posterior draws; the last
    draw is Santa's estimate of the global mode (``mcmc.get_samples()[site][-1]``, constrained like every
    draw; ``group_by_chain=True`` gives one per chain). With ``num_exploration=None`` (default) the warm-up
    explores and the kept draws refine. For the optimiser alone (no model, no ``MCMC``), see
    :func:`ppl_sgmcmc.optim.santa`.

    **Step size.** ``step_size`` must be given (or a schedule): Santa cannot use the warm-up's tuning,
    which aims at a noise ratio for a fixed target from an adapted preconditioner, whereas Santa anneals
    its target and preconditions by its own RMSprop average. ``step_size=None`` raises. Choose ``h`` so that
    ``h g sqrt(curvature) < 1`` (``g ≈ (λ + |f|/N)^{-1/2}``): the explicit scheme is unstable beyond.

    :param step_size: ``h`` (the paper's learning rate is ``η = h²``), a float or a schedule.
    :param inverse_temperature: ``β_t``, a positive float or a schedule ``t -> β_t`` of the 0-based step index;
        default :func:`ppl_sgmcmc.rules.santa.annealing` ``()``, ``β_t = t^0.5`` (1-based ``t``), the schedule of
        the authors' implementations.
        ``annealing(rate, scale)`` anneals more slowly in steps, as a small ``h`` needs. ``β = 1`` with
        ``num_exploration=math.inf`` samples the posterior (an RMSprop-preconditioned mSGNHT-E).
    :param num_exploration: the steps of exploration (the paper's burn-in), counted from the chain's start
        (warm-up included): ``None`` (default) for the warm-up's steps, an integer, or ``math.inf`` (never
        refine).
    :param decay: the RMSprop decay ``σ ∈ (0, 1)`` (default 0.999, as in the authors' implementation).
    :param eps: the regulariser ``λ > 0`` (default 1e-8).
    :param initial_thermostat: ``C >= 0``: the thermostat starts at ``ξ_0 = C sqrt(N)`` (default 5), the paper's
        ``α_0 = sqrt(η) C`` read for the per-datum gradient (:func:`ppl_sgmcmc.rules.santa.init`).
    :param curvature_term: add the paper's estimate ``T_t (1 - g'⊘g) ⊘ p`` of the drift ``T ∇G(θ)`` of the
        θ-dependent preconditioner to the exploration (default ``False``). It divides by the momentum: on the
        double-well it overflowed in 4-12% of the runs (such steps are rejected and the momentum redrawn). The
        authors' implementation leaves it out; so does pSGLD (its ``Γ``).

    ``temperature`` must stay 1: Santa's temperature is ``1/β_t`` (:meth:`temperature_at`). Other arguments:
    see :class:`Algorithm`.
    """

    rule = santa_rule
    schedulable = ("inverse_temperature",)
    samples_posterior = False  # an optimiser: its draws anneal to a mode
    can_adapt_mass = False
    can_adapt_mass_reason = (
        "Santa preconditions by its own RMSprop average and anneals its target (β_t → ∞), so no fixed target's "
        "gradient noise can set its step size."
    )

    def __init__(
        self,
        model: Callable[..., Any] | None = None,
        potential_fn: Callable[..., Any] | None = None,
        *,
        step_size: float | Schedule | None = None,
        inverse_temperature: float | Schedule | None = None,
        num_exploration: int | float | None = None,
        decay: float = 0.999,
        eps: float = 1e-8,
        initial_thermostat: float = 5.0,
        curvature_term: bool = False,
        **kwargs: Any,
    ) -> None:
        name = type(self).__name__
        if kwargs.get("temperature", 1.0) != 1.0:
            raise ValueError(
                f"{name}: `temperature` must be 1: Santa's temperature is 1/β_t. Give `inverse_temperature` (a number "
                "or a schedule t -> β_t) instead."
            )
        super().__init__(model, potential_fn, step_size=step_size, **kwargs)
        beta = santa_rule.annealing() if inverse_temperature is None else inverse_temperature
        if num_exploration is not None and num_exploration != math.inf:
            num_exploration = _checks.int_at_least("num_exploration", num_exploration, 0, name)
        self._num_exploration_arg = num_exploration
        self._options = {
            "inverse_temperature": _checks.schedule_or(_checks.positive, "inverse_temperature", beta, name),
            "decay": _checks.in_unit_interval("decay", decay, name),
            "eps": _checks.positive("eps", eps, name),
            "initial_thermostat": _checks.non_negative("initial_thermostat", initial_thermostat, name),
            "curvature_term": _checks.boolean("curvature_term", curvature_term, name),
        }
        self._num_exploration: int | float = 0 if num_exploration is None else num_exploration
        self._data_size = 1  # N, from the model

    def hyperparameters(self) -> dict[str, Any]:
        """The rule's keyword arguments besides ``step_size``: ``inverse_temperature`` (a schedule stays a
        callable), ``decay``, ``eps``, ``initial_thermostat``, ``curvature_term``, ``num_exploration`` (in steps,
        set from the warm-up when not given) and ``data_size`` (``N``, from the model: its largest subsampled
        plate; 1 for a ``potential_fn``); no ``temperature``.

        **Example** (the exploration is the warm-up: 100 draws of 2 steps)::

            >>> import jax, jax.numpy as jnp
            >>> from ppl_sgmcmc.numpyro import Santa
            >>> kernel = Santa(potential_fn=lambda z: jnp.sum(z["x"] ** 2), step_size=0.1, inverse_temperature=2.0,
            ...                steps_per_sample=2)
            >>> _ = kernel.init(jax.random.PRNGKey(0), 100, init_params={"x": jnp.ones(2)})
            >>> hp = kernel.hyperparameters()
            >>> hp["inverse_temperature"], hp["num_exploration"], hp["data_size"], "temperature" in hp
            (2.0, 200, 1, False)
        """
        return dict(self._options, num_exploration=self._num_exploration, data_size=self._data_size)

    def temperature_at(self, i: StepIndex) -> Scalar:
        """Santa's temperature at step ``i``: ``T_i = 1/β_i`` while it explores, 0 once it refines. A momentum
        redrawn after a rejected step gets ``N(0, T_i I)``.

        **Example**::

            >>> from ppl_sgmcmc.numpyro import Santa
            >>> kernel = Santa(potential_fn=lambda z: 0.0, step_size=0.1, num_exploration=10)
            >>> kernel.temperature_at(3), kernel.temperature_at(10)  # β_3 = 2 (the default annealing)
            (0.5, 0.0)
        """
        beta = self._options["inverse_temperature"]
        return cast(Scalar, (i < self._num_exploration) / (beta(i) if callable(beta) else beta))

    def noise_scale(self, rule_state: santa_rule.SantaState, i: StepIndex, position: Array) -> Scalar:
        """Not measured (NaN): the annealed target changes, and the refinement injects no noise."""
        return math.nan

    def _set_warmup(self, num_warmup: int, steps: int | None = None) -> None:
        super()._set_warmup(num_warmup, steps)
        explore = self._num_exploration_arg
        self._num_exploration = self._num_warmup_steps if explore is None else explore
        if explore is None and self._num_warmup_steps == 0:
            self._start_warning = (
                f"{self.name}: the exploration is the warm-up (num_exploration=None), but {self.warmup_arg}=0 leaves "
                "none: the chain only refines, a deterministic optimiser. That is right when continuing a chain; a new "
                f"chain should set `{self.warmup_arg}` or `num_exploration`."
            )

    def _check_dimension(self, target: Target, dim: int) -> None:
        super()._check_dimension(target, dim)
        self._data_size = target.data_size
        self._kwargs_cache = {}

    def progress(self, state: ChainState[santa_rule.SantaState]) -> dict[str, Any]:
        """The base items, the mean thermostat ``ξ̄`` and the temperature ``T`` (0 once refining).

        **Example**::

            >>> import jax, jax.numpy as jnp
            >>> from ppl_sgmcmc.numpyro import Santa
            >>> kernel = Santa(potential_fn=lambda z: jnp.sum(z["x"] ** 2), step_size=0.1, initial_thermostat=2.0)
            >>> state = kernel.init(jax.random.PRNGKey(0), num_warmup=10, init_params={"x": jnp.ones(3)})
            >>> kernel.progress(state)
            {'Ũ_t': '3', 'h': '1.00e-01', 'div': 0, 'ξ̄': '2', 'T': '1'}
        """
        temperature = float(self.temperature_at(int(state.i)))
        return {**super().progress(state), "ξ̄": f"{float(state.rule_state.thermostat.mean()):.3g}", "T": f"{temperature:.3g}"}


# --- the complete recipe ----------------------------------------------------------------------------------
class Recipe(Algorithm[recipe_rule.RecipeState]):
    """A sampler built from the complete recipe of Ma, Chen & Fox ("A Complete Recipe for Stochastic Gradient
    MCMC", NeurIPS 2015): a positive semidefinite diffusion matrix ``D(z)`` and a skew-symmetric curl matrix
    ``Q(z)`` over the joint state ``z = θ``, or ``z = (θ, r)`` with momenta and ``H(z) = U(θ) + r·r/2``; the
    correction ``Γ_i(z) = Σ_j ∂_j (D_ij(z) + Q_ij(z))`` comes from the backend's autodiff. Every such choice
    samples ``exp(-H/τ)``, in the limit of small steps::

        dz = [-(D(z) + Q(z)) ∇H(z) + τ Γ(z)] dt + sqrt(2 τ D(z)) dW

    One step, split in the part of the drift without the gradient and the rest (the rule, exactly:
    :mod:`ppl_sgmcmc.rules.recipe`)::

        z ← z + h [-(D + Q)(z) (0, r) + τ Γ(z)]
        z ← z - h (D + Q)(z) (∇Ũ_t(θ), 0) + sqrt(2 h τ) D(z)^{1/2} ζ

    ``D=1.0`` is SGLD, and ``D=A``, ``Q=[[0, -I], [I, 0]]``, ``momentum=True`` is SGHMC with the Euler
    integrator, step for step.

    :param step_size: ``h``, a float or a schedule; it must be given: the warm-up tunes step sizes in the
        coordinates of an adapted preconditioner, where ``D`` and ``Q`` would mean something else.
    :param D: the diffusion: a callable ``z -> D(z)`` of the flat joint state (a ``jax.numpy`` array on
        NumPyro, a ``torch`` tensor on Pyro; the parameters in the order of ``ravel_pytree``, then the
        momenta), or a constant (a float, a NumPy array). Its value is a scalar (``D I``), ``d`` diagonal
        entries or a ``d×d`` positive semidefinite matrix. Without momenta it acts on ``θ``; with momenta it is
        the momentum block of the joint diffusion ``diag(0, D)``: the noise enters the momenta only.
    :param Q: the curl: a callable ``z -> Q(z)`` or a constant ``n×n`` skew-symmetric matrix (``n = d``, or
        ``2d`` with momenta, ``θ`` first), or ``None`` (0, default; with momenta it is required).
    :param momentum: ``z = (θ, r)`` with ``r`` started at ``N(0, τ I)`` (default ``False``: ``z = θ``).
    :param temperature: ``τ`` (default 1).

    **Autodiff.** ``Γ`` is the divergence of the rows of the callables among ``D`` and ``Q``, from their Jacobian:
    ``jax.jacfwd`` on NumPyro, ``torch.func.jacfwd`` on Pyro, which needs ``D`` and ``Q`` written in ``torch``
    operations that ``torch.func`` transforms (no in-place updates, no ``.item()``, no Python branching on
    values: ``torch.where``). Write them once with ``array_api_compat.array_namespace(z)`` to serve both.
    Costs grow with ``n``: ``n`` evaluations per Jacobian, a dense product, an ``eigh`` of a dense ``D(z)``.
    A recipe to try out a sampler; the dedicated kernels are the fast forms of its instances. The algorithm
    page ("The complete recipe") shows how to build one, e.g. the paper's Riemannian SGRHMC.

    Other arguments: see :class:`Algorithm`.
    """

    rule = recipe_rule
    can_adapt_mass = False
    can_adapt_mass_reason = (
        "its D(z) and Q(z) are given in the model's unconstrained coordinates, which an adapted preconditioner "
        "would change."
    )
    #: ``f -> (z -> ∂f(z)/∂z)``, the backend's Jacobian operator (each backend's base class defines it).
    _jacobian: Callable[[Callable[[Array], Array]], Callable[[Array], Array]]

    def __init__(
        self,
        model: Callable[..., Any] | None = None,
        potential_fn: Callable[..., Any] | None = None,
        *,
        step_size: float | Schedule | None = None,
        D: Any,
        Q: Any = None,
        momentum: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, potential_fn, step_size=step_size, **kwargs)
        name = self.name
        momentum = _checks.boolean("momentum", momentum, name)
        if momentum and Q is None:
            raise ValueError(
                f"{name}: with momentum=True the curl `Q` couples θ and the momenta (SGHMC's is [[0, -I], [I, 0]]); "
                "without it the gradient never reaches θ. Give `Q`."
            )
        self._options = {
            "D": _recipe_matrix("D", D, name),
            "Q": None if Q is None else _recipe_matrix("Q", Q, name),
            "momentum": momentum,
            "jacobian": self._jacobian,
        }

    def noise_scale(self, rule_state: recipe_rule.RecipeState, i: StepIndex, position: Array) -> Scalar:
        """Not measured (NaN): how the gradient noise enters depends on the user's ``D`` and ``Q``."""
        return math.nan

    def _check_dimension(self, target: Target, dim: int) -> None:
        super()._check_dimension(target, dim)
        for name in ("D", "Q"):
            value = self._options[name]
            if value is not None and not callable(value):
                try:
                    recipe_rule.check_shape(name, np.shape(value), dim, self._options["momentum"])
                except ValueError as err:
                    raise ValueError(f"{self.name}: {err} The model has d = {dim} latent coordinates.") from None


def _recipe_matrix(name: str, value: Any, kernel: str) -> Any:  # Any: a user's value in, checked or callable out
    """The recipe's ``D`` (positive semidefinite: a non-negative scalar or diagonal, or a symmetric matrix) or
    ``Q`` (a skew-symmetric matrix), checked when constant: a float or a float64 NumPy array; a callable as is."""
    if callable(value):
        return value
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        array = None
    kinds = "a non-negative number, non-negative diagonal entries or a square matrix" if name == "D" else "a square matrix"
    if array is None or (array.ndim > 2 or name == "Q" and array.ndim != 2) or not np.all(np.isfinite(array)):
        raise ValueError(f"{kernel}: `{name}` must be a callable z -> {name}(z) or {kinds}, got {value!r}.")
    if array.ndim == 2 and array.shape[0] != array.shape[1]:
        raise ValueError(f"{kernel}: `{name}` must be a square matrix, got shape {array.shape}.")
    if name == "Q":
        if not np.allclose(array, -array.T, rtol=0, atol=1e-12 * max(1.0, np.abs(array).max())):
            raise ValueError(f"{kernel}: `Q` must be skew-symmetric (Q = -Qᵀ).")
        return array
    if array.ndim == 2:
        if not np.allclose(array, array.T, rtol=1e-6, atol=0):
            raise ValueError(f"{kernel}: `D` must be symmetric.")
        if np.linalg.eigvalsh(array).min() < -1e-10 * max(1.0, np.abs(array).max()):
            raise ValueError(f"{kernel}: `D` must be positive semidefinite (it has a negative eigenvalue).")
    elif np.any(array < 0):
        raise ValueError(f"{kernel}: `D` must be non-negative, got {value!r}.")
    return float(array) if array.ndim == 0 else array


# --- replica exchange (reSGLD / reSGHMC) ----------------------------------------------------------------------
class ReplicaFields:
    """The replica-exchange quantities of a reSGLD/reSGHMC rule state (:class:`ppl_sgmcmc.rules.replica.ReplicaState`)
    as attributes of the kernel's state, collected with every draw by default (ArviZ ``sample_stats``):

    - ``swap_probability``: ``min(1, S̃)`` of the swap between the cold slot and the next one at the draw's last
      step; its mean over the draws is the chain's swap acceptance rate;
    - ``num_swaps``: the swaps of the cold slot so far (each is a jump of the chain to another walker's position);
    - ``cold_replica``: which walker (numbered by its starting slot) holds the kept chain.

    Also ``ladder`` (``τ_k/τ``), ``energy_variance`` (``ŝ²`` of each adjacent pair) and ``swaps`` (per pair), all
    pairs'. Each backend's ``ReplicaState`` mixes it into its state class.
    """

    __slots__ = ()
    rule_state: recipe_rule.RecipeState

    swap_probability = property(lambda self: self.rule_state.swap_probability[..., 0],
                                doc="min(1, S̃) of the cold pair at the draw's last step")  # fmt: skip
    num_swaps = property(lambda self: self.rule_state.swaps[..., 0], doc="swaps of the cold slot so far")
    cold_replica = property(lambda self: self.rule_state.walkers[..., 0], doc="the walker in the cold slot")
    ladder = property(lambda self: self.rule_state.ladder, doc="the temperatures over τ")
    energy_variance = property(lambda self: self.rule_state.energy_variance, doc="ŝ² of each adjacent pair")
    swaps = property(lambda self: self.rule_state.swaps, doc="the swaps of each adjacent pair so far")


class ReSGLD(Algorithm[replica_rule.ReplicaState]):
    """Replica-exchange SGLD (Deng, Feng, Gao, Liang & Lin, "Non-convex Learning via Replica Exchange Stochastic
    Gradient MCMC", ICML 2020): ``K`` SGLD replicas at the temperatures ``τ_0 = τ < τ_1 < ... < τ_{K-1}`` on the same
    minibatch, and a swap of adjacent replicas' positions after each gradient, with the swap rate corrected for
    the minibatch noise of the energies. With ``Ũ_k`` the minibatch energy of slot ``k``, ``a_k = 1/τ_k - 1/τ_{k+1}``
    and ``ŝ²_k`` the variance of ``Ũ_k - Ũ_{k+1}`` (estimated along the chain), for ``k = 0, ..., K-2`` in turn::

        S̃_k = exp(a_k (Ũ_k - Ũ_{k+1}) - a_k² ŝ²_k / (2F));   swap slots k and k+1 if u < S̃_k,  u ~ U(0, 1)
        θ_k ← θ_k - h ∇Ũ_t(θ_k) + sqrt(2 h τ_k) ξ_k                         (every slot, after the swaps)

    ``F = 1`` is exact for Gaussian energy noise (detailed balance in the mean over the noise); the rule, the
    estimate of ``ŝ²`` and why the swap is exact are in :mod:`ppl_sgmcmc.rules.replica`. The cold slot (``τ``) is
    the chain: its draws are the posterior draws. A swap moves it to another replica's position (a jump); the
    noise estimate skips the gradient difference across it.

    **Temperatures.** ``temperatures=None`` (default): a ladder of ``num_replicas`` temperatures, geometric from
    ``1 + 2/sqrt(d)`` and adapted during the warm-up so that each adjacent pair swaps with probability
    ``target_swap_rate`` (the ratios then stay fixed); or ``temperatures``, the ``K`` multipliers ``τ_k/τ`` (the first
    1, increasing). Every replica runs with the cold chain's step size ``h`` (tuned for it by the warm-up) and, with
    ``adapt_mass_matrix``, in its preconditioned coordinates: the replicas share the metric. A hot replica's target
    is ``exp(-U/τ_k)``, wider than the posterior; it crosses the barriers between modes that the cold chain does not,
    and a swap hands the cold chain its position. ``K = 2`` replicas double the gradients of a step. The
    preconditioner is the Laplace approximation at the chain's start (after ``find_mode``), which the warm-up's
    windows narrow where the draws spread less but never widen (:attr:`widens_mass`): for a chain that swaps between
    modes the draws' spread is the modes', far wider than the local scale that bounds the step size.

    **Variance-reduced energies** (Deng, Feng, Karagiannis, Lin & Liang, "Accelerating Convergence of Replica Exchange
    Stochastic Gradient MCMC via Variance Reduction", ICLR 2021). The minibatch noise of ``Ũ_k - Ũ_{k+1}`` grows with
    the replicas' distance, and its correction all but stops the swaps between replicas in different modes (an adapted
    ladder then collapses towards 1). With ``anchor_every``, every ``m`` steps each replica's position becomes its
    anchor ``a_k``, with its full-data energy ``U(a_k)`` (one pass over the data per replica), and the swaps read
    ``Ũ_t(y_k) - Ũ_t(a_k) + U(a_k)``: unbiased, with a noise that grows only with each replica's distance from its own
    anchor. It costs ``K`` more minibatch energies a step and ``K`` full-data energies every ``m`` steps.

    **Output.** Every draw carries ``swap_probability``, ``num_swaps`` and ``cold_replica`` (see
    :class:`ReplicaFields`), which the ArviZ converters put in ``sample_stats``; the chain's final ``ladder``,
    ``swaps`` and ``energy_variance`` are in its state.

    :param step_size: ``h``, a float or a schedule, or ``None`` (tuned for the cold chain).
    :param num_replicas: ``K >= 2`` (default 2), or the length of ``temperatures``.
    :param temperatures: the ladder ``τ_k/τ``, or ``None`` (default: adapted in the warm-up).
    :param energy_variance: ``"auto"`` (default: estimated along the chain; 0 for a target without minibatches, a
        deterministic ``potential_fn`` or a model without subsampled plates) or ``ŝ² >= 0``, the known variance of
        the minibatch energy difference of two replicas (0: the uncorrected swap).
    :param correction_factor: ``F > 0`` (default 1). Larger values correct less: more swaps, biased.
    :param target_swap_rate: the swap probability the adapted ladder aims at, in (0, 1) (default 0.3).
    :param anchor_every: ``None`` (default: the swaps read the plain minibatch energies), ``"epoch"`` (new anchors
        every ``N/n`` steps of the largest subsampled plate) or a number of steps ``m``: variance-reduced energies
        (above). For a model with a subsampled plate; not with a given ``energy_variance``.
    :param temperature: ``τ``, the cold chain's (default 1).

    Other arguments: see :class:`Algorithm`.
    """

    rule = replica_rule
    # a chain that swaps between modes spreads over them: its draws' spread is not the local scale the step must respect
    widens_mass = False
    sample_stats_fields = ("swap_probability", "num_swaps", "cold_replica")
    final_state_fields = ("ladder", "swaps", "energy_variance")
    integrator = "langevin"

    def __init__(
        self,
        model: Callable[..., Any] | None = None,
        potential_fn: Callable[..., Any] | None = None,
        *,
        step_size: float | Schedule | None = None,
        num_replicas: int | None = None,
        temperatures: Any = None,
        energy_variance: float | str = "auto",
        correction_factor: float = 1.0,
        target_swap_rate: float = 0.3,
        anchor_every: int | str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, potential_fn, step_size=step_size, **kwargs)
        name = self.name
        if isinstance(anchor_every, str) and anchor_every != "epoch":
            raise ValueError(f"{name}: `anchor_every` must be None, 'epoch' or a number of steps >= 1, got {anchor_every!r}.")
        if anchor_every is not None and anchor_every != "epoch":
            anchor_every = _checks.int_at_least("anchor_every", anchor_every, 1, name)
        if anchor_every is not None and energy_variance != "auto":
            raise ValueError(f"{name}: `anchor_every` estimates the variance of the variance-reduced energies; a given "
                             "`energy_variance` is the plain energies'. Give one of them.")  # fmt: skip
        self._anchor_every = anchor_every
        if self._cycles is not None:  # the exploration stage zeroes the rule's normal draws, whose last row is the swap's
            raise ValueError(
                f"{name}: `cycle_length` (cyclical SG-MCMC) is another way across modes; replica exchange takes its "
                "swaps from the rule's draws, which an exploration stage would zero. Use one of the two."
            )
        ladder = None
        if temperatures is not None:
            ladder = _ladder(temperatures, name)
            if num_replicas is not None and num_replicas != len(ladder):
                raise ValueError(f"{name}: `num_replicas` ({num_replicas}) differs from the {len(ladder)} `temperatures`; "
                                 "give one of them.")  # fmt: skip
        replicas = len(ladder) if ladder is not None else 2 if num_replicas is None else num_replicas
        self._replica = {
            "num_replicas": _checks.int_at_least("num_replicas", replicas, 2, name),
            "ladder": ladder,
            "energy_variance": None if energy_variance == "auto"
            else _checks.non_negative("energy_variance", energy_variance, name),
            "correction_factor": _checks.positive("correction_factor", correction_factor, name),
            "target_swap_rate": _checks.in_unit_interval("target_swap_rate", target_swap_rate, name),
            "anchored": anchor_every is not None,
        }
        self._adaptation_steps = 0  # the ladder's, set from the warm-up
        self._exact_energies = False  # set from the model: no minibatch, no stochastic potential, no Gibbs sites

    def tuned_options(self, state: object, chain: int | None = None) -> dict[str, Any]:
        """:meth:`Algorithm.tuned_options` and the ladder the warm-up adapted, as ``temperatures``: a kernel built with
        them swaps at the run's temperatures rather than adapting a ladder again.

        **Example**::

            >>> import jax, jax.numpy as jnp
            >>> from ppl_sgmcmc.numpyro import MCMC, ReSGLD
            >>> kernel = ReSGLD(potential_fn=lambda z: 0.5 * jnp.sum(z["x"] ** 2))
            >>> mcmc = MCMC(kernel, num_warmup=300, num_samples=100, progress_bar=False, verdict=False)
            >>> mcmc.run(jax.random.PRNGKey(0), init_params={"x": jnp.ones(2)})
            >>> options = kernel.tuned_options(mcmc.last_state)
            >>> sorted(options), len(options["temperatures"]), options["temperatures"][0]
            (['inverse_mass_matrix', 'step_size', 'temperatures'], 2, 1.0)
        """
        options = super().tuned_options(state, chain)
        ladder = getattr(state, "state", state).rule_state.ladder  # type: ignore[attr-defined]
        ladder = np.asarray(ladder.detach().cpu() if hasattr(ladder, "detach") else ladder)
        options["temperatures"] = tuple(float(t) for t in (ladder[chain] if ladder.ndim > 1 else ladder))
        return options

    def hyperparameters(self) -> dict[str, Any]:
        """The rule's keyword arguments besides ``step_size``: ``temperature``, ``num_replicas``, ``ladder`` (``None``:
        adapted), ``energy_variance`` (``None``: estimated), ``correction_factor``, ``target_swap_rate``,
        ``adaptation_steps`` (the warm-up's steps when the ladder adapts, else 0) and the ``integrator``.

        **Example**::

            >>> from ppl_sgmcmc.numpyro import ReSGLD
            >>> hp = ReSGLD(potential_fn=lambda z: 0.0, step_size=0.1, temperatures=(1, 3, 9)).hyperparameters()
            >>> hp["num_replicas"], hp["ladder"], hp["energy_variance"], hp["integrator"]
            (3, (1.0, 3.0, 9.0), None, 'langevin')

        (``energy_variance`` becomes 0 once the kernel has seen a target with exact energies.)
        """
        hyper = {**super().hyperparameters(), **self._replica, "integrator": self.integrator,
                 "adaptation_steps": self._adaptation_steps}  # fmt: skip
        if hyper["energy_variance"] is None and self._exact_energies:
            hyper["energy_variance"] = 0.0
        return hyper

    def _anchor_length(self, target: Target) -> int | None:
        """``anchor_every`` in steps (``"epoch"``: ``N/n`` of the largest subsampled plate), or ``None``."""
        every = self._anchor_every
        if every is None:
            return None
        return _epoch(target) if every == "epoch" else int(every)

    def _anchor(self, rule_state: replica_rule.ReplicaState, position: Array, adapt_state: AdaptationState,
                full_energy: Callable[[Array], Scalar]) -> replica_rule.ReplicaState:  # fmt: skip
        """Every slot's anchor at its position (the chain's ``θ`` and the hot replicas, in the rule's coordinates), with
        its full-data energy (:func:`ppl_sgmcmc.rules.replica.anchor`)."""
        xp = array_namespace(position)
        pre = cast(adaptation.AdaptState, adapt_state).preconditioner if self._preconditioned else None
        u = position if pre is None else adaptation.to_u(pre, position)
        points = xp.concat([u[None, :], rule_state.replicas])
        thetas = [points[j] if pre is None else adaptation.to_theta(pre, points[j]) for j in range(points.shape[0])]
        energies = xp.stack([xp.asarray(full_energy(theta)) for theta in thetas])
        return replica_rule.anchor(rule_state, points, energies)

    def _check_dimension(self, target: Target, dim: int) -> None:
        """``energy_variance="auto"`` is 0 for a target whose energies are exact: no subsampled plate, no stochastic
        ``potential_fn``, no local Gibbs sites (the estimate would measure only its own discretisation error).
        ``anchor_every`` needs a model with a subsampled plate (the anchors' energies are its full-data energies)."""
        super()._check_dimension(target, dim)
        self._kwargs_cache = {}
        self._exact_energies = not (getattr(target, "plate_sizes", None) or getattr(target, "stochastic", False)
                                    or self._gibbs is not None)  # fmt: skip
        if self._anchor_every is not None and not getattr(target, "plate_sizes", None):
            raise ValueError(
                f"{self.name}: `anchor_every` reduces the minibatch noise of the swaps' energies with full-data energies "
                "of a model's subsampled plates, but this target has none (its energies are exact, or it is a "
                "potential_fn); leave `anchor_every` unset."
            )

    def noise_shape(self, dim: int) -> tuple[int, ...]:
        """``(K, d + 2)``: each replica's noise, and two normals per swap (:func:`ppl_sgmcmc.rules.replica.noise_shape`).

        **Example**::

            >>> from ppl_sgmcmc.numpyro import ReSGLD
            >>> ReSGLD(potential_fn=lambda z: 0.0, step_size=0.1, num_replicas=3).noise_shape(4)
            (3, 6)
        """
        return replica_rule.noise_shape(dim, self._replica["num_replicas"])

    def _set_warmup(self, num_warmup: int, steps: int | None = None) -> None:
        super()._set_warmup(num_warmup, steps)
        self._adaptation_steps = self._num_warmup_steps if self._replica["ladder"] is None else 0
        self._kwargs_cache = {}

    def _same_step_after_warmup(self) -> bool:
        """``False``: the noise estimate skips the steps whose swap moved the chain (:meth:`_measure_noise`), which a
        step compiled with its noise estimate would not."""
        return False

    def _measure_noise(self, noise_state: NoiseState, gradient: StochasticGradient, rule_state: replica_rule.ReplicaState,
                       accepted: Flag, i: StepIndex, position: Array) -> tuple[NoiseState, Array, Flag]:  # fmt: skip
        """The base estimate, without the gradient difference across a swap of the cold slot (a jump to another
        replica's position, not noise): the swapped-in gradient becomes the one the next step's is compared with."""
        jumped = rule_state.swapped[..., 0]
        noise_state, term, valid = super()._measure_noise(noise_state, gradient, rule_state, accepted & ~jumped, i,
                                                          position)  # fmt: skip
        xp = array_namespace(gradient.grad)
        return noise_state._replace(previous=xp.where(accepted & jumped, gradient.grad, noise_state.previous)), term, valid

    def _adapt(self, adapt_state: AdaptationState, noise_state: NoiseState, rule_state: replica_rule.ReplicaState,
               position: Array, energy: Scalar, term: Array, valid: Flag, i: StepIndex,
               fresh_noise: Array) -> tuple[AdaptationState, NoiseState, replica_rule.ReplicaState, Array]:  # fmt: skip
        """The base adaptation, but a step whose swap moved the chain is not judged to have run off: its energy is
        a hotter replica's (higher by the swap's design, and accepted with probability ``exp(-a ΔŨ)``), so the
        warm-up's energy level stands in for it."""
        if self.adapts and self._window_ends is not None:
            xp = array_namespace(position)
            level = cast(adaptation.AdaptState, adapt_state).energy_level  # the warm-up adapts
            energy = xp.where(rule_state.swapped[..., 0], level, energy)
        return super()._adapt(adapt_state, noise_state, rule_state, position, energy, term, valid, i, fresh_noise)

    def _place_rule_state(self, rule_state: replica_rule.ReplicaState, u: Array) -> replica_rule.ReplicaState:
        """Every replica, and its last gradient point, at ``u``; anchors unset until the next :meth:`_anchor`."""
        xp = array_namespace(u)
        points = xp.broadcast_to(u[None, :], rule_state.points.shape) + xp.zeros_like(rule_state.points)
        placed = rule_state._replace(replicas=points[1:], points=points)
        if rule_state.anchored is None:
            return placed
        # the coordinates may be new: the anchors wait for the next full-data pass
        return placed._replace(anchored=xp.zeros_like(rule_state.anchored))

    def _rescale_rule_state(self, rule_state: replica_rule.ReplicaState, factor: Array) -> replica_rule.ReplicaState:
        """The replicas, their last gradient points and their anchors in the rescaled coordinates (``u ⊘ factor``),
        their last gradients ``⊙ factor``; the momenta are kept."""
        anchors = None if rule_state.anchors is None else rule_state.anchors / factor
        return rule_state._replace(replicas=rule_state.replicas / factor, points=rule_state.points / factor,
                                   gradients=rule_state.gradients * factor, anchors=anchors)  # fmt: skip

    def _watched_state(self, rule_state: replica_rule.ReplicaState) -> tuple[Array | None, ...]:
        """The replicas and the momenta; not the energies, gradients and their statistics (they grow with ``N``) nor
        the ladder."""
        return (rule_state.replicas, rule_state.momentum, rule_state.replica_momentum)

    def verdict_advice(self, rule_state: replica_rule.ReplicaState | None) -> tuple[str, ...]:
        """For an adapted ladder that collapsed (its hottest temperature below the square root of the one it started
        from): what held its swaps back and the fix. A replica that close to the posterior crosses no barrier the cold
        chain cannot, and replicas left in different modes then hand the cold chain each mode about half the time,
        whatever the modes' weights.

        **Example** (an adapted two-replica ladder in 4 coordinates starts at ``(1, 2)``; ``(1, 1.14)`` collapsed)::

            >>> import numpy as np
            >>> from ppl_sgmcmc.numpyro import ReSGLD
            >>> from ppl_sgmcmc.rules import replica
            >>> state = replica.init(np.zeros(4), np.zeros((2, 6)), num_replicas=2)
            >>> kernel = ReSGLD(potential_fn=lambda z: 0.0)
            >>> kernel.verdict_advice(state), len(kernel.verdict_advice(state._replace(ladder=np.array([1.0, 1.14]))))
            ((), 1)
        """
        if rule_state is None or self._replica["ladder"] is not None:
            return ()
        ladder, variance = (np.asarray(x.detach().cpu() if hasattr(x, "detach") else x, np.float64)
                            for x in (rule_state.ladder, rule_state.energy_variance))  # fmt: skip
        k, dim = ladder.shape[-1], rule_state.points.shape[-1]
        start = replica_rule.initial_ladder(dim, k)[-1]
        hottest = float(np.min(ladder[..., -1]))
        if math.log(hottest) >= 0.5 * math.log(start):
            return ()
        collapsed = (f"the adapted temperature ladder collapsed (its hottest replica at {hottest:.3g} τ, started at "
                     f"{start:.3g} τ)")  # fmt: skip
        stuck = ("a replica that close to the posterior crosses no barrier the cold chain cannot, and replicas left in "
                 "different modes hand the cold chain each about half the time, whatever the modes' weights")  # fmt: skip
        a = 1 - 1 / replica_rule.initial_ladder(dim, 2)[-1]
        noise = float(np.max(variance[..., 0]))
        if a * a * noise / 2 > 1:  # the noise correction alone all but stopped the swaps at the starting ratio
            return ("anchor_every='epoch' (variance-reduced energies) for a model with minibatches, or "
                    f"energy_variance=0 if the energies are exact and only the gradients are noisy: {collapsed}, the "
                    f"correction for the energies' minibatch noise (ŝ² = {noise:.3g} for the cold pair) holding its "
                    f"swaps back; {stuck}",)  # fmt: skip
        return (f"more replicas (num_replicas) or a fixed ladder (temperatures=(1, 3, 9), ...): {collapsed}; {stuck}",)

    def progress(self, state: ChainState[replica_rule.ReplicaState]) -> dict[str, Any]:
        """The base items, the cold pair's last swap probability and the hottest temperature over ``τ``."""
        rule = state.rule_state
        return {**super().progress(state), "swap": f"{float(rule.swap_probability[0]):.2f}",
                "τ_max": f"{float(rule.ladder[-1]):.3g}"}  # fmt: skip


def _epoch(target: Target) -> int:
    """Steps in one epoch, ``N/n``, of the model's largest subsampled plate (at least 1)."""
    size, n = max(target.plate_sizes.values())
    return max(1, size // n)


def _aligned(every: int, steps: int) -> int:
    """``every`` if it is a multiple or a divisor of ``steps``, else the nearest (in ratio) multiple, or divisor if
    ``every < steps``, of ``steps``.

    **Example**::

        >>> from ppl_sgmcmc.algorithms import _aligned
        >>> _aligned(325, 1), _aligned(325, 40), _aligned(20, 100), _aligned(30, 100), _aligned(90, 100)
        (325, 320, 20, 25, 100)
    """
    if every % steps == 0 or steps % every == 0:
        return every
    if every > steps:
        return round(every / steps) * steps
    return min((d for d in range(1, steps + 1) if steps % d == 0), key=lambda d: abs(math.log(d / every)))


def _ladder(temperatures: Any, kernel: str) -> tuple[float, ...]:  # Any: the user's value, before its check
    """``temperatures`` checked: at least 2 finite numbers, the first 1, increasing."""
    try:
        ladder = tuple(float(t) for t in temperatures)
    except (TypeError, ValueError):
        ladder = ()
    if len(ladder) < 2 or ladder[0] != 1.0 or any(b <= a for a, b in zip(ladder, ladder[1:])) or not all(
        math.isfinite(t) for t in ladder
    ):
        raise ValueError(
            f"{kernel}: `temperatures` must be the ladder τ_k/τ of at least 2 replicas: finite numbers starting at 1 "
            f"and increasing, e.g. (1, 3, 9); got {temperatures!r}. Or leave it None to adapt the ladder in the warm-up."
        )
    return ladder


class ReSGHMC(_SGHMCMoves[replica_rule.ReplicaState], ReSGLD):
    """Replica-exchange SGHMC (Deng, Feng, Gao, Liang & Lin, ICML 2020): the replicas and swaps of :class:`ReSGLD`,
    each replica moved by the SGHMC integrator of :class:`SGHMC` (identity mass, friction ``A``) at its temperature.
    The swap is decided on the energies at the points where the step takes its gradients (``θ + (h/2) p`` for the
    splitting integrator, ``θ + h p`` for Euler) and exchanges those points; the momenta stay with their temperatures.

    :param friction: ``A > 0`` (default 1.0), also the injected noise's diffusion.
    :param integrator: ``"splitting"`` (default) or ``"euler"``.

    The replica arguments are those of :class:`ReSGLD`.
    """

    def noise_scale(self, rule_state: replica_rule.ReplicaState, i: StepIndex, position: Array) -> Scalar:
        """``1/A``: the injected noise's variance is ``2Ahτ``."""
        return cast(Scalar, 1 / self.hyperparameters_at(i)["friction"])
