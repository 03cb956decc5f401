"""The kernels' hyper-parameters, checked and turned into their update rule's keyword arguments once for
both backends.

A NumPyro kernel and its Pyro twin take the same arguments with the same defaults and call the same
function here (built on :mod:`ppl_sgmcmc._checks`), so that the same input gets the same rule arguments
and the same bad input the same error; each kernel class keeps only what is backend-specific (the model
or potential, the state, the warm-up protocol). One function per algorithm, named after its rule in
:mod:`ppl_sgmcmc.rules`; ``kernel`` is the kernel's class name, for the messages. The arguments are
checked in the order the messages are tested in.
"""

import math
import warnings
from dataclasses import dataclass, replace
from typing import Any, NamedTuple, Optional

import numpy as np

from ppl_sgmcmc import _checks
from ppl_sgmcmc.rules import csgld as csgld_rule
from ppl_sgmcmc.rules import sgfs as sgfs_rule

INTEGRATORS = ("splitting", "euler")  # SGHMC's, SGNHT's and CSGHMC's momentum integrators


class Sampler(NamedTuple):
    """The base class's checked arguments (:func:`sampler`)."""

    step_size: Any  # a positive float or a schedule
    temperature: float
    steps_per_sample: int
    gibbs: Optional[tuple]  # as `_checks.gibbs_options` returns it


def sampler(model, potential_fn, step_size, temperature, steps_per_sample, gibbs, kernel):
    """The arguments every kernel takes: exactly one of ``model`` and ``potential_fn``, callable; ``gibbs``
    is ``(gibbs_sites, gibbs_fn, gibbs_sweeps, gibbs_init)``."""
    if (model is None) == (potential_fn is None):
        raise ValueError(f"{kernel}: give exactly one of `model` and `potential_fn`.")
    for arg, fn in (("model", model), ("potential_fn", potential_fn)):
        if fn is not None and not callable(fn):
            raise TypeError(f"{kernel}: `{arg}` must be callable, got {type(fn).__name__}.")
    step_size = _checks.step_size(step_size, kernel)
    temperature = _checks.positive("temperature", temperature, kernel)
    steps_per_sample = _checks.positive_int("steps_per_sample", steps_per_sample, kernel)
    gibbs_sites, gibbs_fn, gibbs_sweeps, gibbs_init = gibbs
    gibbs = _checks.gibbs_options(
        gibbs_sites, gibbs_fn, gibbs_sweeps, kernel, has_model=model is not None, gibbs_init=gibbs_init
    )
    return Sampler(step_size, temperature, steps_per_sample, gibbs)


def sghmc(friction, integrator, kernel):
    """SGHMC's (and CSGHMC's) ``friction`` ``A > 0`` and ``integrator``."""
    return {
        "friction": _checks.positive("friction", friction, kernel),
        "integrator": _checks.choice("integrator", integrator, INTEGRATORS, kernel),
    }


def sgnht(diffusion, thermostat, integrator, kernel):
    """SGNHT's ``diffusion`` ``D > 0``, ``thermostat`` (the rule's ``multivariate``) and ``integrator``."""
    return {
        "diffusion": _checks.positive("diffusion", diffusion, kernel),
        "multivariate": _checks.choice("thermostat", thermostat, ("multivariate", "scalar"), kernel) == "multivariate",
        "integrator": _checks.choice("integrator", integrator, INTEGRATORS, kernel),
    }


def psgld(alpha, eps, kernel):
    """pSGLD's RMSprop decay ``alpha`` in (0, 1) and regulariser ``eps > 0``."""
    return {
        "alpha": _checks.in_unit_interval("alpha", alpha, kernel),
        "eps": _checks.positive("eps", eps, kernel),
    }


# --- CSGLD / CSGHMC -----------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Contour:
    """CSGLD's (and CSGHMC's) contour arguments, checked (:func:`csgld`); ``energy_gap``/``energy_min``
    ``None`` for ``"auto"``, ``calibration_steps`` ``None`` for the default, ``initial_theta`` normalised."""

    adapt_theta: str
    num_partitions: int
    energy_gap: Optional[float]
    energy_min: Optional[float]
    zeta: float
    sa_step_size: Any  # a float in (0, 1) or a schedule
    weight: str
    calibration_steps: Optional[int]
    initial_theta: Optional[np.ndarray]

    @property
    def auto_grid(self):
        """Whether the energy grid is chosen from the warm-up."""
        return self.energy_min is None or self.energy_gap is None

    def windows(self, warmup_draws, steps_per_sample, warmup_arg, kernel):
        """The rule's ``(calibration_steps, adaptation_steps)`` for a warm-up of ``warmup_draws`` draws of
        ``steps_per_sample`` steps; ``warmup_arg`` names the warm-up's argument (``num_warmup`` in NumPyro,
        ``warmup_steps`` in Pyro) in the messages."""
        steps = warmup_draws * steps_per_sample
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

    def rule_kwargs(self, calibration_steps, adaptation_steps):
        """The rule's contour keyword arguments, with the windows of :meth:`windows`."""
        return {
            "num_partitions": self.num_partitions,
            "energy_min": self.energy_min,
            "energy_gap": self.energy_gap,
            "zeta": self.zeta,
            "sa_step_size": self.sa_step_size,
            "calibration_steps": calibration_steps,
            "adaptation_steps": adaptation_steps,
            "weight": self.weight,
        }


