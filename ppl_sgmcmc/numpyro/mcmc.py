"""NumPyro's :class:`numpyro.infer.MCMC` with the progress bar drawn from inside the compiled sampling loop.

With one chain (or ``chain_method="vectorized"``) and ``progress_bar=True``, NumPyro runs its sampling loop
in Python: one call of the compiled step and one update of the bar per draw, about 0.1 ms, several times
the cost of a minibatch step on a small model. :class:`MCMC` runs the loop NumPyro runs without a
progress bar (one compiled loop) and the kernel updates the bar from inside it, through a host callback
(:func:`jax.experimental.io_callback`) every ``progress_rate`` draws, as BlackJAX's ``progress_bar`` does.
The bar keeps NumPyro's conventions: one tick per draw (``num_warmup + num_samples``, or ``num_samples``
for a resumed chain; ``thinning`` does not change it), the description ``warmup`` / ``sample``, and the
kernel's diagnostics string as its postfix (none for vectorized chains, as in NumPyro). The callback reads
the state and draws no random numbers: the samples are those of ``progress_bar=False``, bit for bit.

For other chain methods (``"sequential"`` or ``"parallel"`` with several chains, a callable), and for
kernels that are not SG-MCMC kernels, :class:`MCMC` is NumPyro's ``MCMC`` unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.infer
import tqdm.auto as tqdm
from jax import lax
from jax.experimental import io_callback
from numpyro.util import nested_attrgetter

from ppl_sgmcmc import _checks, diagnostics
from ppl_sgmcmc import verdict as _verdict
from ppl_sgmcmc.numpyro.kernel import SGMCMCKernel
from ppl_sgmcmc.numpyro.potential import as_jax_arrays, split_arrays

__all__ = ["MCMC"]


class MCMC(numpyro.infer.MCMC):
    """:class:`numpyro.infer.MCMC`, same arguments and methods, whose progress bar costs next to nothing for
    an SG-MCMC kernel with one chain or vectorized chains: the sampling loop stays compiled and the kernel
    updates the bar from inside it (see :mod:`ppl_sgmcmc.numpyro.mcmc`). Draws, thinning and the state after a
    run are those of ``numpyro.infer.MCMC``; the chain's health (:meth:`SGMCMCKernel.report_health
    <ppl_sgmcmc.numpyro.kernel.SGMCMCKernel.report_health>`) is reported at the end of each run, from the host,
    rather than from the compiled loop as under ``numpyro.infer.MCMC``: without a progress bar the loop then has
    no host callback, and JAX's persistent compilation cache (which does not keep programs with host callbacks)
    can read it back in a later process. A finished run's compiled loop goes with the ``MCMC`` object (or at its
    next run): under ``numpyro.infer.MCMC`` JAX's caches keep every run's loop, kernel and draws for the life of
    the process (10-20 MB a run for a small model, NUTS too), which a notebook whose cells are rerun feels.

    At the end of each run the draws are judged (:func:`ppl_sgmcmc.diagnostics.verdict`: whether the chains agree,
    hold enough effective draws, left no burn-in in the draws, met no more gradient noise than the step size
    allows), with one ``RuntimeWarning`` if they fail (unless a health check already warned about the run, naming
    its failure); ``verdict=False`` skips it. ``verdict="predictions"`` judges the model's predictions instead of
    its parameters (the log-likelihoods of fixed data rows): for a model with symmetries, such as a network whose
    hidden units can be permuted, whose chains may each hold their own copy of one posterior.
    :attr:`last_verdict` keeps it.

    **Example**::

        >>> import jax, jax.numpy as jnp
        >>> from ppl_sgmcmc.numpyro import MCMC, SGLD
        >>> kernel = SGLD(potential_fn=lambda z: 0.5 * jnp.sum(z["x"] ** 2), step_size=0.05)
        >>> mcmc = MCMC(kernel, num_warmup=100, num_samples=1000)  # a progress bar, one compiled loop
        >>> mcmc.run(jax.random.PRNGKey(0), init_params={"x": jnp.ones(2)})
        >>> mcmc.get_samples()["x"].shape
        (1000, 2)
    """

    progress_bar: bool  # NumPyro's attribute

    def __init__(self, sampler: Any, *args: Any, verdict: bool | str = True, **kwargs: Any) -> None:
        # NumPyro runs num_chains=0 and fails inside `pmap` with an error about squeezing an axis
        _checks.positive_int("num_chains", kwargs.get("num_chains", 1), type(self).__name__)
        if not isinstance(verdict, bool) and verdict not in _verdict.JUDGES:
            raise ValueError(
                f"{type(self).__name__}: `verdict` must be True, False or one of {_verdict.JUDGES} (what it judges), "
                f"got {verdict!r}."
            )
        super().__init__(sampler, *args, **kwargs)
        self.verdict = verdict
        #: The :class:`~ppl_sgmcmc.verdict.Verdict` of the last run (``None``: not judged).
        self.last_verdict: _verdict.Verdict | None = None

    def run(self, rng_key: Any, *args: Any, extra_fields: tuple | list = (), init_params: Any = None,
            **kwargs: Any) -> None:
        """Run the chains as :meth:`numpyro.infer.MCMC.run` does, with the progress bar drawn from inside the
        compiled loop where :mod:`ppl_sgmcmc.numpyro.mcmc` says so."""
        kernel = self.sampler
        if not isinstance(kernel, SGMCMCKernel):
            return super().run(rng_key, *args, extra_fields=extra_fields, init_params=init_params, **kwargs)
        if self.verdict == "predictions":  # refused before the run, not after it
            diagnostics._check_predictions(kernel, type(self).__name__)
        # the compiled step reads `kernel._progress` when it is traced: NumPyro's cached step functions
        # (kept per model arguments) must not outlive a run with another bar, or none
        self._cache: dict = {}
        phase = self._collection_params.get("phase")  # "warmup" for `warmup()`, whose draws are not judged
        self.last_verdict = None
        kernel._reports_after_run = True  # no health callback in the compiled loop: see `report_health` below
        kernel._judged_after_run = True
        kernel._keeps_sampling_stage = True  # `get_samples` leaves a cyclical kernel's exploration draws out
        # a run from the start checks its last step in the loop; a resumed chain's last step would make each of its
        # runs a new program (the persistent cache would miss), so its final state is checked after the run
        last_step = None if self._warmup_state is not None else self._steps()[1] * kernel._steps_per_sample
        kernel._last_step = last_step
        # the warm-up may run again while it has not settled: from the start, its draws not collected, in this class's
        # compiled loop (which counts the chain's own steps; NumPyro's loop with its bar, for chains run one by one,
        # counts calls)
        in_loop = self.progress_bar and (self.num_chains == 1 or self.chain_method == "vectorized")
        replays = (self._warmup_state is None and self._collection_params["lower"] == self.num_warmup > 0
                   and (in_loop or not self.progress_bar))  # fmt: skip
        try:
            kernel._replays_allowed = replays
            self._run(kernel, rng_key, *args, extra_fields=extra_fields, init_params=init_params, **kwargs)
        finally:
            kernel._reports_after_run, kernel._judged_after_run, kernel._last_step = False, False, None
            kernel._keeps_sampling_stage, kernel._replays_allowed = False, False
        state = self.last_state
        if last_step is not None and np.all(np.asarray(state.i) == last_step):  # what the loop recorded
            kernel._health.report(state.health.flags, state.health.values)
        else:
            kernel.report_health(state)
        if self._judged(kernel, phase):
            judge = self.verdict if isinstance(self.verdict, str) else "parameters"
            self.last_verdict = diagnostics.verdict(self, warn=False, judge=judge)
            if not kernel._health.named_failure:  # a failed health check already named the run's failure
                _verdict.report(self.last_verdict, kernel.name)

    def _judged(self, kernel: SGMCMCKernel, phase: str | None) -> bool:
        """Whether the run's draws get the end-of-run verdict: asked for, a sampler's draws of a latent dict (not
        an optimiser's, nor a custom ``postprocess_fn``'s) holding every latent site (``extra_fields=("~z.a",)``
        leaves one out), enough of them, not the warm-up's."""
        draws = len(self._sampling_stage()) if kernel.cycles is not None else self.num_samples // self.thinning
        return (self.verdict is not False and kernel.samples_posterior and phase != "warmup"
                and self.postprocess_fn is None and isinstance(self.last_state.z, Mapping) and draws >= _verdict.MIN_DRAWS
                and set(self.get_samples()) >= set(self.last_state.z))  # fmt: skip

    def get_samples(self, group_by_chain: bool = False) -> Any:
        """:meth:`numpyro.infer.MCMC.get_samples`; of a cyclical kernel (``cycle_length``), only the draws of the
        cycles' sampling stages (:meth:`~ppl_sgmcmc.algorithms.Algorithm.sampling_stage`), which
        ``print_summary``, ArviZ and the verdict then read.

        **Example** (cycles of 10 draws, 3 exploring: 28 of 40 draws are kept)::

            >>> import jax, jax.numpy as jnp
            >>> from ppl_sgmcmc.numpyro import MCMC, SGLD
            >>> kernel = SGLD(potential_fn=lambda z: 0.5 * jnp.sum(z["x"] ** 2), step_size=0.1, cycle_length=10,
            ...               exploration_fraction=0.3)
            >>> mcmc = MCMC(kernel, num_warmup=20, num_samples=40, progress_bar=False, verdict=False)
            >>> mcmc.run(jax.random.PRNGKey(0), init_params={"x": jnp.ones(2)})
            >>> mcmc.get_samples()["x"].shape, mcmc.get_extra_fields()["i"][:3].tolist()
            ((28, 2), [24, 25, 26])
        """
        return self._kept(super().get_samples(group_by_chain=True), group_by_chain)

    def get_extra_fields(self, group_by_chain: bool = False) -> dict:
        """:meth:`numpyro.infer.MCMC.get_extra_fields`, of the draws :meth:`get_samples` keeps."""
        return self._kept(super().get_extra_fields(group_by_chain=True), group_by_chain)

    def _sampling_stage(self) -> np.ndarray:
        """The indices of the collected draws that a cyclical kernel's sampling stages made (from the first chain's
        recorded step counts: every chain's are the same)."""
        counts = super().get_extra_fields(group_by_chain=True).get("i")
        if counts is None:  # `extra_fields` that exclude it: the step counts are needed to tell the stages
            raise ValueError(
                f"{self.sampler.name}: the run did not collect the step count `i` of its draws, which tells a cyclical "
                "kernel's exploration draws from its sampling draws; leave it among the collected fields."
            )
        return np.flatnonzero(self.sampler.sampling_stage(np.asarray(counts)[0]))

    def _kept(self, grouped: Any, group_by_chain: bool) -> Any:
        """``grouped`` (``(chains, draws, ...)`` leaves) with only the sampling stages' draws of a cyclical kernel,
        the chains' draws flattened into one axis unless ``group_by_chain``."""
        if isinstance(self.sampler, SGMCMCKernel) and self.sampler.cycles is not None:
            index = self._sampling_stage()
            grouped = jax.tree.map(lambda x: x[:, index], grouped)
        if group_by_chain:
            return grouped
        return jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), grouped)

    def _steps(self) -> tuple[int, int]:
        """``(the step count at the run's start, the draws the run makes)``: NumPyro's collection range for a run
        from the start (or ``warmup()``'s), ``num_samples`` from a resumed chain's own step count."""
        if self._warmup_state is None:
            return 0, self._collection_params["upper"]
        return int(np.ravel(self._warmup_state.i)[0]), self.num_samples

    def _single_chain_mcmc(self, init: Any, args: Any, kwargs: Any, collect_fields: tuple, remove_sites: tuple) -> Any:
        """NumPyro's, for an SG-MCMC kernel without NumPyro's progress bar: the same draws, collected by a compiled
        loop that belongs to this run (:func:`_collection_loop`, kept in ``self._cache``, which each run resets)
        instead of NumPyro's. NumPyro compiles its module-level loop with the run's step function as a static
        argument, so JAX's caches keep every run's program, and through it the kernel and this object, for the
        life of the process: a notebook cell rerun with a new kernel grew the process by 10-20 MB each time
        (``benchmarks/repeated_runs.py``). JAX's caches key this loop on the function itself, weakly: its program
        goes when this object does, or at its next run."""
        kernel = self.sampler
        if self.progress_bar or not isinstance(kernel, SGMCMCKernel):  # NumPyro's Python loop with its bar
            return super()._single_chain_mcmc(init, args, kwargs, collect_fields, remove_sites)
        rng_key, init_state, init_params = init
        if init_state is None or kernel._sample_fn is None:  # as NumPyro does
            state = kernel.init(rng_key, self.num_warmup, init_params, model_args=args, model_kwargs=kwargs)
            init_state = state if init_state is None else init_state
        init_val: tuple
        recentre: Any
        if self._jit_model_args:
            sample_fn, postprocess_fn = self._get_cached_fns()
            init_val, recentre = (init_state, args, kwargs), _RecentreWithArguments(kernel)
        else:  # the data as the loop's arguments, not constants of its program (see `_ArrayArguments`)
            # one per run (a run's chains share its arguments, and `run` empties the cache): NumPy arrays converted
            # once, and one loop for the run's chains
            arguments = self._cache.get("ppl_sgmcmc: array arguments")
            if arguments is None:
                arguments = self._cache["ppl_sgmcmc: array arguments"] = _ArrayArguments(self, args, kwargs)
            sample_fn, postprocess_fn, init_val = arguments, arguments.postprocess, (init_state, arguments.data)
            recentre = arguments.recentre
        params, thinning = self._collection_params, self.thinning
        lower, upper, size = params["lower"], params["upper"], params["collection_size"]
        size = (upper - lower) // thinning if size is None else size // thinning
        # one loop for the run's chains (chain_method="sequential" calls this once per chain); none kept when
        # traced (chain_method="parallel": `pmap` traces this), as NumPyro keeps none
        accelerated = _Accelerated.of(kernel, self._steps()[0], upper, recentre)
        # with replays of the warm-up, the loop counts the chain's own draws (`state.i`), which a replay sets back
        replays = kernel._steps_per_sample if kernel._replays_allowed and kernel.warmup_replays() else None
        key = ("ppl_sgmcmc: collection loop", sample_fn, postprocess_fn, collect_fields, remove_sites, lower, upper,
               thinning, size, accelerated, replays)  # fmt: skip
        loop = None if isinstance(rng_key, jax.core.Tracer) else self._cache.get(key)
        if loop is None:
            transform = _collect_and_postprocess(postprocess_fn, collect_fields, remove_sites)
            loop = _collection_loop(sample_fn, transform, lower, upper, thinning, size, accelerated, replays)
            if not isinstance(rng_key, jax.core.Tracer):
                self._cache[key] = loop
        states, last_val = loop(init_val)
        if len(collect_fields) == 1:
            states = (states,)
        return dict(zip(collect_fields, states)), last_val[0]

    def _run(self, kernel: SGMCMCKernel, rng_key: Any, *args: Any, **kwargs: Any) -> None:
        in_loop = self.progress_bar and (self.num_chains == 1 or self.chain_method == "vectorized")
        if not in_loop:
            super().run(rng_key, *args, **kwargs)
            return
        start, upper = self._steps()
        if self._warmup_state is None:  # a run from the start, or `warmup()` (which sets its own range)
            lower, phase = self._collection_params["lower"], self._collection_params["phase"]
        else:  # a resumed chain: its `num_samples` draws, as `numpyro.infer.MCMC.run` counts them
            lower, phase = 0, "sample"
        bar = _Bar(kernel, upper, lower, phase, start, self.progress_rate)
        kernel._progress, self.progress_bar = bar, False
        try:
            super().run(rng_key, *args, **kwargs)
            jax.block_until_ready(self._states)
            bar.finish()
        finally:
            kernel._progress, self.progress_bar = None, True
            bar.close()


class _ArrayArguments:
    """The loop's step and postprocessing with the model's array arguments passed to the compiled loop, its other
    leaves (a ``batch_size``) static: ``sample_fn((state, data)) -> (state, data)`` and ``postprocess_fn(z, data)``,
    as NumPyro's ``jit_model_args=True`` passes every argument. NumPyro's loop without ``jit_model_args`` closes over
    the arguments, and JAX embeds a closed-over array in the program as a constant: the data were copied into the
    program, its cache key and the compiled executable (the user guide's large-data page gives the cost). The
    kernel's own compiled functions already take the data as arguments
    (:func:`~ppl_sgmcmc.numpyro.potential.split_arrays`)."""

    def __init__(self, mcmc: MCMC, args: tuple, kwargs: dict) -> None:
        self.mcmc = mcmc
        self.data, self.merge = split_arrays(as_jax_arrays((args, kwargs)))  # as the kernel sees them

    def __call__(self, val: tuple) -> tuple:
        state, data = val
        return self.mcmc.sampler.sample(state, *self.merge(data)), data

    def recentre(self, val: tuple) -> tuple:
        """The loop's value with the kernel's gradient estimator centred at the chain's position (:class:`_Accelerated`)."""
        state, data = val
        return self.mcmc.sampler._recentre(state, *self.merge(data)), data

    def postprocess(self, z: Any, data: Any) -> Any:
        """NumPyro's postprocessing of the collected latent values ``z``: the MCMC's ``postprocess_fn``, else the
        kernel's, over the chains of a vectorized run."""
        mcmc = self.mcmc
        body_fn = mcmc.postprocess_fn or mcmc.sampler.postprocess_fn(*self.merge(data))
        if mcmc.chain_method != "vectorized" or mcmc.num_chains == 1:
            return body_fn(z)
        if jax.tree.leaves(z):
            return jax.vmap(body_fn)(z)
        return jax.tree.map(lambda x: jnp.broadcast_to(x, (mcmc.num_chains, *jnp.shape(x))), body_fn(z))


class _RecentreWithArguments(NamedTuple):
    """:meth:`_ArrayArguments.recentre` for the loop of ``jit_model_args=True``, whose value is NumPyro's ``(state,
    model_args, model_kwargs)``."""

    kernel: SGMCMCKernel

    def __call__(self, val: tuple) -> tuple:
        state, args, kwargs = val
        return self.kernel._recentre(state, args, kwargs), args, kwargs


def _collect_and_postprocess(postprocess_fn: Any, collect_fields: tuple, remove_sites: tuple) -> Any:
    """NumPyro's ``_collect_and_postprocess`` (the collected fields of a state, its latent values postprocessed and
    ``remove_sites`` left out), without NumPyro's module-level cache of these functions (which would keep the run)."""

    def collect_and_postprocess(x: tuple) -> Any:
        if not collect_fields:
            return x[0]
        fields = nested_attrgetter(*collect_fields)(x[0])
        fields = [fields] if len(collect_fields) == 1 else list(fields)
        fields[0] = postprocess_fn(fields[0], *x[1:])
        if remove_sites:
            sites = dict(fields[0])
            for site in remove_sites:
                sites.pop(site)
            fields[0] = sites
        return fields[0] if len(collect_fields) == 1 else fields

    return collect_and_postprocess


class _Accelerated(NamedTuple):
    """How the collection loop runs the accelerator step (:data:`ppl_sgmcmc.numpyro.kernel.STEP_PATH`): its first
    ``warmup_calls`` calls as traced for the warm-up, the others traced after it (without the adaptation's branch);
    with a progress bar, the bar's host call after every ``chunk`` calls; with a gradient estimator that moves its
    centre every epoch (SVRG), ``recentre(val)`` before every ``epoch_calls``-th call after the warm-up, from call
    ``first_centre`` on (a loop of loops: no branch per step)."""

    warmup_calls: int
    after_warmup: Any  # the kernel's `_traced_after_warmup`
    show: Any  # the bar's `show`, or None
    chunk: int
    recentre: Any = None  # `val -> val` with the estimator's centre at the chain's position, or None
    epoch_calls: int = 0
    first_centre: int = 0

    @classmethod
    def of(cls, kernel: SGMCMCKernel, start_step: int, upper: int, recentre: Any) -> _Accelerated | None:
        """For ``kernel``'s run of ``upper`` calls from step ``start_step``, ``recentre`` moving the centre of its
        gradient estimator in the loop's value; ``None`` on the CPU step."""
        if not kernel._accelerated:
            return None
        steps = kernel._steps_per_sample
        warmup_calls = 0
        if kernel.adapts:  # the calls that end at or before the warm-up's last step
            left = kernel._num_warmup_steps - start_step
            warmup_calls = min(upper, max(0, -(-left // steps)))
        bar = kernel._progress
        accelerated = cls(warmup_calls, kernel._traced_after_warmup, None if bar is None else bar.show,
                          0 if bar is None else bar.rate)  # fmt: skip
        epoch = kernel._epoch_steps  # a multiple or a divisor of a call's steps (`Algorithm._epoch_length`)
        if epoch is None or epoch < steps:  # none, or moved inside each call (`SGMCMCKernel._sample_one`)
            return accelerated
        # the kernel's step moves the centre at its steps `i > 0` with `i % epoch == 0`; call `c` starts at step
        # `start_step + c * steps`
        first = warmup_calls + (-(start_step + warmup_calls * steps) % epoch) // steps
        first += epoch // steps if start_step + first * steps == 0 else 0
        return accelerated._replace(recentre=recentre, epoch_calls=epoch // steps, first_centre=first)


def _collection_loop(sample_fn: Any, transform: Any, lower: int, upper: int, thinning: int, size: int,
                     accelerated: _Accelerated | None = None, replays: int | None = None) -> Any:
    """``loop(init_val) -> (collection, last_val)``, compiled: ``upper`` calls of ``sample_fn`` from ``init_val``, and
    ``transform`` of every ``thinning``-th value from call ``lower`` on stored in ``size`` rows, as NumPyro's
    ``fori_collect(..., progbar=False)`` collects them (the same calls and draws). With ``accelerated``
    (:class:`_Accelerated`), the calls after the warm-up are traced without its adaptation, and a progress bar is
    drawn after each chunk of calls. With ``replays`` (the kernel's ``steps_per_sample``; a run from the start whose
    warm-up may run again, :meth:`SGMCMCKernel._replayed`), a call's index is the chain's own draw count
    (``state.i // replays``): the loop runs until it reaches ``upper``, however often the warm-up ran."""
    start = lower + (upper - lower) % thinning

    def calls(val: Any) -> Any:
        """The draws the chain made so far (its first chain's, for vectorized chains: all run together)."""
        i = val[0].i
        return (i if i.ndim == 0 else i[0]) // replays

    def _collect_draws(init_val: Any) -> Any:
        rows = jax.eval_shape(transform, init_val)
        collection = jax.tree.map(lambda x: jnp.zeros((size, *x.shape), x.dtype), rows)

        def body(i: Any, carry: tuple) -> tuple:
            val, collection = carry
            val = sample_fn(val)
            # before the collection starts the row index is out of range and the write is dropped: a select, no
            # branch in the per-step loop
            idx = jnp.where(i >= start, (i - start) // thinning, size)
            return val, jax.tree.map(lambda rows, new: rows.at[idx].set(new, mode="drop"), collection, transform(val))

        if accelerated is None and replays is not None:
            last_val, collection = lax.while_loop(lambda carry: calls(carry[0]) < upper,
                                                  lambda carry: body(calls(carry[0]), carry), (init_val, collection))
            return collection, last_val
        if accelerated is None:
            last_val, collection = lax.fori_loop(0, upper, body, (init_val, collection))
            return collection, last_val

        def run_calls(a: Any, length: int, carry: tuple) -> tuple:
            """``length`` calls from call ``a`` (traced in a loop of epochs): loops of static length (no branch on
            device data), the bar drawn after each chunk."""
            if accelerated.show is None:
                return lax.fori_loop(0, length, lambda j, carry: body(a + j, carry), carry)

            def run(base: Any, length: int, carry: tuple) -> tuple:
                carry = lax.fori_loop(0, length, lambda j, carry: body(base + j, carry), carry)
                accelerated.show(carry[0][0])
                return carry

            chunks, rest = divmod(length, accelerated.chunk)
            carry = lax.fori_loop(0, chunks, lambda c, carry: run(a + c * accelerated.chunk, accelerated.chunk, carry),
                                  carry)  # fmt: skip
            return run(a + chunks * accelerated.chunk, rest, carry) if rest else carry

        def run_epochs(a: int, b: int, carry: tuple) -> tuple:
            """Calls ``a`` to ``b - 1`` after the warm-up: with a gradient estimator's centre moved before every
            ``epoch_calls``-th from ``first_centre`` (outside the calls' loops: no branch)."""
            first, every = accelerated.first_centre, accelerated.epoch_calls
            if accelerated.recentre is None or first >= b:
                return run_calls(a, b - a, carry)
            carry = run_calls(a, first - a, carry)

            def epoch(e: Any, carry: tuple, length: int = every) -> tuple:
                val, collection = carry
                return run_calls(first + e * every, length, (accelerated.recentre(val), collection))

            epochs, rest = divmod(b - first, every)
            carry = lax.fori_loop(0, epochs, epoch, carry)
            return epoch(epochs, carry, rest) if rest else carry

        carry, split = (init_val, collection), accelerated.warmup_calls
        if split > 0 and replays is not None:  # the warm-up's calls, run again while a replay set the count back
            carry = lax.while_loop(lambda carry: calls(carry[0]) < split, lambda carry: run_calls(0, split, carry),
                                   carry)  # fmt: skip
        elif split > 0:
            carry = run_calls(0, split, carry)
        if split < upper:
            with accelerated.after_warmup():
                carry = run_epochs(split, upper, carry)
        last_val, collection = carry
        return collection, last_val

    return jax.jit(_collect_draws)


# the state's fields that the progress line (`Algorithm.progress`) does not read
_NOT_SHOWN = ("z", "batch_state", "gradient_state", "finite_position", "adapt_state", "noise", "health", "rng_key")


class _Bar:
    """A tqdm bar of ``total`` draws that the compiled step updates (:meth:`due`, :meth:`show_if`): the host callback
    runs when the draw count of this run is a multiple of ``progress_rate`` (NumPyro's default: a
    twentieth of the run) or reaches ``total``."""

    def __init__(self, kernel: SGMCMCKernel, total: int, num_warmup: int, phase: str | None, start_step: int,
                 progress_rate: int | None):
        self.kernel, self.total, self.num_warmup, self.phase = kernel, total, num_warmup, phase
        self.start = start_step
        self.replayed = 0  # the draws of the warm-up's replays so far
        self.rate = max(int(progress_rate or total / 20), 1)
        self.bar = tqdm.tqdm(total=total)
        self.bar.set_description(self._description(0), refresh=True)

    def _description(self, draws: int) -> str:
        """NumPyro's: the phase if given, else ``warmup`` before the ``num_warmup``-th draw, then ``sample``."""
        if self.phase is not None:
            return self.phase
        return "warmup" if max(draws - 1, 0) < self.num_warmup else "sample"

    def due(self, state: Any) -> Any:
        """In the compiled step: whether the bar is due for an update after the step that ended at ``state``."""
        i = state.i[0] if self.kernel._vectorized else state.i
        draws = (i - self.start) // self.kernel._steps_per_sample
        return (draws % self.rate == 0) | (draws == self.total)

    def show_if(self, due: Any, state: Any) -> None:
        """In the compiled step: :meth:`show` if ``due`` (a branch; the CPU step's)."""
        lax.cond(due, self.show, lambda s: None, state)

    def show(self, state: Any) -> None:
        """In the compiled loop: call :meth:`_show` with the first chain's state. Only the fields the diagnostics
        string reads travel to the host."""
        first = jax.tree.map(lambda x: x[0], state) if self.kernel._vectorized else state
        # of the adaptation, only how many times the warm-up ran again travels (as `adapt_state`)
        shown = first._replace(**{**dict.fromkeys(_NOT_SHOWN), "adapt_state": getattr(first.adapt_state, "rounds", None)})
        io_callback(self._show, None, shown, ordered=False)

    def _show(self, state: Any) -> None:
        rounds = 0 if state.adapt_state is None else int(state.adapt_state)
        replayed = rounds * self.num_warmup  # a warm-up run again (SGMCMCKernel._replayed) adds its draws
        self.total, self.bar.total = self.total + replayed - self.replayed, self.bar.total + replayed - self.replayed
        self.replayed = replayed
        draws = min((int(state.i) - self.start) // self.kernel._steps_per_sample + replayed, self.total)
        self.bar.set_description(self._description(draws - replayed), refresh=False)
        if not self.kernel._vectorized:
            self.bar.set_postfix_str(self.kernel.diagnostics(state), refresh=False)
        self.bar.update(draws - self.bar.n)

    def finish(self) -> None:
        self.bar.update(self.total - self.bar.n)

    def close(self) -> None:
        self.bar.close()
