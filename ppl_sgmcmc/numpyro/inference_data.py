"""ArviZ InferenceData from an SG-MCMC run, with the pointwise log-likelihood on the full data.

``arviz.from_numpyro(mcmc)`` already works with these kernels: their :attr:`~SGMCMCKernel.model`
is the model's full-data view, so ``log_likelihood``, ``observed_data`` and the plate coordinates
cover all ``N`` data points. :func:`to_inference_data` adds what a large data set needs: the
pointwise log-likelihood computed a chunk of draws at a time (or skipped), and the sample
statistics named for what they are.

Posterior predictive draws need the full-data view too: :func:`predictive` is
``numpyro.infer.Predictive(full_data(model), samples)`` for a run (NumPyro's ``Predictive`` on the
subsampled model returns a random minibatch of rows per draw, and nothing can intercept that).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import jax
import numpy as np
import numpyro
from numpyro.handlers import seed, substitute, trace
from numpyro.infer import MCMC, Predictive
from numpyro.infer import log_likelihood as numpyro_log_likelihood

from ppl_sgmcmc import _model_checks
from ppl_sgmcmc.numpyro.kernel import SGMCMCKernel
from ppl_sgmcmc.numpyro.potential import feasible_latent, split_arrays
from ppl_sgmcmc.numpyro.sharding import to_host

if TYPE_CHECKING:  # ArviZ (with xarray and matplotlib) is imported when InferenceData is made
    import arviz as az

__all__ = ["MAX_LOG_LIKELIHOOD_BYTES", "full_data_log_likelihood", "predictive", "to_inference_data"]

MAX_LOG_LIKELIHOOD_BYTES = 2**30

_THINNING = "a larger `thinning` or `steps_per_sample`"  # how this driver keeps fewer draws, for the size refusal
"""Default of ``max_log_likelihood_bytes``: the largest pointwise log-likelihood (1 GiB) that
:func:`full_data_log_likelihood` and :func:`to_inference_data` compute before refusing."""


def _check(mcmc: MCMC) -> None:
    if not isinstance(mcmc.sampler, SGMCMCKernel) or mcmc.sampler.model is None:
        raise TypeError("expected an `MCMC` run with a ppl_sgmcmc kernel built from a model.")


def _local_sites(mcmc: MCMC, samples: dict[str, Any]) -> list[str]:
    """The latent sample sites of the full-data model that are not among the samples: local Gibbs sites."""
    model = seed(substitute(mcmc.sampler.model, substitute_fn=feasible_latent), 0)  # no prior draw (ImproperUniform)
    model_trace = trace(model).get_trace(*mcmc._args, **mcmc._kwargs)
    return [
        name
        for name, site in model_trace.items()
        if site["type"] == "sample" and not site["is_observed"] and name not in samples
    ]



def full_data_log_likelihood(
    mcmc: MCMC, chunk_size: int = 256, max_log_likelihood_bytes: int = MAX_LOG_LIKELIHOOD_BYTES
) -> dict[str, np.ndarray]:
    """Pointwise log-likelihood of every observed site on all of its data, for every draw.

    The result is allocated once and filled ``chunk_size`` draws at a time, so the peak memory is the
    result plus one chunk's evaluation.

    :param mcmc: a finished :class:`numpyro.infer.MCMC` run of an SG-MCMC kernel.
    :param int chunk_size: draws evaluated at once; bounds the memory beyond the result to about
        ``chunk_size × N`` floats (times the model's intermediates).
    :param int max_log_likelihood_bytes: refuse (``ValueError``, saying what to do) when the result would
        be larger than this; default :data:`MAX_LOG_LIKELIHOOD_BYTES` (1 GiB).
    :return: ``{site: array of shape (num_chains, num_draws, *site_shape)}`` (NumPy).
    :raises ValueError: if the result is too large, or the run has local Gibbs sites (the log-likelihood
        would need them marginalised; :func:`to_inference_data` then leaves it out with a warning).

    **Example** (100 data points, minibatches of 10: the log-likelihood covers all 100)::

        >>> import jax, jax.numpy as jnp, numpyro, numpyro.distributions as dist
        >>> from numpyro.infer import MCMC
        >>> from ppl_sgmcmc.numpyro import SGLD
        >>> def model(y):
        ...     mu = numpyro.sample("mu", dist.Normal(0, 10))
        ...     with numpyro.plate("data", y.shape[0], subsample_size=10):
        ...         numpyro.sample("y", dist.Normal(mu, 1), obs=numpyro.subsample(y, event_dim=0))
        >>> mcmc = MCMC(SGLD(model, step_size=1e-3), num_warmup=10, num_samples=20, progress_bar=False)
        >>> mcmc.run(jax.random.PRNGKey(0), jnp.zeros(100))
        >>> full_data_log_likelihood(mcmc, chunk_size=8)["y"].shape
        (1, 20, 100)
        >>> full_data_log_likelihood(mcmc, max_log_likelihood_bytes=1000)
        Traceback (most recent call last):
        ...
        ValueError: the pointwise log-likelihood would take 0.00 GiB (1 chains × 20 draws × 100 ('y') values), ...
        Pass log_likelihood=False, ...
    """
    _check(mcmc)
    samples = mcmc.get_samples(group_by_chain=True)
    local = _local_sites(mcmc, samples)
    if local:
        raise ValueError(f"full_data_log_likelihood: {_model_checks.local_sites_message(local)}.")
    num_chains, num_draws = jax.tree.leaves(samples)[0].shape[:2]
    total = num_chains * num_draws
    flat = jax.tree.map(lambda x: x.reshape((total,) + x.shape[2:]), samples)
    evaluate = _evaluator(mcmc)
    shapes = jax.eval_shape(evaluate, jax.tree.map(lambda x: x[:1], flat))  # no evaluation
    sizes = {name: math.prod(shape.shape[1:]) for name, shape in shapes.items()}
    num_bytes = sum(total * sizes[name] * np.dtype(shape.dtype).itemsize for name, shape in shapes.items())
    if num_bytes > max_log_likelihood_bytes:
        raise ValueError(_model_checks.log_likelihood_too_large(
            num_bytes, max_log_likelihood_bytes, num_chains, num_draws, sizes, _THINNING
        ))
    out = {name: np.empty((total,) + shape.shape[1:], np.dtype(shape.dtype)) for name, shape in shapes.items()}
    for start, chunk in _log_likelihood_chunks(evaluate, flat, chunk_size):
        for name, values in chunk.items():
            out[name][start : start + len(values)] = values
    return {name: values.reshape((num_chains, num_draws) + values.shape[1:]) for name, values in out.items()}


def _evaluator(
    mcmc: MCMC, model: Callable[..., Any] | None = None
) -> Callable[[dict[str, Any]], dict[str, jax.Array]]:
    """The compiled pointwise log-likelihood of ``model`` (default: the run's full-data model) at draws
    ``{site: (m, ...)}``, with the run's data as arguments of the compiled function, not constants in it (large N;
    data on several hosts)."""
    data, merge = split_arrays((mcmc._args, mcmc._kwargs))
    model = mcmc.sampler.model if model is None else model

    @jax.jit
    def evaluate(s, data):
        args, kwargs = merge(data)
        return numpyro_log_likelihood(model, s, *args, **kwargs)

    return partial(evaluate, data=data)


def _log_likelihood_chunks(
    evaluate: Callable[[dict[str, Any]], dict[str, jax.Array]], flat: dict[str, Any], chunk_size: int
) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
    """``(start, {site: (rows, *site_shape)})``: the pointwise log-likelihood of ``chunk_size`` draws at a time of
    ``flat`` ``{site: (m, ...)}`` by ``evaluate`` (:func:`_evaluator`), on this host (gathered from every host)."""
    total = jax.tree.leaves(flat)[0].shape[0]
    for start in range(0, total, chunk_size):
        chunk = jax.tree.map(lambda x, start=start: x[start : start + chunk_size], flat)
        yield start, {name: to_host(values) for name, values in evaluate(chunk).items()}


def to_inference_data(
    mcmc: MCMC,
    log_likelihood: bool = True,
    chunk_size: int = 256,
    max_log_likelihood_bytes: int = MAX_LOG_LIKELIHOOD_BYTES,
    **kwargs: Any,
) -> az.InferenceData:
    """``arviz.from_numpyro`` for SG-MCMC runs.

    - ``log_likelihood``: the full-data pointwise log-likelihood, computed ``chunk_size`` draws at a
      time into a preallocated array (see :func:`full_data_log_likelihood`); ``False`` skips it (for very
      large ``N``). Above ``max_log_likelihood_bytes`` (default 1 GiB) it refuses with a ``ValueError``
      that says what to do. A run with local Gibbs sites (``gibbs_sites=``) gets no log-likelihood, with a
      warning: it would need the local sites, which are not among the samples, marginalised.
    - ``sample_stats.lp`` (ArviZ's name for ``-potential_energy``) is renamed ``minibatch_lp``: it is
      the noisy minibatch estimate ``-Ũ_t``, not the log density.
    - ``sample_stats.diverging`` marks the rejected non-finite steps among the collected draws.
    - A cyclical kernel's (``cycle_length``) draws are those of the sampling stages only, also from a
      ``numpyro.infer.MCMC`` run (``sample_stats.i``, the step counts, tells them apart; see
      :class:`~ppl_sgmcmc.algorithms.Cycles`).

    Other keyword arguments go to :func:`arviz.from_numpyro` (``coords``, ``dims``,
    ``posterior_predictive=`` :func:`predictive` ``(mcmc, key, X)``, ...).

    **Example**::

        >>> import jax, jax.numpy as jnp, numpyro, numpyro.distributions as dist
        >>> from numpyro.infer import MCMC
        >>> from ppl_sgmcmc.numpyro import SGLD
        >>> def model(y):
        ...     mu = numpyro.sample("mu", dist.Normal(0, 10))
        ...     with numpyro.plate("data", y.shape[0], subsample_size=10):
        ...         numpyro.sample("y", dist.Normal(mu, 1), obs=numpyro.subsample(y, event_dim=0))
        >>> mcmc = MCMC(SGLD(model, step_size=1e-3), num_warmup=100, num_samples=100, progress_bar=False)
        >>> mcmc.run(jax.random.PRNGKey(0), jnp.zeros(1000), extra_fields=("potential_energy",))
        >>> idata = to_inference_data(mcmc, chunk_size=50)
        >>> idata.log_likelihood["y"].shape, "minibatch_lp" in idata.sample_stats
        ((1, 100, 1000), True)
    """
    _check(mcmc)
    if mcmc.last_state is not None:
        mcmc.sampler.report_health(mcmc.last_state)  # a run that went wrong says so
    if log_likelihood:
        local = _local_sites(mcmc, mcmc.get_samples())
        if local:
            warnings.warn(
                f"to_inference_data: no log_likelihood group: {_model_checks.local_sites_message(local)}. Pass "
                "log_likelihood=False to silence this warning.",
                UserWarning,
                stacklevel=2,
            )
            log_likelihood = False
    pointwise = full_data_log_likelihood(mcmc, chunk_size, max_log_likelihood_bytes) if log_likelihood else None
    import arviz as az

    idata = az.from_numpyro(mcmc, log_likelihood=False, **kwargs)
    if "lp" in idata.sample_stats:
        idata.sample_stats = idata.sample_stats.rename({"lp": "minibatch_lp"})
    if pointwise is not None:
        observed = idata.observed_data
        dims = {name: list(observed[name].dims) for name in pointwise}
        coords = {dim: observed[dim].values for name in pointwise for dim in observed[name].dims}
        idata.add_groups(log_likelihood=az.dict_to_dataset(pointwise, library=numpyro, dims=dims, coords=coords))
    return mcmc.sampler.sampling_stage_only(idata)


def predictive(
    mcmc: MCMC, rng_key: jax.Array, *args: Any, return_sites: Sequence[str] | None = None, **kwargs: Any
) -> dict[str, jax.Array]:
    """Posterior predictive draws of a run on the model's full data:
    ``numpyro.infer.Predictive(full_data(model), mcmc.get_samples())(rng_key, *args, **kwargs)``.

    Call it as you would call the model, without the observations (``predictive(mcmc, key, X_new)``
    for ``model(X, y=None)``). Every row of ``X_new`` gets a replicate per draw; NumPyro's
    ``Predictive(model, samples)`` on the *subsampled* model would return a random minibatch of rows
    per draw instead, silently.

    :param mcmc: a finished :class:`numpyro.infer.MCMC` run of an SG-MCMC kernel.
    :param rng_key: the random key of the predictive draws.
    :param args: the model's positional arguments (new data, or the run's).
    :param return_sites: the sites to return; default: the sample sites that are not among the
        samples (the observed ones) and the deterministic sites (NumPyro's default).
    :param kwargs: the model's keyword arguments.
    :return: ``{site: array of shape (num_chains × num_draws, *site_shape)}``, as ``Predictive``
        returns; ``to_inference_data(mcmc, posterior_predictive=...)`` and ``az.from_numpyro`` take it.

    **Example** (a minibatch of 10 in the model; the predictive covers all 100 rows)::

        >>> import jax, jax.numpy as jnp, numpyro, numpyro.distributions as dist
        >>> from numpyro.infer import MCMC
        >>> from ppl_sgmcmc.numpyro import SGLD
        >>> def model(x, y=None):
        ...     w = numpyro.sample("w", dist.Normal(0, 10))
        ...     with numpyro.plate("data", x.shape[0], subsample_size=10):
        ...         xb = numpyro.subsample(x, event_dim=0)
        ...         yb = numpyro.subsample(y, event_dim=0) if y is not None else None
        ...         numpyro.sample("y", dist.Normal(w * xb, 1), obs=yb)
        >>> x = jnp.linspace(-1, 1, 100)
        >>> mcmc = MCMC(SGLD(model, step_size=1e-3), num_warmup=10, num_samples=20, progress_bar=False)
        >>> mcmc.run(jax.random.PRNGKey(0), x, 2 * x)
        >>> predictive(mcmc, jax.random.PRNGKey(1), x)["y"].shape
        (20, 100)
    """
    _check(mcmc)
    return Predictive(mcmc.sampler.model, mcmc.get_samples(), return_sites=return_sites)(rng_key, *args, **kwargs)
