"""Long runs in chunks, checkpointed to disk: an interrupted run loses at most one chunk, and calling
:func:`run` again, in the same process or a new one, continues the same chain bit for bit.

:func:`run` takes a configured ``MCMC`` object (NumPyro's or Pyro's) and runs its ``num_samples`` draws
``checkpoint_every`` at a time. The warm-up runs once, with the first chunk; each later chunk continues
from the last state of the one before, as a resumed run does (NumPyro: ``mcmc.post_warmup_state``;
Pyro: :attr:`SGMCMCKernel.resume_from <ppl_sgmcmc.pyro.kernel.SGMCMCKernel.resume_from>`). After each
chunk the checkpoint directory gets

- ``draws-00000.npz``, ``draws-00001.npz``, ...: the chunk's draws, ``(chain, draw, ...)`` arrays in the
  model's constrained space (deterministic sites included), and its per-draw statistics (``diverging``,
  ``extra_fields``, CSGLD's ``log_weight`` and ``partition``);
- ``state.pkl``: the chain's state after the chunk (a pickle), the list of chunk files, and the run's
  configuration.

Each file is written to a temporary name and renamed into place, the chunk before ``state.pkl``, so a
run killed at any moment leaves the last complete checkpoint. The draws are NumPy ``.npz`` files, one per
chunk, rather than a netCDF file: a chunk is appended by writing one small new file (netCDF through xarray
can only be rewritten whole, an O(run) cost per chunk), the arrays keep their dtypes bit for bit, and a
half-written file is never read (HDF5 files of a killed process can be left unreadable). :func:`load`
reads them as ArviZ ``InferenceData`` at any time, also while the run is going on; save that with
``idata.to_netcdf`` once the run is over.

When the run is complete, the ``MCMC`` object holds all the draws, as after one uninterrupted
``mcmc.run``: ``get_samples``, ``print_summary``/``summary``, ``to_inference_data`` (with the full-data
log-likelihood) and ``last_state`` work as usual.
"""

from __future__ import annotations

import os
import pickle
import sys
from collections.abc import Mapping
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from ppl_sgmcmc import verdict

if TYPE_CHECKING:  # pragma: no cover
    import arviz as az

__all__ = ["ChainState", "load", "run"]

STATE_FILE = "state.pkl"
_FORMAT = 1
_GROUPS = ("posterior", "sample_stats")


class ChainState(NamedTuple):
    """Everything a Pyro chain needs to continue exactly where it stopped:
    :attr:`SGMCMCKernel.last_state <ppl_sgmcmc.pyro.kernel.SGMCMCKernel.last_state>` after a run, and what
    :attr:`SGMCMCKernel.resume_from <ppl_sgmcmc.pyro.kernel.SGMCMCKernel.resume_from>` takes. It pickles.

    - **state**: the kernel's :class:`~ppl_sgmcmc.pyro.kernel.SGMCMCState` after the chain's last step: the
      position, the rule's state (momentum, thermostat, preconditioner, CSGLD's ``θ`` and grid), the step
      counter that drives the schedules, the minibatch sampler's position, the number of rejected steps.
    - **generator_state**: the state of the chain's ``torch.Generator`` (``generator.get_state()``), which
      draws the minibatches and the noise.
    - **num_warmup**: the warm-up of the chain's first run, in SG-MCMC steps (draws × ``steps_per_sample``). A
      continued chain keeps it for what depends on it (the adaptation's windows, CSGLD's calibration and
      adaptation windows, SGFS's ``fisher_window``) although the continuation itself has no warm-up.

    **Example** (five steps, then three more from the state: the same chain as eight steps in one go)::

        >>> import torch, pyro
        >>> from pyro.infer import MCMC
        >>> from ppl_sgmcmc.pyro import SGNHT
        >>> def chain(num_samples, resume_from=None):
        ...     kernel = SGNHT(potential_fn=lambda z: 0.5 * (z["x"] ** 2).sum(), step_size=0.1)
        ...     kernel.resume_from = resume_from
        ...     mcmc = MCMC(kernel, warmup_steps=0, num_samples=num_samples, initial_params={"x": torch.ones(2)},
        ...                 disable_progbar=True)
        ...     mcmc.run()
        ...     return mcmc.get_samples()["x"], kernel.last_state
        >>> pyro.set_rng_seed(0)
        >>> whole, _ = chain(8)
        >>> pyro.set_rng_seed(0)
        >>> first, state = chain(5)
        >>> state.state.i, state.num_warmup, state.generator_state.dtype
        (5, 0, torch.uint8)
        >>> rest, _ = chain(3, resume_from=state)
        >>> torch.equal(torch.cat([first, rest]), whole)
        True
    """

    state: Any
    generator_state: Any
    num_warmup: int


