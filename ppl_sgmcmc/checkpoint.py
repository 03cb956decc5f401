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
- ``state-NNNNN.npz``: the chain's state after the last chunk, one array per leaf of its pytree (``NNNNN`` is
  the chunk's index; the previous one is removed);
- ``manifest.json``: the format version, the run's configuration, each chunk's file, index, number of draws,
  size and SHA-256 checksum, the state file's size and checksum, the state's structure (the pytree as JSON:
  tuples, lists, dicts, Python numbers and strings, ``NamedTuple`` classes by name, each array leaf by its
  name in the state file, its type (NumPy, JAX, torch), its dtype and, for torch, its device), a fingerprint
  of the run's data, and a checksum of the manifest itself.

Nothing in a checkpoint is a pickle: the arrays are read with ``np.load(..., allow_pickle=False)`` and the
state is rebuilt from the JSON by code that knows its types (a ``NamedTuple`` class is taken from
:mod:`ppl_sgmcmc` or from a module the process has already imported, and filled without calling its
code), so reading a checkpoint runs no code that the files could bring. Every file is checked against the
manifest's checksums when it is read: a missing, truncated, damaged or swapped file raises a ``ValueError``
that names it. Checkpoints of ppl_sgmcmc before format 2 (``state.pkl``, a pickle) are read only with
``allow_pickle=True``, with a warning; the next chunk rewrites them in the current format.

Each file is written to a temporary name and renamed into place, the chunk and the state before the
manifest, so a run killed at any moment leaves the last complete checkpoint. The draws are NumPy ``.npz``
files, one per chunk, rather than a netCDF file: a chunk is appended by writing one small new file (netCDF
through xarray can only be rewritten whole, an O(run) cost per chunk), the arrays keep their dtypes bit for
bit, and a half-written file is never read (HDF5 files of a killed process can be left unreadable).
:func:`load` reads them as ArviZ ``InferenceData`` at any time, also while the run is going on; save that
with ``idata.to_netcdf`` once the run is over.

