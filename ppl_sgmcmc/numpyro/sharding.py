"""Data-parallel minibatches over several devices and hosts, with JAX's own sharding.

The switch is the data: pass arrays whose rows are sharded over a :class:`jax.sharding.Mesh` axis
(:func:`shard_rows` makes them) to ``mcmc.run``, and nothing else changes. The kernel's compiled step takes
the data as arguments, so XLA's SPMD partitioner compiles the minibatch gather for the sharded layout:

* **The global draw** (the scheme the kernels use). The step draws ``n`` indices from ``0..N-1`` exactly as on
  one device (:mod:`~ppl_sgmcmc.numpyro.minibatch`: same key, same indices, with or without replacement);
  every device gathers the rows among them that it holds (zeros elsewhere) and one all-reduce of the
  ``n × d`` minibatch puts the rows everywhere. The step communicates ``O(n d)`` numbers, never the data,
  and the estimator ``Ũ_t`` is the one-device estimator: the trajectory is the one-device trajectory, up
  to the summation order of floats.
* **The stratified draw** (documented, not implemented). Each of the ``k`` shards would draw ``n/k`` of its
  own ``N/k`` rows; ``(N/n) Σ`` over the union stays unbiased. With draws with replacement its variance is
  the within-shard part of the global draw's: ``Var_strat = Var_global - (N²/n) · (between-shard variance
  of the shard means of the per-datum gradients)``, never larger, and smaller only when the shards differ
  (data sorted by class or by time). It would save the all-reduce of the rows, not the gradient's.

A mesh whose data axis does not divide ``N`` cannot hold the rows evenly: :func:`shard_rows` refuses with
the fix. Under ``jax.distributed.initialize`` (one process per host), each process passes its own block of
rows to :func:`shard_rows`, and ``MCMC(..., jit_model_args=True)`` passes them to the compiled loop as
arguments (a closed-over array that spans other hosts' devices cannot be compiled in; the kernel says so).

**Example** (a mesh of the devices there are, here one: the rows split over them, the values unchanged)::

    >>> import numpy as np
    >>> from ppl_sgmcmc.numpyro.sharding import data_mesh, shard_rows
    >>> X, y = shard_rows(np.ones((4, 3), np.float32), np.zeros(4, np.float32), mesh=data_mesh())
    >>> X.shape, X.sharding.spec, float(y.sum())
    ((4, 3), P('data',), 0.0)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

__all__ = ["check_arguments", "data_mesh", "shard_rows", "to_host"]


def data_mesh(devices: Sequence[jax.Device] | None = None, axis: str = "data") -> Mesh:
    """A one-axis mesh named ``axis`` over ``devices`` (default: all devices of all processes,
    :func:`jax.devices`, whose order puts each process's devices together).

    **Example**::

        >>> from ppl_sgmcmc.numpyro.sharding import data_mesh
        >>> data_mesh().axis_names
        ('data',)
    """
    return Mesh(np.array(list(jax.devices() if devices is None else devices)), (axis,))


def _global_rows(local: np.ndarray | jax.Array, position: int, axis_size: int, mesh_processes: int) -> int:
    """The number of rows of the global array whose process-local block is ``local``, checked: every process
    holds a block of the same shape and dtype, and the rows divide evenly over the data axis."""
    rows = int(local.shape[0])
    if jax.process_count() > 1:
        signature = np.array([rows, local.ndim, *local.shape[1:], np.dtype(local.dtype).num], np.int64)
        lengths = multihost_utils.process_allgather(np.array([signature.size], np.int64))
        if np.any(lengths != signature.size):
            raise ValueError(
                f"shard_rows: argument {position}: the processes pass arrays of different ranks "
                f"{lengths.ravel().tolist()}: every process must pass its block of the same array."
            )
        signatures = multihost_utils.process_allgather(signature)
        if np.any(signatures != signature):
            raise ValueError(
                f"shard_rows: argument {position}: the processes disagree on the data: rows held, then "
                f"shape and dtype, per process: {signatures.tolist()}. Give every process the same number of "
                "rows (N / number of processes, a contiguous block in process order) of the same array."
            )
        rows *= mesh_processes
    if rows % axis_size:
        divisors = [k for k in range(1, axis_size + 1) if rows % k == 0]
        raise ValueError(
            f"shard_rows: argument {position} has {rows} rows, which do not divide evenly over the mesh's data "
            f"axis of {axis_size} devices. Use a mesh whose data axis divides {rows} (of up to {axis_size} "
            f"devices: {divisors}), or make N a multiple of {axis_size}: drop the last {rows % axis_size} rows, "
            f"or pad to {rows + axis_size - rows % axis_size} rows and mask the padding out of the likelihood "
            "(`numpyro.handlers.mask`: padded rows then add zero, and the minibatch estimator stays unbiased)."
        )
    return rows


def shard_rows(*arrays: Any, mesh: Mesh | None = None, axis: str = "data") -> Any:
    """The ``arrays`` with their leading axis (the rows of a subsampled plate) sharded over ``mesh``'s
    ``axis``, every other axis replicated: each device holds ``N / k`` rows, ``k`` the axis's size.

    In one process each array is the whole data (NumPy or JAX). Under ``jax.distributed.initialize`` each
    process passes its own contiguous block of rows, the same number on every process; the processes check
    that they agree (rows, shape, dtype) and raise a ``ValueError`` naming the fix if not.

    :param arrays: the data arrays, each with the plate's rows on axis 0.
    :param mesh: the device mesh; default :func:`data_mesh` over all devices.
    :param axis: the mesh axis that splits the rows.
    :return: the sharded global arrays (one array if one was given, else a tuple).
    :raises ValueError: if the rows do not divide over the axis, an array has no rows axis, or the processes
        disagree on the data.

    **Example** (on one device every ``N`` divides; on 4, 10 rows would be refused with the fix)::

        >>> import numpy as np
        >>> from ppl_sgmcmc.numpyro.sharding import data_mesh, shard_rows
        >>> shard_rows(np.ones((10, 2)), mesh=data_mesh()).shape
        (10, 2)
    """
    mesh = data_mesh(axis=axis) if mesh is None else mesh
    if axis not in mesh.axis_names:
        raise ValueError(f"shard_rows: the mesh has axes {mesh.axis_names}, not {axis!r}: pass axis= one of them.")
    sharding = NamedSharding(mesh, P(axis))
    axis_size = mesh.shape[axis]
    mesh_processes = len({device.process_index for device in mesh.devices.flat})
    out = []
    for position, array in enumerate(arrays):
        if not hasattr(array, "shape") or len(array.shape) == 0:
            raise ValueError(
                f"shard_rows: argument {position} is not an array with a rows axis (got {type(array).__name__}): "
                "pass only the data arrays of the subsampled plates; other arguments stay as they are."
            )
        rows = _global_rows(array, position, axis_size, mesh_processes)
        local = np.asarray(array) if isinstance(array, np.ndarray) or jax.process_count() > 1 else array
        out.append(jax.make_array_from_process_local_data(sharding, local, (rows, *array.shape[1:])))
    return out[0] if len(out) == 1 else tuple(out)


def check_arguments(state_leaf: Any, model_args: Any, model_kwargs: Mapping[str, Any], kernel_name: str) -> None:
    """Raise if the step is being compiled (``state_leaf`` is traced) with a model argument that is a concrete
    array spanning other processes' devices: ``MCMC`` closes over its arguments unless
    ``jit_model_args=True``, and XLA cannot embed such an array in the program."""
    if not isinstance(state_leaf, jax.core.Tracer):
        return
    for leaf in jax.tree.leaves((model_args, model_kwargs)):
        if isinstance(leaf, jax.Array) and not isinstance(leaf, jax.core.Tracer) and not leaf.is_fully_addressable:
            raise ValueError(
                f"{kernel_name}: a model argument of shape {leaf.shape} spans the devices of other processes, and "
                "the step would close over it. Pass `jit_model_args=True` to `MCMC`, so that the compiled loop "
                "takes the data as arguments."
            )


def to_host(values: jax.Array) -> np.ndarray:
    """``values`` as a NumPy array on this host: the whole array, gathered from every process if it spans
    devices of other processes (every process must call it, as for any collective).

    **Example**::

        >>> import jax.numpy as jnp
        >>> to_host(jnp.arange(3)).tolist()
        [0, 1, 2]
    """
    if isinstance(values, jax.Array) and not values.is_fully_addressable:
        return np.asarray(multihost_utils.process_allgather(values, tiled=True))
    return np.asarray(values)
