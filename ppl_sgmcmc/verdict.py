"""The end of a run as a report: whether a finished run's draws can be trusted, from what the run kept.

An SG-MCMC run can end wrong without any step failing: chains that never met (a correlated posterior crossed
too slowly), burn-in left in the draws (a hand-set step size from a far start, a warm-up too short for the
posterior), too few effective draws to estimate anything, a step size too large for the gradient noise. The
health checks of :mod:`ppl_sgmcmc.health` watch single steps; the verdict watches the draws, as Stan and
nutpie do at the end of a run:

* **split rank-normalised R-hat** and **bulk and tail effective sample sizes** (Vehtari, Gelman, Simpson,
  Carpenter & Bürkner, "Rank-normalization, folding, and localization: an improved R-hat for assessing
  convergence of MCMC", Bayesian Analysis 16(2), 2021; computed by ArviZ) of the watched quantities: every
  coordinate (up to :data:`MAX_COORDINATES` of them, evenly chosen), the :data:`DIRECTIONS` leading principal
  directions of those coordinates' pooled draws, standardised (where chains that disagree spread the pooled
  draws the most), the squared radius of the standardised draws (which sees a scale parameter that has not
  settled, as in a hierarchical model) and, when the run kept it, the potential energy. A run passes when every
  R-hat is at most :data:`RHAT_LIMIT` and every ESS at least :data:`ESS_PER_CHAIN` per chain, the thresholds
  that paper recommends;
* **an energy-drift test for burn-in left in the draws**: Geweke's comparison ("Evaluating the accuracy of
  sampling-based approaches to the calculation of posterior moments", Bayesian Statistics 4, 1992) of the
  first :data:`DRIFT_HEAD` and the last :data:`DRIFT_TAIL` of each chain, on the radius, the leading
  directions and the energy, with the standard error of a stationary chain (the tail's variance and
  autocorrelation time, for both segments); a drift beyond :data:`DRIFT_Z` standard errors fails (a chain
  still moving towards the typical set);
* **the noise ratio's upper quantile over the kept draws** (:mod:`ppl_sgmcmc.noise`): its
  :data:`NOISE_QUANTILE` quantile above the algorithm's limit means that the step size is too large for the
  gradient noise somewhere the chain went, even when it was right where it was tuned.

**Models with symmetries.** A network's hidden units can be permuted and their signs flipped, a mixture's labels
switched, without changing the likelihood: the posterior holds many copies of itself, and chains that start
apart stay in different copies however long they run, with NUTS as with SG-MCMC. Their parameters disagree (an
R-hat far above 1) while every prediction agrees, and the approximate-inference literature judges such a
posterior in function space (Izmailov, Vikram, Hoffman & Wilson, "What Are Bayesian Neural Network Posteriors
Really Like?", ICML 2021). The backends give the verdict ``predictions``: each judged draw's log-likelihood of
fixed data rows (the rows of one minibatch, evenly spread over the data), which no such symmetry changes. With
``judge="predictions"`` the watched quantities are those (their coordinates, leading directions and radius, and
the energy) instead of the parameters; with the default ``judge="parameters"`` a run whose chains disagree on the
parameters but agree on the predictions says so and names the other judge.

:func:`assess` computes a :class:`Verdict` from arrays (backend-neutral, NumPy); :func:`report` warns with one
``RuntimeWarning`` naming what failed and what to do. The backends call them at the end of a run
(:class:`ppl_sgmcmc.numpyro.MCMC`, each chain of ``pyro.infer.MCMC``); :func:`ppl_sgmcmc.diagnostics.verdict`
does it for any finished run.

**Example** (four chains that agree, and four stuck in two places)::

    >>> import numpy as np
    >>> from ppl_sgmcmc.verdict import assess
    >>> rng = np.random.default_rng(0)
    >>> assess(rng.normal(size=(4, 1000, 3))).ok
    True
    >>> stuck = rng.normal(size=(4, 1000, 3)) * 0.1 + np.array([0.0, 0.0, 1.0, 1.0])[:, None, None]
    >>> verdict = assess(stuck)
    >>> verdict.ok, verdict.rhat > 1.5
    (False, True)
"""