When the run is complete, the ``MCMC`` object holds all the draws, as after one uninterrupted
``mcmc.run``: ``get_samples``, ``print_summary``/``summary``, ``to_inference_data`` (with the full-data
log-likelihood) and ``last_state`` work as usual.
"""

from __future__ import annotations

import hashlib
import importlib
import io
import json
import os
import pickle
import sys
import warnings
from collections.abc import Mapping
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from ppl_sgmcmc import _checks, gradients, verdict

if TYPE_CHECKING:  # pragma: no cover
    import arviz as az

__all__ = ["ChainState", "load", "run"]

MANIFEST_FILE = "manifest.json"
LEGACY_STATE_FILE = "state.pkl"  # format 1: the whole checkpoint in one pickle
_FORMAT = 2
_LEGACY_FORMAT = 1
_GROUPS = ("posterior", "sample_stats")
_CONFIG_KEYS = ("backend", "kernel", "num_warmup", "num_chains", "thinning", "extra_fields")
_MANIFEST_KEYS = {"format", *_CONFIG_KEYS, "num_draws", "chunks", "state", "data"}
_FULL_HASH_BYTES = 1 << 24  # a data array up to 16 MiB is hashed whole; a larger one by a strided sample
_SAMPLE_SIZE = 1 << 16  # the values of that sample
_FIX = "restore the file (e.g. from a backup), or start the run again in a new directory"


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
def run(
    mcmc: Any,
    *args: Any,
    checkpoint: str | os.PathLike[str],
    checkpoint_every: int,
    check_data: bool = True,
    allow_pickle: bool = False,
    **kwargs: Any,
) -> None:
    """``mcmc.run(*args, **kwargs)`` in chunks of ``checkpoint_every`` draws, each saved to the directory
    ``checkpoint`` as soon as it is drawn; if the directory already holds a checkpoint of this run, the run
    continues from it (or, if it is complete, only loads it). The checkpoint holds no pickle: ``.npz`` arrays
    and a JSON manifest (see the module's description); every file is checked against its checksum when read.

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
    :param check_data: refuse to continue a checkpoint whose run had other data (default). The checkpoint
        keeps a fingerprint of the model's arguments (``args`` after NumPyro's key, and the model's keyword
        arguments): each array's shape, dtype and SHA-256 hash (of all its values up to 16 MiB; beyond, of
        65,536 values at a regular stride: a change elsewhere goes unnoticed), and the value of each Python
        scalar or string. ``False`` continues the chain with these data anyway (and keeps their fingerprint
        for the next call).
    :param allow_pickle: read a checkpoint of the format before 2 (``state.pkl``, a pickle), with a warning:
        reading a pickle can run any code the file holds, so do it only for a file you trust. The next chunk
        rewrites the checkpoint in the current format, which holds no pickle.
    :param kwargs: ``mcmc.run``'s keyword arguments (NumPyro's ``extra_fields`` and ``init_params``, the
        model's keyword arguments).
    :raises ValueError: if the directory holds a checkpoint of another run (another kernel, warm-up,
        number of chains, thinning or ``extra_fields``), of more draws than ``num_samples`` or, unless
        ``check_data=False``, of other data; if one of its files is missing, truncated, damaged or swapped (the
        manifest's checksums); if it is a pickle (format 1) and ``allow_pickle`` is not set.
    :raises TypeError: if the chain's state holds something a checkpoint cannot store (see the module's
        description).

    To continue a finished run, call it again with a larger ``num_samples``: the chain goes on.

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
    check_data = _checks.boolean("check_data", check_data, "checkpoint.run")
    allow_pickle = _checks.boolean("allow_pickle", allow_pickle, "checkpoint.run")
    directory = Path(checkpoint)
    directory.mkdir(parents=True, exist_ok=True)
    backend = _backend(mcmc)
    kernel = mcmc.sampler if backend == "numpyro" else mcmc.kernel
    own_verdict = getattr(mcmc, "verdict", None)  # `ppl_sgmcmc.numpyro.MCMC` judges each run: here, each chunk
    judge = own_verdict if isinstance(own_verdict, str) else "parameters"
    from ppl_sgmcmc import diagnostics

    if judge == "predictions":  # refused before the run, not after it
        diagnostics._check_predictions(kernel, "checkpoint.run")
    kernel._judged_after_run = True  # the chunks are judged together, at the end
    if own_verdict is not None:
        mcmc.verdict = False
    try:
        options = _Options(directory, every, check_data, allow_pickle)
        if backend == "numpyro":
            _run_numpyro(mcmc, args, dict(kwargs), options)
        else:
            _run_pyro(mcmc, args, dict(kwargs), options)
    finally:
        kernel._judged_after_run = False
        if own_verdict is not None:
            mcmc.verdict = own_verdict
    # the whole run's draws, as one uninterrupted run is judged: a sampler's draws of a latent dict, enough of them
    last = getattr(mcmc, "last_state", None)  # NumPyro's; Pyro's latents are always a dict
    judged = (own_verdict is not False and kernel.samples_posterior and getattr(mcmc, "postprocess_fn", None) is None
              and isinstance(getattr(last, "z", {}), Mapping))  # fmt: skip
    if judged and mcmc.num_samples // getattr(mcmc, "thinning", 1) >= verdict.MIN_DRAWS:
        result = diagnostics.verdict(mcmc, warn=False, judge=judge)
        reporter = getattr(kernel, "_health", None)  # none if every chunk was on disk already: the kernel never ran
        if reporter is None or not reporter.named_failure:  # a failed health check already named the failure
            verdict.report(result, kernel.name)


def load(checkpoint: str | os.PathLike[str], *, allow_pickle: bool = False) -> az.InferenceData:
    """The draws saved so far in the checkpoint directory of :func:`run`, as ArviZ ``InferenceData``:
    ``posterior`` (constrained values, deterministic sites included) and ``sample_stats`` (``diverging``,
    the ``extra_fields`` collected, CSGLD's ``log_weight`` and ``partition``; a collected ``potential_energy``
    becomes ``minibatch_lp = -Ũ_t``, as in ``to_inference_data``). It can be called at any time, from any
    process, also while the run goes on. For the full-data log-likelihood and ``observed_data``, call the
    backend's ``to_inference_data`` on the ``MCMC`` object once :func:`run` has finished.

    :param checkpoint: the directory given to :func:`run`.
    :param allow_pickle: read a checkpoint of the format before 2 (``state.pkl``, a pickle), with a warning
        (reading a pickle can run any code the file holds: only for a file you trust).
    :raises FileNotFoundError: if it holds no checkpoint.
    :raises ValueError: if the manifest or a chunk file is missing, truncated, damaged or swapped (the
        manifest's checksums), or if the checkpoint is a pickle (format 1) and ``allow_pickle`` is not set.

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
    manifest = _read_manifest(directory, allow_pickle)
    if manifest is None:
        raise FileNotFoundError(f"{os.fspath(directory)!r} holds no checkpoint (no {MANIFEST_FILE}).")
    draws = _read_draws(directory, manifest["chunks"])
    stats = dict(draws["sample_stats"])
    if "potential_energy" in stats:
        stats["minibatch_lp"] = -stats.pop("potential_energy")
    return az.from_dict(posterior=draws["posterior"], sample_stats=stats or None)


class _Options(NamedTuple):
    """:func:`run`'s checkpoint options."""

    directory: Path
    every: int
    check_data: bool
    allow_pickle: bool


