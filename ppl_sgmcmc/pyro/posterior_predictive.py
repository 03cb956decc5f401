"""Posterior-predictive quantities of many draws at many new rows, in bounded memory (Pyro).

The twin of :mod:`ppl_sgmcmc.numpyro.posterior_predictive`: :func:`batched_predictive` evaluates the model
``batch_draws`` draws × ``batch_rows`` rows at a time with ``pyro.infer.Predictive`` on its full-data view
(:func:`~ppl_sgmcmc.pyro.full_data`), and by default keeps only the mean and standard deviation over the
draws of each returned site at each row, merged block by block (:mod:`ppl_sgmcmc._predictive`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from pyro import poutine
from pyro.infer import Predictive

from ppl_sgmcmc import _predictive
from ppl_sgmcmc._predictive import PredictiveSummary
from ppl_sgmcmc.pyro.handlers import full_data

__all__ = ["PredictiveSummary", "batched_predictive"]


def _prototype_sites(model: Callable[..., Any], args: tuple, kwargs: Mapping[str, Any]) -> tuple[set, list[str]]:
    """``(deterministic sites, sample sites)`` of one run of ``model`` from its prior, the plates' sites left
    out (a draw's deterministic sites hold the old rows, so none is conditioned on; Pyro's RNG is left as it
    was)."""
    with torch.random.fork_rng(devices=[]), torch.no_grad(), poutine.block():
        model_trace = poutine.trace(model).get_trace(*args, **kwargs)
    sites = [name for name, site in model_trace.nodes.items()
             if site["type"] == "sample" and type(site["fn"]).__name__ != "_Subsample"]  # fmt: skip
    deterministic = {name for name in sites if (model_trace.nodes[name]["infer"] or {}).get("_deterministic")}
    return deterministic, sites


def _padded(x: torch.Tensor, start: int, stop: int, size: int) -> torch.Tensor:
    """Rows ``start:stop`` of ``x``, padded to ``size`` by repeating the last row."""
    block = x[start:stop]
    return block if stop - start == size else torch.cat([block, block[-1:].expand(size - (stop - start), *block.shape[1:])])


def _to_numpy(value: torch.Tensor) -> np.ndarray:
    return value.detach().cpu().numpy()


def batched_predictive(
    model: Callable[..., Any],
    samples: Mapping[str, torch.Tensor],
    *args: Any,
    return_sites: Sequence[str] = (),
    batch_draws: int = 100,
    batch_rows: int = 1024,
    summary: bool = True,
    parallel: bool = False,
    **kwargs: Any,
) -> PredictiveSummary | dict[str, np.ndarray]:
    """The posterior predictive of ``model`` at the rows of ``args`` for every draw of ``samples``,
    ``batch_draws`` draws × ``batch_rows`` rows at a time: by default only its mean and standard deviation
    over the draws at each row, never the whole ``draws × rows × ...`` array.

    Each block is ``pyro.infer.Predictive(full_data(model), block_draws, return_sites=...)(*block_rows,
    **kwargs)``: the deterministic sites (a network's output ``f(x)``, say) are recomputed at the new rows
    (those among ``samples`` are left out) and the observed sites drawn anew. The positional arguments are
    the rows: tensors with the same leading size ``R``, cut into blocks of ``batch_rows``; keyword arguments
    pass whole to every block. Each returned site must have one value per row, its leading axis. Memory
    beyond the result is one block's evaluation: ``batch_rows`` rows of one draw at a time (``parallel=False``,
    what a ``PyroModule`` network of ``nn.Linear`` layers needs), or of ``batch_draws`` draws at once
    (``parallel=True``, a model that broadcasts over a leading sample dimension). The result is ``2 × R × ...``
    values (``summary=True``) or ``draws × R × ...`` (``summary=False``). The deterministic sites' values do not
    depend on the blocks; the observed sites' draws use Pyro's global random state, as ``Predictive`` does.

    :param model: the model (the kernel's or its own: its plates with ``subsample_size`` cover all rows).
    :param samples: ``{site: (draws, ...)}``, the latent sites' draws (``mcmc.get_samples()``).
    :param args: the model's positional arguments: the new rows (``X_test`` for ``model(X, y=None)``).
    :param return_sites: the sites to return; default: ``Predictive``'s, the sample sites that are not among
        the samples (the observed and the deterministic ones).
    :param batch_draws: the draws evaluated together.
    :param batch_rows: the rows evaluated together.
    :param summary: return the :class:`~ppl_sgmcmc._predictive.PredictiveSummary` (mean and sd over the draws);
        ``False``: every draw's values, ``{site: (draws, rows, ...)}``.
    :param parallel: run a block's draws in one batched run of the model (``Predictive(parallel=True)``).
    :param kwargs: the model's keyword arguments.
    :returns: a :class:`~ppl_sgmcmc._predictive.PredictiveSummary`, or ``{site: (draws, rows, ...)}`` (NumPy).
    :raises ValueError: a non-positive block size, positional arguments without a common leading size, or a
        returned site without one value per row.

    **Example** (``f(x) = w x`` with two draws of ``w``; the plate's minibatch of 2 covers all 5 rows)::

        >>> import torch, pyro, pyro.distributions as dist
        >>> def model(x, y=None):
        ...     w = pyro.sample("w", dist.Normal(0.0, 1.0))
        ...     with pyro.plate("data", x.shape[0], subsample_size=2):
        ...         xb = pyro.subsample(x, event_dim=0)
        ...         pyro.sample("y", dist.Normal(pyro.deterministic("f", w * xb), 1.0), obs=y)
        >>> out = batched_predictive(model, {"w": torch.tensor([1.0, 3.0])}, torch.arange(5.0), return_sites=["f"],
        ...                          batch_draws=1, batch_rows=2)
        >>> out.mean["f"].tolist(), out.sd["f"].tolist()
        ([0.0, 2.0, 4.0, 6.0, 8.0], [0.0, 1.0, 2.0, 3.0, 4.0])
    """
    fn = "batched_predictive"
    num_draws, num_rows = _predictive.sizes(samples, args, batch_draws, batch_rows, fn)
    model = full_data(model)
    deterministic, default = _prototype_sites(model, tuple(arg[:batch_rows] for arg in args), kwargs)
    draws = {name: value for name, value in samples.items() if name not in deterministic}
    sites = list(return_sites) or [name for name in default if name not in draws]

    r = min(batch_rows, num_rows)

    def run(start: int, stop: int, row_start: int, row_stop: int) -> dict[str, torch.Tensor]:
        block = {name: value[start:stop] for name, value in draws.items()}
        # the last block of rows padded to r rows (repeating its last row): a plate's `subsample_size` fits it
        rows = tuple(_padded(arg, row_start, row_stop, r) for arg in args)
        with torch.no_grad():
            return Predictive(model, block, return_sites=sites, parallel=parallel)(*rows, **kwargs)

    return _predictive.evaluate_blocks(
        run, sites, num_draws, num_rows, min(batch_draws, num_draws), r, summary, _to_numpy, fn
    )