from __future__ import annotations

import math
import sys
import warnings
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ppl_sgmcmc.adaptation import MIN_EFFECTIVE
from ppl_sgmcmc.algorithms import MAX_DENSE_DIM

__all__ = [
    "DIRECTIONS",
    "DRIFT_HEAD",
    "DRIFT_TAIL",
    "DRIFT_Z",
    "ESS_PER_CHAIN",
    "JUDGES",
    "KeptDraws",
    "MAX_COORDINATES",
    "MAX_DRAWS",
    "NOISE_QUANTILE",
    "PREDICTION_DRAWS",
    "RHAT_LIMIT",
    "RHAT_SEVERE",
    "RHAT_UNBOUNDED",
    "SEVERE",
    "SHORT",
    "SYMMETRIC",
    "Verdict",
    "assess",
    "report",
    "with_predictions",
]

#: The largest split rank-normalised R-hat of a run that passes (Vehtari et al. 2021).
RHAT_LIMIT = 1.01
#: Above this R-hat (Gelman & Rubin's old threshold) the chains have not met at all, rather than too few times.
RHAT_SEVERE = 1.1
#: An R-hat above this is read as chains that hold (nearly) one value each, apart from each other: its digits say
#: nothing (ArviZ's R-hat divides by a within-chain variance of zero up to rounding).
RHAT_UNBOUNDED = 1e3
#: The fewest bulk and tail effective draws per chain of a run that passes (Vehtari et al. 2021: 100 per chain).
ESS_PER_CHAIN = 100
#: The leading principal directions of the pooled standardised draws that are watched.
DIRECTIONS = 3
#: The most coordinates watched one by one (evenly chosen from the flattened draws).
MAX_COORDINATES = 256
#: The most draws per chain the verdict reads (evenly thinned beyond): the statistics' cost stays bounded.
MAX_DRAWS = 4000
#: Geweke's segments: the first and the last fractions of each chain.
DRIFT_HEAD, DRIFT_TAIL = 0.1, 0.5
#: A difference of the segments' means beyond this many standard errors is a drift. Several quantities and chains
#: are tested at once, so the bar is well above a single test's 2.
DRIFT_Z = 4.0
#: The quantile of the kept draws' noise ratios compared with the algorithm's limit.
NOISE_QUANTILE = 0.9
#: The warnings' leads: draws that are probably not a sample of the posterior, a run too short to trust, and chains
#: that agree on the predictions only (a model with symmetries).
SEVERE = "the draws are probably not a sample of the posterior yet"
SHORT = "the run is too short for reliable estimates"
SYMMETRIC = "the chains agree on the model's predictions but not on its parameters"
#: What the verdict can judge: the parameters' draws, or the predictions' (the log-likelihoods of fixed data rows).
JUDGES = ("parameters", "predictions")
#: The draws per chain at which the backends evaluate the predictions (evenly spaced): their R-hat and ESS need no
#: more, and a network's evaluation costs a forward pass per draw.
PREDICTION_DRAWS = 1000
#: Fewer draws per chain than this are too few to judge: no verdict.
MIN_DRAWS = 20


