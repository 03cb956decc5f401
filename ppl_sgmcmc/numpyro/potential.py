"""The stochastic potential ``Ũ_t`` of a target, its gradient, and the minibatches it is built on.

Two kinds of target share one interface, used by :class:`~ppl_sgmcmc.numpyro.kernel.SGMCMCKernel`:

* :class:`ModelTarget`: a NumPyro model. Its subsampled plates are found from a prototype trace;
  each step the kernel draws the plates' indices (:mod:`~ppl_sgmcmc.numpyro.minibatch`) and
  substitutes them, so the model's own ``N/n`` plate scale makes its potential energy
  ``Ũ_t(θ) = -log p(θ) - (N/n) Σ_{i∈S_t} log p(x_i | θ)``, in unconstrained space with the
  log-Jacobian of the transforms.
* :class:`PotentialTarget`: a user-written energy ``potential_fn(z)``, or ``potential_fn(z, rng_key)``
  returning a stochastic estimate ``Ũ_t(z)`` whose gradient is the stochastic gradient.

``draw(rng_key, batch_state) -> (batch, batch_state)`` picks one step's data;
``gradient(flat, batch, model_args, model_kwargs) -> StochasticGradient`` evaluates it.
"""

import inspect
import warnings
from contextlib import contextmanager
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.handlers import seed, substitute, trace
from numpyro.infer.gibbs import subsample_plate_sizes
from numpyro.infer.util import _unconstrain_reparam, compute_log_probs, constrain_fn, initialize_model

from ppl_sgmcmc.numpyro import minibatch
from ppl_sgmcmc.numpyro.handlers import full_data
from ppl_sgmcmc.rules import StochasticGradient


def as_jax_arrays(tree):
    """Turn NumPy array leaves into JAX arrays so that traced minibatch indices can index them.

    Python scalars stay as they are: they may be static (a plate's ``subsample_size``)."""
    return jax.tree.map(lambda x: jnp.asarray(x) if isinstance(x, np.ndarray) else x, tree)


@contextmanager
def model_errors(kernel_name, doing):
    """Re-raise the errors a model commonly hits under a kernel with what is wrong and how to fix it."""
    try:
        yield
    except jax.errors.TracerArrayConversionError as err:
        raise TypeError(
            f"{kernel_name}: {doing}: the model indexes a NumPy array with traced minibatch indices. Pass the "
            "data as model arguments (the kernel converts them), or wrap global arrays in `jax.numpy.asarray`."
        ) from err
    except (ValueError, TypeError, IndexError) as err:
        raise ValueError(
            f"{kernel_name}: {doing} failed: {err}\nCheck that every array subsampled inside a plate has the "
            "plate's size along the plate's dimension, and that the model runs on its data without the kernel."
        ) from err


def _first_rows(msg):
    """Indices ``0..n-1`` for a subsampled plate of the prototype trace (the plate's own draw would
    shuffle all ``N`` rows, and compile that shuffle, on every ``MCMC.run``)."""
    if msg["type"] == "plate" and msg["args"][1] is not None and msg["args"][1] < msg["args"][0]:
        return jnp.arange(msg["args"][1])
    return None


