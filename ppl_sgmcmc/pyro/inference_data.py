"""ArviZ InferenceData from an SG-MCMC run, with the pointwise log-likelihood on the full data.

``arviz.from_pyro(mcmc)`` already works with these kernels: it reads ``mcmc.kernel.model``, which
is the model's full-data view (:class:`~ppl_sgmcmc.pyro.handlers.FullDataModel`), so
``log_likelihood`` and ``observed_data`` cover all ``N`` data points instead of one random
minibatch. Two quirks of ``from_pyro`` remain, which :func:`to_inference_data` fixes: it treats
``pyro.deterministic`` sites as observed data (they get a ``log_likelihood`` of zeros, and
``az.loo`` then asks which variable to use), and it evaluates the log-likelihood of all draws at
once (``chains × draws × N`` values and the model's intermediates in memory), and omits it, with a
warning, for a model that does not broadcast over a leading sample dimension (``Xb @ w``), where
:func:`to_inference_data` evaluates it draw by draw.

Posterior predictive draws need the full-data view too: :func:`predictive` is
``pyro.infer.Predictive(full_data(model), samples)`` for a run (``Predictive`` on the subsampled model
returns a random minibatch of rows per draw, and nothing can intercept that).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import numpy as np
import pyro
import torch
from pyro import poutine
from pyro.infer import MCMC, Predictive

from ppl_sgmcmc import _model_checks
from ppl_sgmcmc.pyro.kernel import SGMCMCKernel

if TYPE_CHECKING:  # ArviZ (with xarray and matplotlib) is imported when InferenceData is made
    import arviz as az

__all__ = ["MAX_LOG_LIKELIHOOD_BYTES", "full_data_log_likelihood", "predictive", "sample_stats", "to_inference_data"]

MAX_LOG_LIKELIHOOD_BYTES = 2**30

_THINNING = "a larger `steps_per_sample`"  # how this driver keeps fewer draws, for the size refusal
_PREDICTIVE_ASIDE = " (Predictive would draw them from their prior instead)"
"""Default of ``max_log_likelihood_bytes``: the largest pointwise log-likelihood (1 GiB) that
:func:`full_data_log_likelihood` and :func:`to_inference_data` compute before refusing."""


def _check(mcmc: MCMC, needs_model: bool = True) -> None:
    if not isinstance(getattr(mcmc, "kernel", None), SGMCMCKernel) or (needs_model and mcmc.kernel.model is None):
        raise TypeError(
            "expected an `MCMC` run with a ppl_sgmcmc kernel" + (" built from a model." if needs_model else ".")
        )


def sample_stats(mcmc: MCMC) -> dict[str, np.ndarray]:
    """The per-draw statistics a kernel records besides ``diverging``, as ``{name: array (chain, draw)}``
    (NumPy): ``step_size``, ``noise_ratio`` and ``noise_variance`` (:mod:`ppl_sgmcmc.noise`), and ``log_weight``
    and ``partition`` for :class:`~ppl_sgmcmc.pyro.CSGLD` and :class:`~ppl_sgmcmc.pyro.CSGHMC` (the kernel's
    :attr:`~ppl_sgmcmc.pyro.kernel.SGMCMCKernel.recorded_fields`). Pyro's ``MCMC`` returns them through each
    chain's :meth:`~ppl_sgmcmc.pyro.kernel.SGMCMCKernel.diagnostics`.

    :param mcmc: a finished :class:`pyro.infer.MCMC` run of an SG-MCMC kernel (from a model or a
        ``potential_fn``).

    **Example**::

        >>> import torch, pyro
        >>> from pyro.infer import MCMC
        >>> from ppl_sgmcmc.pyro import CSGLD
        >>> pyro.set_rng_seed(0)
        >>> kernel = CSGLD(potential_fn=lambda z: 0.5 * (z["x"] ** 2).sum(), step_size=0.1, num_partitions=10,
        ...                energy_min=0.0, energy_gap=0.5)
        >>> mcmc = MCMC(kernel, warmup_steps=10, num_samples=20, initial_params={"x": torch.zeros(2)},
        ...             disable_progbar=True)
        >>> mcmc.run()
        >>> {name: values.shape for name, values in sample_stats(mcmc).items()}
        {'step_size': (1, 20), 'noise_ratio': (1, 20), 'noise_variance': (1, 20), 'log_weight': (1, 20),
         'partition': (1, 20)}
    """
    _check(mcmc, needs_model=False)
    chains = mcmc._diagnostics
    out = {}
    for name in mcmc.kernel.recorded_fields:
        if chains and all(chain is not None and name in chain for chain in chains):
            out[name] = np.stack([np.asarray(chain[name]) for chain in chains])
    return out


class _Sites(NamedTuple):
    """The sites of a run's full-data model, from one trace with the run's arguments."""

    observed: dict[str, tuple[torch.Size, torch.dtype]]  # data sites (not deterministic): log_prob's shape, dtype
    deterministic: list[str]
    local: list[str]  # latent sites that are not among the samples: local Gibbs sites
    plates: dict[str, list[tuple[str, int | None]]]  # each observed site's plates: (name, dim)


def _sites(mcmc: MCMC, model: Callable[..., Any] | None = None) -> _Sites:
    """The sites of ``model`` (default: the run's full-data model) run with the run's arguments."""
    samples = mcmc.get_samples()
    first = {name: value[0] for name, value in samples.items()}  # no prior draw (an ImproperUniform has none)
    with torch.random.fork_rng(devices=[]), torch.no_grad(), poutine.block():  # leaves Pyro's RNG as it was
        model = poutine.condition(mcmc.kernel.model if model is None else model, first)
        model_trace: Any = poutine.trace(model).get_trace(*mcmc._args, **mcmc._kwargs)
    observed, deterministic, local, plates = {}, [], [], {}
    for name, site in model_trace.nodes.items():
        if site["type"] != "sample" or type(site["fn"]).__name__ == "_Subsample":
            continue
        if site["infer"].get("_deterministic"):
            deterministic.append(name)
        elif name in samples:  # a latent site, conditioned on its first draw
            continue
        elif site["is_observed"]:
            log_prob = site["fn"].log_prob(site["value"])
            observed[name] = (log_prob.shape, log_prob.dtype)
            plates[name] = [(frame.name, frame.dim) for frame in site["cond_indep_stack"]]
        else:
            local.append(name)
    return _Sites(observed, deterministic, local, plates)



def _plate_nesting(mcmc: MCMC, draw: dict[str, torch.Tensor], model: Callable[..., Any]) -> int:
    """The number of plate dims of ``model``, from one run conditioned on ``draw`` (the batched draws go left of
    them, as ``Predictive`` puts them)."""
    model_trace = poutine.trace(poutine.condition(model, draw)).get_trace(*mcmc._args, **mcmc._kwargs)
    return max(
        (-frame.dim for site in model_trace.nodes.values() if site["type"] == "sample"
         for frame in site["cond_indep_stack"] if frame.vectorized and frame.dim is not None),
        default=0,
    )  # fmt: skip


def _vectorized(
    mcmc: MCMC, chunk: dict[str, torch.Tensor], observed: dict[str, tuple], nesting: int, model: Callable[..., Any]
) -> dict[str, torch.Tensor]:
    """The log-likelihood of the draws ``chunk`` in one run of the model, batched over them in a plate left of the
    model's ``nesting`` plate dims: ``Predictive.get_vectorized_trace``'s run, without its prior draw of a
    prototype and without its ``poutine.mask(mask=False)``, which hides a site's own mask."""
    num = next(iter(chunk.values())).shape[0]
    samples = {k: v.reshape((num,) + (1,) * (nesting - (v.dim() - 1)) + v.shape[1:]) for k, v in chunk.items()}
    draws = pyro.plate("_num_draws", num, dim=-nesting - 1)
    model_trace: Any = poutine.trace(poutine.condition(draws(model), samples)).get_trace(*mcmc._args, **mcmc._kwargs)
    out = {}
    for name, (shape, _) in observed.items():
        site = model_trace.nodes[name]
        values = _masked(site, site["fn"].log_prob(site["value"]))
        if values.numel() != num * math.prod(shape):  # broadcast wrongly
            raise ValueError(
                f"site {name!r}: log_prob of shape {tuple(values.shape)} for {num} draws of {tuple(shape)}"
            )
        out[name] = values.reshape((num,) + tuple(shape))
    return out


def _one_draw(
    mcmc: MCMC, draw: dict[str, torch.Tensor], observed: dict[str, tuple], model: Callable[..., Any]
) -> dict[str, torch.Tensor]:
    """The log-likelihood of one draw: one run of ``model``, conditioned on it."""
    model_trace = poutine.trace(poutine.condition(model, draw)).get_trace(*mcmc._args, **mcmc._kwargs)
    sites = model_trace.nodes
    # an observed site's "fn" is its distribution (pyro's Message types it as any callable)
    return {
        name: _masked(sites[name], cast(pyro.distributions.Distribution, sites[name]["fn"]).log_prob(sites[name]["value"]))
        for name in observed
    }


def _masked(site: Any, log_prob: torch.Tensor) -> torch.Tensor:
    """``log_prob`` of an observed site with the entries its ``poutine.mask`` masks out set to 0: what NumPyro's
    ``log_likelihood`` (a masked site's distribution is a ``MaskedDistribution``) and so ``az.from_numpyro`` give
    them. ``az.from_pyro`` reads the unmasked ``log_prob``: a masked row, which may hold any placeholder, would
    count in ``az.loo`` as a datum."""
    mask = site["mask"]
    if mask is None or mask is True:
        return log_prob
    mask = torch.as_tensor(mask, dtype=torch.bool, device=log_prob.device)
    return torch.where(mask, log_prob, torch.zeros((), dtype=log_prob.dtype, device=log_prob.device))


def full_data_log_likelihood(
    mcmc: MCMC, chunk_size: int = 256, max_log_likelihood_bytes: int = MAX_LOG_LIKELIHOOD_BYTES
) -> dict[str, np.ndarray]:
    """Pointwise log-likelihood of every observed site on all of its data, for every draw.

    The result is allocated once and filled ``chunk_size`` draws at a time, each chunk in one run of the
    model batched over its draws (as ``arviz.from_pyro`` does). A model that does not broadcast over a
    leading sample dimension (``Xb @ w`` with ``w`` of shape ``(draws, 1, D)``) is evaluated one draw at a
    time instead, with a warning (``arviz.from_pyro`` omits the log-likelihood of such a model).

    :param mcmc: a finished :class:`pyro.infer.MCMC` run of an SG-MCMC kernel.
    :param int chunk_size: draws evaluated at once; bounds the memory beyond the result to about
        ``chunk_size × N`` values (times the model's intermediates).
    :param int max_log_likelihood_bytes: refuse (``ValueError``, saying what to do) when the result would
        be larger than this; default :data:`MAX_LOG_LIKELIHOOD_BYTES` (1 GiB).
    :return: ``{site: array of shape (num_chains, num_draws, *site_shape)}`` (NumPy), shaped as
        ``arviz.from_pyro`` shapes it.
    :raises ValueError: if the result is too large, or the run has local Gibbs sites (the log-likelihood
        would need them marginalised; :func:`to_inference_data` then leaves it out with a warning).

    **Example** (100 data points, minibatches of 10: the log-likelihood covers all 100)::

        >>> import torch, pyro, pyro.distributions as dist
        >>> from pyro.infer import MCMC
        >>> from ppl_sgmcmc.pyro import SGLD
        >>> def model(y):
        ...     mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
        ...     with pyro.plate("data", y.shape[0], subsample_size=10):
        ...         pyro.sample("y", dist.Normal(mu, 1.0), obs=pyro.subsample(y, event_dim=0))
        >>> mcmc = MCMC(SGLD(model, step_size=1e-3), warmup_steps=10, num_samples=20, disable_progbar=True)
        >>> mcmc.run(torch.zeros(100))
        >>> full_data_log_likelihood(mcmc, chunk_size=8)["y"].shape
        (1, 20, 100)
        >>> full_data_log_likelihood(mcmc, max_log_likelihood_bytes=1000)
        Traceback (most recent call last):
        ...
        ValueError: the pointwise log-likelihood would take 0.00 GiB (1 chains × 20 draws × 100 ('y') values), ...
        Pass log_likelihood=False, ...
    """
    _check(mcmc)
    sites = _sites(mcmc)
    if sites.local:
        raise ValueError(f"full_data_log_likelihood: {_model_checks.local_sites_message(sites.local, _PREDICTIVE_ASIDE)}.")
    samples = mcmc.get_samples(group_by_chain=True)  # deterministic sites too: Predictive conditions on them
    num_chains, num_draws = next(iter(samples.values())).shape[:2]
    total = num_chains * num_draws
    flat = {k: v.reshape((total,) + v.shape[2:]) for k, v in samples.items()}
    sizes = {name: math.prod(shape) for name, (shape, _) in sites.observed.items()}
    num_bytes = sum(total * sizes[name] * dtype.itemsize for name, (_, dtype) in sites.observed.items())
    if num_bytes > max_log_likelihood_bytes:
        raise ValueError(_model_checks.log_likelihood_too_large(
            num_bytes, max_log_likelihood_bytes, num_chains, num_draws, sizes, _THINNING
        ))
    out = {
        name: torch.empty((total,) + tuple(shape), dtype=dtype).numpy()
        for name, (shape, dtype) in sites.observed.items()
    }
    for start, chunk in _log_likelihood_chunks(mcmc, flat, sites.observed, chunk_size):
        for name, values in chunk.items():
            out[name][start : start + len(values)] = values
    return {name: values.reshape((num_chains, num_draws) + values.shape[1:]) for name, values in out.items()}


def _log_likelihood_chunks(
    mcmc: MCMC,
    flat: dict[str, torch.Tensor],
    observed: dict[str, tuple],
    chunk_size: int,
    model: Callable[..., Any] | None = None,
) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
    """``(start, {site: (rows, *site_shape)})``: the pointwise log-likelihood of the ``observed`` sites at
    ``chunk_size`` draws at a time of ``flat`` ``{site: (m, ...)}``, each chunk in one run of ``model`` (default:
    the run's full-data model) batched over its draws, or, from the first chunk the model does not broadcast
    over, one draw at a time (with a warning)."""
    model = mcmc.kernel.model if model is None else model
    total = next(iter(flat.values())).shape[0]
    vectorize = True
    with torch.no_grad(), poutine.block():
        nesting = _plate_nesting(mcmc, {k: v[0] for k, v in flat.items()}, model)
    for start in range(0, total, chunk_size):
        stop = min(start + chunk_size, total)
        out: dict[str, np.ndarray] | None = None
        with torch.no_grad(), poutine.block():
            if vectorize:
                try:
                    chunk = _vectorized(mcmc, {k: v[start:stop] for k, v in flat.items()}, observed, nesting, model)
                except Exception as error:  # noqa: BLE001 - any failure of the batched run: fall back
                    vectorize = False
                    reason = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
                    warnings.warn(
                        f"the model does not broadcast over a leading sample dimension ({reason}), so the "
                        "log-likelihood is evaluated one draw at a time (slower; arviz.from_pyro omits it). To batch "
                        "it, write the model to broadcast, e.g. `(Xb @ w.unsqueeze(-1)).squeeze(-1)` instead of "
                        "`Xb @ w`.",
                        UserWarning,
                        stacklevel=4,
                    )
                else:
                    out = {name: values.cpu().numpy() for name, values in chunk.items()}
            if out is None:
                rows = [_one_draw(mcmc, {k: v[i] for k, v in flat.items()}, observed, model) for i in range(start, stop)]
                out = {name: np.stack([row[name].cpu().numpy() for row in rows]) for name in observed}
        yield start, out


def to_inference_data(
    mcmc: MCMC,
    log_likelihood: bool = True,
    chunk_size: int = 256,
    max_log_likelihood_bytes: int = MAX_LOG_LIKELIHOOD_BYTES,
    **kwargs: Any,
) -> az.InferenceData:
    """``arviz.from_pyro`` for SG-MCMC runs.

    - ``log_likelihood``: the full-data pointwise log-likelihood of the observed sites (deterministic
      sites left out), computed ``chunk_size`` draws at a time into a preallocated array (see
      :func:`full_data_log_likelihood`; draw by draw, with a warning, for a model that does not broadcast
      over a leading sample dimension); ``False`` skips it (for very large ``N``). Above
      ``max_log_likelihood_bytes`` (default 1 GiB) it refuses with a ``ValueError`` that says what to do.
      A run with local Gibbs sites (``gibbs_sites=``) gets no log-likelihood, with a warning: it would need
      the local sites, which are not among the samples, marginalised.
    - ``observed_data`` holds the observed sites on their full data, without deterministic sites.
    - ``sample_stats.diverging`` marks the rejected non-finite steps among the draws; CSGLD and CSGHMC
      runs add ``log_weight`` and ``partition`` (see :func:`sample_stats`; ``arviz.from_pyro`` leaves
      them out), which :mod:`ppl_sgmcmc.importance` reads.
    - A kernel built from ``potential_fn`` has no model: the result has ``posterior`` and
      ``sample_stats`` only.
    - A cyclical kernel's (``cycle_length``) draws are those of the sampling stages only (``sample_stats.i``,
      the step counts, tells them apart; see :class:`~ppl_sgmcmc.algorithms.Cycles`): ``mcmc.get_samples()``
      holds the exploration stages' draws too.

    Other keyword arguments go to :func:`arviz.from_pyro` (``coords``, ``dims``,
    ``posterior_predictive=`` :func:`predictive` ``(mcmc, X)``, ...).

    **Example**::

        >>> import torch, pyro, pyro.distributions as dist
        >>> from pyro.infer import MCMC
        >>> from ppl_sgmcmc.pyro import SGLD
        >>> def model(y):
        ...     mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
        ...     with pyro.plate("data", y.shape[0], subsample_size=10):
        ...         pyro.sample("y", dist.Normal(mu, 1.0), obs=pyro.subsample(y, event_dim=0))
        >>> mcmc = MCMC(SGLD(model, step_size=1e-3), warmup_steps=100, num_samples=100, disable_progbar=True)
        >>> mcmc.run(torch.zeros(1000))
        >>> idata = to_inference_data(mcmc, chunk_size=50)
        >>> idata.log_likelihood["y"].shape, idata.observed_data["y"].shape
        ((1, 100, 1000), (1000,))
    """
    _check(mcmc, needs_model=False)
    import arviz as az

    idata = az.from_pyro(mcmc, log_likelihood=False, **kwargs)
    stats = sample_stats(mcmc)
    if stats:
        idata.sample_stats = idata.sample_stats.assign(
            {name: (("chain", "draw"), values) for name, values in stats.items()}
        )
    if mcmc.kernel.model is None:
        return mcmc.kernel.sampling_stage_only(idata)
    sites = _sites(mcmc)
    names = list(sites.observed)
    if "observed_data" in idata.groups():
        observed = idata.observed_data.drop_vars([name for name in idata.observed_data.data_vars if name not in names])
        used = {dim for name in observed.data_vars for dim in observed[name].dims}
        idata.observed_data = observed.drop_dims([dim for dim in observed.dims if dim not in used])
    if log_likelihood and sites.local:
        warnings.warn(
            "to_inference_data: no log_likelihood group: "
            f"{_model_checks.local_sites_message(sites.local, _PREDICTIVE_ASIDE)}. Pass "
            "log_likelihood=False to silence this warning.",
            UserWarning,
            stacklevel=2,
        )
        log_likelihood = False
    if log_likelihood:
        pointwise = full_data_log_likelihood(mcmc, chunk_size, max_log_likelihood_bytes)
        dims, coords = {}, {}
        if "observed_data" in idata.groups():
            observed = idata.observed_data
            for name in pointwise:
                if name in observed and observed[name].shape == pointwise[name].shape[2:]:
                    dims[name] = list(observed[name].dims)
                    coords.update({dim: observed[dim].values for dim in observed[name].dims if dim in observed.coords})
        idata.add_groups(log_likelihood=az.dict_to_dataset(pointwise, library=pyro, dims=dims, coords=coords or None))
    return mcmc.kernel.sampling_stage_only(idata)


def predictive(
    mcmc: MCMC, *args: Any, return_sites: Sequence[str] = (), parallel: bool = False, **kwargs: Any
) -> dict[str, torch.Tensor]:
    """Posterior predictive draws of a run on the model's full data:
    ``pyro.infer.Predictive(full_data(model), samples)(*args, **kwargs)`` with the run's samples of the
    latent sites (deterministic sites are recomputed from them, for the new arguments).

    Call it as you would call the model, without the observations (``predictive(mcmc, X_new)`` for
    ``model(X, y=None)``). Every row of ``X_new`` gets a replicate per draw; ``Predictive(model,
    samples)`` on the *subsampled* model would return a random minibatch of rows per draw instead,
    silently.

    :param mcmc: a finished :class:`pyro.infer.MCMC` run of an SG-MCMC kernel.
    :param args: the model's positional arguments (new data, or the run's).
    :param return_sites: the sites to return; default: the sample sites that are not among the samples
        (the observed ones, and the deterministic ones), as ``Predictive`` returns them.
    :param parallel: batch the draws in one run of the model (``Predictive(parallel=True)``; the model
        must broadcast over a leading sample dimension); default: one run per draw.
    :param kwargs: the model's keyword arguments.
    :return: ``{site: tensor of shape (num_chains × num_draws, *site_shape)}``;
        ``to_inference_data(mcmc, posterior_predictive=...)`` and ``az.from_pyro`` take it.

    **Example** (a minibatch of 10 in the model, ``Xb @ w`` is fine; the predictive covers all 100 rows)::

        >>> import torch, pyro, pyro.distributions as dist
        >>> from pyro.infer import MCMC
        >>> from ppl_sgmcmc.pyro import SGLD
        >>> def model(X, y=None):
        ...     w = pyro.sample("w", dist.Normal(0.0, 10.0).expand([2]).to_event(1))
        ...     with pyro.plate("data", X.shape[0], subsample_size=10):
        ...         Xb = pyro.subsample(X, event_dim=1)
        ...         yb = pyro.subsample(y, event_dim=0) if y is not None else None
        ...         pyro.sample("y", dist.Normal(Xb @ w, 1.0), obs=yb)
        >>> X = torch.randn(100, 2)
        >>> mcmc = MCMC(SGLD(model, step_size=1e-3), warmup_steps=10, num_samples=20, disable_progbar=True)
        >>> mcmc.run(X, X.sum(-1))
        >>> predictive(mcmc, X)["y"].shape
        torch.Size([20, 100])
    """
    _check(mcmc)
    deterministic = set(_sites(mcmc).deterministic)
    samples = {name: values for name, values in mcmc.get_samples().items() if name not in deterministic}
    model = Predictive(mcmc.kernel.model, samples, return_sites=return_sites, parallel=parallel)
    return model(*args, **kwargs)