@dataclass(frozen=True)
class Verdict:
    """What :func:`assess` found.

    - **num_chains**, **num_draws**: the chains and draws per chain judged.
    - **rhat**: the largest split rank-normalised R-hat over the watched quantities, and **rhat_of** which one.
    - **ess_bulk**, **ess_tail**: the smallest bulk and tail effective sample sizes (all chains together).
    - **drift**: the largest Geweke ``|z|`` over chains and watched quantities, and **drift_of** which one.
    - **noise_ratio**: the :data:`NOISE_QUANTILE` quantile of the kept draws' noise ratios (NaN: not kept), and
      **noise_limit** the algorithm's limit.
    - **warmup**: what the warm-up's last slow window found (:func:`ppl_sgmcmc.adaptation.settled`), the worst over
      the chains: ``(misfit, explored, rounds run again)``, or ``None`` when nothing adapted. It does not decide
      :attr:`ok` (a metric that did not settle still gives a valid kernel, only a slower one); a failed run's
      message says what it means for the fix.
    - **advice**: the algorithm's own fixes for what its final state shows
      (:meth:`~ppl_sgmcmc.algorithms.Algorithm.verdict_advice`), put first in a failed run's message.
    - **judged**: what the watched quantities were (one of :data:`JUDGES`).
    - **parameters_rhat**: ``(R-hat, quantity)`` of the parameters where the chains disagreed on them while they
      agreed on the predictions, judging the parameters (:attr:`symmetric`); the other statistics are then the
      predictions' (``judged="predictions"``), and the run fails. ``None`` otherwise.
    - **dimension**: the draws' coordinates ``d`` (0: not known), which decides whether the message can offer a
      dense metric (at most :data:`~ppl_sgmcmc.algorithms.MAX_DENSE_DIM` coordinates).
    """

    num_chains: int
    num_draws: int
    rhat: float
    rhat_of: str
    ess_bulk: float
    ess_tail: float
    drift: float
    drift_of: str
    noise_ratio: float = math.nan
    noise_limit: float = math.inf
    warmup: tuple[float, float, int] | None = None
    advice: tuple[str, ...] = ()
    judged: str = "parameters"
    parameters_rhat: tuple[float, str] | None = None
    dimension: int = 0

    @property
    def symmetric(self) -> bool:
        """Whether the chains disagree on the parameters but agree on the predictions (:attr:`parameters_rhat`)."""
        return self.parameters_rhat is not None

    @property
    def unmixed(self) -> bool:
        """Whether the chains disagree (R-hat above :data:`RHAT_LIMIT`)."""
        return self.rhat > RHAT_LIMIT

    @property
    def too_few(self) -> bool:
        """Whether the run holds too few effective draws (below :data:`ESS_PER_CHAIN` per chain)."""
        return min(self.ess_bulk, self.ess_tail) < ESS_PER_CHAIN * self.num_chains

    @property
    def drifting(self) -> bool:
        """Whether a chain was still drifting (burn-in left in the draws)."""
        return self.drift > DRIFT_Z

    @property
    def noisy(self) -> bool:
        """Whether the step size was too large for the gradient noise over the kept draws."""
        return self.noise_ratio > self.noise_limit

    @property
    def ok(self) -> bool:
        """Whether the run passes every test."""
        return not (self.unmixed or self.symmetric or self.too_few or self.drifting or self.noisy)

    @property
    def severe(self) -> bool:
        """Whether the draws are probably not a sample of the posterior at all (chains that never met, R-hat above
        :data:`RHAT_SEVERE`; burn-in left in them; too much gradient noise), rather than too few of them."""
        return self.rhat > RHAT_SEVERE or self.drifting or self.noisy

    def message(self, kernel: str) -> str:
        """The warning for a run that failed: what was seen, what it means and what to do.

        **Example**::

            >>> from ppl_sgmcmc.verdict import Verdict
            >>> print(Verdict(4, 1000, 1.3, "theta[2]", 40.0, 90.0, 1.0, "radius").message("SGLD"))
            SGLD: the draws are probably not a sample of the posterior yet: ...
            >>> print(Verdict(4, 1000, 1.02, "theta[2]", 300.0, 900.0, 1.0, "radius").message("SGLD"))
            SGLD: the run is too short for reliable estimates: ...
            >>> symmetric = Verdict(4, 1000, 1.003, "prediction[3]", 900.0, 900.0, 1.0, "radius",
            ...                     judged="predictions", parameters_rhat=(2.1, "theta[2]"))
            >>> print(symmetric.message("SGLD"))
            SGLD: the chains agree on the model's predictions but not on its parameters: ...
        """
        seen: list[str] = []
        fixes: list[str] = []
        chains = "the chains disagree" if self.num_chains > 1 else "the two halves of the chain disagree"
        if self.parameters_rhat is not None:
            rhat, of = self.parameters_rhat
            seen.append(
                f"{chains} on the parameters ({_rhat_text(rhat, of)}) but agree on the "
                f"predictions (R-hat at most {self.rhat:.3f}): if the model "
                "has symmetries (a network's hidden units can be permuted, a mixture's labels switched), each chain "
                "holds its own copy of one posterior, whose predictions can be trusted and whose parameters' summaries "
                "cannot; if it has none (a regression's weights), the chains have not met on the parameters yet"
            )
            fixes.append(
                "for such a model, judge the predictions: MCMC(..., verdict=\"predictions\") "
                "(ppl_sgmcmc.numpyro.MCMC) or ppl_sgmcmc.diagnostics.verdict(mcmc, judge=\"predictions\")"
            )
            if not (self.unmixed or self.too_few or self.drifting):  # else the advice below says it
                fixes.append("for a model without symmetries, " + self._run_longer())
        if self.unmixed:
            seen.append(f"{chains} ({_rhat_text(self.rhat, self.rhat_of)})")
        if self.too_few:
            seen.append(
                f"only {min(self.ess_bulk, self.ess_tail):.0f} effective draws (bulk {self.ess_bulk:.0f}, tail "
                f"{self.ess_tail:.0f}; at least {ESS_PER_CHAIN} per chain are needed)"
            )
        if self.drifting:
            seen.append(
                f"a chain was still drifting in its kept draws ({self.drift:.3g} standard errors between the mean "
                f"of its first {DRIFT_HEAD:.0%} and its last {DRIFT_TAIL:.0%} on {self.drift_of}): burn-in is left "
                "in the draws"
            )
        fixes.extend(self.advice)
        if self.unmixed or self.too_few or self.drifting:
            fixes.append(self._run_longer())
            if self.dimension <= MAX_DENSE_DIM:
                fixes.append(
                    "for a correlated posterior with a diagonal metric (the default beyond 256 coordinates), "
                    "dense_mass=True (a dense metric mixes along correlated directions that a diagonal one crosses "
                    "slowly)"
                )
            if self.drifting and self.warmup is None:  # nothing adapted: probably a hand-set step size
                fixes.append("with a hand-set step_size, leave it unset so that the warm-up starts from a mode")
        if self.noisy:
            seen.append(
                f"the noise ratio over the kept draws reached {self.noise_ratio:.3g} ({NOISE_QUANTILE:.0%} quantile; "
                f"the limit is {self.noise_limit:g}): the gradient noise where the chain went biases the draws"
            )
            fixes.append("a smaller step size (target_noise_ratio, or a smaller step_size) or a larger subsample_size")
        lead = SEVERE if self.severe else SHORT if self.unmixed or self.too_few else SYMMETRIC
        return (
            f"{kernel}: " + lead + ": " + "; ".join(seen) + ". "
            + "Try: " + "; or ".join(fixes) + ". (ppl_sgmcmc.verdict; `mcmc.print_summary()` shows r_hat and n_eff.)"
        )


    def _run_longer(self) -> str:
        """The advice to run longer, with what the warm-up's last window found (:attr:`warmup`)."""
        advice = ("run longer (a longer warm-up adapts the metric and the step size further and leaves the burn-in "
                  "behind; more samples add effective draws)")  # fmt: skip
        if self.warmup is None:
            return advice
        misfit, explored, rounds = self.warmup
        if explored < 0.75:  # below three quarters of MIN_EFFECTIVE: the window rescaled nothing
            effective = explored * MIN_EFFECTIVE
            advice += (f"; the warm-up's last window held about {effective:.0f} effective draws of its slowest "
                       f"coordinate, too few to adapt the metric from the draws (it kept the Laplace approximation at "
                       f"the mode): a warm-up about {math.ceil(1 / max(explored, 1e-3)):.0f}x as long lets it")  # fmt: skip
        elif misfit > 1:
            again = f" after running {rounds} more time(s)" if rounds else ""
            advice += (f"; the warm-up had not settled{again}: its metric still changed in its last window (a longer "
                       "num_warmup, or a larger max_warmup)")  # fmt: skip
        return advice