# --- the public functions ----------------------------------------------------------------------------------------------
def run(mcmc: Any, *args: Any, checkpoint: str | os.PathLike[str], checkpoint_every: int, **kwargs: Any) -> None:
    """``mcmc.run(*args, **kwargs)`` in chunks of ``checkpoint_every`` draws, each saved to the directory
    ``checkpoint`` as soon as it is drawn; if the directory already holds a checkpoint of this run, the run
    continues from it (or, if it is complete, only loads it).

    :param mcmc: a :class:`numpyro.infer.MCMC` (any ``num_chains`` and ``chain_method``; ``thinning``
        must divide ``num_samples`` and ``checkpoint_every``) or a :class:`pyro.infer.MCMC` with one chain
        (``num_chains=1``), of an SG-MCMC kernel; its ``num_warmup``/``warmup_steps`` and ``num_samples``
        are the run's.
    :param args: what ``mcmc.run`` takes: for NumPyro the PRNG key, then the model's arguments; for Pyro
        the model's arguments. When the run continues from a checkpoint, the key is not used (the chain's
        key is in its state) and Pyro's global seed does not matter (the chain's generator is).
    :param checkpoint: the checkpoint directory (created if needed).
    :param checkpoint_every: the draws per chunk (counted as ``num_samples`` counts them, before
        thinning): at most this many are lost when the run is interrupted.
    :param kwargs: ``mcmc.run``'s keyword arguments (NumPyro's ``extra_fields`` and ``init_params``, the
        model's keyword arguments).
    :raises ValueError: if the directory holds a checkpoint of another run (another kernel, warm-up,
        number of chains, thinning or ``extra_fields``) or of more draws than ``num_samples``.

    To continue a finished run, call it again with a larger ``num_samples``: the chain goes on. The model's
    arguments are not checked against the checkpoint's: give the same data.

    **Example** (40 draws in chunks of 10; a second call finds the run complete and only loads it)::

        >>> import tempfile, jax, jax.numpy as jnp
        >>> from numpyro.infer import MCMC
        >>> from ppl_sgmcmc import checkpoint
        >>> from ppl_sgmcmc.numpyro import SGLD
        >>> def make_mcmc():
        ...     kernel = SGLD(potential_fn=lambda z: 0.5 * jnp.sum(z["x"] ** 2), step_size=0.1)
        ...     return MCMC(kernel, num_warmup=20, num_samples=40, progress_bar=False)
        >>> tmp = tempfile.TemporaryDirectory()
        >>> mcmc = make_mcmc()
        >>> checkpoint.run(mcmc, jax.random.PRNGKey(0), init_params={"x": jnp.ones(2)},
        ...                checkpoint=tmp.name, checkpoint_every=10)
        >>> mcmc.get_samples()["x"].shape, int(mcmc.last_state.i)  # 20 warm-up + 40 steps
        ((40, 2), 60)
        >>> again = make_mcmc()
        >>> checkpoint.run(again, jax.random.PRNGKey(0), init_params={"x": jnp.ones(2)},
        ...                checkpoint=tmp.name, checkpoint_every=10)
        >>> bool(jnp.array_equal(again.get_samples()["x"], mcmc.get_samples()["x"]))
        True
        >>> tmp.cleanup()

    The same with Pyro (one chain)::

        >>> import torch, pyro
        >>> from pyro.infer import MCMC
        >>> from ppl_sgmcmc.pyro import SGLD
        >>> pyro.set_rng_seed(0)
        >>> kernel = SGLD(potential_fn=lambda z: 0.5 * (z["x"] ** 2).sum(), step_size=0.1)
        >>> mcmc = MCMC(kernel, warmup_steps=20, num_samples=40, initial_params={"x": torch.ones(2)},
        ...             disable_progbar=True)
        >>> tmp = tempfile.TemporaryDirectory()
        >>> checkpoint.run(mcmc, checkpoint=tmp.name, checkpoint_every=10)
        >>> mcmc.get_samples()["x"].shape, kernel.last_state.state.i
        (torch.Size([40, 2]), 60)
        >>> tmp.cleanup()
    """
    every = _positive_int("checkpoint_every", checkpoint_every)
    directory = Path(checkpoint)
    directory.mkdir(parents=True, exist_ok=True)
    backend = _backend(mcmc)
    kernel = mcmc.sampler if backend == "numpyro" else mcmc.kernel
    own_verdict = getattr(mcmc, "verdict", None)  # `ppl_sgmcmc.numpyro.MCMC` judges each run: here, each chunk
    kernel._judged_after_run = True  # the chunks are judged together, at the end
    if own_verdict is not None:
        mcmc.verdict = False
    try:
        if backend == "numpyro":
            _run_numpyro(mcmc, args, dict(kwargs), directory, every)
        else:
            _run_pyro(mcmc, args, dict(kwargs), directory, every)
    finally:
        kernel._judged_after_run = False
        if own_verdict is not None:
            mcmc.verdict = own_verdict
    # the whole run's draws, as one uninterrupted run is judged: a sampler's draws of a latent dict, enough of them
    last = getattr(mcmc, "last_state", None)  # NumPyro's; Pyro's latents are always a dict
    judged = (own_verdict is not False and kernel.samples_posterior and getattr(mcmc, "postprocess_fn", None) is None
              and isinstance(getattr(last, "z", {}), Mapping))  # fmt: skip
    if judged and mcmc.num_samples // getattr(mcmc, "thinning", 1) >= verdict.MIN_DRAWS:
        from ppl_sgmcmc import diagnostics

        result = diagnostics.verdict(mcmc, warn=False)
        reporter = getattr(kernel, "_health", None)  # none if every chunk was on disk already: the kernel never ran
        if reporter is None or not reporter.reported:  # a failed health check already named the specific failure
            verdict.report(result, kernel.name)


