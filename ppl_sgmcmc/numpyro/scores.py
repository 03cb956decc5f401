"""The full-data score of a NumPyro model at given latent values, and what :func:`ppl_sgmcmc.diagnostics.ksd`,
:func:`ppl_sgmcmc.diagnostics.step_halving_check` and :func:`ppl_sgmcmc.diagnostics.energy_noise` read from a
finished NumPyro run.

:func:`full_data_score` is ``s(θ) = -∇U(θ)`` for the potential ``U`` of the whole data set, the gradient an
SG-MCMC kernel only estimates from minibatches: the kernel Stein discrepancy compares the draws with the
posterior through it (Gorham & Mackey, "Measuring Sample Quality with Kernels", ICML 2017).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax, random
from jax.flatten_util import ravel_pytree
from jax.typing import ArrayLike
from numpyro.distributions.transforms import biject_to
from numpyro.handlers import seed, substitute, trace
from numpyro.infer import MCMC

from ppl_sgmcmc import _run_view, diagnostics
from ppl_sgmcmc.numpyro import inference_data, warmup
from ppl_sgmcmc.numpyro.kernel import SGMCMCKernel
from ppl_sgmcmc.numpyro.potential import ModelTarget, PotentialTarget, as_jax_arrays, feasible_latent, split_arrays

__all__ = ["DRAWS_PER_BLOCK", "RunView", "full_data_score"]

#: The draws whose scores are computed together (vectorised): the memory holds that many minibatch gradients.
DRAWS_PER_BLOCK = 16


def _score_target(
    kernel: SGMCMCKernel, model_args: tuple, model_kwargs: Mapping[str, Any], rng_key: jax.Array, fn: str
) -> ModelTarget | PotentialTarget:
    """The kernel's potential, in unconstrained coordinates (also for a kernel that moves constrained ones)."""
    _run_view.check_kernel(kernel, SGMCMCKernel, fn)
    _run_view.check_scores_available(kernel, fn)
    if kernel._model is None:
        assert kernel._potential_fn is not None  # a kernel has exactly one of the two
        return PotentialTarget(kernel._potential_fn, kernel.name)
    with warnings.catch_warnings():  # the kernel said so when it ran
        warnings.filterwarnings("ignore", message=".*has no plate with `subsample_size`")
        return ModelTarget(kernel._model, model_args, model_kwargs, rng_key, kernel._replace, kernel.name)


def _scores(
    target: ModelTarget | PotentialTarget,
    latents: Mapping[str, ArrayLike],
    model_args: tuple,
    model_kwargs: Mapping[str, Any],
    rng_key: jax.Array,
    fn: str,
) -> jax.Array:
    """The ``(m, d)`` full-data scores at the rows of ``latents`` ``{site: (m, ...)}``."""
    if isinstance(target, ModelTarget) and set(latents) != set(target.latent_supports):
        raise ValueError(
            f"{fn}: `latents` must hold the model's latent sites {sorted(target.latent_supports)}, got "
            f"{sorted(latents)}."
        )
    flat = diagnostics.flatten_draws(latents, batch_ndim=1)
    _, unravel = ravel_pytree({name: jnp.asarray(value, flat.dtype)[0] for name, value in latents.items()})
    batches = target.epoch(rng_key, target.data_size)
    count = warmup.batch_count(batches)
    data, merge = split_arrays((model_args, model_kwargs))

    @jax.jit
    def rows(flat: jax.Array, batches: Any, data: list) -> jax.Array:
        args, kwargs = merge(data)

        def score(x: jax.Array) -> jax.Array:
            def add(total: jax.Array, batch: Any) -> tuple[jax.Array, None]:
                return total + jnp.asarray(target.gradient(x, unravel, batch, args, kwargs).grad), None

            return -lax.scan(add, jnp.zeros_like(x), batches, length=count)[0] / count

        return lax.map(score, flat, batch_size=DRAWS_PER_BLOCK)

    return rows(flat, batches, data)


