"""Local Gibbs sites: discrete (or any) latents inside a subsampled plate, updated by a user's
conditional each step, with the SG-MCMC step on the global latents in between.

This is the SG-MCMC analogue of :class:`numpyro.infer.HMCGibbs`, for models whose local latents
cannot be marginalised in closed form but have a cheap conditional: the topic assignments ``z`` of
semi-collapsed LDA (Patterson & Teh 2013), mixture memberships, missing data. Every kernel takes it::

    SGNHT(model, step_size=1e-3, gibbs_sites=["z"], gibbs_fn=gibbs_fn, gibbs_sweeps=(5, 5))

**The contract of** ``gibbs_fn(rng_key, gibbs_sites, hmc_sites, subsample_indices) -> gibbs_sites``:

* it performs **one** conditional update (a sweep) of the named sites of the *current minibatch*;
* ``gibbs_sites``: ``{name: value}`` of the named sites, shaped as the model declares them inside the
  subsampled plate (the minibatch's rows);
* ``hmc_sites``: the global latents at the point where the rule evaluates its gradient, in their
  constrained space, together with the model's deterministic sites computed from them;
* ``subsample_indices``: ``{plate_name: indices}`` of the minibatch (rows of the full data);
* it returns the updated ``{name: value}`` with the same shapes (dtypes are cast back);
* data reach it by closure, as with ``HMCGibbs``; it must be traceable by JAX (it runs inside
  ``lax.scan``) and must not depend on the global latents through anything but ``hmc_sites``.

**What a step does.** Inside the rule's ``grad_fn(x)`` (so at the point where the rule takes its
gradient, e.g. the half step ``θ_{t+½}`` of a splitting integrator), the local sites of the minibatch
are drawn from the model's own prior (the model traced with the minibatch's indices and ``x``
substituted), optionally moved to a better start by ``gibbs_init`` (same signature and contract as
``gibbs_fn``), then ``burn_in`` sweeps of ``gibbs_fn`` run and ``kept`` more are kept, all under one
``lax.scan``; the gradient is the average over the kept sweeps of ``∇_x`` of the log joint with the
local sites substituted (the Fisher identity ``∇ log p(w | x) = E_{z|w,x}[∇ log p(w, z | x)]``)::

    ∇Ũ_t(x) ≈ -∇ log p(x) - (N/n) Σ_{i∈S_t} (1/S) Σ_{s=1..S} ∇ log p(w_i, z_i^{(s)} | x)

and the reported energy ``Ũ_t`` is that average of the log joint, not of the marginal (which is
intractable). The estimate is unbiased as the sweeps reach the conditional ``p(z | w, x)``; with
too few burn-in sweeps it is biased towards the prior. The local sites are not kept between steps
(a document is seldom revisited) and are not part of the samples.

Why ``gibbs_init``: a sticky conditional mixes slowly from the prior. In LDA with ``α = 0.1`` a prior
draw puts a document on one or two random topics, and moving a token to a topic the document does
not use costs a factor ``α`` in the conditional, so a few sweeps from the prior leave the documents on
random topics and bias the gradient towards the prior. Starting each token from ``p(z | w, π)`` with
uniform document proportions (:func:`models.lda.make_gibbs_init`) avoids that.

The random key of the sweeps is drawn with the minibatch (``draw``), so a step that evaluates the
gradient twice at one point (a CSGLD energy, say) sees the same local samples.

Limits: the named sites must lie inside a plate with ``subsample_size`` smaller than its size;
per-datum scores (SGFS) are not available with local Gibbs sites; deterministic sites that depend on
the local sites are computed with those sites set to 0 when samples are post-processed, and ArviZ's
full-data log-likelihood of an observed site that depends on them is not meaningful (pass
``log_likelihood=False`` to :func:`~ppl_sgmcmc.numpyro.to_inference_data`).
"""

from functools import partial

import jax
import jax.numpy as jnp
from jax import lax
from numpyro.handlers import condition, seed, substitute, trace
from numpyro.infer.util import compute_log_probs, constrain_fn
from numpyro.util import is_prng_key

from ppl_sgmcmc import _checks
from ppl_sgmcmc._checks import GibbsFnError  # noqa: F401  (re-exported: raised by the sweeps)
from ppl_sgmcmc.algorithms import GibbsOptions
from ppl_sgmcmc.numpyro import prng
from ppl_sgmcmc.numpyro.handlers import full_data
from ppl_sgmcmc.numpyro.potential import ModelTarget, _values_and_deterministic