def load(checkpoint: str | os.PathLike[str]) -> az.InferenceData:
    """The draws saved so far in the checkpoint directory of :func:`run`, as ArviZ ``InferenceData``:
    ``posterior`` (constrained values, deterministic sites included) and ``sample_stats`` (``diverging``,
    the ``extra_fields`` collected, CSGLD's ``log_weight`` and ``partition``; a collected ``potential_energy``
    becomes ``minibatch_lp = -Ũ_t``, as in ``to_inference_data``). It can be called at any time, from any
    process, also while the run goes on. For the full-data log-likelihood and ``observed_data``, call the
    backend's ``to_inference_data`` on the ``MCMC`` object once :func:`run` has finished.

    :param checkpoint: the directory given to :func:`run`.
    :raises FileNotFoundError: if it holds no checkpoint.

    **Example** (a run of 30 draws in chunks of 10, read back)::

        >>> import tempfile, jax, jax.numpy as jnp
        >>> from numpyro.infer import MCMC
        >>> from ppl_sgmcmc import checkpoint
        >>> from ppl_sgmcmc.numpyro import SGLD
        >>> kernel = SGLD(potential_fn=lambda z: 0.5 * jnp.sum(z["x"] ** 2), step_size=0.1)
        >>> mcmc = MCMC(kernel, num_warmup=10, num_samples=30, progress_bar=False)
        >>> tmp = tempfile.TemporaryDirectory()
        >>> checkpoint.run(mcmc, jax.random.PRNGKey(0), init_params={"x": jnp.ones(2)},
        ...                extra_fields=("potential_energy",), checkpoint=tmp.name, checkpoint_every=10)
        >>> idata = checkpoint.load(tmp.name)
        >>> idata.posterior["x"].shape, sorted(idata.sample_stats.data_vars)
        ((1, 30, 2), ['diverging', 'minibatch_lp', 'noise_ratio', 'noise_variance', 'step_size'])
        >>> tmp.cleanup()
    """
    import arviz as az

    directory = Path(checkpoint)
    manifest = _read_manifest(directory)
    if manifest is None:
        raise FileNotFoundError(f"{os.fspath(directory)!r} holds no checkpoint (no {STATE_FILE}).")
    draws = _read_draws(directory, manifest["chunks"])
    stats = dict(draws["sample_stats"])
    if "potential_energy" in stats:
        stats["minibatch_lp"] = -stats.pop("potential_energy")
    return az.from_dict(posterior=draws["posterior"], sample_stats=stats or None)