def full_data_score(
    kernel: SGMCMCKernel,
    latents: Mapping[str, ArrayLike],
    model_args: tuple = (),
    model_kwargs: Mapping[str, Any] | None = None,
    *,
    rng_key: jax.Array | None = None,
) -> jax.Array:
    """The full-data score ``s(θ) = -∇U(θ)`` of a kernel's target at each row of ``latents``.

    ``U`` is the potential of the whole data set in the unconstrained coordinates: ``-log p(θ)``, minus the
    log-likelihood of all ``N`` rows, minus the log-Jacobian of the transforms to the latents' supports
    (for SGRLD too, whose chain moves the constrained values), or the kernel's ``potential_fn``. The data
    enter in minibatches of the model's own ``subsample_size`` ``n``: the score is the mean of the minibatch
    gradients over an epoch of ``⌊N/n⌋`` minibatches drawn without replacement
    (:meth:`~ppl_sgmcmc.numpyro.potential.ModelTarget.epoch`), computed for :data:`DRAWS_PER_BLOCK` rows at a
    time, so that memory stays at that many minibatch gradients whatever ``N``. It is exact when the model has
    one subsampled plate and ``n`` divides ``N``; otherwise the ``N mod n`` rows an epoch cannot hold are left
    out and the others weighted by ``N/(⌊N/n⌋ n)``, an unbiased estimate over the epoch's random rows (with
    several subsampled plates, the smaller plates' rows are drawn anew once their epoch ends). A stochastic
    ``potential_fn(z, rng_key)`` gives the mean of its gradient over
    :data:`~ppl_sgmcmc.numpyro.potential.PotentialTarget.EPOCH_KEYS` keys. Cost: ``m`` epochs, one compiled
    program.

    :param kernel: a ppl_sgmcmc NumPyro kernel (it need not have run).
    :param latents: ``{site: (m, ...)}``, ``m`` values of every latent site in the unconstrained coordinates
        (``mcmc.last_state.z`` of a run of several chains, say); the rows of the result follow
        :func:`ppl_sgmcmc.diagnostics.flatten_draws` of it (``batch_ndim=1``).
    :param model_args: the model's positional arguments (the data).
    :param model_kwargs: the model's keyword arguments.
    :param rng_key: the key of the model's prototype trace and the epoch's minibatches (default
        ``PRNGKey(0)``).
    :returns: the ``(m, d)`` scores.
    :raises TypeError: a kernel that is not a ppl_sgmcmc kernel.
    :raises ValueError: a kernel with local Gibbs sites, or ``latents`` without the model's latent sites.

    **Example** (``y_i ~ N(μ, 1)``, ``μ ~ N(0, 1)``: ``s(μ) = Σ_i y_i - (N + 1) μ``, here ``10 - 11 μ``)::

        >>> import jax.numpy as jnp, numpyro, numpyro.distributions as dist
        >>> from ppl_sgmcmc.numpyro import SGLD
        >>> def model(y):
        ...     mu = numpyro.sample("mu", dist.Normal(0, 1))
        ...     with numpyro.plate("data", y.shape[0], subsample_size=2):
        ...         numpyro.sample("y", dist.Normal(mu, 1), obs=numpyro.subsample(y, event_dim=0))
        >>> score = full_data_score(SGLD(model, step_size=1e-3), {"mu": jnp.array([0.0, 1.0])}, (jnp.ones(10),))
        >>> score.round(4).tolist()
        [[10.0], [-1.0]]
    """
    model_args, model_kwargs = as_jax_arrays(tuple(model_args)), as_jax_arrays(dict(model_kwargs or {}))
    key_target, key_epoch = random.split(random.PRNGKey(0) if rng_key is None else rng_key)
    target = _score_target(kernel, model_args, model_kwargs, key_target, "full_data_score")
    return _scores(target, latents, model_args, model_kwargs, key_epoch, "full_data_score")


