"""Minibatch indices for subsampled plates, drawn by the kernel in O(n) per step.

NumPyro's own plate draws its indices with an O(N) shuffle on every trace. The kernels draw them
here instead and substitute them into the plate:

* ``replace=True`` (default): ``n`` indices uniformly with replacement, ``S_t ~ U{0..N-1}^n``.
* ``replace=False``: epoch-wise reshuffling; a permutation of ``0..N-1`` is drawn once per epoch
  and consumed ``n`` indices at a time (the tail shorter than ``n`` is skipped). The reshuffle is
  O(N) once per epoch, amortised O(n) per step; under ``chain_method="vectorized"`` JAX evaluates
  both branches of the epoch test, so vectorised chains pay O(N) every step.
"""

from typing import NamedTuple

import jax.numpy as jnp
from jax import lax, random


class BatchState(NamedTuple):
    """Per plate: the current epoch's permutation and the position in it (empty when ``replace``)."""

    permutation: dict
    position: dict


def init(rng_key, plate_sizes, replace):
    """The batch state at the start of the chain."""
    if replace:
        return BatchState({}, {})
    keys = random.split(rng_key, max(len(plate_sizes), 1))
    return BatchState(
        {name: random.permutation(key, size) for key, (name, (size, _)) in zip(keys, plate_sizes.items())},
        {name: jnp.zeros((), jnp.int32) for name in plate_sizes},
    )


def draw(rng_key, state, plate_sizes, replace):
    """The indices of each subsampled plate for one step, and the advanced batch state."""
    keys = dict(zip(plate_sizes, random.split(rng_key, max(len(plate_sizes), 1))))
    if replace:
        return {name: random.randint(keys[name], (n,), 0, size) for name, (size, n) in plate_sizes.items()}, state
    indices, permutation, position = {}, {}, {}
    for name, (size, n) in plate_sizes.items():
        start = state.position[name]
        new_epoch = start + n > size
        permutation[name] = lax.cond(
            new_epoch, lambda key: random.permutation(key, size), lambda _: state.permutation[name], keys[name]
        )
        start = jnp.where(new_epoch, 0, start)
        indices[name] = lax.dynamic_slice_in_dim(permutation[name], start, n)
        position[name] = start + n
    return indices, BatchState(permutation, position)
