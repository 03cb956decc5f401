"""What the diagnostics read from a finished run, and the NumPy helpers both backends' views of a run share.

Each backend's ``scores.RunView`` (:mod:`ppl_sgmcmc.numpyro.scores`, :mod:`ppl_sgmcmc.pyro.scores`) implements
:class:`Run` for :mod:`ppl_sgmcmc.diagnostics`; the checks, records and index arithmetic here are the same for both.
This module imports neither JAX nor torch, so that a backend loads nothing of the other through it (and the Pyro
backend no JAX).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple, Protocol

import numpy as np


class Run(Protocol):
    """What :func:`~ppl_sgmcmc.diagnostics.ksd`, :func:`~ppl_sgmcmc.diagnostics.step_halving_check` and
    :func:`~ppl_sgmcmc.diagnostics.energy_noise` read from a finished run: each backend's
    ``scores.RunView`` (:mod:`ppl_sgmcmc.numpyro.scores`, :mod:`ppl_sgmcmc.pyro.scores`)."""

    kernel: Any

    def samples(self) -> dict[str, np.ndarray]:
        """The latent sites' draws as the run reports them (constrained), ``(chains, draws, ...)``."""
        ...

    def latents(self, samples: Mapping[str, Any] | None = None) -> dict[str, np.ndarray]:
        """The run's draws (or ``samples``, constrained) in the unconstrained coordinates of the full-data
        score, ``(chains, draws, ...)``."""
        ...

    def scores(self, rows: Mapping[str, np.ndarray], seed: int) -> np.ndarray:
        """The ``(m, d)`` full-data scores at the unconstrained ``rows`` ``{site: (m, ...)}``."""
        ...

    def preconditioner_scales(self) -> np.ndarray | None:
        """The adapted preconditioners' ``L`` of the chains, ``(chains, d)`` or ``(chains, d, d)``, or ``None``."""
        ...

    def warmup_fit(self) -> tuple[float, float, int] | None:
        """``(misfit, explored, rounds)`` of the warm-up's last slow window over the chains (the worst of each), or
        ``None`` when nothing adapted."""
        ...

    def final_rule_state(self) -> Any:
        """The rule's state at the end of the run (with a leading chain axis for vectorised chains), or ``None``."""
        ...

    def step_index(self) -> int:
        """The step counter of the run's final state."""
        ...

    def continue_chains(self, adjust: Callable[[Any], Any], num_draws: int, spacing: int) -> Continuation:
        """Continue the chains from their final states, each first passed through ``adjust``, for ``num_draws``
        draws ``spacing`` times as many steps apart as the run's."""
        ...

    def kept(self) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """The run's draws flattened, ``(chains, draws, d)``, and its kept noise ratios and potential energies,
        ``(chains, draws)`` or ``None``, for :func:`~ppl_sgmcmc.diagnostics.verdict`."""
        ...

    def pointwise(self, num_draws: int, chunk_size: int | None, fixed: bool = False) -> Pointwise:
        """The per-datum log-likelihoods on the full data (``fixed``: on the :func:`fixed_rows` of each subsampled
        plate, whose ``(N, n)`` are then ``(n, n)``) at ``num_draws`` draws evenly spaced over each chain,
        evaluated lazily ``chunk_size`` draws at a time (``None``: see :func:`rows_per_chunk`)."""
        ...

    def energy_gaps(self) -> np.ndarray:
        """CSGLD's ``Δu`` of each chain, ``(chains,)``."""
        ...


class Continuation(NamedTuple):
    """The halved-step continuation of a run, from a backend's ``RunView.continue_chains``."""

    chains: list[int]  # the chains continued (Pyro: the last one)
    samples: dict[str, np.ndarray]  # their draws, constrained, (chains, draws, ...)
    step_size: np.ndarray  # each chain's last step size before
    halved_step_size: np.ndarray  # and in the continuation


class Pointwise(NamedTuple):
    """The per-datum log-likelihoods of a run's thinned draws, from a backend's ``RunView.pointwise``."""

    plates: dict[str, tuple[int, int]]  # the subsampled plates {name: (N, n)}
    sites: dict[str, tuple[str, int]]  # the observed sites in them {site: (plate, its dim in the site's log density)}
    replace: bool  # minibatches with replacement
    shape: tuple[int, int]  # (chains, draws per chain) evaluated
    chunks: Iterable[tuple[int, dict[str, np.ndarray]]]  # (first row, {site: (rows, *batch)}), rows chain-major