class RunView:
    """A finished ``numpyro.infer.MCMC`` run of a ppl_sgmcmc kernel, as :mod:`ppl_sgmcmc.diagnostics` reads it:
    its draws (constrained, or unconstrained for the scores), the full-data scores, the adapted
    preconditioner, the per-datum log-likelihoods and CSGLD's energy grid, and the continuation of its chains
    from their final states (``mcmc.last_state``, as ``mcmc.post_warmup_state`` of a new ``MCMC`` without
    warm-up: the kernel is not initialised again).

    :param mcmc: the run.
    :param fn: the diagnostic's name, for messages.

    **Example**::

        >>> import jax, jax.numpy as jnp
        >>> from numpyro.infer import MCMC
        >>> from ppl_sgmcmc.numpyro import SGLD
        >>> kernel = SGLD(potential_fn=lambda z: 0.5 * jnp.sum(z["x"] ** 2), step_size=0.1)
        >>> mcmc = MCMC(kernel, num_warmup=10, num_samples=20, num_chains=2, chain_method="vectorized",
        ...             progress_bar=False)
        >>> mcmc.run(jax.random.PRNGKey(0), init_params={"x": jnp.zeros((2, 3))})
        >>> view = RunView(mcmc, "example")
        >>> view.samples()["x"].shape, view.step_index(), view.preconditioner_scales()
        ((2, 20, 3), 30, None)
    """

    def __init__(self, mcmc: MCMC, fn: str) -> None:
        kernel = mcmc.sampler
        _run_view.check_kernel(kernel, SGMCMCKernel, fn)
        if mcmc.last_state is None or mcmc._states is None:
            raise ValueError(_run_view.no_draws(fn))
        if mcmc.postprocess_fn is not None:
            raise ValueError(
                f"{fn}: the run has its own `postprocess_fn`, so its draws are not the latents' values; run it "
                "without one."
            )
        if not isinstance(mcmc.last_state.z, Mapping):
            raise TypeError(f"{fn}: the chain's latents must be a dict {{site: array}}, got {type(mcmc.last_state.z)}.")
        self.mcmc, self.kernel, self.fn = mcmc, kernel, fn
        self.names = sorted(mcmc.last_state.z)
        self.model_args, self.model_kwargs = as_jax_arrays(tuple(mcmc._args)), as_jax_arrays(dict(mcmc._kwargs))
        self._target: ModelTarget | PotentialTarget | None = None

    @property
    def target(self) -> ModelTarget | PotentialTarget:
        """The kernel's potential in unconstrained coordinates (built once)."""
        if self._target is None:
            self._target = _score_target(self.kernel, self.model_args, self.model_kwargs, random.PRNGKey(0), self.fn)
        return self._target

    def _latent_sites(self, draws: Mapping[str, Any], what: str) -> dict[str, np.ndarray]:
        missing = [name for name in self.names if name not in draws]
        if missing:
            raise ValueError(f"{self.fn}: {what} lack the latent site(s) {missing}.")
        return {name: np.asarray(draws[name]) for name in self.names}

    def samples(self) -> dict[str, np.ndarray]:
        """The latent sites' draws, constrained, ``(chains, draws, ...)``."""
        return self._latent_sites(self.mcmc.get_samples(group_by_chain=True), "the run's draws")

    def kept(self) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """What the run kept for :func:`~ppl_sgmcmc.diagnostics.verdict`: the latents' draws flattened,
        ``(chains, draws, d)``, and the collected ``noise_ratio`` and ``potential_energy``, ``(chains, draws)``
        (``None`` where not collected)."""
        samples = self.samples()
        chains, draws = next(iter(samples.values())).shape[:2]
        flat = np.concatenate([np.reshape(samples[name], (chains, draws, -1)) for name in self.names], axis=-1)
        fields = self.mcmc.get_extra_fields(group_by_chain=True)
        noise_ratio, energy = (np.asarray(fields[name]) if name in fields else None
                               for name in ("noise_ratio", "potential_energy"))  # fmt: skip
        return flat, noise_ratio, energy

    def latents(self, samples: Mapping[str, Any] | None = None) -> dict[str, np.ndarray]:
        """The run's draws (or ``samples``, constrained) in the score's unconstrained coordinates."""
        values = self.samples() if samples is None else self._latent_sites(samples, "`samples`")
        target = self.target
        if isinstance(target, PotentialTarget):
            return values
        return {
            name: np.asarray(biject_to(target.latent_supports[name]).inv(jnp.asarray(value)))
            for name, value in values.items()
        }

    def scores(self, rows: Mapping[str, np.ndarray], seed: int) -> np.ndarray:
        """The full-data scores at the unconstrained ``rows`` (see :func:`full_data_score`)."""
        key = random.PRNGKey(seed)
        return np.asarray(_scores(self.target, rows, self.model_args, self.model_kwargs, key, self.fn))

    def preconditioner_scales(self) -> np.ndarray | None:
        """The chains' adapted ``L``, ``(chains, d)`` or ``(chains, d, d)``; ``None`` when nothing adapted."""
        adapt = self.mcmc.last_state.adapt_state
        if not adapt:
            return None
        scale = np.asarray(adapt.preconditioner.scale)
        return scale if self.mcmc.num_chains > 1 else scale[None]

    def warmup_fit(self) -> tuple[float, float, int] | None:
        """What the warm-up's last slow window found, over the chains (:func:`ppl_sgmcmc.adaptation.settled`): the
        largest ``misfit``, the smallest ``explored``, and the most ``rounds`` run again; ``None`` when nothing adapted."""
        adapt = self.mcmc.last_state.adapt_state
        if not adapt:
            return None
        return float(np.max(adapt.misfit)), float(np.min(adapt.explored)), int(np.max(adapt.rounds))

    def final_rule_state(self) -> Any:
        """The rule's final state (a leading chain axis for several chains)."""
        return self.mcmc.last_state.rule_state

    def step_index(self) -> int:
        """The step counter of the final state (the chains count their steps together)."""
        return int(np.asarray(self.mcmc.last_state.i).reshape(-1)[0])

    def continue_chains(self, adjust: Callable[[Any], Any], num_draws: int, spacing: int) -> _run_view.Continuation:
        """``num_draws`` more draws of every chain from ``adjust`` of its final state, ``spacing`` times as many
        steps apart as the run's kept draws, by a new ``MCMC`` of the same kernel, chains and chain method
        (thinning ``spacing`` times the run's)."""
        mcmc = self.mcmc
        state = adjust(mcmc.last_state)
        thinning = mcmc.thinning * spacing
        continued = MCMC(
            self.kernel,
            num_warmup=0,
            num_samples=num_draws * thinning,
            num_chains=mcmc.num_chains,
            thinning=thinning,
            chain_method=mcmc.chain_method,
            progress_bar=False,
            jit_model_args=mcmc._jit_model_args,
        )
        continued.post_warmup_state = state
        continued.run(state.rng_key, *mcmc._args, init_params=state.z, **mcmc._kwargs)
        return _run_view.Continuation(
            list(range(mcmc.num_chains)),
            self._latent_sites(continued.get_samples(group_by_chain=True), "the continued draws"),
            np.atleast_1d(np.asarray(mcmc.last_state.step_size)),
            np.atleast_1d(np.asarray(continued.last_state.step_size)),
        )

    def pointwise(self, num_draws: int, chunk_size: int | None, fixed: bool = False) -> _run_view.Pointwise:
        """The per-datum log-likelihoods of the full-data model (:func:`ppl_sgmcmc.numpyro.full_data_log_likelihood`'s
        compiled evaluation; ``fixed``: of the model on the :func:`~ppl_sgmcmc._run_view.fixed_rows` of each
        subsampled plate) at ``num_draws`` draws evenly spaced over each chain, evaluated lazily ``chunk_size``
        draws at a time, with the subsampled plates and the plate of each observed site."""
        target = self.target
        assert isinstance(target, ModelTarget)  # energy_noise and the verdict refuse a potential_fn first
        plates, evaluated = dict(target.plate_sizes), None
        if fixed:  # the model as declared, its plates' indices substituted
            indices = {name: jnp.asarray(_run_view.fixed_rows(size, n)) for name, (size, n) in plates.items()}
            evaluated = substitute(self.kernel.subsampled_model, data=indices)
            plates = {name: (n, n) for name, (_, n) in plates.items()}
        model = seed(substitute(self.kernel.model, substitute_fn=feasible_latent), 0)  # no prior draw
        model_trace = trace(model).get_trace(*self.model_args, **self.model_kwargs)
        frames = {
            name: [(frame.name, frame.dim) for frame in site["cond_indep_stack"]]
            for name, site in model_trace.items()
            if site["type"] == "sample" and site["is_observed"]
        }
        sites = _run_view.site_plates(frames, plates, self.fn)
        samples = self.mcmc.get_samples(group_by_chain=True)
        chains, draws = jax.tree.leaves(samples)[0].shape[:2]
        index = _run_view.chain_index(draws, num_draws, self.fn)
        m = chains * len(index)
        flat = {name: value[:, index].reshape((m,) + value.shape[2:]) for name, value in samples.items()}
        evaluate = inference_data._evaluator(self.mcmc, evaluated)
        shapes = jax.eval_shape(evaluate, {name: value[:1] for name, value in flat.items()})  # no evaluation
        entries = sum(math.prod(shape.shape[1:]) for shape in shapes.values())
        rows = _run_view.rows_per_chunk(chunk_size, entries, m)
        return _run_view.Pointwise(
            plates, sites, target.replace, (chains, len(index)),
            inference_data._log_likelihood_chunks(evaluate, flat, rows),
        )  # fmt: skip

    def energy_gaps(self) -> np.ndarray:
        """CSGLD's ``Δu`` of each chain, from the final state."""
        return np.atleast_1d(np.asarray(self.mcmc.last_state.rule_state.energy_gap, np.float64))
