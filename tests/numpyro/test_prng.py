"""The unrolled Threefry draws: JAX's numbers exactly, and the kernels' chains unchanged by them."""

import warnings
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import random
from numpyro.infer import MCMC

from ppl_sgmcmc.numpyro import SGLD, prng
from tests.numpyro.conftest import logistic_model

DRAWS = {
    "split": lambda key: random.key_data(random.split(key, 3)) if _typed(key) else random.split(key, 3),
    "split, 2-d shape": lambda key: random.key_data(random.split(key, (2, 5))) if _typed(key)
    else random.split(key, (2, 5)),
    "fold_in": lambda key: random.key_data(random.fold_in(key, 7)) if _typed(key) else random.fold_in(key, 7),
    "fold_in, data above 2^31": lambda key: random.key_data(random.fold_in(key, 2**31 + 5)) if _typed(key)
    else random.fold_in(key, 2**31 + 5),
    "bits, 32": lambda key: random.bits(key, (5, 7), jnp.uint32),
    "bits, 16": lambda key: random.bits(key, (11,), jnp.uint16),
    "bits, 8": lambda key: random.bits(key, (3, 3), jnp.uint8),
    "bits, scalar": lambda key: random.bits(key, (), jnp.uint32),
    "normal": lambda key: random.normal(key, (123,)),
    "uniform": lambda key: random.uniform(key, (3, 4)),
    "randint": lambda key: random.randint(key, (100,), 0, 32561),
    "permutation": lambda key: random.permutation(key, 50),
    "gamma": lambda key: random.gamma(key, 2.0, (5,)),
}


def _typed(key):
    return jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)


@pytest.mark.parametrize(  # gamma and randint compile rejection loops, the slowest: the slow tier
    "draw", [pytest.param(d, marks=pytest.mark.slow) if d in ("gamma", "randint") else d for d in DRAWS], ids=list(DRAWS)
)
def test_the_numbers_of_jax_threefry(draw):
    fn, key = DRAWS[draw], random.PRNGKey(42)
    expected = fn(key)
    np.testing.assert_array_equal(fn(prng.unrolled(key)), expected)
    np.testing.assert_array_equal(jax.jit(fn)(prng.unrolled(key)), expected)
    keys = random.split(key, 4)
    np.testing.assert_array_equal(jax.vmap(lambda k: fn(prng.unrolled(k)))(keys), jax.vmap(fn)(keys))


def test_64_bit_draws():
    with jax.enable_x64(True):
        key = random.PRNGKey(3)
        np.testing.assert_array_equal(random.bits(prng.unrolled(key), (9,), jnp.uint64),
                                      random.bits(key, (9,), jnp.uint64))
        np.testing.assert_array_equal(random.normal(prng.unrolled(key), (9,)), random.normal(key, (9,)))


def test_split_keeps_the_keys_representation():
    raw, typed = random.PRNGKey(0), random.key(0)
    assert prng.unrolled(raw).dtype == prng.unrolled(typed).dtype != typed.dtype
    keys = prng.split(raw, 3)
    assert keys.dtype == jnp.uint32 and keys.shape == (3, 2)
    np.testing.assert_array_equal(keys, random.split(raw, 3))
    keys = prng.split(typed, 3)
    assert keys.dtype == typed.dtype
    np.testing.assert_array_equal(random.key_data(keys), random.key_data(random.split(typed, 3)))


def test_other_keys_are_left_to_jax():
    rbg = random.key(0, impl="rbg")
    assert prng.unrolled(rbg) is rbg
    raw_rbg = random.key_data(rbg)  # uint32 of shape (4,): not a Threefry key
    assert prng.unrolled(raw_rbg) is raw_rbg
    assert prng.split(rbg, 2).dtype == rbg.dtype
    key = random.PRNGKey(0)
    with jax.threefry_partitionable(False):  # JAX counts otherwise: its own implementation draws
        assert prng.unrolled(key) is key
        np.testing.assert_array_equal(prng.split(key, 3), random.split(key, 3))


def _jax_threefry():
    """The kernels' draws through JAX's own Threefry (its rolled loop on the CPU)."""
    return mock.patch.multiple(prng, unrolled=lambda key: key, split=random.split)


@pytest.mark.slow
def test_a_chain_is_the_chain_jax_threefry_draws(logistic_data):
    """One pair of runs draws with every key the kernels split: the start's and the warm-up's (a tuned kernel's
    mode search, Hessian, noise probe and adaptation), the steps' (minibatch indices, an epoch's permutations,
    the rule's noise) and vectorized chains' keys. The draws are kernel-generic (``ppl_sgmcmc.numpyro.kernel``:
    each rule gets its noise from one key), so one kernel, SGLD, stands for all.

    The two programs differ only in how they hash the keys (integer operations, exact); their floating-point
    operations are the same, and they compute them bit for bit alike at the session's ``-O0``
    (``tests/conftest.py``) as with XLA's defaults (``PPL_SGMCMC_TEST_XLA_DEFAULTS=1``). Compiled at ``-O0``, the
    two runs take a third less CPU time than with the ``xla_optimizations`` fixture."""

    def run():
        mcmc = MCMC(SGLD(logistic_model, replace=False), num_warmup=200, num_samples=100, num_chains=2,
                    chain_method="vectorized", progress_bar=False)  # fmt: skip
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mcmc.run(random.PRNGKey(1), *logistic_data)
        return mcmc.get_samples(), mcmc.last_state.rng_key

    samples, key = run()
    with _jax_threefry():
        expected, expected_key = run()
    for site in expected:
        np.testing.assert_array_equal(samples[site], expected[site])
    np.testing.assert_array_equal(key, expected_key)


@pytest.mark.slow
@pytest.mark.skipif(jax.default_backend() != "cpu", reason="JAX rolls the Threefry loop on the CPU only")
def test_the_step_has_no_rolled_hash_loop(logistic_data):
    """The step's HLO has no loop (JAX's own Threefry puts one per draw: a split, the indices, the noise)."""

    def loops():
        kernel = SGLD(logistic_model, step_size=1e-3)
        state = kernel.init(random.PRNGKey(0), 0, None, logistic_data, {})
        text = jax.jit(lambda s: kernel.sample(s, logistic_data, {})).lower(state).compile().as_text()
        return text.count(" while(")

    assert loops() == 0
    with _jax_threefry():
        assert loops() == 3
