"""ArviZ InferenceData from an SG-MCMC run, with the pointwise log-likelihood on the full data.

``arviz.from_pyro(mcmc)`` already works with these kernels: it reads ``mcmc.kernel.model``, which
is the model's full-data view (:class:`~ppl_sgmcmc.pyro.handlers.FullDataModel`), so
``log_likelihood`` and ``observed_data`` cover all ``N`` data points instead of one random
minibatch. Two quirks of ``from_pyro`` remain, which :func:`to_inference_data` fixes: it treats
``pyro.deterministic`` sites as observed data (they get a ``log_likelihood`` of zeros, and
``az.loo`` then asks which variable to use), and it evaluates the log-likelihood of all draws at
once (``chains × draws × N`` values and the model's intermediates in memory).
"""

import arviz as az
import numpy as np
import pyro
import torch
from pyro import poutine
from pyro.infer import Predictive

from ppl_sgmcmc.pyro.kernel import SGMCMCKernel

__all__ = ["full_data_log_likelihood", "sample_stats", "to_inference_data"]


def _check(mcmc, needs_model=True):
    if not isinstance(getattr(mcmc, "kernel", None), SGMCMCKernel) or (needs_model and mcmc.kernel.model is None):
        raise TypeError(
            "expected an `MCMC` run with a ppl_sgmcmc kernel" + (" built from a model." if needs_model else ".")
        )


def sample_stats(mcmc):
    """The per-draw statistics a kernel records besides ``diverging``, as ``{name: array (chain, draw)}``
    (NumPy): ``log_weight`` and ``partition`` for :class:`~ppl_sgmcmc.pyro.CSGLD` and
    :class:`~ppl_sgmcmc.pyro.CSGHMC`; ``{}`` for the other kernels. Pyro's ``MCMC`` returns them
    through each chain's :meth:`~ppl_sgmcmc.pyro.kernel.SGMCMCKernel.diagnostics`.

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
        {'log_weight': (1, 20), 'partition': (1, 20)}
    """
    _check(mcmc, needs_model=False)
    chains = mcmc._diagnostics
    out = {}
    for name in getattr(mcmc.kernel, "sample_stats_fields", ()):
        if chains and all(chain is not None and name in chain for chain in chains):
            out[name] = np.stack([np.asarray(chain[name]) for chain in chains])
    return out


def _observed_sites(mcmc):
    """Names of the observed sites of the model that are data (not ``pyro.deterministic``)."""
    with torch.no_grad(), poutine.block():
        model_trace = poutine.trace(mcmc.kernel.model).get_trace(*mcmc._args, **mcmc._kwargs)
    return [
        name
        for name, site in model_trace.nodes.items()
        if site["type"] == "sample" and site["is_observed"] and not site["infer"].get("_deterministic")
    ]


def full_data_log_likelihood(mcmc, chunk_size=256):
    """Pointwise log-likelihood of every observed site on all of its data, for every draw.

    :param mcmc: a finished :class:`pyro.infer.MCMC` run of an SG-MCMC kernel.
    :param int chunk_size: draws evaluated at once; bounds the peak memory to about
        ``chunk_size × N`` values (times the model's intermediates) beyond the result.
    :return: ``{site: array of shape (num_chains, num_draws, *site_shape)}`` (NumPy), shaped as
        ``arviz.from_pyro`` shapes it.

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
    """
    _check(mcmc)
    names = _observed_sites(mcmc)
    samples = mcmc.get_samples(group_by_chain=True)  # deterministic sites too: Predictive conditions on them
    num_chains, num_draws = next(iter(samples.values())).shape[:2]
    flat = {k: v.reshape((num_chains * num_draws,) + v.shape[2:]) for k, v in samples.items()}
    chunks = []
    with torch.no_grad(), poutine.block():
        for start in range(0, num_chains * num_draws, chunk_size):
            chunk = {k: v[start : start + chunk_size] for k, v in flat.items()}
            model_trace = Predictive(mcmc.kernel.model, chunk).get_vectorized_trace(*mcmc._args, **mcmc._kwargs)
            chunks.append(
                {
                    name: model_trace.nodes[name]["fn"].log_prob(model_trace.nodes[name]["value"]).cpu().numpy()
                    for name in names
                }
            )
    return {
        name: np.concatenate([c[name] for c in chunks]).reshape((num_chains, num_draws) + chunks[0][name].shape[1:])
        for name in names
    }


def to_inference_data(mcmc, log_likelihood=True, chunk_size=256, **kwargs):
    """``arviz.from_pyro`` for SG-MCMC runs.

    - ``log_likelihood``: the full-data pointwise log-likelihood of the observed sites (deterministic
      sites left out), computed ``chunk_size`` draws at a time (see :func:`full_data_log_likelihood`);
      ``False`` skips it (for very large ``N``).
    - ``observed_data`` holds the observed sites on their full data, without deterministic sites.
    - ``sample_stats.diverging`` marks the rejected non-finite steps among the draws; CSGLD and CSGHMC
      runs add ``log_weight`` and ``partition`` (see :func:`sample_stats`; ``arviz.from_pyro`` leaves
      them out), which :mod:`ppl_sgmcmc.importance` reads.
    - A kernel built from ``potential_fn`` has no model: the result has ``posterior`` and
      ``sample_stats`` only.

    Other keyword arguments go to :func:`arviz.from_pyro` (``coords``, ``dims``, ...).

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
    idata = az.from_pyro(mcmc, log_likelihood=False, **kwargs)
    stats = sample_stats(mcmc)
    if stats:
        idata.sample_stats = idata.sample_stats.assign(
            {name: (("chain", "draw"), values) for name, values in stats.items()}
        )
    if mcmc.kernel.model is None:
        return idata
    names = _observed_sites(mcmc)
    if "observed_data" in idata.groups():
        observed = idata.observed_data.drop_vars([name for name in idata.observed_data.data_vars if name not in names])
        used = {dim for name in observed.data_vars for dim in observed[name].dims}
        idata.observed_data = observed.drop_dims([dim for dim in observed.dims if dim not in used])
    if log_likelihood:
        pointwise = full_data_log_likelihood(mcmc, chunk_size)
        dims, coords = {}, {}
        if "observed_data" in idata.groups():
            observed = idata.observed_data
            for name in pointwise:
                if name in observed and observed[name].shape == pointwise[name].shape[2:]:
                    dims[name] = list(observed[name].dims)
                    coords.update({dim: observed[dim].values for dim in observed[name].dims if dim in observed.coords})
        idata.add_groups(
            log_likelihood=az.dict_to_dataset(pointwise, library=pyro, dims=dims, coords=coords or None)
        )
    return idata
