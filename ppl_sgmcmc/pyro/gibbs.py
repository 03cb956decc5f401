"""Local Gibbs sites for the Pyro kernels: discrete (or any) latents inside a subsampled plate,
updated by a user's conditional each step, with the SG-MCMC step on the global latents in between.

The Pyro twin of :mod:`ppl_sgmcmc.numpyro.gibbs`, with the same options on every kernel and the same
step; only the source of randomness differs: a ``torch.Generator`` in place of a JAX key::

    SGNHT(model, step_size=1e-3, gibbs_sites=["z"], gibbs_fn=gibbs_fn, gibbs_sweeps=(5, 5))

**The contract of** ``gibbs_fn(generator, gibbs_sites, hmc_sites, subsample_indices) -> gibbs_sites``:

* it performs **one** conditional update (a sweep) of the named sites of the *current minibatch*,
  drawing its randomness from ``generator`` (pass it to ``torch.rand(..., generator=generator)`` and
  the like; then runs are reproducible under ``pyro.set_rng_seed``);
* ``gibbs_sites``: ``{name: tensor}`` of the named sites, shaped as the model declares them inside
  the subsampled plate (the minibatch's rows);
* ``hmc_sites``: the global latents at the point where the rule evaluates its gradient, in their
  constrained space, together with the model's deterministic sites computed from them;
* ``subsample_indices``: ``{plate_name: indices}`` of the minibatch (rows of the full data);
* it returns the updated ``{name: tensor}`` with the same shapes (dtypes are cast back);
* data reach it by closure; it runs under ``torch.no_grad()``.

**What a step does** (as in NumPyro). Inside the rule's gradient at ``x`` the minibatch's local
sites are drawn from the model's own prior (the model run with the minibatch's indices and ``x``
substituted), moved by ``gibbs_init`` if given (same signature), then ``burn_in`` sweeps of
``gibbs_fn`` run and ``kept`` more are kept; the gradient is the average over the kept sweeps of
``∇_x`` of the log joint with the local sites substituted (the Fisher identity
``∇ log p(w | x) = E_{z|w,x}[∇ log p(w, z | x)]``)::

    ∇Ũ_t(x) ≈ -∇ log p(x) - (N/n) Σ_{i∈S_t} (1/S) Σ_{s=1..S} ∇ log p(w_i, z_i^{(s)} | x)

and the reported energy ``Ũ_t`` is that average of the log joint. With the default
``compile_potential=True`` the log joint and its gradient are traced once, with the local sites'
values as inputs of the graph, and replayed every step; the sweeps themselves run eagerly.

The sweeps' randomness (the prior draw and ``generator``) is seeded once per step from the chain's
generator, with the minibatch, so a step that evaluates its gradient twice at one point sees the
same local samples. The local sites are not kept between steps and are not part of the samples.

Limits: the named sites must lie inside a plate with ``subsample_size`` smaller than its size;
per-datum scores (SGFS) are not available; when samples are post-processed (deterministic sites,
ArviZ) the local sites are set to 0, so a full-data log-likelihood of an observed site that depends
on them is not meaningful.
"""

from types import SimpleNamespace

import torch

from ppl_sgmcmc import _checks
from ppl_sgmcmc._checks import GibbsFnError  # noqa: F401  (re-exported: raised by the sweeps)
from ppl_sgmcmc.algorithms import GibbsOptions
from ppl_sgmcmc.pyro.handlers import is_subsample_site
from ppl_sgmcmc.pyro.potential import ModelTarget

__all__ = ["GibbsTarget", "GibbsFnError"]


def _placeholder(fn):
    """Zeros of a local site's shape, for runs of the model outside a step (full data, deterministic sites)."""
    return torch.zeros(fn.shape(), dtype=torch.long if fn.support.is_discrete else torch.get_default_dtype())