class ModelTarget:
    """The subsampled potential of a NumPyro model (see the module docstring)."""

    def __init__(self, model, model_args, model_kwargs, rng_key, replace, kernel_name):
        self.model = model
        self.replace = replace
        self.kernel_name = kernel_name
        with model_errors(kernel_name, "tracing the model"):
            model_trace = trace(seed(substitute(model, substitute_fn=_first_rows), rng_key)).get_trace(
                *model_args, **model_kwargs
            )
        self.plate_sizes = subsample_plate_sizes(model_trace)
        self.data_sites = frozenset(
            name
            for name, site in model_trace.items()
            if site["type"] == "sample" and any(f.name in self.plate_sizes for f in site["cond_indep_stack"])
        )
        self._check_sites(model_trace)
        if not self.plate_sizes:
            warnings.warn(
                f"{kernel_name}: the model has no plate with `subsample_size` smaller than its size, so every "
                "step uses the full-data gradient. Declare `numpyro.plate(name, N, subsample_size=n)` around the "
                "likelihood to use minibatches.",
                stacklevel=4,
            )
        # the mean-score scale N (pSGLD, SGFS); with several subsampled plates the largest one
        self.data_size = max((size for size, _ in self.plate_sizes.values()), default=1)
        self._check_full_data(model_args, model_kwargs)

    def _check_sites(self, model_trace):
        for name, site in model_trace.items():
            if site["type"] != "sample" or site["is_observed"]:
                continue
            if site["fn"].support.is_discrete:
                raise NotImplementedError(
                    f"{self.kernel_name}: latent site {name!r} is discrete ({type(site['fn']).__name__}); "
                    "SG-MCMC kernels move continuous latents only. Marginalise it out of the model, or observe "
                    "it (a Gibbs step for local discrete sites is planned)."
                )
            if name in self.data_sites:
                plates = [f.name for f in site["cond_indep_stack"] if f.name in self.plate_sizes]
                raise NotImplementedError(
                    f"{self.kernel_name}: latent site {name!r} lies inside the subsampled plate {plates[0]!r}; "
                    "SG-MCMC kernels sample global latents only. Marginalise the local latent out of the "
                    "likelihood, or move it outside the plate."
                )

    def _check_full_data(self, model_args, model_kwargs):
        """Trace the full-data view abstractly (no arithmetic) to catch shape errors early."""

        def run():
            tr = trace(seed(full_data(self.model), 0)).get_trace(*model_args, **model_kwargs)
            return {name: site["fn"].log_prob(site["value"]) for name, site in tr.items() if name in self.data_sites}

        plates = ", ".join(f"{name!r} of size {size}" for name, (size, _) in self.plate_sizes.items())
        with model_errors(self.kernel_name, f"running the model on its full data (plates {plates})"):
            jax.eval_shape(run)

    def initial_params(self, rng_key, init_strategy, model_args, model_kwargs):
        """Valid unconstrained initial values (a batch of them for a batch of keys)."""
        batch, _ = self.draw(rng_key if rng_key.ndim == 1 else rng_key[0], self.init_batch(rng_key))
        info = initialize_model(
            rng_key,
            substitute(self.model, data=batch),
            init_strategy=init_strategy,
            model_args=model_args,
            model_kwargs=model_kwargs,
        )
        return info.param_info.z

    def init_batch(self, rng_key):
        key = rng_key if rng_key.ndim == 1 else rng_key[0]
        return minibatch.init(key, self.plate_sizes, self.replace)

    def draw(self, rng_key, batch_state):
        return minibatch.draw(rng_key, batch_state, self.plate_sizes, self.replace)

    def _energies(self, z, batch, model_args, model_kwargs):
        """``(prior part, data part)`` of ``Ũ_t(z)``; the data part holds the sites in subsampled plates."""
        model = substitute(substitute(self.model, data=batch), substitute_fn=partial(_unconstrain_reparam, z))
        log_probs, _ = compute_log_probs(model, model_args, model_kwargs, {})
        prior = sum((v for k, v in log_probs.items() if k not in self.data_sites), start=0.0)
        data = sum((v for k, v in log_probs.items() if k in self.data_sites), start=0.0)
        return -prior, -data

    def gradient(self, flat, unravel, batch, model_args, model_kwargs):
        def energy(x):
            prior, data = self._energies(unravel(x), batch, model_args, model_kwargs)
            return prior + data

        def prior_energy(x):
            return self._energies(unravel(x), batch, model_args, model_kwargs)[0]

        value, grad = jax.value_and_grad(energy)(flat)
        # ḡ = -∇(data part)/N; XLA drops this prior gradient for rules that do not read the score
        score = -(grad - jax.grad(prior_energy)(flat)) / self.data_size
        return StochasticGradient(value, grad, score)

    def postprocess_fn(self, model_args, model_kwargs):
        """Map unconstrained samples to constrained values and deterministic sites (on the full data)."""
        return partial(constrain_fn, full_data(self.model), model_args, model_kwargs, return_deterministic=True)


class PotentialTarget:
    """A target given as an energy ``potential_fn(z)`` or a stochastic energy ``potential_fn(z, rng_key)``."""

    def __init__(self, potential_fn, kernel_name):
        self.potential_fn = potential_fn
        self.kernel_name = kernel_name
        try:
            num_args = len(inspect.signature(potential_fn).parameters)
        except (TypeError, ValueError):
            num_args = 1
        self.stochastic = num_args >= 2
        self.data_size = 1

    def initial_params(self, rng_key, init_strategy, model_args, model_kwargs):
        raise ValueError(
            f"{self.kernel_name}: a kernel built from `potential_fn` needs `init_params`: pass them to "
            "`mcmc.run(rng_key, init_params=...)` (one leading entry per chain when num_chains > 1)."
        )

    def init_batch(self, rng_key):
        return minibatch.BatchState({}, {})

    def draw(self, rng_key, batch_state):
        return rng_key, batch_state

    def gradient(self, flat, unravel, batch, model_args, model_kwargs):
        def energy(x):
            z = unravel(x)
            return self.potential_fn(z, batch) if self.stochastic else self.potential_fn(z)

        value, grad = jax.value_and_grad(energy)(flat)
        return StochasticGradient(value, grad, -grad)

    def postprocess_fn(self, model_args, model_kwargs):
        return lambda z: z