def check_kernel(kernel: Any, base: type, fn: str) -> None:
    """Refuse a run whose kernel is not one of the backend's SG-MCMC kernels (``base``)."""
    if not isinstance(kernel, base):
        raise TypeError(
            f"{fn}: the run's kernel is {type(kernel).__name__}, not a ppl_sgmcmc kernel, whose target and state "
            "this diagnostic reads. For another sampler's draws, compute the full-data scores yourself and call "
            "`ppl_sgmcmc.diagnostics.imq_ksd`."
        )


def check_scores_available(kernel: Any, fn: str) -> None:
    """Refuse a kernel with local Gibbs sites: the score of the global latents' marginal posterior is not a
    gradient of the model's potential."""
    if kernel._gibbs is not None:
        raise ValueError(
            f"{fn}: {kernel.name} updates the local sites {list(kernel._gibbs.sites)} by Gibbs sweeps, so the "
            "posterior of the other latents is the model's with those sites marginalised out, whose score the "
            "model does not give. Marginalise them out of the model to compute its full-data score."
        )


def no_draws(fn: str) -> str:
    """The error of ``fn`` called on a run that made no draws."""
    return f"{fn}: the MCMC object holds no draws: call `mcmc.run(...)` first."


def chain_index(draws: int, num_draws: int, fn: str) -> np.ndarray:
    """At most ``num_draws`` indices evenly spaced over a chain's ``draws``."""
    if draws == 0:
        raise ValueError(no_draws(fn))
    m = min(num_draws, draws)
    return np.arange(m) * draws // m


# entries of the per-datum log-likelihoods evaluated at once when `chunk_size=None` (16 MiB of float32)
AUTO_LOG_LIKELIHOOD_ENTRIES = 2**22


def rows_per_chunk(chunk_size: int | None, entries: int, m: int) -> int:
    """Draws evaluated at once: ``chunk_size``, or with ``None`` as many as keep ``entries`` per draw within
    ``AUTO_LOG_LIKELIHOOD_ENTRIES``."""
    if chunk_size is None:
        chunk_size = AUTO_LOG_LIKELIHOOD_ENTRIES // max(entries, 1)
    return max(1, min(chunk_size, m))


def site_plates(
    frames: Mapping[str, list[tuple[str, int | None]]], plate_sizes: Mapping[str, tuple[int, int]], fn: str
) -> dict[str, tuple[str, int]]:
    """``{site: (plate, dim)}`` for the observed sites (``frames``: their plates' ``(name, dim)``) in a subsampled
    plate; the sites in none add no noise."""
    sites = {}
    for site, plates in frames.items():
        subsampled = [(name, dim) for name, dim in plates if name in plate_sizes]
        if len(subsampled) > 1:
            raise ValueError(
                f"{fn}: the observed site {site!r} lies in the subsampled plates {[name for name, _ in subsampled]}: "
                "its minibatch is a sub-array of all of them, whose energy's variance has no one-plate formula. "
                "Evaluate the minibatch energy repeatedly at a point instead (the CSGLD algorithm page)."
            )
        if subsampled:
            name, dim = subsampled[0]
            if dim is None:
                raise ValueError(
                    f"{fn}: the observed site {site!r} lies in the sequential plate {name!r}; declare it as a "
                    "vectorised plate (a context manager) to compute its per-datum log-likelihoods."
                )
            sites[site] = (name, dim)
    return sites


def fixed_rows(size: int, n: int) -> np.ndarray:
    """The ``n`` rows of a plate of ``size`` whose log-likelihoods :func:`~ppl_sgmcmc.diagnostics.verdict` judges as
    predictions: one minibatch's worth, evenly spread over the data (the data's order then matters less than with the
    first ``n``).

    **Example**::

        >>> from ppl_sgmcmc.diagnostics import fixed_rows
        >>> fixed_rows(10, 4).tolist()
        [0, 2, 5, 7]
    """
    return np.arange(n) * size // n
