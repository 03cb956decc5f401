"""JAX's default random numbers (Threefry-2x32), drawn through a hash with its rounds unrolled.

An SG-MCMC step of a small model draws three times from JAX's PRNG: a key split, the minibatch's indices and the
injected noise. On the CPU, JAX lowers each Threefry hash as a rolled loop of five iterations (to keep compile times
down), and XLA:CPU runs every iteration's operations one by one: for a small model, those loops are a large part of
the step. :data:`UNROLLED` is a PRNG implementation (``jax.extend.random.define_prng_impl``) that
computes the same hash with its 20 rounds written out, which XLA fuses like any elementwise code: the same bits as
JAX's ``threefry2x32`` for every key, shape and width (the counter layout of ``jax_threefry_partitionable``, JAX's
default), so a chain is the same, draw for draw, whichever implementation draws it. Measured in
``benchmarks/RESULTS.md`` ("Per-step cost").

The kernels keep the chain's key as they are given it (raw key data or a typed key); :func:`unrolled` re-wraps it
at each draw. Keys of other implementations, and every key with ``jax_threefry_partitionable`` off (JAX then
counts differently), are left to JAX.

The hash: Salmon, Moraes, Dror & Shaw, "Parallel random numbers: as easy as 1, 2, 3", SC 2011 (Threefry-2x32, 20
rounds).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax, random
from jax.extend.random import define_prng_impl, threefry_prng_impl

__all__ = ["UNROLLED", "threefry2x32", "unrolled", "split"]

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = np.uint32(0x1BD11BDA)


def threefry2x32(k1: Any, k2: Any, x1: Any, x2: Any) -> tuple[Any, Any]:
    """The Threefry-2x32 hash (20 rounds) of the counters ``(x1, x2)`` under the key ``(k1, k2)``, all ``uint32``
    (broadcast together), as ``jax.extend.random.threefry2x32_p`` computes it, with every round written out.

    **Example** (the hash of JAX's ``threefry2x32_p`` for the same inputs)::

        >>> import jax.numpy as jnp
        >>> from jax.extend.random import threefry2x32_p
        >>> from ppl_sgmcmc.numpyro.prng import threefry2x32
        >>> k, x = jnp.uint32(7), jnp.arange(4, dtype=jnp.uint32)
        >>> ours, jax_own = threefry2x32(k, k + 1, x, x), threefry2x32_p.bind(k, k + 1, x, x)
        >>> all(bool((a == b).all()) for a, b in zip(ours, jax_own))
        True
    """
    ks = (k1, k2, k1 ^ k2 ^ _PARITY)
    x1, x2 = x1 + ks[0], x2 + ks[1]
    for block in range(5):
        for rotation in _ROTATIONS[block % 2]:
            x1 = x1 + x2
            x2 = x1 ^ (lax.shift_left(x2, np.uint32(rotation)) | lax.shift_right_logical(x2, np.uint32(32 - rotation)))
        x1 = x1 + ks[(block + 1) % 3]
        x2 = x2 + ks[(block + 2) % 3] + np.uint32(block + 1)
    return x1, x2


def _counters(shape: tuple[int, ...]) -> tuple[Any, Any]:
    """The row-major index of each entry of ``shape`` as two ``uint32`` halves, high and low (sizes below 2³²:
    the high half is zero), as ``jax_threefry_partitionable`` numbers the draws."""
    low = lax.iota(np.uint32, math.prod(shape)).reshape(shape)
    return jnp.zeros_like(low), low


def _split(key: Any, shape: tuple[int, ...]) -> Any:
    if math.prod(shape) >= 2**32:
        return threefry_prng_impl.split(key, shape)
    bits1, bits2 = threefry2x32(key[0], key[1], *_counters(shape))
    return jnp.stack([bits1, bits2], axis=bits1.ndim)


def _random_bits(key: Any, bit_width: int, shape: tuple[int, ...]) -> Any:
    if math.prod(shape) >= 2**32:
        return threefry_prng_impl.random_bits(key, bit_width, shape)
    bits1, bits2 = threefry2x32(key[0], key[1], *_counters(shape))
    if bit_width == 64:
        high, low = lax.convert_element_type(bits1, np.uint64), lax.convert_element_type(bits2, np.uint64)
        return lax.shift_left(high, np.uint64(32)) | low
    dtype = {8: np.uint8, 16: np.uint16, 32: np.uint32}[bit_width]
    return lax.convert_element_type(bits1 ^ bits2, dtype)


def _fold_in(key: Any, data: Any) -> Any:
    # JAX: the hash of the counters (0, data), the data's seed, laid out as one pair
    bits1, bits2 = threefry2x32(key[0], key[1], jnp.zeros((1,), np.uint32), jnp.asarray(data, np.uint32)[None])
    return jnp.concatenate([bits1, bits2])


#: The PRNG implementation: JAX's Threefry-2x32 (its seeds, key layout and bits), the hash unrolled.
UNROLLED = define_prng_impl(
    key_shape=(2,),
    seed=threefry_prng_impl.seed,
    split=_split,
    random_bits=_random_bits,
    fold_in=_fold_in,
    name="threefry2x32_unrolled",
    tag="fry_unrolled",
)


def _is_threefry(key: Any) -> bool:
    if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        return str(random.key_impl(key)) == "threefry2x32"
    return key.dtype == jnp.uint32 and key.shape[-1:] == (2,)


def unrolled(key: Any) -> Any:
    """``key`` (a raw Threefry key, ``uint32`` of shape ``(..., 2)``, or a typed one) as a typed key of
    :data:`UNROLLED`, which draws the same numbers; any other key unchanged.

    **Example**::

        >>> import jax
        >>> from ppl_sgmcmc.numpyro.prng import unrolled
        >>> key = jax.random.PRNGKey(0)
        >>> bool((jax.random.normal(unrolled(key), (3,)) == jax.random.normal(key, (3,))).all())
        True
    """
    if not jax.config.values["jax_threefry_partitionable"] or not _is_threefry(key):
        return key
    if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = random.key_data(key)
    return random.wrap_key_data(key, impl=UNROLLED)


def split(key: Any, num: int) -> Any:
    """``jax.random.split(key, num)``, in the representation of ``key`` (raw or typed), drawn through
    :func:`unrolled`.

    **Example**::

        >>> import jax
        >>> from ppl_sgmcmc.numpyro import prng
        >>> key = jax.random.PRNGKey(0)
        >>> bool((prng.split(key, 3) == jax.random.split(key, 3)).all())
        True
    """
    keys = random.split(unrolled(key), num)
    if keys.dtype == getattr(key, "dtype", None):  # left to JAX
        return keys
    if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        return random.wrap_key_data(random.key_data(keys), impl=random.key_impl(key))
    return random.key_data(keys)