# --- NumPyro -----------------------------------------------------------------------------------------------------------
def _run_numpyro(mcmc: Any, args: tuple, kwargs: dict, options: _Options) -> None:
    import jax.numpy as jnp

    if not args:
        raise TypeError("checkpoint.run(mcmc, rng_key, *model_args, ...): give the PRNG key, as to `mcmc.run`.")
    rng_key, model_args = args[0], tuple(args[1:])
    extra_fields = tuple(kwargs.pop("extra_fields", ()))
    init_params = kwargs.pop("init_params", None)
    total, thinning, every = mcmc.num_samples, mcmc.thinning, options.every
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
        "extra_fields": list(extra_fields),
    }
    data = _fingerprint(model_args, kwargs)
    done, chunks, state, _ = _resume(options, config, total, data)
    _check_estimator(mcmc.sampler, state, options.directory)
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
            chunks = _save_chunk(options.directory, config, chunks, draws, n, state, None, data)
            done += n
    finally:
        mcmc.num_samples = total
        mcmc._set_collection_params()
        mcmc.post_warmup_state = user_state
    # all the draws, as one uninterrupted `mcmc.run` leaves them
    draws = _read_draws(options.directory, chunks)
    states: dict[str, Any] = {field: jnp.asarray(value) for field, value in draws["sample_stats"].items()}
    states[mcmc._sample_field] = {name: jnp.asarray(value) for name, value in draws["posterior"].items()}
    mcmc._states, mcmc._states_flat = states, None
    mcmc._last_state = state
    mcmc._args, mcmc._kwargs = model_args, kwargs


# --- Pyro --------------------------------------------------------------------------------------------------------------
def _run_pyro(mcmc: Any, args: tuple, kwargs: dict, options: _Options) -> None:
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
        "extra_fields": [],
    }
    data = _fingerprint(args, kwargs)
    done, chunks, state, diagnostics = _resume(options, config, total, data)
    _check_estimator(kernel, state, options.directory)
    try:
        while done < total:
            n = min(options.every, total - done)
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
            chunks = _save_chunk(options.directory, config, chunks, draws, n, state, diagnostics, data)
            done += n
    finally:
        mcmc.num_samples = sampler.num_samples = total
        mcmc.warmup_steps = sampler.warmup_steps = warmup
        if state is not None and kernel.resume_from is state:  # interrupted before the chunk started
            kernel.resume_from = None
    draws = _read_draws(options.directory, chunks)
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
def _resume(options: _Options, config: dict, total: int, data: list[dict]) -> tuple[int, list[dict], Any, Any]:
    """``(draws done, chunk entries, state, diagnostics)`` of the checkpoint in the directory, checked against
    this run's ``config`` and ``data`` and read back (every file against its checksum); nothing done if there
    is none."""
    directory = options.directory
    manifest = _read_manifest(directory, options.allow_pickle)
    if manifest is None:
        return 0, [], None, None
    for key, value in config.items():
        if manifest[key] != value:
            raise ValueError(
                f"checkpoint.run: {os.fspath(directory)!r} holds a run with {key}={manifest[key]!r}, not "
                f"{value!r}; use another directory for another run."
            )
    if manifest["num_draws"] > total:
        raise ValueError(
            f"checkpoint.run: {os.fspath(directory)!r} holds {manifest['num_draws']} draws, more than "
            f"num_samples={total}."
        )
    if options.check_data and manifest["data"] is not None and manifest["data"] != data:
        raise ValueError(
            f"checkpoint.run: the model's data are not those of the run in {os.fspath(directory)!r}: "
            f"{_data_differences(manifest['data'], data)}. Give the data of that run, or pass check_data=False "
            "to continue its chain with these data."
        )
    checksums = {entry["sha256"]: entry for entry in manifest["chunks"]}
    for entry in manifest["chunks"]:  # a damaged chunk fails now, not after the new ones
        _read_chunk(directory, entry, checksums)
    saved = _read_state(directory, manifest["state"])
    return manifest["num_draws"], manifest["chunks"], saved["state"], saved["diagnostics"]


