"""Data larger than memory: plates over host-resident or on-disk arrays whose minibatch rows are gathered
on the host, a block of steps at a time.

Wrap each large array in a :class:`HostArray` (a NumPy array, typically a ``numpy.memmap`` of a file) and the
model in :class:`streamed`; the model itself is unchanged (``numpy.subsample(X, event_dim=1)`` inside its
subsampled plate)::

    X = HostArray(np.load("X.npy", mmap_mode="r"), dtype=np.float32, shape=(None, 20))
    mcmc = MCMC(SGLD(streamed(model)), ...)
    mcmc.run(key, X, y)                     # y may stay a device array: it is indexed on the device

Each evaluation of the model inside a subsampled plate asks the host, through :func:`jax.pure_callback`, for
the rows at the plate's indices (the indices the kernel drew in the compiled step), and the host reads them
from the array (for a memmap: from the page cache, or the disk). A step therefore moves ``n`` rows to the
device and no more (read ahead by blocks of steps, below): its cost is ``O(n)`` and the device memory is flat
in ``N``. Because the rows are those
at the kernel's own indices, a streamed chain follows the trajectory of the same chain with the array on
the device, and everything else works unchanged: the warm-up (its averages over stacked minibatches ask for
their rows in one call), vectorised chains (one call for all chains), resuming.

**Reading ahead.** A host call costs far more than reading a minibatch from the page cache, so the kernel reads
the rows of ``block`` steps at once (``streamed(model, block=16)``, the default): every ``block`` steps it draws
the next ``block`` minibatches, at the indices those steps would draw (a step's indices depend on the chain's
key only, not on its position), asks the host for their rows in one call per streamed array, and keeps the
``block × n`` rows in its state (:class:`Block`), which a resumed chain continues. The trajectory is unchanged.
The read is synchronous: the host reads when the block's first step asks. Outside the kernels' steps (the
warm-up's mode finding and averages, models with local Gibbs sites, SGFS's per-datum scores) rows are read
step by step. From a cold disk each row is a random read (see the benchmarks in ``benchmarks/RESULTS.md``).

**Once per run, every row.** ``numpyro.infer.MCMC`` postprocesses the initial state eagerly (outside the
compiled loop, to size its buffers), once per phase (warm-up, sampling), on the full-data view of the model:
that evaluation reads every row of the file once, so the host needs ``O(N)`` memory for a moment. Inside the
compiled loop the full-data view's reads are not needed by anything the draws report (unless a deterministic
site is computed from the streamed rows) and XLA drops them. The kernel's own step, driven directly
(``jax.jit(kernel.sample)``), never reads more than its minibatch.

**The full-data view.** ArviZ's pointwise log-likelihood (:func:`~ppl_sgmcmc.numpyro.full_data_log_likelihood`)
evaluates every row, and asks for all ``N`` rows once per chunk of draws: its memory is ``O(N)`` while it
runs. It refuses past ``max_log_likelihood_bytes`` with the fix (``log_likelihood=False`` skips it). The
kernel's check of the data for NaN and inf, which reads every row of a device array, reads only the rows of the
first minibatch of a streamed one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple

import jax
import numpy as np
from numpyro.primitives import _PYRO_STACK, Messenger
from numpyro.primitives import plate as numpyro_plate

__all__ = ["Block", "HostArray", "StreamedBatch", "streamed"]

#: The message type of a ``numpyro.subsample`` of a :class:`HostArray` once :class:`streamed` has read its rows
#: (the plate's own indexing skips it; the kernel's data checks read the rows of the first minibatch).
STREAMED = "streamed_subsample"


class HostArray:
    """An array kept on the host (often a ``numpy.memmap``) whose rows (axis 0) a model reads through
    ``numpyro.subsample`` under :class:`streamed`: only the rows of each minibatch reach the device.

    :param array: a NumPy array or memmap, rows on axis 0.
    :param dtype: the dtype it must have (``None``: any). A mismatch raises: converting a memmap would copy it.
    :param shape: the shape it must have, ``None`` for an axis of any length (e.g. ``(None, 20)``).
    :raises TypeError: if ``array`` is not a NumPy array.
    :raises ValueError: if its dtype or shape is not the one expected.

    **Example**::

        >>> import numpy as np
        >>> from ppl_sgmcmc.numpyro.streaming import HostArray
        >>> X = HostArray(np.zeros((100, 3), np.float32), dtype=np.float32, shape=(None, 3))
        >>> X.shape, len(X)
        ((100, 3), 100)
        >>> HostArray(np.zeros((100, 3)), dtype=np.float32)
        Traceback (most recent call last):
        ...
        ValueError: HostArray: the array has dtype float64, not float32. Write the file with dtype float32 ...
    """

    def __init__(
        self, array: np.ndarray, dtype: Any = None, shape: Sequence[int | None] | None = None
    ) -> None:
        if not isinstance(array, np.ndarray):
            raise TypeError(
                f"HostArray: expected a NumPy array or memmap (`np.load(path, mmap_mode='r')`, `np.memmap(...)`), "
                f"got {type(array).__name__}."
            )
        if dtype is not None and array.dtype != np.dtype(dtype):
            raise ValueError(
                f"HostArray: the array has dtype {array.dtype}, not {np.dtype(dtype)}. Write the file with dtype "
                f"{np.dtype(dtype)} (or open the memmap with `dtype=np.{np.dtype(dtype)}` if that is how it was "
                "written): converting it here would copy the whole array into memory."
            )
        if shape is not None:
            expected = tuple(shape)
            if len(expected) != array.ndim or any(e is not None and e != a for e, a in zip(expected, array.shape)):
                wanted = str(tuple("any" if e is None else e for e in expected)).replace("'", "")
                raise ValueError(
                    f"HostArray: the array has shape {array.shape}, not {wanted}. Check the file's shape (a raw "
                    "`np.memmap` needs `shape=` when it is opened: rows × features, in the order written)."
                )
        if array.ndim == 0:
            raise ValueError("HostArray: the array needs a rows axis (axis 0); got a scalar.")
        self.array = array
        self._buffer = array.view(np.ndarray)  # the same memory, without np.memmap's per-index overhead
        self.shape: tuple[int, ...] = tuple(array.shape)
        self.dtype = array.dtype
        self.ndim = array.ndim

    def __len__(self) -> int:
        return self.shape[0]

    def __repr__(self) -> str:
        return f"HostArray(shape={self.shape}, dtype={self.dtype})"

    def _read(self, indices: np.ndarray) -> np.ndarray:
        """The rows at ``indices`` (any shape): ``np.take`` on the array's buffer, several times faster than
        indexing the ``np.memmap`` subclass (``benchmarks/RESULTS.md``)."""
        return np.take(self._buffer, np.asarray(indices), axis=0)

    def rows(self, indices: jax.Array) -> jax.Array:
        """The rows at ``indices`` as a device array, read on the host by a :func:`jax.pure_callback` (traceable;
        under ``vmap`` one call reads the rows of every batch element).

        **Example**::

            >>> import numpy as np, jax.numpy as jnp
            >>> X = HostArray(np.arange(10.0, dtype=np.float32).reshape(5, 2))
            >>> X.rows(jnp.array([4, 0])).tolist()
            [[8.0, 9.0], [0.0, 1.0]]
        """
        result = jax.ShapeDtypeStruct(indices.shape + self.shape[1:], self.dtype)
        return jax.pure_callback(self._read, result, indices, vmap_method="expand_dims")


# no leaves: a HostArray passes through `jax.jit` and `MCMC(jit_model_args=True)` as a static part of the arguments
jax.tree_util.register_pytree_node(HostArray, lambda array: ((), array), lambda array, _: array)


def _rows_plate(value: HostArray, event_dim: int) -> numpyro_plate:
    """The innermost active plate over the rows (axis 0) of ``value``."""
    dim = event_dim - value.ndim
    for handler in reversed(_PYRO_STACK):
        if isinstance(handler, numpyro_plate) and handler.dim == dim and handler.size == len(value):
            return handler
    raise ValueError(
        f"streamed: numpyro.subsample of a {value!r} with event_dim={event_dim} needs an enclosing "
        f"numpyro.plate of size {len(value)} at dim {dim} (its rows): declare the plate around it, "
        "with `subsample_size`, and pass `event_dim` = the number of axes right of the rows."
    )


class StreamedBatch(NamedTuple):
    """One step's data for a model under :class:`streamed` whose rows the kernel read ahead: the plates'
    indices and, per streamed array (in :attr:`streamed.arrays` order), the rows at them."""

    #: ``{plate name: minibatch indices}``, as :meth:`~ppl_sgmcmc.numpyro.potential.ModelTarget.draw` gives them.
    indices: dict[str, jax.Array]
    #: the rows of each streamed array at its plate's indices.
    rows: tuple[jax.Array, ...]


class Block(NamedTuple):
    """The minibatches of the next steps, read ahead in one host call per streamed array (the kernel's
    ``batch_state`` under a block-streamed model)."""

    #: the minibatch sampler's state after the block's draws.
    batch_state: Any
    #: ``{plate name: (block, n) indices}``, one row per step of the block.
    indices: dict[str, jax.Array]
    #: per streamed array, ``(block, n, ...)`` rows.
    rows: tuple[jax.Array, ...]
    #: the next step's row in the block; ``block`` when it must be read again.
    position: jax.Array


class streamed(Messenger):
    """Let a model's ``numpyro.subsample(X, event_dim)`` read the rows of a :class:`HostArray` ``X`` on the host:
    the value becomes ``X.rows(plate indices)`` (the kernel's minibatch, or all rows in the full-data view).
    Other data pass unchanged (device arrays are indexed on the device, as without the handler).

    :param fn: the model.
    :param block: the number of steps whose rows the kernel reads in one host call per streamed array (default
        16). A host call costs far more than the few microseconds of reading a minibatch from the page cache,
        so reading the next ``block`` steps' rows at once, at the indices those steps will draw, divides that
        cost; the chain is unchanged (the same indices, the same trajectory) and its state holds the
        ``block × n`` rows. ``block=1`` reads at every step. (Only the kernels' steps read ahead; the warm-up's
        mode finding and averages, and models with local Gibbs sites or per-datum scores (SGFS), read step by
        step.)
    :raises ValueError: if ``block`` is not a positive integer.

    **Example** (a streamed run follows the run with the data on the device)::

        >>> import jax, jax.numpy as jnp, numpy as np, numpyro, numpyro.distributions as dist
        >>> from numpyro.infer import MCMC
        >>> from ppl_sgmcmc.numpyro import SGLD
        >>> def model(y):
        ...     mu = numpyro.sample("mu", dist.Normal(0, 10))
        ...     with numpyro.plate("data", len(y), subsample_size=10):
        ...         numpyro.sample("y", dist.Normal(mu, 1), obs=numpyro.subsample(y, event_dim=0))
        >>> y = np.linspace(0, 2, 1000, dtype=np.float32)
        >>> def run(model, data):
        ...     mcmc = MCMC(SGLD(model, step_size=1e-3), num_warmup=50, num_samples=50, progress_bar=False)
        ...     mcmc.run(jax.random.PRNGKey(0), data)
        ...     return mcmc.get_samples()["mu"]
        >>> bool(jnp.allclose(run(streamed(model), HostArray(y)), run(model, jnp.asarray(y))))
        True
    """

    def __init__(self, fn: Callable[..., Any] | None = None, block: int = 16) -> None:
        if isinstance(block, bool) or not isinstance(block, int) or block < 1:
            raise ValueError(f"streamed: `block` must be a positive integer (steps read ahead at once), got {block!r}.")
        super().__init__(fn)
        self.block = block
        #: the streamed arrays the model subsampled, in the order first met, with their plates' names
        self.arrays: list[tuple[HostArray, str]] = []
        self._provided: tuple[jax.Array, ...] | None = None

    @contextmanager
    def providing(self, rows: tuple[jax.Array, ...]) -> Iterator[None]:
        """While the model is traced in this context, its streamed arrays take ``rows`` (aligned with
        :attr:`arrays`: the rows read ahead) instead of calling the host."""
        self._provided = rows
        try:
            yield
        finally:
            self._provided = None

    def read(self, indices: Mapping[str, jax.Array]) -> tuple[jax.Array, ...]:
        """The rows of every streamed array at its plate's ``indices`` (any leading axes: one host call per
        array for a block of steps, and for all chains under ``vmap``)."""
        return tuple(array.rows(indices[plate]) for array, plate in self.arrays)

    def process_message(self, msg: dict[str, Any]) -> None:
        """Read the rows of a :class:`HostArray` at the enclosing plate's indices (or take those provided); the
        message then bypasses the plate's own indexing (which would convert the whole array)."""
        if msg["type"] == "subsample" and isinstance(msg["value"], HostArray):
            array = msg["value"]
            event_dim = msg["kwargs"].get("event_dim")
            plate = _rows_plate(array, 0 if event_dim is None else event_dim)
            position = next((i for i, (known, _) in enumerate(self.arrays) if known is array), None)
            if position is None:
                position = len(self.arrays)
                self.arrays.append((array, plate.name))
            if self._provided is not None and position < len(self._provided):
                msg["value"] = self._provided[position]
            else:
                msg["value"] = array.rows(plate._indices)
            msg["type"] = STREAMED
