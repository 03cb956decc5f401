"""Minibatch indices for subsampled plates, drawn by the kernel in O(n) per step.

NumPyro's own plate draws its indices with an O(N) shuffle on every trace. The kernels draw them
here instead and substitute them into the plate:

* ``replace=True`` (default): ``n`` indices uniformly with replacement, ``S_t ~ U{0..N-1}^n``.
  For ``N ≤ 2^18`` an index is ``bits mod N`` of 32 random bits (one draw; the modulo bias makes
  no index more likely than another by more than ``N / 2^32 < 6·10^-5`` relative), above that
  :func:`jax.random.randint`.
* ``replace=False``: epoch-wise reshuffling; a permutation of ``0..N-1`` is drawn once per epoch
  and consumed ``n`` indices at a time (the tail shorter than ``n`` is skipped). The reshuffle is
  O(N) once per epoch, amortised O(n) per step, also for vectorised chains: all chains start
  their epochs on the same step, and the reshuffle has its own batching rule that keeps the
  epoch test a branch instead of evaluating both sides for every chain.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import custom_batching, lax, random, vmap

from ppl_sgmcmc.numpyro import prng

# Above this plate size, ``bits mod N`` would be measurably non-uniform; use randint.
_MAX_MODULO_SIZE = 2**18


class BatchState(NamedTuple):
    """Per plate: the current epoch's permutation and the position in it (empty when ``replace``).

    **Example**::

        >>> import jax
        >>> from ppl_sgmcmc.numpyro import minibatch
        >>> minibatch.init(jax.random.PRNGKey(0), {"data": (10, 3)}, replace=True)
        BatchState(permutation={}, position={})
    """

    #: ``{plate name: the epoch's permutation of 0..N-1}`` (int32, shape ``(N,)``).
    permutation: dict[str, jax.Array]
    #: ``{plate name: the index into the permutation where the next minibatch starts}`` (int32 scalar).
    position: dict[str, jax.Array]


def init(rng_key: jax.Array, plate_sizes: Mapping[str, tuple[int, int]], replace: bool) -> BatchState:
    """The batch state at the start of the chain.

    :param rng_key: a PRNG key (for the first epoch's permutations).
    :param plate_sizes: ``{plate name: (N, n)}``.
    :param replace: draw with replacement (no state) or reshuffle each epoch.

    **Example**::

        >>> import jax
        >>> from ppl_sgmcmc.numpyro import minibatch
        >>> state = minibatch.init(jax.random.PRNGKey(0), {"data": (10, 3)}, replace=False)
        >>> sorted(state.permutation["data"].tolist()), int(state.position["data"])
        ([0, 1, 2, 3, 4, 5, 6, 7, 8, 9], 0)
    """
    if replace:
        return BatchState({}, {})
    keys = random.split(rng_key, max(len(plate_sizes), 1))
    return BatchState(
        {name: random.permutation(key, size) for key, (name, (size, _)) in zip(keys, plate_sizes.items())},
        {name: jnp.zeros((), jnp.int32) for name in plate_sizes},
    )


def uniform_indices(rng_key: jax.Array, size: int, n: int) -> jax.Array:
    """``n`` indices drawn uniformly with replacement from ``0..size-1`` (int32).

    **Example**::

        >>> import jax
        >>> from ppl_sgmcmc.numpyro import minibatch
        >>> idx = minibatch.uniform_indices(jax.random.PRNGKey(0), 10, 5)
        >>> idx.shape, idx.dtype, bool(((idx >= 0) & (idx < 10)).all())
        ((5,), dtype('int32'), True)
    """
    rng_key = prng.unrolled(rng_key)  # JAX's numbers, drawn without XLA:CPU's rolled hash loop
    if size <= _MAX_MODULO_SIZE:
        return (random.bits(rng_key, (n,), jnp.uint32) % size).astype(jnp.int32)
    return random.randint(rng_key, (n,), 0, size)


@custom_batching.custom_vmap
def _reshuffle(new_epoch: jax.Array, rng_key: jax.Array, permutation: jax.Array) -> jax.Array:
    """A fresh permutation if ``new_epoch``, else ``permutation``."""
    return lax.cond(new_epoch, lambda: random.permutation(rng_key, permutation.shape[0]), lambda: permutation)


@_reshuffle.def_vmap
def _reshuffle_batched(
    axis_size: int, in_batched: Sequence[bool], new_epoch: jax.Array, rng_key: jax.Array, permutation: jax.Array
) -> tuple[jax.Array, bool]:
    new_epoch, rng_key, permutation = (
        x if batched else jnp.broadcast_to(x, (axis_size,) + jnp.shape(x))
        for x, batched in zip((new_epoch, rng_key, permutation), in_batched)
    )

    def fresh():
        shuffled = vmap(lambda key: random.permutation(key, permutation.shape[-1]))(rng_key)
        return jnp.where(new_epoch[:, None], shuffled, permutation)

    return lax.cond(jnp.any(new_epoch), fresh, lambda: permutation), True


def draw(
    rng_key: jax.Array, state: BatchState, plate_sizes: Mapping[str, tuple[int, int]], replace: bool
) -> tuple[dict[str, jax.Array], BatchState]:
    """The indices of each subsampled plate for one step, and the advanced batch state.

    :param rng_key: a PRNG key for this step.
    :param state: the :class:`BatchState`.
    :param plate_sizes: ``{plate name: (N, n)}``.
    :param replace: with replacement, or the next ``n`` indices of the epoch's permutation.
    :return: ``({plate name: n indices}, new state)``.

    **Example** (without replacement: three minibatches of 3 cover 9 distinct points of 10; the fourth
    starts a new epoch)::

        >>> import jax
        >>> from functools import partial
        >>> from ppl_sgmcmc.numpyro import minibatch
        >>> sizes = {"data": (10, 3)}
        >>> state = minibatch.init(jax.random.PRNGKey(0), sizes, replace=False)
        >>> draw = jax.jit(partial(minibatch.draw, plate_sizes=sizes, replace=False))  # as in a kernel's step
        >>> seen = []
        >>> for key in jax.random.split(jax.random.PRNGKey(1), 3):
        ...     indices, state = draw(key, state)
        ...     seen += indices["data"].tolist()
        >>> len(set(seen)), int(state.position["data"])
        (9, 9)
        >>> indices, state = draw(jax.random.PRNGKey(2), state)
        >>> int(state.position["data"])
        3
    """
    keys = dict(zip(plate_sizes, prng.split(rng_key, len(plate_sizes)) if len(plate_sizes) > 1 else [rng_key]))
    if replace:
        return {name: uniform_indices(keys[name], size, n) for name, (size, n) in plate_sizes.items()}, state
    indices, permutation, position = {}, {}, {}
    for name, (size, n) in plate_sizes.items():
        start = state.position[name]
        new_epoch = start + n > size
        permutation[name] = _reshuffle(new_epoch, keys[name], state.permutation[name])
        start = jnp.where(new_epoch, 0, start)
        indices[name] = lax.dynamic_slice_in_dim(permutation[name], start, n)
        position[name] = start + n
    return indices, BatchState(permutation, position)