def _check_estimator(kernel: Any, state: Any, directory: Path) -> None:
    """The saved chain (``state``; ``None``: nothing saved) took its gradients with an estimator of the kernel's kind:
    one with a centre (``"svrg"``, ``"control_variates"``) or the minibatch gradient, which keeps no state. Another
    kind's state does not fit the kernel's step."""
    if state is None:
        return
    centred = isinstance(getattr(state, "state", state).gradient_state, gradients.Centre)
    estimator = kernel.gradient_estimator
    if centred == estimator.needs_full_gradient:
        return
    saved = "an estimator with a centre ('svrg' or 'control_variates')" if centred else "the minibatch gradient"
    raise ValueError(
        f"checkpoint.run: the chain in {os.fspath(directory)!r} took its gradients with {saved}, but this kernel "
        f"takes them with {estimator.name!r}: build the kernel with the run's `gradient` to continue its chain "
        "(SGHMC's and SGNHT's default with a tuned step size is 'svrg' where the model allows it; a run of theirs "
        "with the minibatch gradient continues with gradient='minibatch')."
    )


def _save_chunk(
    directory: Path,
    config: dict,
    chunks: list[dict],
    draws: dict,
    num_draws: int,
    state: Any,
    diagnostics: Any,
    data: list[dict],
) -> list[dict]:
    """Write a chunk's draws, the state that follows them, then the manifest that lists both (the checkpoint
    is the manifest: a file it does not list is ignored, and overwritten by the next run); the chunk entries
    after it."""
    index = len(chunks)
    arrays = {f"{group}/{key}": value for group in _GROUPS for key, value in draws[group].items()}
    chunk = {"index": index, "num_draws": num_draws, **_write_npz(directory / f"draws-{index:05d}.npz", arrays)}
    chunks = [*chunks, chunk]
    leaves: dict[str, np.ndarray] = {}
    tree = _encode({"state": state, "diagnostics": diagnostics}, leaves)
    state_file = {**_write_npz(directory / f"state-{index:05d}.npz", leaves), "tree": tree}
    manifest = {
        "format": _FORMAT,
        **config,
        "num_draws": sum(entry["num_draws"] for entry in chunks),
        "chunks": chunks,
        "state": state_file,
        "data": data,
    }
    text = json.dumps({**manifest, "checksum": _digest(manifest)}, sort_keys=True, indent=1, allow_nan=False)
    _write_atomic(directory / MANIFEST_FILE, text.encode())
    for stale in [*directory.glob("state-*.npz"), directory / LEGACY_STATE_FILE]:  # the states this one replaces
        if stale.name != state_file["file"]:
            stale.unlink(missing_ok=True)
    return chunks