class GibbsTarget(ModelTarget):
    """The subsampled potential of a model with local Gibbs sites (see the module docstring).

    ``draw`` returns ``(indices, rng_key)``; ``gradient`` runs the sweeps and averages the gradient of
    the log joint over the kept ones."""

    def __init__(
        self,
        model,
        model_args,
        model_kwargs,
        rng_key,
        replace,
        kernel_name,
        gibbs: GibbsOptions,
        constrained=False,
    ):
        self.gibbs_sites = tuple(gibbs.sites)
        self.gibbs_fn = gibbs.fn
        self.gibbs_init = gibbs.init
        self.burn_in, self.kept = gibbs.sweeps
        super().__init__(model, model_args, model_kwargs, rng_key, replace, kernel_name, constrained=constrained)

    def _check_sites(self, model_trace):
        _checks.gibbs_sites(self.gibbs_sites, model_trace, self.data_sites, self.kernel_name, "numpyro.plate")
        super()._check_sites({k: v for k, v in model_trace.items() if k not in self.gibbs_sites})

    def enable_per_example_scores(self):
        raise NotImplementedError(
            f"{self.kernel_name}: per-datum scores (SGFS) are not available with local Gibbs sites."
        )

    def _search_key(self):
        """``None``: the initial-value search depends on the Gibbs options too; it is compiled for each kernel."""
        return None

    @property
    def stream_block(self):
        """``None``: the local sites are drawn step by step, so streamed rows are read step by step too."""
        return None

    def draw(self, rng_key, batch_state, replace=None):
        key_indices, key_local = prng.split(rng_key, 2)
        indices, batch_state = super().draw(key_indices, batch_state, replace)
        return (indices, key_local), batch_state

    def _prior_local(self, model, rng_key, model_args, model_kwargs):
        """One trace of ``model`` (globals already substituted) with the local sites drawn from the prior."""
        return trace(seed(model, rng_key)).get_trace(*model_args, **model_kwargs)

    def initial_params(self, rng_key, init_strategy, model_args, model_kwargs):
        def minibatch_model(rng_key, model_args, model_kwargs):
            key = rng_key if is_prng_key(rng_key) else rng_key[0]
            (indices, key_local), _ = self.draw(key, self.init_batch(rng_key))
            minibatch_model = substitute(self.model, data=indices)
            prior_trace = self._prior_local(minibatch_model, key_local, model_args, model_kwargs)
            return condition(minibatch_model, data={name: prior_trace[name]["value"] for name in self.gibbs_sites})

        return self._initialize(rng_key, minibatch_model, init_strategy, model_args, model_kwargs)

    def local_samples(self, flat, unravel, batch, model_args, model_kwargs):
        """The kept sweeps of the local sites at the position ``flat``: ``{name: (kept, *shape)}``."""
        indices, rng_key = batch
        key_init, key_sweeps = prng.split(rng_key, 2)
        z = unravel(lax.stop_gradient(flat))
        model = self._with_latents(substitute(self.model, data=indices), z)
        model_trace = self._prior_local(model, key_init, model_args, model_kwargs)
        local = {name: model_trace[name]["value"] for name in self.gibbs_sites}
        hmc_sites = {
            name: site["value"]
            for name, site in model_trace.items()
            if (site["type"] == "sample" and name in self.latent_supports) or site["type"] == "deterministic"
        }

        def update(fn, label, current, key):
            new = _checks.gibbs_result(fn(key, current, hmc_sites, indices), current, jnp.shape, label, self.kernel_name)
            return {name: jnp.asarray(value).astype(jnp.result_type(current[name])) for name, value in new.items()}

        def sweep(current, key):
            new = update(self.gibbs_fn, "gibbs_fn", current, key)
            return new, new

        if self.gibbs_init is not None:
            key_init, key_sweeps = prng.split(key_sweeps, 2)
            local = update(self.gibbs_init, "gibbs_init", local, key_init)
        keys = prng.split(key_sweeps, self.burn_in + self.kept)
        local, _ = lax.scan(lambda c, k: (sweep(c, k)[0], None), local, keys[: self.burn_in])
        _, kept = lax.scan(sweep, local, keys[self.burn_in :])
        return kept

    def gradient(self, flat, unravel, batch, model_args, model_kwargs):
        indices, _ = batch
        kept = self.local_samples(flat, unravel, batch, model_args, model_kwargs)
        return super().gradient(flat, unravel, (indices, kept), model_args, model_kwargs)

    def _energies(self, z, batch, model_args, model_kwargs):
        """``(prior part, data part)`` of ``Ũ_t(z)``, each averaged over the kept sweeps of the local sites
        (which count in the data part: they lie in the subsampled plate)."""
        indices, kept = batch

        def one(local):
            model = self._with_latents(condition(substitute(self.model, data=indices), data=local), z)
            log_probs, _ = compute_log_probs(model, model_args, model_kwargs, {})
            prior = sum((v for k, v in log_probs.items() if k not in self.data_sites), start=0.0)
            data = sum((v for k, v in log_probs.items() if k in self.data_sites), start=0.0)
            return -prior, -data

        prior, data = jax.vmap(one)(kept)
        return prior.mean(), data.mean()

    def _placeholder(self, site):
        """Zeros for the local sites when the full-data model is replayed (they are not sampled there)."""
        if site["type"] == "sample" and site["name"] in self.gibbs_sites:
            dtype = jnp.int32 if site["fn"].support.is_discrete else jnp.result_type(float)
            return jnp.zeros(site["fn"].shape(), dtype)
        return None

    def postprocess_fn(self, model_args, model_kwargs):
        model = substitute(full_data(self.model), substitute_fn=self._placeholder)
        if self.constrained:
            return partial(_values_and_deterministic, model, model_args, model_kwargs)
        return partial(constrain_fn, model, model_args, model_kwargs, return_deterministic=True)
