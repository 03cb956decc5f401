"""The blocks of draws × rows of a batched posterior predictive, and the mean and standard deviation over
the draws merged block by block, for both backends (``ppl_sgmcmc.numpyro.posterior_predictive``,
``ppl_sgmcmc.pyro.posterior_predictive``).

The moments of two blocks of ``n_a`` and ``n_b`` draws with means ``m_a, m_b`` and sums of squared
deviations ``M_a, M_b`` merge as ``m = m_a + δ n_b / n``, ``M = M_a + M_b + δ² n_a n_b / n`` with ``δ = m_b -
m_a`` and ``n = n_a + n_b`` (Chan, Golub & LeVeque, "Algorithms for computing the sample variance: analysis
and recommendations", The American Statistician 1983), so no block needs the others in memory.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
from array_api_compat import array_namespace

__all__ = ["PredictiveSummary", "evaluate_blocks", "sizes"]

#: ``run(draw_start, draw_stop, row_start, row_stop) -> {site: (draws, batch_rows, ...)}`` for one block.
BlockFn = Callable[[int, int, int, int], dict[str, Any]]


class PredictiveSummary(NamedTuple):
    """The mean and standard deviation over the draws of each returned site at each row: ``{site: (rows,
    ...)}`` (NumPy). ``sd`` divides by the number of draws (the draws are the population)."""

    mean: dict[str, np.ndarray]
    sd: dict[str, np.ndarray]


def sizes(samples: Mapping[str, Any], args: Sequence[Any], batch_draws: Any, batch_rows: Any, fn: str) -> tuple[int, int]:
    """``(draws, rows)``: the leading size of the ``samples`` and the common leading size of the positional
    array arguments ``args``, after refusing block sizes that are not positive integers."""
    for name, value in (("batch_draws", batch_draws), ("batch_rows", batch_rows)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{fn}: `{name}` must be a positive integer, got {value!r}.")
    if not samples:
        raise ValueError(f"{fn}: `samples` is empty; pass the draws of the latent sites, `mcmc.get_samples()`.")
    arrays = [arg for arg in args if hasattr(arg, "shape") and len(arg.shape) > 0]
    rows = {tuple(arg.shape)[0] for arg in arrays}
    if len(arrays) != len(args) or len(rows) != 1:
        raise ValueError(
            f"{fn}: the positional arguments are the new rows, so they must be arrays with the same leading size "
            f"(got leading sizes {sorted(rows) or 'none'}); pass the other arguments by keyword."
        )
    return tuple(next(iter(samples.values())).shape)[0], rows.pop()


def _blocks(total: int, size: int) -> list[tuple[int, int]]:
    return [(start, min(start + size, total)) for start in range(0, total, size)]


class _Moments:
    """The running mean and sum of squared deviations of one site over the draws of a block of rows."""

    def __init__(self) -> None:
        self.count = 0
        self.mean: Any = None
        self.m2: Any = None

    def add(self, block: Any) -> None:
        xp = array_namespace(block)
        n = block.shape[0]
        mean = xp.mean(block, axis=0)
        m2 = xp.sum((block - mean) ** 2, axis=0)
        if self.mean is None:
            self.mean, self.m2 = mean, m2
        else:
            delta = mean - self.mean
            total = self.count + n
            self.mean = self.mean + delta * (n / total)
            self.m2 = self.m2 + m2 + delta**2 * (self.count * n / total)
        self.count += n

    def sd(self) -> Any:
        return array_namespace(self.m2).sqrt(self.m2 / self.count)


def evaluate_blocks(
    run: BlockFn,
    sites: Sequence[str],
    num_draws: int,
    num_rows: int,
    batch_draws: int,
    batch_rows: int,
    summary: bool,
    to_numpy: Callable[[Any], np.ndarray],
    fn: str,
) -> PredictiveSummary | dict[str, np.ndarray]:
    """Run every block of ``batch_draws`` draws × ``batch_rows`` rows and keep either the moments over the
    draws (``summary``) or every draw's values, ``{site: (draws, rows, ...)}`` (NumPy). ``run`` returns
    ``{site: (≥ draws, batch_rows, ...)}``: a last block padded to ``batch_rows`` rows (and to more draws)."""
    moments: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {name: [] for name in sites}
    values: dict[str, list[np.ndarray]] = {name: [] for name in sites}
    for row_start, row_stop in _blocks(num_rows, batch_rows):
        running = {name: _Moments() for name in sites}
        per_draw: dict[str, list[np.ndarray]] = {name: [] for name in sites}
        for start, stop in _blocks(num_draws, batch_draws):
            out = run(start, stop, row_start, row_stop)
            for name in sites:
                value = out[name]
                if len(value.shape) < 2 or value.shape[1] != batch_rows:
                    raise ValueError(
                        f"{fn}: site {name!r} has the shape {tuple(value.shape[1:])} per draw, not one value per row "
                        f"({batch_rows} rows in the block) along its leading axis: pass `return_sites` with the "
                        "sites that have one value per row."
                    )
                value = value[: stop - start, : row_stop - row_start]  # without the padding of a last block
                if summary:
                    running[name].add(value)
                else:
                    per_draw[name].append(to_numpy(value))
        for name in sites:
            if summary:
                moments[name].append((to_numpy(running[name].mean), to_numpy(running[name].sd())))
            else:
                values[name].append(np.concatenate(per_draw[name], axis=0))
    if not summary:
        return {name: np.concatenate(blocks, axis=1) for name, blocks in values.items()}
    return PredictiveSummary(
        {name: np.concatenate([mean for mean, _ in blocks]) for name, blocks in moments.items()},
        {name: np.concatenate([sd for _, sd in blocks]) for name, blocks in moments.items()},
    )
