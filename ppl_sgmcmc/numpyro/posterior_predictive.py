"""Posterior-predictive quantities of many draws at many new rows, in bounded memory.

A network's predictive ``f(x)`` at ``R`` test rows for ``S`` draws is an ``S × R × K`` array (``K``
outputs): 4000 draws × 100 000 rows × 10 classes is 16 GB in float32. :func:`batched_predictive`
evaluates the model ``batch_draws`` draws × ``batch_rows`` rows at a time, in one compiled program run
over the blocks, and by default keeps only the mean and standard deviation over the draws of each
returned site at each row (``R × K``), merged block by block (:mod:`ppl_sgmcmc._predictive`). The model
runs on its full-data view (:class:`~ppl_sgmcmc.numpyro.full_data`), so a plate subsampled for the kernel
covers every new row.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import random
from jax.typing import ArrayLike
from numpyro.handlers import mask, seed, substitute, trace

from ppl_sgmcmc import _predictive
from ppl_sgmcmc._predictive import PredictiveSummary
from ppl_sgmcmc.numpyro.handlers import full_data
from ppl_sgmcmc.numpyro.potential import split_arrays
from ppl_sgmcmc.numpyro.sharding import to_host

__all__ = ["PredictiveSummary", "batched_predictive"]


def _padded(x: Any, start: int, stop: int, size: int) -> Any:
    """Rows ``start:stop`` of ``x``, padded to ``size`` by repeating the last row (one compiled shape)."""
    block = x[start:stop]
    if stop - start == size:
        return block
    return jnp.concatenate([block, jnp.repeat(block[-1:], size - (stop - start), axis=0)])


def prototype_sites(
    model: Callable[..., Any], draw: Mapping[str, Any], args: tuple, kwargs: Mapping[str, Any]
) -> tuple[list[str], list[str]]:
    """``(deterministic sites, Predictive's default return sites)`` of one run of ``model`` at ``draw``."""
    def latent(msg: dict[str, Any]) -> Any:  # the sample sites only: the draws' deterministic sites have old rows
        return draw.get(msg["name"]) if msg["type"] == "sample" else None

    model_trace = trace(seed(substitute(mask(model, mask=False), substitute_fn=latent), 0)).get_trace(*args, **kwargs)
    deterministic = [name for name, site in model_trace.items() if site["type"] == "deterministic"]
    default = [
        name
        for name, site in model_trace.items()
        if (site["type"] == "sample" and name not in draw) or site["type"] == "deterministic"
    ]
    return deterministic, default


def block_program(
    model: Callable[..., Any], sites: Sequence[str], merge: Callable[[list], Any]
) -> Callable[[jax.Array, dict[str, jax.Array], list], dict[str, jax.Array]]:
    """The compiled evaluation of a block: ``(keys (b, 2), draws {site: (b, ...)}, data) -> {site: (b, r,
    ...)}``, each draw run as ``numpyro.infer.Predictive`` runs it (the model seeded with its key, the
    draw's latents substituted, no log-density)."""
    masked = mask(model, mask=False)

    @jax.jit
    def run(keys: jax.Array, draws: dict[str, jax.Array], data: list) -> dict[str, jax.Array]:
        args, kwargs = merge(data)

        def one(key: jax.Array, draw: dict[str, jax.Array]) -> dict[str, jax.Array]:
            model_trace = trace(seed(substitute(masked, data=draw), key)).get_trace(*args, **kwargs)
            return {name: model_trace[name]["value"] for name in sites}

        return jax.vmap(one)(keys, draws)

    return run


def batched_predictive(
    model: Callable[..., Any],
    samples: Mapping[str, ArrayLike],
    rng_key: jax.Array,
    *args: Any,
    return_sites: Sequence[str] | None = None,
    batch_draws: int = 100,
    batch_rows: int = 1024,
    summary: bool = True,
    **kwargs: Any,
) -> PredictiveSummary | dict[str, np.ndarray]:
    """The posterior predictive of ``model`` at the rows of ``args`` for every draw of ``samples``,
    ``batch_draws`` draws × ``batch_rows`` rows at a time: by default only its mean and standard deviation
    over the draws at each row, never the whole ``draws × rows × ...`` array.

    Each draw ``s`` runs the model's full-data view with the draw's latent values, seeded with the ``s``-th
    key of ``random.split(rng_key, draws)``, as ``numpyro.infer.Predictive(model, samples)(rng_key, *args,
    **kwargs)`` runs it: the deterministic sites (a network's output ``f(x)``, say) are recomputed at the new
    rows and the observed sites drawn anew. The positional arguments are the rows: arrays with the same
    leading size ``R``, cut into blocks of ``batch_rows``; keyword arguments pass whole to every block. Each
    returned site must have one value per row, its leading axis. Memory beyond the result is one block's
    evaluation, about ``batch_draws × batch_rows`` times a row's intermediates; the result is ``2 × R × ...``
    values (``summary=True``) or ``draws × R × ...`` (``summary=False``). The values of the deterministic
    sites do not depend on the blocks; the random draws of the observed sites equal ``Predictive``'s when
    ``batch_rows >= R`` (a site's draw over a block of rows takes the draw's key, so other blocks draw
    otherwise).

    :param model: the model (the kernel's or its own: its plates with ``subsample_size`` cover all rows).
    :param samples: ``{site: (draws, ...)}``, the latent sites' draws (``mcmc.get_samples()``;
        deterministic sites among them are left out and recomputed).
    :param rng_key: the key of the predictive draws.
    :param args: the model's positional arguments: the new rows (``X_test`` for ``model(X, y=None)``).
    :param return_sites: the sites to return; default: ``Predictive``'s, the sample sites that are not among
        the samples and the deterministic sites.
    :param batch_draws: the draws evaluated together.
    :param batch_rows: the rows evaluated together.
    :param summary: return the :class:`PredictiveSummary` (mean and sd over the draws); ``False``: the
        values of every draw, ``{site: (draws, rows, ...)}``.
    :param kwargs: the model's keyword arguments.
    :returns: a :class:`PredictiveSummary`, or ``{site: (draws, rows, ...)}`` (NumPy).
    :raises ValueError: a non-positive block size, positional arguments without a common leading size, or a
        returned site without one value per row.

    **Example** (``f(x) = w x`` with two draws of ``w``; the plate's minibatch of 2 covers all 5 rows)::

        >>> import jax, jax.numpy as jnp, numpyro, numpyro.distributions as dist
        >>> def model(x, y=None):
        ...     w = numpyro.sample("w", dist.Normal(0, 1))
        ...     with numpyro.plate("data", x.shape[0], subsample_size=2):
        ...         xb = numpyro.subsample(x, event_dim=0)
        ...         numpyro.sample("y", dist.Normal(numpyro.deterministic("f", w * xb), 1), obs=y)
        >>> out = batched_predictive(model, {"w": jnp.array([1.0, 3.0])}, jax.random.PRNGKey(0), jnp.arange(5.0),
        ...                          return_sites=["f"], batch_draws=1, batch_rows=2)
        >>> out.mean["f"].tolist(), out.sd["f"].tolist()
        ([0.0, 2.0, 4.0, 6.0, 8.0], [0.0, 1.0, 2.0, 3.0, 4.0])
    """
    fn = "batched_predictive"
    draws = {name: jnp.asarray(value) for name, value in samples.items()}
    row_args = tuple(jnp.asarray(arg) for arg in args)
    num_draws, num_rows = _predictive.sizes(draws, row_args, batch_draws, batch_rows, fn)
    model = full_data(model)
    b, r = min(batch_draws, num_draws), min(batch_rows, num_rows)
    first_rows = tuple(arg[:r] for arg in row_args)
    deterministic, default = prototype_sites(model, {k: v[0] for k, v in draws.items()}, first_rows, kwargs)
    draws = {name: value for name, value in draws.items() if name not in deterministic}
    sites = list(default if return_sites is None else return_sites)
    keys = random.split(rng_key, num_draws) if num_draws > 1 else rng_key[None]
    _, merge = split_arrays((row_args, dict(kwargs)))
    program = block_program(model, sites, merge)

    def run(start: int, stop: int, row_start: int, row_stop: int) -> dict[str, jax.Array]:
        rows = tuple(_padded(arg, row_start, row_stop, r) for arg in row_args)
        block = {name: _padded(value, start, stop, b) for name, value in draws.items()}
        return program(_padded(keys, start, stop, b), block, split_arrays((rows, dict(kwargs)))[0])

    return _predictive.evaluate_blocks(run, sites, num_draws, num_rows, b, r, summary, to_host, fn)