def _coordinates(d: int) -> np.ndarray:
    """The indices of at most :data:`MAX_COORDINATES` coordinates of ``d``, evenly spread."""
    k = max(min(d, MAX_COORDINATES), 1)
    return np.unique(np.arange(k) * d // k)


def _standardised(x: np.ndarray) -> np.ndarray:
    centre = x.reshape(-1, x.shape[-1]).mean(axis=0)
    scale = x.reshape(-1, x.shape[-1]).std(axis=0)
    return (x - centre) / np.where(scale > 0, scale, 1.0)


#: The names of the watched quantities of each judge: a coordinate, a leading direction, the radius.
_NAMES = {
    "parameters": ("theta[{}]", "principal direction {}", "the radius |θ|² (standardised)"),
    "predictions": ("prediction[{}]", "the predictions' principal direction {}", "the predictions' radius (standardised)"),
}  # fmt: skip


def _watched(draws: np.ndarray, index: np.ndarray, energy: np.ndarray | None,
             judged: str = "parameters") -> tuple[np.ndarray, list[str], list[int]]:  # fmt: skip
    """The watched quantities ``(chains, draws, k)`` of the watched coordinates ``draws`` (the flattened draws'
    coordinates ``index``, of the parameters or the predictions: ``judged``), their names, and which of them
    the drift test reads."""
    coordinate, direction, radius = _NAMES[judged]
    chains, n, d = draws.shape
    z = _standardised(draws)
    columns = [draws]
    names = [coordinate.format(k) for k in index]
    drift = []
    pooled = z.reshape(-1, d)
    varying = pooled.std(axis=0) > 0
    if d > 1 and varying.any():
        _, _, vt = np.linalg.svd(pooled[:, varying] - pooled[:, varying].mean(axis=0), full_matrices=False)
        directions = vt[: min(DIRECTIONS, vt.shape[0])]
        columns.append(z[..., varying] @ directions.T)
        drift += list(range(len(names), len(names) + directions.shape[0]))
        names += [direction.format(j + 1) for j in range(directions.shape[0])]
    columns.append(np.sum(z * z, axis=-1, keepdims=True))
    drift.append(len(names))
    names.append(radius)
    if energy is not None:
        columns.append(np.asarray(energy, np.float64).reshape(chains, n, 1))
        drift.append(len(names))
        names.append("the potential energy")
    return np.concatenate(columns, axis=-1), names, drift


def _ess(quantities: np.ndarray, method: str) -> np.ndarray:
    """ArviZ's ESS (``method``) of each quantity of ``(chains, draws, k)``, all chains together."""
    import arviz as az

    with warnings.catch_warnings():  # a constant quantity gives NaN, which is judged below, not warned about
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.asarray(az.ess(az.convert_to_dataset({"q": quantities}), method=method)["q"].values, np.float64)


def _halves(quantities: np.ndarray) -> np.ndarray:
    """One chain ``(1, draws, k)`` as its two halves ``(2, draws // 2, k)`` (ArviZ needs two chains)."""
    half = quantities.shape[1] // 2
    return quantities[:, : 2 * half].reshape(2, half, quantities.shape[-1])


def _rhat_text(rhat: float, of: str) -> str:
    """The R-hat of the quantity ``of`` against :data:`RHAT_LIMIT`, or for one above :data:`RHAT_UNBOUNDED` what it
    means.

    **Example**::

        >>> from ppl_sgmcmc.verdict import _rhat_text
        >>> _rhat_text(1.2345, "theta[2]")
        'R-hat 1.234 on theta[2], above 1.01'
        >>> _rhat_text(3.5e15, "prediction[3]")
        'R-hat unbounded on prediction[3]: each chain nearly constant there, the chains apart'
    """
    if rhat > RHAT_UNBOUNDED:
        return f"R-hat unbounded on {of}: each chain nearly constant there, the chains apart"
    return f"R-hat {rhat:.3f} on {of}, above {RHAT_LIMIT}"


def _diagnostics(quantities: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split rank-normalised R-hat, bulk and tail ESS of each quantity of ``(chains, draws, k)`` (ArviZ); one
    chain is judged as its two halves."""
    import arviz as az

    if quantities.shape[0] == 1:
        quantities = _halves(quantities)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        rhat = np.asarray(az.rhat(az.convert_to_dataset({"q": quantities}), method="rank")["q"].values, np.float64)
    return rhat, _ess(quantities, "bulk"), _ess(quantities, "tail")


def _drift(quantities: np.ndarray) -> np.ndarray:
    """Geweke's ``|z|`` of each chain and quantity of ``(chains, draws, k)``, ``(chains, k)``: the difference of
    the means of the chain's head and tail, over its standard error if the chain were stationary, from the
    tail's variance and autocorrelation time (a head still moving has a strong autocorrelation of its own, which
    would hide the drift in its own standard error)."""
    n = quantities.shape[1]
    h, t = max(int(DRIFT_HEAD * n), 4), max(int(DRIFT_TAIL * n), 8)
    head, tail = quantities[:, :h], quantities[:, n - t:]
    ess = np.stack([_ess(_halves(tail[c][None]), "mean") for c in range(tail.shape[0])])
    tau = tail.shape[1] / np.clip(np.nan_to_num(ess, nan=1.0), 1.0, tail.shape[1])
    error = np.sqrt(tail.var(axis=1) * tau * (1 / h + 1 / t))
    gap = np.abs(head.mean(axis=1) - tail.mean(axis=1))
    return np.where(error > 0, gap / np.where(error > 0, error, 1.0), 0.0)


def _thinned(x: np.ndarray, most: int = MAX_DRAWS) -> np.ndarray:
    """At most ``most`` draws per chain of ``(chains, draws, ...)``, evenly spaced (``arange(most) * draws //
    most``)."""
    n = x.shape[1]
    return x if n <= most else x[:, np.arange(most) * n // most]


class KeptDraws:
    """A chain's kept draws for :func:`assess`, recorded one at a time in bounded memory: at most
    :data:`MAX_COORDINATES` coordinates of each draw (evenly chosen) and between :data:`MAX_DRAWS` and twice as
    many draws, evenly spaced (every other one is dropped and the spacing doubles when the buffer fills).

    **Example**::

        >>> import numpy as np
        >>> from ppl_sgmcmc.verdict import KeptDraws, MAX_DRAWS
        >>> kept = KeptDraws()
        >>> for t in range(3 * MAX_DRAWS):
        ...     kept.add(np.full(1000, float(t)))
        >>> draws = kept.draws()
        >>> draws.shape, draws[0, :3, 0].tolist()
        ((1, 6000, 256), [0.0, 2.0, 4.0])
    """

    def __init__(self) -> None:
        self.rows: list[np.ndarray] = []
        self.stride, self.seen = 1, 0
        self.index: np.ndarray | None = None

    def add(self, draw: Any) -> None:
        """Record a draw: a flat array, NumPy's or a ``torch`` tensor on any device (copied to the host only when
        it is recorded)."""
        if self.seen % self.stride == 0:
            host = draw.detach().cpu() if hasattr(draw, "detach") else draw
            row = np.asarray(host, np.float64).reshape(-1)
            if self.index is None:
                self.index = _coordinates(row.shape[0])
            self.rows.append(row[self.index])
        self.seen += 1
        if len(self.rows) >= 2 * MAX_DRAWS:
            self.rows, self.stride = self.rows[::2], 2 * self.stride

    def draws(self) -> np.ndarray:
        """The recorded draws as one chain, ``(1, draws, coordinates)``."""
        return np.stack(self.rows)[None]


def _selected(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """At most :data:`MAX_COORDINATES` coordinates of ``(chains, draws, d)`` and :data:`MAX_DRAWS` draws per chain
    (selected and thinned before any copy: a network's draws may be gigabytes), those whose draws are all finite,
    and their indices."""
    index = _coordinates(values.shape[-1])
    x = _thinned(values[..., index]).astype(np.float64)
    finite = np.isfinite(x).all(axis=(0, 1))
    return x[..., finite], index[finite]


def _predictions(predictions: Any, chains: int, n: int) -> np.ndarray:
    """``predictions`` ``(chains, m, k)`` at ``m`` of the ``n`` draws of each chain, at most :data:`MAX_DRAWS` of
    them."""
    p = np.asarray(predictions)
    if p.ndim != 3 or p.shape[0] != chains or not min(MIN_DRAWS, n) <= p.shape[1] <= n:
        raise ValueError(
            f"verdict: `predictions` must be (chains, draws, k) with the draws' {chains} chains and at most their "
            f"{n} draws (at least {MIN_DRAWS}), got shape {p.shape}."
        )
    return _thinned(p)


def assess(
    draws: Any,
    *,
    energy: Any = None,
    noise_ratio: Any = None,
    noise_limit: float = math.inf,
    warmup: tuple[float, float, int] | None = None,
    advice: tuple[str, ...] = (),
    predictions: Any = None,
    judge: str = "parameters",
) -> Verdict:
    """The verdict on a run's kept draws.

    :param draws: the draws, ``(chains, draws, d)`` (flattened latents; constrained or not: rank-normalised
        statistics do not depend on monotone transforms of a coordinate, and the directions are taken in
        standardised coordinates).
    :param energy: the potential energy at each draw, ``(chains, draws)``, or ``None``.
    :param noise_ratio: the noise ratio at each draw, ``(chains, draws)`` (NaN where not measured), or ``None``.
    :param noise_limit: the algorithm's noise-ratio limit (:attr:`~ppl_sgmcmc.algorithms.Algorithm.noise_ratio_limit`).
    :param warmup: what the warm-up's last slow window found (:attr:`Verdict.warmup`), or ``None``.
    :param advice: the algorithm's own fixes (:attr:`Verdict.advice`).
    :param predictions: quantities that the model's symmetries leave alone, ``(chains, m, k)``: the
        log-likelihoods of fixed data rows at each draw, or at ``m`` of them evenly spaced over each chain (the
        backends evaluate :data:`PREDICTION_DRAWS`), or ``None``.
    :param judge: ``"parameters"`` (default) watches the draws; where the chains disagree on them, and agree on
        the ``predictions`` given, the verdict is the predictions' and fails as :attr:`Verdict.symmetric`.
        ``"predictions"`` watches the predictions instead of the draws (a model with symmetries; see the module's
        docstring).
    :raises ValueError: for draws or predictions of another shape, fewer than 20 draws per chain, an unknown
        ``judge``, or ``judge="predictions"`` without predictions.

    **Example** (two chains in mirror-image modes of ``y ~ N(a b, 1)``: ``(a, b)`` and ``(-a, -b)`` predict alike)::

        >>> import numpy as np
        >>> rng = np.random.default_rng(1)
        >>> ab = 1.0 + 0.1 * rng.normal(size=(2, 1000, 2))
        >>> ab[1] *= -1.0
        >>> f = (ab[..., 0] * ab[..., 1])[..., None]  # the prediction at each draw
        >>> assess(ab).ok, assess(ab, predictions=f).symmetric, assess(ab, predictions=f, judge="predictions").ok
        (False, True, True)
    """
    if judge not in JUDGES:
        raise ValueError(f"verdict: `judge` must be one of {JUDGES}, got {judge!r}.")
    x = np.asarray(draws)
    if x.ndim != 3:
        raise ValueError(f"verdict: `draws` must be (chains, draws, d), got shape {x.shape}.")
    chains, n, d = x.shape
    if n < MIN_DRAWS:
        raise ValueError(f"verdict: {n} draws per chain are too few to judge (at least {MIN_DRAWS}).")
    if predictions is None and judge == "predictions":
        raise ValueError("verdict: judge='predictions' needs `predictions` (chains, draws, k).")
    p = None if predictions is None else _predictions(predictions, chains, n)
    u = None if energy is None else np.asarray(energy, np.float64).reshape(chains, n)
    if u is not None and not np.isfinite(u).all():
        u = None
    statistics = _statistics(x if p is None or judge == "parameters" else p, u, judge)
    if statistics is None:  # every coordinate has a non-finite draw: nothing to compare, and nothing to trust
        return Verdict(chains, n, math.inf, "every coordinate (non-finite draws)", 0.0, 0.0, math.inf, "the draws",
                       judged=judge, dimension=d)  # fmt: skip
    ratio = math.nan
    if noise_ratio is not None:
        ratios = np.asarray(noise_ratio, np.float64)
        ratios = ratios[np.isfinite(ratios)]
        ratio = float(np.quantile(ratios, NOISE_QUANTILE)) if ratios.size else math.nan
    result = Verdict(num_chains=chains, num_draws=n, **statistics, noise_ratio=ratio, noise_limit=noise_limit,
                     warmup=warmup, advice=tuple(advice), judged=judge, dimension=d)  # fmt: skip
    if p is None or judge == "predictions" or not result.unmixed:
        return result
    on_predictions = assess(draws, energy=energy, noise_ratio=noise_ratio, noise_limit=noise_limit, warmup=warmup,
                            advice=advice, predictions=p, judge="predictions")  # fmt: skip
    return with_predictions(result, on_predictions)


def with_predictions(on_parameters: Verdict, on_predictions: Verdict) -> Verdict:
    """The verdict of a run judged on its parameters whose chains disagree (``on_parameters``), given its verdict on
    the predictions: the predictions' verdict, failing as :attr:`Verdict.symmetric`, where the chains agree on
    them (copies of one posterior); else ``on_parameters``."""
    if not on_parameters.unmixed or on_predictions.unmixed:
        return on_parameters
    return replace(on_predictions, parameters_rhat=(on_parameters.rhat, on_parameters.rhat_of))


def _statistics(values: np.ndarray, energy: np.ndarray | None, judged: str) -> dict[str, Any] | None:
    """:class:`Verdict`'s R-hat, ESS and drift fields from the watched quantities of ``values`` ``(chains, draws,
    d)`` (the parameters' or the predictions': ``judged``) and the ``energy`` ``(chains, n)`` (thinned to the draws
    read); ``None`` if no coordinate has only finite draws."""
    selected, index = _selected(values)
    if selected.shape[-1] == 0:
        return None
    energy = None if energy is None else _thinned(energy, selected.shape[1])
    quantities, names, drifting = _watched(selected, index, energy, judged)
    rhat, bulk, tail = _diagnostics(quantities)
    # a quantity constant in every chain: nothing to compare (NaN); constant in each chain but not across them: R-hat ∞
    rhat = np.where(np.isnan(rhat), 1.0, rhat)
    worst = int(np.argmax(rhat))
    drift = _drift(quantities[..., drifting]).max(axis=0)
    worst_drift = int(np.argmax(drift))
    return {
        "rhat": float(rhat[worst]),
        "rhat_of": names[worst],
        "ess_bulk": float(np.nanmin(np.where(np.isfinite(bulk), bulk, np.inf))),
        "ess_tail": float(np.nanmin(np.where(np.isfinite(tail), tail, np.inf))),
        "drift": float(drift[worst_drift]),
        "drift_of": names[drifting[worst_drift]],
    }


def report(verdict: Verdict, kernel: str, stacklevel: int = 2) -> None:
    """One ``RuntimeWarning`` (:meth:`Verdict.message`) if ``verdict`` failed, attributed to the code
    ``stacklevel`` frames up (as :func:`warnings.warn`'s; 2: the caller's caller, the user's ``mcmc.run`` line).
    Every failed run warns, also when an earlier one warned from the same line (no warnings registry)."""
    if verdict.ok:
        return
    caller = sys._getframe(stacklevel)
    # no `module_globals`: for a script run with `python -m`, its loader cannot give `__main__`'s source lines
    warnings.warn_explicit(
        verdict.message(kernel), RuntimeWarning, caller.f_code.co_filename, caller.f_lineno,
        module=caller.f_globals.get("__name__"), registry=None,
    )  # fmt: skip