# --- NumPyro -----------------------------------------------------------------------------------------------------------
def _run_numpyro(mcmc: Any, args: tuple, kwargs: dict, directory: Path, every: int) -> None:
    import jax.numpy as jnp

    if not args:
        raise TypeError("checkpoint.run(mcmc, rng_key, *model_args, ...): give the PRNG key, as to `mcmc.run`.")
    rng_key, model_args = args[0], tuple(args[1:])
    extra_fields = tuple(kwargs.pop("extra_fields", ()))
    init_params = kwargs.pop("init_params", None)
    total, thinning = mcmc.num_samples, mcmc.thinning
    if total % thinning or every % thinning:
        raise ValueError(
            f"checkpoint.run: `thinning` ({thinning}) must divide `num_samples` ({total}) and `checkpoint_every` "
            f"({every}), so that every chunk keeps the draws one run would keep."
        )
    config = {
        "backend": "numpyro",
        "kernel": type(mcmc.sampler).__name__,
        "num_warmup": mcmc.num_warmup,
        "num_chains": mcmc.num_chains,
        "thinning": thinning,
        "extra_fields": extra_fields,
    }
    done, chunks, state, _ = _resume(directory, config, total)
    sample_field = attrgetter(mcmc.sampler.sample_field)
    user_state = mcmc.post_warmup_state
    try:
        while done < total:
            n = min(every, total - done)
            mcmc.num_samples = n
            mcmc._set_collection_params()  # NumPyro reads the draws to collect from these, set at construction
            if state is None:  # the first chunk: the warm-up, then n draws
                mcmc.run(rng_key, *model_args, extra_fields=extra_fields, init_params=init_params, **kwargs)
            else:  # continue the chain; its position doubles as `init_params`, which a fresh kernel's init needs
                mcmc.post_warmup_state = state
                mcmc.run(
                    state.rng_key, *model_args, extra_fields=extra_fields, init_params=sample_field(state), **kwargs
                )
            state = mcmc.last_state
            mcmc.sampler.report_health(state)  # at every chunk: a long run that goes wrong says so early
            draws = {
                "posterior": _as_numpy(mcmc.get_samples(group_by_chain=True), "samples"),
                "sample_stats": _as_numpy(mcmc.get_extra_fields(group_by_chain=True), "extra fields"),
            }
            done, chunks = _save_chunk(directory, config, chunks, draws, done + n, state)
    finally:
        mcmc.num_samples = total
        mcmc._set_collection_params()
        mcmc.post_warmup_state = user_state
    # all the draws, as one uninterrupted `mcmc.run` leaves them
    draws = _read_draws(directory, chunks)
    states: dict[str, Any] = {field: jnp.asarray(value) for field, value in draws["sample_stats"].items()}
    states[mcmc._sample_field] = {name: jnp.asarray(value) for name, value in draws["posterior"].items()}
    mcmc._states, mcmc._states_flat = states, None
    mcmc._last_state = state
    mcmc._args, mcmc._kwargs = model_args, kwargs


# --- Pyro --------------------------------------------------------------------------------------------------------------
def _run_pyro(mcmc: Any, args: tuple, kwargs: dict, directory: Path, every: int) -> None:
    import torch

    kernel = mcmc.kernel
    if not (hasattr(kernel, "last_state") and hasattr(kernel, "resume_from")):
        raise TypeError("checkpoint.run: expected a Pyro `MCMC` of a ppl_sgmcmc kernel.")
    if mcmc.num_chains != 1:
        raise ValueError(
            "checkpoint.run: a Pyro `MCMC` with num_chains=1 (Pyro runs each chain from a fresh `setup`); run one "
            "checkpointed `MCMC` per chain, each with its own seed and checkpoint directory."
        )
    sampler = mcmc.sampler
    total, warmup = mcmc.num_samples, mcmc.warmup_steps
    config = {
        "backend": "pyro",
        "kernel": type(kernel).__name__,
        "num_warmup": warmup,
        "num_chains": 1,
        "thinning": 1,
        "extra_fields": (),
    }
    done, chunks, state, diagnostics = _resume(directory, config, total)
    try:
        while done < total:
            n = min(every, total - done)
            mcmc.num_samples = sampler.num_samples = n
            if state is not None:  # continue the chain, without a warm-up
                kernel.resume_from = state
                mcmc.warmup_steps = sampler.warmup_steps = 0
            mcmc.run(*args, **kwargs)
            state, diagnostics = kernel.last_state, mcmc._diagnostics
            stats = {"diverging": np.zeros((1, n), bool)}
            stats["diverging"][0, diagnostics[0]["divergences"]] = True
            stats.update({field: np.asarray(diagnostics[0][field])[None] for field in kernel.recorded_fields})
            draws = {
                "posterior": {k: v.detach().cpu().numpy() for k, v in mcmc.get_samples(group_by_chain=True).items()},
                "sample_stats": stats,
            }
            done, chunks = _save_chunk(directory, config, chunks, draws, done + n, state, diagnostics)
    finally:
        mcmc.num_samples = sampler.num_samples = total
        mcmc.warmup_steps = sampler.warmup_steps = warmup
        if state is not None and kernel.resume_from is state:  # interrupted before the chunk started
            kernel.resume_from = None
    draws = _read_draws(directory, chunks)
    mcmc._samples = {name: torch.from_numpy(value) for name, value in draws["posterior"].items()}
    stats = draws["sample_stats"]
    mcmc._diagnostics = [
        {
            **chain,
            "divergences": np.flatnonzero(stats["diverging"][c]).tolist(),
            **{field: stats[field][c].tolist() for field in kernel.recorded_fields if field in stats},
        }
        for c, chain in enumerate(diagnostics)
    ]
    mcmc._args, mcmc._kwargs = args, kwargs