def _read_manifest(directory: Path, allow_pickle: bool) -> dict | None:
    """The checkpoint's manifest, checked; ``None`` if there is none. A format-1 checkpoint (a pickle) is
    read only with ``allow_pickle``, and converted."""
    path = directory / MANIFEST_FILE
    if not path.exists():
        legacy = directory / LEGACY_STATE_FILE
        return _read_legacy(legacy, allow_pickle) if legacy.exists() else None
    where = f"checkpoint: {os.fspath(path)!r}"
    try:
        manifest = json.loads(path.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise ValueError(
            f"{where} is not a checkpoint manifest (empty, truncated or damaged: {error}); {_FIX}."
        ) from None
    if not isinstance(manifest, dict) or "checksum" not in manifest:
        raise ValueError(f"{where} is not a checkpoint manifest of ppl_sgmcmc (it has no checksum); {_FIX}.")
    checksum, version = manifest.pop("checksum"), manifest.get("format")
    if isinstance(version, int) and version > _FORMAT:
        raise ValueError(
            f"{where} is of format {version}, newer than this ppl_sgmcmc's ({_FORMAT}): update ppl_sgmcmc."
        )
    if checksum != _digest(manifest):
        raise ValueError(f"{where}: its contents do not match its checksum (it was changed or damaged); {_FIX}.")
    if version != _FORMAT or not _MANIFEST_KEYS <= manifest.keys():
        raise ValueError(f"{where} is not a checkpoint manifest of format {_FORMAT}; {_FIX}.")
    return manifest


def _read_legacy(path: Path, allow_pickle: bool) -> dict:
    """The manifest of a format-1 checkpoint (``state.pkl``, a pickle) in the current format, its chunks'
    checksums computed from their files; the state is kept as the unpickled objects (``state["objects"]``)."""
    if not allow_pickle:
        raise ValueError(
            f"checkpoint: {os.fspath(path)!r} is a checkpoint of an older ppl_sgmcmc (format {_LEGACY_FORMAT}, a "
            "pickle). Reading a pickle can run any code the file holds, so it is read only on request: if you trust "
            "this file, pass allow_pickle=True to checkpoint.run or checkpoint.load (the next chunk rewrites the "
            f"checkpoint in format {_FORMAT}, which holds no pickle)."
        )
    warnings.warn(
        f"checkpoint: reading {os.fspath(path)!r}, a pickle (allow_pickle=True): reading a pickle can run any code "
        f"the file holds; read only files you trust. The next chunk rewrites the checkpoint in format {_FORMAT}, "
        "which holds no pickle.",
        UserWarning,
        stacklevel=2,
    )
    try:
        with open(path, "rb") as f:
            old = pickle.load(f)
        if old["format"] != _LEGACY_FORMAT:
            raise ValueError(f"format {old['format']!r}")
        directory, thinning = path.parent, old["thinning"]
        chunks = []
        for index, name in enumerate(old["chunks"]):
            content = (directory / name).read_bytes()
            with np.load(io.BytesIO(content), allow_pickle=False) as arrays:
                kept = arrays[arrays.files[0]].shape[1]  # (chain, draw, ...), thinned
            chunks.append({"index": index, "num_draws": kept * thinning, **_file_entry(name, content)})
        return {
            "format": _FORMAT,
            **{key: old[key] for key in _CONFIG_KEYS},
            "extra_fields": list(old["extra_fields"]),
            "num_draws": old["num_draws"],
            "chunks": chunks,
            "state": {"objects": {"state": old["state"], "diagnostics": old.get("diagnostics")}},
            "data": None,  # not recorded by format 1: not checked
        }
    except Exception as error:  # anything a damaged pickle or its chunks raise
        raise ValueError(
            f"checkpoint: {os.fspath(path)!r} is not a readable format-{_LEGACY_FORMAT} checkpoint "
            f"({type(error).__name__}: {error}); {_FIX}."
        ) from error


def _read_state(directory: Path, entry: dict) -> dict:
    """``{"state": ..., "diagnostics": ...}`` rebuilt from the state file and its structure in the manifest."""
    if "objects" in entry:  # read from a format-1 pickle
        return entry["objects"]
    content = _read_checked(directory, entry, "the chain's state", {})
    try:
        with np.load(io.BytesIO(content), allow_pickle=False) as arrays:
            leaves = {key: arrays[key] for key in arrays.files}
        return _decode(entry["tree"], leaves)
    except (ValueError, KeyError, TypeError, IndexError, AttributeError, ImportError, RecursionError) as error:
        raise ValueError(
            f"checkpoint: the chain's state in {os.fspath(directory / entry['file'])!r} does not rebuild ({error}); "
            f"{_FIX}."
        ) from None


def _read_draws(directory: Path, chunks: list[dict]) -> dict[str, dict[str, np.ndarray]]:
    """``{"posterior": {...}, "sample_stats": {...}}``: the chunks' arrays, checked against their checksums,
    joined along the draw axis."""
    parts: dict[str, dict[str, list[np.ndarray]]] = {group: {} for group in _GROUPS}
    checksums = {entry["sha256"]: entry for entry in chunks}
    for entry in chunks:
        with np.load(io.BytesIO(_read_chunk(directory, entry, checksums)), allow_pickle=False) as arrays:
            for key in arrays.files:
                group, field = key.split("/", 1)
                parts[group].setdefault(field, []).append(arrays[key])
    return {group: {k: np.concatenate(v, axis=1) for k, v in fields.items()} for group, fields in parts.items()}


def _read_chunk(directory: Path, entry: dict, checksums: Mapping[str, dict]) -> bytes:
    """The contents of a chunk file, checked (``checksums``: the run's chunk entries by checksum)."""
    return _read_checked(directory, entry, f"chunk {entry['index']} ({entry['num_draws']} draws)", checksums)


def _read_checked(directory: Path, entry: dict, role: str, others: Mapping[str, dict]) -> bytes:
    """The contents of the file of a manifest ``entry`` (``file``, ``bytes``, ``sha256``), which holds ``role``;
    ``others``: the entries of the other chunks by checksum, to name a swapped file."""
    path = directory / entry["file"]
    where = f"checkpoint: {os.fspath(path)!r}, {role} in the manifest,"
    if path.parent != directory:  # a name, not a path out of the directory
        raise ValueError(f"{where} is not in the checkpoint directory; {_FIX}.")
    try:
        content = path.read_bytes()
    except FileNotFoundError:
        raise ValueError(f"{where} is missing; {_FIX}.") from None
    checksum = hashlib.sha256(content).hexdigest()
    if checksum == entry["sha256"]:
        return content
    if checksum in others:
        other = others[checksum]
        problem = f"holds the contents of {other['file']} (chunk {other['index']}): files were swapped or renamed"
    elif len(content) != entry["bytes"]:
        problem = f"has {len(content)} bytes, not {entry['bytes']}: it is truncated, overwritten or not this run's"
    else:
        problem = "does not match its SHA-256 checksum: it was changed or damaged after it was written"
    raise ValueError(f"{where} {problem}; {_FIX}.")


def _write_npz(path: Path, arrays: Mapping[str, Any]) -> dict:
    """Write ``arrays`` to the ``.npz`` file ``path``; its manifest entry (``file``, ``bytes``, ``sha256``)."""
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    content = buffer.getvalue()
    _write_atomic(path, content)
    return _file_entry(path.name, content)


def _file_entry(name: str, content: bytes) -> dict:
    return {"file": name, "bytes": len(content), "sha256": hashlib.sha256(content).hexdigest()}


def _write_atomic(path: Path, content: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(content)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _digest(manifest: dict) -> str:
    """The manifest's own checksum: the SHA-256 of its canonical JSON."""
    text = json.dumps(manifest, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


# --- the state as JSON and arrays --------------------------------------------------------------------------------------
def _encode(tree: Any, leaves: dict[str, np.ndarray]) -> Any:
    """The JSON description of ``tree``, its arrays added to ``leaves`` (named ``"0"``, ``"1"``, ...):
    ``None``, booleans, integers and strings as themselves, a float as ``{"float": hex}``, ``{"tuple": [...]}``,
    ``{"list": [...]}``, ``{"dict": [[key, value], ...]}``, ``{"namedtuple": "module:qualname", "fields":
    {...}}``, an array as ``{"array": name, "numpy"|"numpy_scalar"|"jax"|"torch": dtype, ...}``."""
    if tree is None or type(tree) in (bool, int, str):
        return tree
    if type(tree) is float:
        return {"float": tree.hex()}
    if isinstance(tree, tuple) and hasattr(type(tree), "_fields"):
        cls: Any = type(tree)
        return {
            "namedtuple": f"{cls.__module__}:{cls.__qualname__}",
            "fields": {name: _encode(value, leaves) for name, value in zip(cls._fields, tree)},
        }
    if type(tree) in (tuple, list):
        return {type(tree).__name__: [_encode(value, leaves) for value in tree]}
    if type(tree) is dict:
        return {"dict": [[_encode(key, leaves), _encode(value, leaves)] for key, value in tree.items()]}
    if not _is_array(tree):
        raise TypeError(
            f"checkpoint.run: the chain's state holds a {type(tree).__module__}.{type(tree).__qualname__}, which a "
            "checkpoint does not store: it stores NumPy, JAX and torch arrays, Python numbers, strings and None, in "
            "tuples, lists, dicts and NamedTuples."
        )
    name = str(len(leaves))
    leaves[name], dtype = _storable(_host(tree))
    if isinstance(tree, np.ndarray | np.generic):
        return {"array": name, "numpy" if isinstance(tree, np.ndarray) else "numpy_scalar": dtype}
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(tree, torch.Tensor):
        return {"array": name, "torch": str(tree.dtype).removeprefix("torch."), "device": str(tree.device)}
    import jax

    if jax.numpy.issubdtype(tree.dtype, jax.dtypes.prng_key):  # a typed key: its data and implementation
        return {"array": name, "jax_key": str(jax.random.key_impl(tree))}
    return {"array": name, "jax": dtype, "weak_type": bool(tree.aval.weak_type)}


def _decode(node: Any, leaves: Mapping[str, np.ndarray]) -> Any:
    """The tree that :func:`_encode` described, its arrays taken from ``leaves``; it runs no code of the files."""
    if node is None or type(node) in (bool, int, str):
        return node
    if type(node) is not dict:
        raise ValueError(f"unexpected node {str(node)[:80]}")
    if "float" in node:
        return float.fromhex(node["float"])
    if "tuple" in node:
        return tuple(_decode(value, leaves) for value in node["tuple"])
    if "list" in node:
        return [_decode(value, leaves) for value in node["list"]]
    if "dict" in node:
        return {_decode(key, leaves): _decode(value, leaves) for key, value in node["dict"]}
    if "namedtuple" in node:
        cls, fields = _namedtuple_class(node["namedtuple"]), node["fields"]
        if sorted(fields) != sorted(cls._fields):
            raise ValueError(f"{node['namedtuple']} has the fields {cls._fields}, not {tuple(fields)}")
        return tuple.__new__(cls, [_decode(fields[name], leaves) for name in cls._fields])  # no __new__ of the class
    if "array" not in node:
        raise ValueError(f"unexpected node {str(node)[:80]}")
    array = leaves[node["array"]]
    if "numpy" in node:
        return _logical(array, node["numpy"])
    if "numpy_scalar" in node:
        return _logical(array, node["numpy_scalar"])[()]
    if "torch" in node:
        import torch

        dtype = getattr(torch, node["torch"], None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"unknown torch dtype {node['torch']!r}")
        tensor = torch.from_numpy(array)
        return (tensor if tensor.dtype == dtype else tensor.view(dtype)).to(torch.device(node["device"]))
    import jax

    if "jax_key" in node:
        return jax.random.wrap_key_data(jax.numpy.asarray(array), impl=str(node["jax_key"]))
    value = jax.device_put(_logical(array, node["jax"]))
    if node["weak_type"]:  # as JAX's own unpickling restores it
        value.aval = value.aval.update(weak_type=True)
    return value


def _host(value: Any) -> np.ndarray:
    """A NumPy, JAX or torch array as a NumPy array on the host: a torch dtype that NumPy lacks (``bfloat16``,
    ...) as integers of its size, a JAX typed key as its data."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        tensor = value.detach().cpu().resolve_conj().resolve_neg()
        try:
            return tensor.numpy()
        except TypeError:  # no NumPy dtype: its bits
            return tensor.view(
                getattr(torch, {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}[tensor.element_size()])
            ).numpy()
    jax = sys.modules.get("jax")
    if jax is not None and isinstance(value, jax.Array) and jax.numpy.issubdtype(value.dtype, jax.dtypes.prng_key):
        return np.asarray(jax.random.key_data(value))
    return np.asarray(value)


def _storable(array: np.ndarray) -> tuple[np.ndarray, str]:
    """``(array or its bits, dtype name)``: a dtype NumPy does not know (``ml_dtypes``' ``bfloat16``, ...) is
    stored as unsigned integers of its size."""
    if array.dtype.kind in "biufc":
        return array, array.dtype.name
    if array.dtype.kind == "V" and array.dtype.itemsize in (1, 2, 4, 8) and not array.dtype.fields:
        return array.view(f"u{array.dtype.itemsize}"), array.dtype.name
    raise TypeError(
        f"checkpoint.run: the chain's state holds an array of dtype {array.dtype}, which a checkpoint does not store."
    )


def _logical(array: np.ndarray, name: str) -> np.ndarray:
    """``array`` as the dtype ``name`` (a NumPy dtype, or one of ``ml_dtypes`` stored as its bits)."""
    if array.dtype.name == name:
        return array
    import ml_dtypes

    dtype = getattr(ml_dtypes, name, None)
    if not (isinstance(dtype, type) and np.dtype(dtype).itemsize == array.dtype.itemsize):
        raise ValueError(f"unknown dtype {name!r} for an array of {array.dtype}")
    return array.view(dtype)


def _namedtuple_class(name: str) -> Any:
    """The ``NamedTuple`` class ``"module:qualname"``: of :mod:`ppl_sgmcmc` (imported if needed), or of a module
    the process has already imported (nothing else is imported)."""
    module_name, _, qualname = name.partition(":")
    module = sys.modules.get(module_name)
    if module is None and module_name.split(".")[0] == "ppl_sgmcmc":
        module = importlib.import_module(module_name)
    cls = module
    for part in qualname.split("."):
        cls = getattr(cls, part, None)
    if not (isinstance(cls, type) and issubclass(cls, tuple) and isinstance(getattr(cls, "_fields", None), tuple)):
        raise ValueError(f"{name!r} is not a NamedTuple class of ppl_sgmcmc or of a module already imported")
    return cls


# --- the data's fingerprint --------------------------------------------------------------------------------------------
def _fingerprint(args: tuple, kwargs: Mapping[str, Any]) -> list[dict]:
    """The model's arguments, described: per array its shape, dtype and the SHA-256 of its values (all of them
    up to ``_FULL_HASH_BYTES``, else about ``_SAMPLE_SIZE`` at a regular stride); per Python scalar or string,
    its value; per other object, its type."""
    entries: list[dict] = []

    def visit(path: str, value: Any) -> None:
        streaming = sys.modules.get("ppl_sgmcmc.numpyro.streaming")
        if streaming is not None and isinstance(value, streaming.HostArray):
            value = value.array
        if isinstance(value, Mapping):
            for key, item in value.items():
                visit(f"{path}[{key!r}]", item)
        elif type(value) in (tuple, list):
            for i, item in enumerate(value):
                visit(f"{path}[{i}]", item)
        elif value is None or type(value) in (bool, int, float, complex, str):
            entries.append({"path": path, "value": repr(value)})
        elif _is_array(value) and value.dtype != object:
            entries.append({"path": path, **_array_fingerprint(value)})
        else:
            entries.append({"path": path, "type": f"{type(value).__module__}.{type(value).__qualname__}"})

    for i, value in enumerate(args):
        visit(f"argument {i}", value)
    for key, value in kwargs.items():
        visit(f"keyword argument {key!r}", value)
    return entries


def _is_array(value: Any) -> bool:
    torch, jax = sys.modules.get("torch"), sys.modules.get("jax")
    return (
        isinstance(value, np.ndarray | np.generic)
        or (torch is not None and isinstance(value, torch.Tensor))
        or (jax is not None and isinstance(value, jax.Array))
    )


def _array_fingerprint(value: Any) -> dict:
    """``{"shape", "dtype", "sha256", "sampled"}`` of a NumPy, JAX or torch array; the sample is taken where
    the array lives (a device array sends only the sample to the host)."""
    flat = value.reshape(-1)
    size = int(flat.shape[0])
    sampled = size * value.dtype.itemsize > _FULL_HASH_BYTES
    if sampled:
        flat = flat[:: -(-size // _SAMPLE_SIZE)]
    return {
        "shape": list(value.shape),
        "dtype": str(value.dtype).removeprefix("torch."),
        "sha256": hashlib.sha256(np.ascontiguousarray(_host(flat)).tobytes()).hexdigest(),
        "sampled": sampled,
    }


def _data_differences(saved: list[dict], data: list[dict]) -> str:
    """What differs between two fingerprints, in words (the first three differences)."""
    before, now = {entry["path"]: entry for entry in saved}, {entry["path"]: entry for entry in data}
    differences = []
    for path in [*before, *(path for path in now if path not in before)]:
        old, new = before.get(path), now.get(path)
        if old == new:
            continue
        if old is None or new is None:
            differences.append(f"{path} is {'new' if old is None else 'missing'}")
        elif old.keys() != new.keys():
            differences.append(f"{path} is of another kind")
        elif "value" in old:
            differences.append(f"{path} is {new['value']} here, {old['value']} in the checkpoint")
        elif "type" in old:
            differences.append(f"{path} is a {new['type']} here, a {old['type']} in the checkpoint")
        elif (old["shape"], old["dtype"]) != (new["shape"], new["dtype"]):
            differences.append(
                f"{path} has shape {tuple(new['shape'])} and dtype {new['dtype']} here, {tuple(old['shape'])} and "
                f"{old['dtype']} in the checkpoint"
            )
        else:
            differences.append(f"{path} has other values")
    return "; ".join(differences[:3]) + ("; ..." if len(differences) > 3 else "")


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
