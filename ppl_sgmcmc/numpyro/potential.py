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
from numpyro.primitives import Messenger
from numpyro.infer.gibbs import subsample_plate_sizes
from numpyro.distributions.transforms import biject_to
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


def _values_and_deterministic(model, model_args, model_kwargs, values):
    """The latent ``values`` (already in their supports) and the deterministic sites they imply."""
    model_trace = trace(substitute(model, data=values)).get_trace(*model_args, **model_kwargs)
    return {
        name: site["value"]
        for name, site in model_trace.items()
        if name in values or site["type"] == "deterministic"
    }


class _one_index(Messenger):
    """Runs the model on one datum of a subsampled plate: the plate's indices become ``index[None]``
    (so the plate scales its sites by ``N/1``)."""

    def __init__(self, fn, plate, index):
        self.plate = plate
        self.index = index
        super().__init__(fn)

    def process_message(self, msg):
        if msg["type"] == "plate" and msg["name"] == self.plate:
            msg["value"] = self.index[None]
            msg["args"] = (msg["args"][0], 1)


class ModelTarget:
    """The subsampled potential of a NumPyro model (see the module docstring).

    With :attr:`per_example_scores` set (see :meth:`enable_per_example_scores`), :meth:`gradient` also
    returns the ``n×d`` per-datum scores of the minibatch (``StochasticGradient.per_example``)."""

    per_example_scores = False

    def __init__(self, model, model_args, model_kwargs, rng_key, replace, kernel_name, constrained=False):
        self.model = model
        self.replace = replace
        self.kernel_name = kernel_name
        # position in the latents' own (constrained) space: no transforms, no log-Jacobian (SGRLD)
        self.constrained = constrained
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
        # the supports of the latents the chain moves (the global sample sites)
        self.latent_supports = {
            name: site["fn"].support
            for name, site in model_trace.items()
            if site["type"] == "sample" and not site["is_observed"] and name not in self.data_sites
        }
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
                    "it; a local discrete site inside a subsampled plate can be updated by a Gibbs step instead "
                    "(`gibbs_sites=[name], gibbs_fn=...`; see ppl_sgmcmc.numpyro.gibbs)."
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
        return self._to_position(info.param_info.z)

    def _to_position(self, unconstrained):
        """Unconstrained values as the chain's position: themselves, or mapped to the support if :attr:`constrained`."""
        if not self.constrained:
            return unconstrained
        return {name: biject_to(self.latent_supports[name])(value) for name, value in unconstrained.items()}

    def _with_latents(self, model, z):
        """``model`` with the chain's latent values ``z`` substituted: unconstrained values through the
        supports' transforms (adding the log-Jacobian), or, if :attr:`constrained`, as they are."""
        if self.constrained:
            return substitute(model, data=z)
        return substitute(model, substitute_fn=partial(_unconstrain_reparam, z))

    def init_batch(self, rng_key):
        key = rng_key if rng_key.ndim == 1 else rng_key[0]
        return minibatch.init(key, self.plate_sizes, self.replace)

    def draw(self, rng_key, batch_state):
        return minibatch.draw(rng_key, batch_state, self.plate_sizes, self.replace)

    def _energies(self, z, batch, model_args, model_kwargs):
        """``(prior part, data part)`` of ``Ũ_t(z)``; the data part holds the sites in subsampled plates."""
        model = self._with_latents(substitute(self.model, data=batch), z)
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
        if not self.per_example_scores:
            return StochasticGradient(value, grad, score)
        return StochasticGradient(value, grad, score, self.per_example(flat, unravel, batch, model_args, model_kwargs))

    def enable_per_example_scores(self):
        """Make :meth:`gradient` return per-datum scores, for rules with ``PER_EXAMPLE_SCORES`` (SGFS).

        They are defined for one subsampled plate of at least 2 elements; anything else raises."""
        if len(self.plate_sizes) != 1:
            found = ", ".join(map(repr, self.plate_sizes)) or "none"
            raise ValueError(
                f"{self.kernel_name}: per-datum scores need exactly one plate with `subsample_size` around the "
                f"likelihood (found: {found}). Declare `numpyro.plate(name, N, subsample_size=n)` with n >= 2 "
                "around all observed sites."
            )
        ((name, (_, n)),) = self.plate_sizes.items()
        if n < 2:
            raise ValueError(
                f"{self.kernel_name}: plate {name!r} has subsample_size {n}; the empirical Fisher needs n >= 2 "
                "(the paper recommends n >= 100)."
            )
        self.per_example_scores = True

    def per_example(self, flat, unravel, batch, model_args, model_kwargs):
        """The ``n×d`` per-datum scores ``∇_x log p(x_i | x)`` of the minibatch (``x``: the chain's position).

        One datum ``i`` is the model traced with its plate holding the single index ``i`` (scale ``N``),
        its data sites' log-density divided by ``N``; ``jax.vmap`` over the minibatch's indices of
        ``jax.grad`` of that costs one batched forward and backward pass, like the minibatch gradient
        (``jax.jacrev`` of the batch's ``n`` log-likelihoods would cost ``n`` backward passes). Row ``i``
        is the gradient of the data site terms of datum ``i``: any user ``scale`` handler is kept, the
        plate's ``N/n`` is not, so the rows sum to ``(n/N)`` times the minibatch gradient of the data part
        and average to ``score``."""
        ((plate, (size, _)),) = self.plate_sizes.items()

        def log_lik(x, index):
            model = self._with_latents(_one_index(self.model, plate, index), unravel(x))
            log_probs, _ = compute_log_probs(model, model_args, model_kwargs, {})
            return sum((v for k, v in log_probs.items() if k in self.data_sites), start=0.0) / size

        return jax.vmap(jax.grad(log_lik), in_axes=(None, 0))(flat, batch[plate])

    def postprocess_fn(self, model_args, model_kwargs):
        """Map unconstrained samples to constrained values and deterministic sites (on the full data)."""
        if self.constrained:
            return partial(_values_and_deterministic, full_data(self.model), model_args, model_kwargs)
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