class GibbsTarget(ModelTarget):
    """The subsampled potential of a Pyro model with local Gibbs sites (see the module docstring).

    ``draw`` returns ``(indices, seed)``; ``gradient`` runs the sweeps and averages the gradient of the
    log joint over the kept ones."""

    def __init__(self, *args, gibbs: GibbsOptions, **kwargs):
        self.local_sites = tuple(gibbs.sites)
        self.gibbs_fn = gibbs.fn
        self.gibbs_init = gibbs.init
        self.burn_in, self.kept = gibbs.sweeps
        super().__init__(*args, **kwargs)
        # the first gradient (initial values) uses the prototype trace's prior draw of the local sites
        self.first_batch = (self.first_batch, {name: value[None] for name, value in self._prototype_local.items()})

    def _check_sites(self, model_trace):
        nodes = {
            name: site
            for name, site in model_trace.nodes.items()
            if not (site["type"] == "sample" and is_subsample_site(site))
        }
        _checks.gibbs_sites(self.local_sites, nodes, self.data_sites, self.kernel_name, "pyro.plate")
        self._prototype_local = {site: nodes[site]["value"].detach() for site in self.local_sites}
        global_sites = {name: site for name, site in nodes.items() if name not in self.local_sites}
        return super()._check_sites(SimpleNamespace(nodes=global_sites))

    def enable_per_example_scores(self):
        raise NotImplementedError(
            f"{self.kernel_name}: per-datum scores (SGFS) are not available with local Gibbs sites."
        )

    # --- a step ----------------------------------------------------------------------------------
    def draw(self, generator, batch_state, replace=None):
        indices, batch_state = super().draw(generator, batch_state, replace)
        return (indices, int(torch.randint(0, 2**62, (), generator=generator))), batch_state

    def differentiable_energy(self, x, batch):
        indices, seed = batch
        return sum(self.energies(x, (indices, self.local_samples(x, indices, seed)), self.model_args, self.model_kwargs))

    def local_samples(self, flat, indices, seed):
        """The kept sweeps of the local sites at the unconstrained ``flat``: ``{name: (kept, *shape)}``."""
        prior = {}
        draw = {name: (lambda fn, name=name: prior.setdefault(name, fn.sample())) for name in self.local_sites}
        with torch.no_grad():
            with torch.random.fork_rng(devices=[]):
                torch.default_generator.manual_seed(seed)
                density = self._run(
                    flat.detach(), indices, self.model_args, self.model_kwargs, log_density=False, local=draw
                )
            hmc_sites = {**density.values, **density.deterministic}
            generator = torch.Generator().manual_seed(seed)

            def update(fn, label, current):
                new = _checks.gibbs_result(
                    fn(generator, current, hmc_sites, indices), current, torch.Tensor.size, label, self.kernel_name
                )
                return {name: torch.as_tensor(value).to(current[name].dtype) for name, value in new.items()}

            local = prior
            if self.gibbs_init is not None:
                local = update(self.gibbs_init, "gibbs_init", local)
            for _ in range(self.burn_in):
                local = update(self.gibbs_fn, "gibbs_fn", local)
            kept = []
            for _ in range(self.kept):
                local = update(self.gibbs_fn, "gibbs_fn", local)
                kept.append(local)
        return {name: torch.stack([sweep[name] for sweep in kept]) for name in self.local_sites}

    def gradient(self, flat, batch, with_score=False):
        indices, seed = batch
        return super().gradient(flat, (indices, self.local_samples(flat, indices, seed)), with_score)

    def energies(self, flat, batch, model_args, model_kwargs, per_datum=False, local=None):
        """``(prior part, data part)`` of ``Ũ_t``, each averaged over the kept sweeps of the local sites
        (which count in the data part: they lie in the subsampled plate). ``batch``: ``(indices, kept)``."""
        indices, kept = batch
        sweeps = len(next(iter(kept.values())))
        parts = [
            super(GibbsTarget, self).energies(
                flat, indices, model_args, model_kwargs, local={name: value[s] for name, value in kept.items()}
            )
            for s in range(sweeps)
        ]
        return tuple(sum(part) / sweeps for part in zip(*parts))

    def _run(self, flat, batch, model_args, model_kwargs, full=False, log_density=True, per_datum=False, local=None):
        if local is None:  # outside a step: the local sites are not sampled
            local = {name: _placeholder for name in self.local_sites}
        return super()._run(flat, batch, model_args, model_kwargs, full, log_density, per_datum, local)

    def traced_gradient(self, flat, batch, with_score=False):
        """``None``: a step's gradient runs the local sites' sweeps (Python), which a larger graph cannot hold."""
        return None

    # --- the traced gradient takes the kept sweeps as inputs ----------------------------------------
    def _batch_tensors(self, batch):
        indices, kept = batch
        return super()._batch_tensors(indices) + [kept[name] for name in self.local_sites]

    def _batch_from_tensors(self, tensors):
        num_plates = len(self.plate_sizes)
        return super()._batch_from_tensors(tensors[:num_plates]), dict(zip(self.local_sites, tensors[num_plates:]))