def csgld(
    num_partitions, energy_gap, energy_min, zeta, sa_step_size, weight, calibration_steps, adapt_theta, initial_theta, kernel
):
    """CSGLD's contour arguments, as a :class:`Contour`."""
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


# --- SGFS -------------------------------------------------------------------------------------------------
def sgfs_step_size(potential_fn, step_size, alpha, options, kernel):
    """SGFS's checks before the base class's (``options``: the keyword arguments for the base class):
    ``(step_size, infinite)``, the step size ``ε`` (from ``alpha`` if given) to give the base class, which
    takes finite ones only, and whether ``ε`` is in fact ``∞``."""
    if potential_fn is not None:
        raise ValueError(
            f"{kernel}: SGFS needs the per-datum scores of a model's subsampled plate; give `model`, not "
            "`potential_fn`."
        )
    if (step_size is None) == (alpha is None):
        raise ValueError(f"{kernel}: give exactly one of `step_size` (ε) and `alpha` (α = 2/sqrt(ε)).")
    if alpha is not None:
        step_size = sgfs_rule.alpha_to_step_size(_checks.non_negative("alpha", alpha, kernel))
    if options.get("temperature", 1.0) != 1.0:
        raise ValueError(f"{kernel}: `temperature` must be 1; SGFS (Algorithm 1) has no temperature.")
    if options.get("gibbs_sites"):
        raise NotImplementedError(
            f"{kernel}: SGFS with local Gibbs sites is not supported (per-datum scores would have to average "
            "over the sweeps); marginalise the local sites or use another kernel."
        )
    infinite = not callable(step_size) and isinstance(step_size, (int, float)) and step_size == math.inf
    return (1.0 if infinite else step_size), infinite


def sgfs(fisher, B, ridge, fisher_window, max_full_dim, kernel):
    """SGFS's rule keyword arguments besides ``data_size`` and ``num_warmup`` (from the model and the run)."""
    fisher = _checks.choice("fisher", fisher, sgfs_rule.FISHER_FORMS, kernel)
    if isinstance(B, str):
        B = _checks.choice("B", B, ("fisher", "identity"), kernel)
    else:
        B = _checks.positive_definite("B", B, kernel)
        if fisher == "diagonal" and B.ndim == 2:
            raise ValueError(
                f"{kernel}: fisher='diagonal' needs a diagonal `B` (a scalar or a vector), got a matrix; use "
                "fisher='full' or pass its diagonal."
            )
    ridge = _checks.non_negative("ridge", ridge, kernel)
    if fisher_window is not None:
        fisher_window = _checks.positive_int("fisher_window", fisher_window, kernel)
    max_full_dim = _checks.positive_int("max_full_dim", max_full_dim, kernel)
    return {"fisher": fisher, "B": B, "ridge": ridge, "fisher_window": fisher_window, "max_full_dim": max_full_dim}


def sgfs_warn_singular(plate_sizes, d, options, kernel):
    """Warn, at the kernel's caller, when a full Fisher estimate of ``d`` parameters from minibatches of the
    one subsampled plate in ``plate_sizes`` (``{name: (N, n)}``) starts singular and ``ridge`` is small."""
    ((_, (_, n)),) = plate_sizes.items()
    if options["fisher"] == "full" and n <= d and options["ridge"] < 1e-2:
        warnings.warn(
            f"{kernel}: the minibatch (n = {n}) is not larger than the number of parameters "
            f"(d = {d}), so the Fisher estimate is singular for the first ~d/n steps and, with ridge = "
            f"{options['ridge']:g}, steps along its null space are huge (rejected as divergent). Use ridge=1e-2 or "
            "more, a larger subsample_size, or fisher='diagonal'.",
            stacklevel=3,
        )
