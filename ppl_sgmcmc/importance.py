"""Importance-weighted draws in ArviZ ``InferenceData``: estimates, resampling, and the weights' ESS.

Backend-neutral: works on any ``InferenceData`` whose ``sample_stats`` holds a per-draw
``log_weight`` (shape ``(chain, draw)``), as the CSGLD/CSGHMC kernels of both backends provide (the
samples follow a flattened density ``ϖ``; ``w ∝ π/ϖ`` restores the posterior ``π``: W. Deng, G. Lin and
F. Liang, *A Contour Stochastic Gradient Langevin Dynamics Algorithm for Simulations of Multi-modal
Distributions*, NeurIPS 2020; the algorithm and its weights are described on the *CSGLD and CSGHMC*
page of the documentation, ``docs/src/algorithms/csgld.md``). The weights are known up to a constant and
are self-normalised:

- ``pool=False`` (default): **per chain**. Each chain's weights sum to ``1/C`` (``C`` chains), so an
  estimate is the plain average of the ``C`` per-chain self-normalised estimates. Each chain learns its
  own partition weights (and, with ``energy_min``/``energy_gap`` ``"auto"``, its own energy grid), so
  its weights carry a constant of their own: only per-chain normalisation is valid then.
- ``pool=True``: over all draws of all chains at once. Valid only when the chains' weights share one
  normalising constant (a fixed grid and converged partition weights); it lets chains that spent more
  time in low-weight regions count less.

:func:`weighted_mean` and :func:`weighted_expectation` give estimates; :func:`resample` turns the run
into ordinary, unweighted ``InferenceData`` whose draws follow ``π``, so that every ArviZ function
(``summary``, ``ess``, ``rhat``, ``plot_*``, ``loo`` where a log-likelihood group exists) applies;
:func:`weight_ess` is Kish's effective sample size ``(Σw)² / Σw²`` of the normalised weights (L. Kish,
*Survey Sampling*, Wiley 1965).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from typing import Any, Literal, cast

import arviz as az
import numpy as np
import xarray as xr

__all__ = ["normalized_weights", "resample", "weight_ess", "weighted_expectation", "weighted_mean"]


def _log_weights(idata: az.InferenceData, log_weight: str) -> xr.DataArray:
    if not hasattr(idata, "sample_stats") or log_weight not in idata.sample_stats:
        raise KeyError(
            f"no `{log_weight}` in `sample_stats`: expected the InferenceData of a run whose kernel records "
            "importance weights (CSGLD, CSGHMC)."
        )
    lw = idata.sample_stats[log_weight].astype(np.float64)
    if set(lw.dims) != {"chain", "draw"}:
        raise ValueError(f"`sample_stats.{log_weight}` must have dims (chain, draw), got {lw.dims}.")
    if not np.all(np.isfinite(lw.values)):
        raise ValueError(f"`sample_stats.{log_weight}` has non-finite entries.")
    return lw.transpose("chain", "draw")


def normalized_weights(idata: az.InferenceData, pool: bool = False, log_weight: str = "log_weight") -> xr.DataArray:
    """The self-normalised importance weights, a ``(chain, draw)`` DataArray summing to 1 in all.

    ``pool=False``: each chain's weights sum to ``1/C``; ``pool=True``: normalised over all draws
    (see the module docstring).

    :param idata: ``InferenceData`` with ``sample_stats[log_weight]`` of dims ``(chain, draw)``.
    :param pool: normalise over all chains at once (default ``False``: per chain).
    :param log_weight: the name of the log weights in ``sample_stats`` (default ``"log_weight"``).
    :raises KeyError: ``sample_stats`` lacks ``log_weight``.
    :raises ValueError: the log weights are not ``(chain, draw)`` or not finite.

    **Example** (two chains of two draws)::

        >>> import arviz as az, numpy as np
        >>> log_w = np.log([[1.0, 3.0], [1.0, 1.0]])
        >>> idata = az.from_dict(posterior={"x": np.zeros((2, 2))}, sample_stats={"log_weight": log_w})
        >>> normalized_weights(idata).values.round(3).tolist()
        [[0.125, 0.375], [0.25, 0.25]]
        >>> normalized_weights(idata, pool=True).values.round(3).tolist()
        [[0.167, 0.5], [0.167, 0.167]]
    """
    lw = _log_weights(idata, log_weight)
    # casts: numpy's stubs type a ufunc of a DataArray as an ndarray (its __array_ufunc__ returns a DataArray)
    if pool:
        w = cast(xr.DataArray, np.exp(lw - lw.max()))
        return w / w.sum()
    w = cast(xr.DataArray, np.exp(lw - lw.max("draw")))
    return w / w.sum("draw") / lw.sizes["chain"]


def weight_ess(
    idata: az.InferenceData, pool: bool = False, by_chain: bool = False, log_weight: str = "log_weight"
) -> float | xr.DataArray:
    """Kish's effective sample size ``(Σw)² / Σw²`` of the normalised weights.

    It measures only the loss from unequal weights (a run of ``n`` independent, equally weighted draws
    has ``n``); the chain's autocorrelation lowers the effective size further, which ArviZ's ``ess``
    of the :func:`resample`-d draws accounts for.

    :param idata: ``InferenceData`` with ``sample_stats[log_weight]`` of dims ``(chain, draw)``.
    :param pool: the weights as normalised with ``pool`` (see :func:`normalized_weights`).
    :param by_chain: each chain's own ESS instead of one number.
    :param log_weight: the name of the log weights in ``sample_stats``.
    :return: a float: the ESS of the weights as the estimators use them (per chain or pooled); with
        ``by_chain=True`` a ``(chain,)`` DataArray of each chain's own ESS.

    **Example** (one chain with equal weights, one whose weight sits on one draw of four)::

        >>> import arviz as az, numpy as np
        >>> log_w = np.array([[0.0, 0.0, 0.0, 0.0], [0.0, -50.0, -50.0, -50.0]])
        >>> idata = az.from_dict(posterior={"x": np.zeros((2, 4))}, sample_stats={"log_weight": log_w})
        >>> weight_ess(idata, by_chain=True).values.round(2).tolist()
        [4.0, 1.0]
        >>> round(weight_ess(idata), 2)  # per-chain weights 1/8 (x4) and 1/2: 1 / (4/64 + 1/4)
        3.2
    """
    if by_chain:
        w = normalized_weights(idata, pool=False, log_weight=log_weight)
        return w.sum("draw") ** 2 / (w**2).sum("draw")
    w = normalized_weights(idata, pool=pool, log_weight=log_weight)
    return float(1.0 / (w**2).sum())


def weighted_expectation(
    idata: az.InferenceData,
    fn: Callable[[xr.Dataset], xr.Dataset | xr.DataArray] | None = None,
    var_names: Iterable[str] | None = None,
    pool: bool = False,
    group: str = "posterior",
    log_weight: str = "log_weight",
) -> xr.Dataset | xr.DataArray:
    """Importance-weighted posterior expectation ``Σ w f(draw)`` with normalised weights.

    :param idata: ``InferenceData`` with ``sample_stats[log_weight]`` and the group ``group``.
    :param fn: maps the group's Dataset to a Dataset or DataArray with ``chain`` and ``draw`` dims
        (e.g. ``lambda post: post["x"] < 0`` for a probability); default the identity.
    :param var_names: restrict the group to these variables first.
    :param pool: see the module docstring (default per-chain normalisation).
    :param group: the ``InferenceData`` group the draws come from (default ``"posterior"``).
    :param log_weight: the name of the log weights in ``sample_stats``.
    :return: ``fn``'s result reduced over ``chain`` and ``draw``.

    **Example** (draws of ``N(0, 1)`` reweighted to ``N(1, 1)``: ``P(x < 0)`` is about ``Φ(-1) ≈ 0.16``)::

        >>> import arviz as az, numpy as np
        >>> x = np.random.default_rng(0).normal(size=(4, 5000))
        >>> idata = az.from_dict(posterior={"x": x}, sample_stats={"log_weight": x - 0.5})
        >>> round(float(weighted_expectation(idata, lambda post: post["x"] < 0)), 2)
        0.16
    """
    data = idata[group]
    if var_names is not None:
        data = data[list(var_names)]
    values = data if fn is None else fn(data)
    w = normalized_weights(idata, pool=pool, log_weight=log_weight)
    return (values * w).sum(("chain", "draw"))


def weighted_mean(
    idata: az.InferenceData,
    var_names: Iterable[str] | None = None,
    pool: bool = False,
    group: str = "posterior",
    log_weight: str = "log_weight",
) -> xr.Dataset:
    """Importance-weighted posterior means of the group's variables (a Dataset).

    ``weighted_expectation(idata, None, ...)``: the arguments are those of :func:`weighted_expectation`.

    **Example** (draws of ``N(0, 1)`` reweighted to ``N(1, 1)``, ``w ∝ exp(x - 1/2)``)::

        >>> import arviz as az, numpy as np
        >>> x = np.random.default_rng(0).normal(size=(4, 5000))
        >>> idata = az.from_dict(posterior={"x": x}, sample_stats={"log_weight": x - 0.5})
        >>> round(float(weighted_mean(idata)["x"]), 1), round(weight_ess(idata) / x.size, 1)  # Kish: 1/e
        (1.0, 0.4)
    """
    mean = weighted_expectation(idata, None, var_names, pool, group, log_weight)
    assert isinstance(mean, xr.Dataset)  # without `fn`, the expectation of the group's Dataset
    return mean


def _systematic(weights: np.ndarray, num: int, u: float) -> np.ndarray:
    """``num`` sorted indices drawn by systematic resampling with offset ``u ∈ [0, 1)``."""
    cdf = np.cumsum(weights)
    cdf /= cdf[-1]
    return np.minimum(np.searchsorted(cdf, (u + np.arange(num)) / num, side="right"), len(weights) - 1)


def resample(
    idata: az.InferenceData,
    num_draws: int | None = None,
    seed: int | np.random.Generator | None = None,
    method: Literal["systematic", "multinomial"] = "systematic",
    pool: bool = False,
    log_weight: str = "log_weight",
) -> az.InferenceData:
    """Importance resampling: ordinary ``InferenceData`` whose draws follow the original posterior.

    For each chain (``pool=False``, default), ``num_draws`` (default: the chain's number of draws)
    indices are drawn with probabilities proportional to the chain's weights, and every group with
    ``chain`` and ``draw`` dimensions (``posterior``, ``sample_stats``, ``log_likelihood``,
    ``posterior_predictive``, ...) is indexed by them; other groups are kept. ``pool=True`` resamples
    ``C × num_draws`` draws from all chains at once and deals them, in order, into ``C`` chains.

    ``method="systematic"`` (default) has the lower variance and returns each chain's indices in
    increasing order, so the resampled chain keeps the time order of the run (repeats of a draw are
    adjacent) and ArviZ's autocorrelation-based ``ess`` and ``rhat`` stay honest; ``"multinomial"`` draws
    independently (shuffled order: do not read ArviZ's ESS of its output as the run's).

    The resampled ``sample_stats`` lose ``log_weight`` (the draws are now unweighted). The weights'
    Kish ESS (:func:`weight_ess`, per chain or pooled as used) is stored in the ``posterior`` group's
    attributes as ``importance_weight_ess``, and a warning is raised when it is below 10% of the draws.

    :param idata: ``InferenceData`` with ``sample_stats[log_weight]`` of dims ``(chain, draw)``.
    :param num_draws: draws per chain of the result (default: as many as the input has).
    :param seed: a seed or a :class:`numpy.random.Generator` for the resampling.
    :param method: ``"systematic"`` (default) or ``"multinomial"``.
    :param pool: resample from all chains at once (see the module docstring).
    :param log_weight: the name of the log weights in ``sample_stats``.
    :return: unweighted ``InferenceData`` with the input's groups.
    :raises ValueError: an unknown ``method`` or a ``num_draws`` below 1.

    **Example**::

        >>> import arviz as az, numpy as np
        >>> x = np.random.default_rng(0).normal(size=(2, 4000))
        >>> idata = az.from_dict(posterior={"x": x}, sample_stats={"log_weight": x - 0.5})
        >>> unweighted = resample(idata, seed=1)
        >>> unweighted.posterior["x"].shape, round(float(unweighted.posterior["x"].mean()), 1)
        ((2, 4000), 1.0)
        >>> unweighted.groups(), unweighted.posterior.attrs["importance_weight_ess"] > 2000
        (['posterior'], True)
    """
    if method not in ("systematic", "multinomial"):
        raise ValueError(f"resample: unknown method {method!r}; choose 'systematic' or 'multinomial'.")
    w = normalized_weights(idata, pool=pool, log_weight=log_weight).values
    num_chains, num_in = w.shape
    num_draws = num_in if num_draws is None else int(num_draws)
    if num_draws < 1:
        raise ValueError(f"resample: `num_draws` must be a positive integer, got {num_draws}.")
    rng = np.random.default_rng(seed)

    def draw(weights: np.ndarray, num: int) -> np.ndarray:
        if method == "systematic":
            return _systematic(weights, num, rng.uniform())
        return rng.choice(len(weights), size=num, p=weights / weights.sum())

    if pool:
        flat = draw(w.ravel(), num_chains * num_draws).reshape(num_chains, num_draws)
        chain_idx, draw_idx = np.divmod(flat, num_in)
    else:
        draw_idx = np.stack([draw(w[c], num_draws) for c in range(num_chains)])
        chain_idx = np.broadcast_to(np.arange(num_chains)[:, None], draw_idx.shape)
    ess = weight_ess(idata, pool=pool, log_weight=log_weight)
    if ess < 0.1 * w.size:
        warnings.warn(
            f"resample: the importance weights' effective sample size is {ess:.1f} of {w.size} draws; the "
            "resampled draws repeat few distinct points. Run longer, or flatten less (smaller `zeta`).",
            stacklevel=2,
        )

    indexers = {
        "chain": xr.DataArray(chain_idx, dims=("chain", "draw")),
        "draw": xr.DataArray(draw_idx, dims=("chain", "draw")),
    }
    groups: dict[str, Any] = {}  # the keyword arguments of az.InferenceData
    for name in idata.groups():
        ds = idata[name]
        if "chain" in ds.dims and "draw" in ds.dims:
            chain_coords = ds["chain"].values
            ds = ds.isel(indexers).assign_coords(chain=chain_coords, draw=np.arange(num_draws))
            if name == "sample_stats" and log_weight in ds:
                ds = ds.drop_vars(log_weight)
            ds.attrs = dict(ds.attrs)
        groups[name] = ds
    groups["posterior"].attrs.update(
        importance_resampled=method,
        importance_weight_ess=ess,
        importance_normalisation="pooled" if pool else "per chain",
    )
    return az.InferenceData(**groups)
