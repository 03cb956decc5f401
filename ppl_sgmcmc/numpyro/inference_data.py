"""ArviZ InferenceData from an SG-MCMC run, with the pointwise log-likelihood on the full data.

``arviz.from_numpyro(mcmc)`` already works with these kernels: their :attr:`~SGMCMCKernel.model`
is the model's full-data view, so ``log_likelihood``, ``observed_data`` and the plate coordinates
cover all ``N`` data points. :func:`to_inference_data` adds what a large data set needs: the
pointwise log-likelihood computed a chunk of draws at a time (or skipped), and the sample
statistics named for what they are.
"""

import arviz as az
import jax
import numpy as np
import numpyro
from numpyro.infer import log_likelihood as numpyro_log_likelihood

from ppl_sgmcmc.numpyro.kernel import SGMCMCKernel

__all__ = ["to_inference_data", "full_data_log_likelihood"]


def _check(mcmc):
    if not isinstance(mcmc.sampler, SGMCMCKernel) or mcmc.sampler.model is None:
        raise TypeError("expected an `MCMC` run with a ppl_sgmcmc kernel built from a model.")


def full_data_log_likelihood(mcmc, chunk_size=256):
    """Pointwise log-likelihood of every observed site on all of its data, for every draw.

    :param mcmc: a finished :class:`numpyro.infer.MCMC` run of an SG-MCMC kernel.
    :param int chunk_size: draws evaluated at once; bounds the peak memory to about
        ``chunk_size × N`` floats beyond the result.
    :return: ``{site: array of shape (num_chains, num_draws, *site_shape)}`` (NumPy).

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
    """
    _check(mcmc)
    samples = mcmc.get_samples(group_by_chain=True)
    num_chains, num_draws = jax.tree.leaves(samples)[0].shape[:2]
    flat = jax.tree.map(lambda x: x.reshape((num_chains * num_draws,) + x.shape[2:]), samples)
    evaluate = jax.jit(lambda s: numpyro_log_likelihood(mcmc.sampler.model, s, *mcmc._args, **mcmc._kwargs))
    chunks = []
    for start in range(0, num_chains * num_draws, chunk_size):
        chunk = jax.tree.map(lambda x: x[start : start + chunk_size], flat)
        chunks.append(jax.device_get(evaluate(chunk)))
    return {
        name: np.concatenate([c[name] for c in chunks]).reshape((num_chains, num_draws) + chunks[0][name].shape[1:])
        for name in chunks[0]
    }


def to_inference_data(mcmc, log_likelihood=True, chunk_size=256, **kwargs):
    """``arviz.from_numpyro`` for SG-MCMC runs.

    - ``log_likelihood``: the full-data pointwise log-likelihood, computed ``chunk_size`` draws at a
      time (see :func:`full_data_log_likelihood`); ``False`` skips it (for very large ``N``).
    - ``sample_stats.lp`` (ArviZ's name for ``-potential_energy``) is renamed ``minibatch_lp``: it is
      the noisy minibatch estimate ``-Ũ_t``, not the log density.
    - ``sample_stats.diverging`` marks the rejected non-finite steps among the collected draws.

    Other keyword arguments go to :func:`arviz.from_numpyro` (``coords``, ``dims``, ...).

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
    idata = az.from_numpyro(mcmc, log_likelihood=False, **kwargs)
    if "lp" in idata.sample_stats:
        idata.sample_stats = idata.sample_stats.rename({"lp": "minibatch_lp"})
    if log_likelihood:
        pointwise = full_data_log_likelihood(mcmc, chunk_size)
        observed = idata.observed_data
        dims = {name: list(observed[name].dims) for name in pointwise}
        coords = {dim: observed[dim].values for name in pointwise for dim in observed[name].dims}
        idata.add_groups(log_likelihood=az.dict_to_dataset(pointwise, library=numpyro, dims=dims, coords=coords))
    return idata