# --- the files ---------------------------------------------------------------------------------------------------------
def _resume(directory: Path, config: dict, total: int) -> tuple[int, list[str], Any, Any]:
    """``(draws done, chunk files, state, diagnostics)`` of the checkpoint in ``directory``, checked against
    this run's ``config``; nothing done if there is none."""
    manifest = _read_manifest(directory)
    if manifest is None:
        return 0, [], None, None
    for key, value in config.items():
        if manifest.get(key) != value:
            raise ValueError(
                f"checkpoint.run: {os.fspath(directory)!r} holds a run with {key}={manifest.get(key)!r}, not "
                f"{value!r}; use another directory for another run."
            )
    if manifest["num_draws"] > total:
        raise ValueError(
            f"checkpoint.run: {os.fspath(directory)!r} holds {manifest['num_draws']} draws, more than "
            f"num_samples={total}."
        )
    return manifest["num_draws"], list(manifest["chunks"]), manifest["state"], manifest.get("diagnostics")


def _save_chunk(
    directory: Path, config: dict, chunks: list[str], draws: dict, done: int, state: Any, diagnostics: Any = None
) -> tuple[int, list[str]]:
    """Write a chunk's draws, then the state that follows them (the checkpoint is the state file: a chunk
    file it does not list is ignored, and overwritten by the next run)."""
    name = f"draws-{len(chunks):05d}.npz"
    arrays = {f"{group}/{key}": value for group in _GROUPS for key, value in draws[group].items()}
    _write_atomic(directory / name, lambda f: np.savez(f, **arrays))
    chunks = [*chunks, name]
    manifest = {
        "format": _FORMAT,
        **config,
        "num_draws": done,
        "chunks": chunks,
        "state": state,
        "diagnostics": diagnostics,
    }
    _write_atomic(directory / STATE_FILE, lambda f: pickle.dump(manifest, f, protocol=pickle.HIGHEST_PROTOCOL))
    return done, chunks


def _read_manifest(directory: Path) -> dict | None:
    path = directory / STATE_FILE
    if not path.exists():
        return None
    with open(path, "rb") as f:
        manifest = pickle.load(f)
    if manifest.get("format") != _FORMAT:
        raise ValueError(f"{os.fspath(path)!r}: not a checkpoint of this version of ppl_sgmcmc.")
    return manifest


def _read_draws(directory: Path, chunks: list[str]) -> dict[str, dict[str, np.ndarray]]:
    """``{"posterior": {...}, "sample_stats": {...}}``: the chunks' arrays joined along the draw axis."""
    parts: dict[str, dict[str, list[np.ndarray]]] = {group: {} for group in _GROUPS}
    for name in chunks:
        with np.load(directory / name) as arrays:
            for key in arrays.files:
                group, field = key.split("/", 1)
                parts[group].setdefault(field, []).append(arrays[key])
    return {group: {k: np.concatenate(v, axis=1) for k, v in fields.items()} for group, fields in parts.items()}


def _write_atomic(path: Path, write: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# --- helpers -----------------------------------------------------------------------------------------------------------
def _backend(mcmc: Any) -> str:
    numpyro_mcmc = getattr(sys.modules.get("numpyro.infer.mcmc"), "MCMC", None)
    if numpyro_mcmc is not None and isinstance(mcmc, numpyro_mcmc):
        return "numpyro"
    pyro_mcmc = getattr(sys.modules.get("pyro.infer.mcmc.api"), "MCMC", None)
    if pyro_mcmc is not None and isinstance(mcmc, pyro_mcmc):
        return "pyro"
    raise TypeError(f"checkpoint.run: expected a NumPyro or Pyro `MCMC`, got {type(mcmc).__name__}.")


def _as_numpy(tree: Any, what: str) -> dict[str, np.ndarray]:
    if not isinstance(tree, Mapping):
        raise TypeError(f"checkpoint.run: the {what} must be a dict of arrays, got {type(tree).__name__}.")
    return {str(name): np.asarray(value) for name, value in tree.items()}


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ValueError(f"checkpoint.run: `{name}` must be a positive integer, got {value!r}.")
    return int(value)
