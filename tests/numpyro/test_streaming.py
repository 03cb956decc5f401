"""Plates over on-disk arrays (:mod:`ppl_sgmcmc.numpyro.streaming`): rows read on the host per minibatch.

* A chain over a ``numpy.memmap`` follows the chain with the data on the device (the rows are those at the
  kernel's own indices): fixed step size with vectorised chains, read ahead by blocks of 16 steps and step by
  step (``block=1``), and the tuned warm-up with epochs, read ahead. The three runs cover the reading paths:
  the read-ahead of independent draws (all of a block's indices at once) and of epochs (one draw after the
  other), and the step's own read (``block=1``), which is the same whatever the kernel and its draw; the
  warm-up reads step by step whatever the block. Each run compiles anew: the runs on the device are shared by
  the tests that compare with them.
* A step reads the minibatch's rows only: the host is asked for ``n`` rows per chain.
* A streamed chain resumed in the middle of a block of rows read ahead follows the chain on the device.
* The posterior is the conjugate one within Monte Carlo error (``tests/helpers.py``).
* Bad input (a memmap of the wrong dtype or shape, a subsample outside its plate) raises naming the fix.
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import MCMC

from ppl_sgmcmc.numpyro import SGLD, SGNHT, full_data_log_likelihood
from ppl_sgmcmc.numpyro.streaming import HostArray, streamed
from tests.helpers import (
    assert_mc_close,
    assert_small_bias,
    conjugate_posterior,
    ess,
    linear_regression_data,
    mahalanobis,
    mean_and_mcse,
    minibatch_gradient_cov,
    predicted_thermostat,
)

NUM_DATA, NUM_FEATURES, BATCH, NOISE, PRIOR = 1000, 3, 50, 16.0, 1.0
X, Y, _ = linear_regression_data(NUM_DATA, NUM_FEATURES, NOISE, seed=0)


def regression(X, y):
    w = numpyro.sample("w", dist.Normal(0.0, PRIOR).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=BATCH):
        x = numpyro.subsample(X, event_dim=1)
        numpyro.sample("y", dist.Normal(x @ w, NOISE), obs=numpyro.subsample(y, event_dim=0))


class CountingArray(HostArray):
    """A :class:`HostArray` that records how many rows each read asks for."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.reads = []

    def _read(self, indices):
        self.reads.append(np.size(indices))
        return super()._read(indices)


@pytest.fixture(scope="module")
def memmap(tmp_path_factory):
    path = tmp_path_factory.mktemp("streaming") / "X.npy"
    np.save(path, X)
    return np.load(path, mmap_mode="r")


def _run(model, data, kernel, num_chains=2, **options):
    mcmc = MCMC(kernel(model), num_warmup=200, num_samples=100, num_chains=num_chains, progress_bar=False,
                chain_method="vectorized", **options)  # fmt: skip
    mcmc.run(jax.random.PRNGKey(0), *data)
    return mcmc


# (kernel, number of vectorised chains)
KERNELS = {
    "fixed": (lambda model: SGLD(model, step_size=5e-4), 2),
    # the minibatch gradient on both sides: a streamed model's default, where the device's would be SVRG's
    "tuned-epochs": (lambda model: SGNHT(model, replace=False, gradient="minibatch"), 1),
}
# the tests of the shared runs on one pytest-xdist worker (`--dist loadgroup`), which runs each of them once
on_shared_runs = pytest.mark.xdist_group("streaming_shared_runs")


@pytest.fixture(scope="module")
def on_the_device():
    """``kernel -> MCMC``: the kernel's chain with the data on the device, run once."""
    runs = {}

    def run(kernel):
        if kernel not in runs:
            runs[kernel] = _run(regression, (jnp.asarray(X), jnp.asarray(Y)), *KERNELS[kernel])
        return runs[kernel]

    return run


@pytest.fixture(scope="module")
def streamed_runs(memmap):
    """``(kernel, block) -> (CountingArray, MCMC)``: the kernel's chain on the rows of the memmap read ``block``
    steps' rows at a time, run once."""
    runs = {}

    def run(kernel, block):
        if (kernel, block) not in runs:
            host = CountingArray(memmap, dtype=np.float32, shape=(None, NUM_FEATURES))
            runs[kernel, block] = host, _run(streamed(regression, block=block), (host, jnp.asarray(Y)), *KERNELS[kernel])
        return runs[kernel, block]

    return run


@pytest.mark.slow
@on_shared_runs
@pytest.mark.parametrize("kernel, block", [("fixed", 16), ("fixed", 1), ("tuned-epochs", 16)])
def test_same_trajectory_as_on_the_device(streamed_runs, on_the_device, kernel, block):
    host, streamed_run = streamed_runs(kernel, block)
    device_run = on_the_device(kernel)
    num_chains = KERNELS[kernel][1]
    np.testing.assert_allclose(streamed_run.get_samples()["w"], device_run.get_samples()["w"], rtol=1e-5, atol=1e-6)
    # the steps (one read for all vectorised chains) ask for their minibatches' rows only, `block` steps' rows
    # per read; the whole file is read by NumPyro's eager postprocessing of the initial state, once per phase of
    # the run (warm-up, sampling; see the module's docs)
    print(f"\nrows per read: {sorted(set(host.reads))}, {len(host.reads)} reads")
    steps = 300  # 200 warm-up and 100 sampling steps
    assert host.reads[-5:] == [block * num_chains * BATCH] * 5
    assert host.reads.count(block * num_chains * BATCH) >= steps // block
    assert 1 <= host.reads.count(NUM_DATA) <= 2
    np.testing.assert_allclose(
        full_data_log_likelihood(streamed_run)["y"], full_data_log_likelihood(device_run)["y"], rtol=1e-5, atol=1e-5
    )


@pytest.mark.slow
@on_shared_runs
def test_reading_ahead_is_resumable(memmap, streamed_runs, on_the_device):
    """The streamed chains of the fixed step size, continued from their last state, in the middle of a block of rows
    read ahead (step 300 of blocks of 16), by another kernel object (as after a restart), follow the chains on the
    device continued likewise (whose state holds no rows: their continuation is the uninterrupted chain) for 100
    steps, over six more blocks."""
    make_kernel, num_chains = KERNELS["fixed"]
    first = streamed_runs("fixed", 16)[1].last_state
    np.testing.assert_array_equal(first.batch_state.position, [300 % 16] * num_chains)  # mid-block
    resumed = []
    for model, data, state in (
        (streamed(regression), (HostArray(memmap), jnp.asarray(Y)), first),
        (regression, (jnp.asarray(X), jnp.asarray(Y)), on_the_device("fixed").last_state),
    ):
        mcmc = MCMC(make_kernel(model), num_warmup=0, num_samples=100, num_chains=num_chains,
                    chain_method="vectorized", progress_bar=False)  # fmt: skip
        mcmc.post_warmup_state = state
        mcmc.run(state.rng_key, *data)
        resumed.append(np.asarray(mcmc.get_samples()["w"]))
    np.testing.assert_allclose(*resumed, rtol=1e-6, atol=1e-7)


def test_block_must_be_a_positive_integer():
    with pytest.raises(ValueError, match="`block` must be a positive integer"):
        streamed(regression, block=0)


def test_posterior_from_a_memmap(memmap):
    """SGNHT reading its rows from a memmap: the conjugate posterior within Monte Carlo error."""
    step, diffusion = 5e-3, 2.0  # as test_posterior.py's "sgnht-multivariate-splitting"
    post_mean, post_cov = conjugate_posterior(X, Y, NOISE, PRIOR)
    grad_cov = minibatch_gradient_cov(X, Y, post_mean, NOISE, BATCH)
    bias = predicted_thermostat(np.linalg.inv(post_cov), grad_cov, step, diffusion, "splitting")[1] - post_cov
    assert_small_bias("sgnht", bias, np.sqrt(np.outer(np.diag(post_cov), np.diag(post_cov))), 0.05)
    mcmc = MCMC(SGNHT(streamed(regression), step_size=step, diffusion=diffusion), num_warmup=2_000,
                num_samples=16_000, num_chains=8, chain_method="vectorized", thinning=4, progress_bar=False)  # fmt: skip
    mcmc.run(jax.random.PRNGKey(1), HostArray(memmap), HostArray(np.asarray(Y)))
    assert not np.asarray(mcmc.get_extra_fields()["diverging"]).any()
    draws = np.asarray(mcmc.get_samples(group_by_chain=True)["w"])
    print(f"\nESS of w {np.round(ess(draws))}")
    mean, mean_se = mean_and_mcse(draws)
    assert_mc_close("mean from a memmap", mean, post_mean, mean_se)
    distance, distance_se = mean_and_mcse(mahalanobis(draws, post_mean, post_cov)[..., None] / NUM_FEATURES)
    allowance = np.trace(np.linalg.inv(post_cov) @ bias) / NUM_FEATURES
    assert_mc_close("Mahalanobis/d from a memmap", distance, 1.0, distance_se, allowance=allowance)


def test_bad_memmaps(tmp_path, memmap):
    with pytest.raises(ValueError, match=r"has dtype float32, not float64\. Write the file with dtype float64"):
        HostArray(memmap, dtype=np.float64)
    with pytest.raises(ValueError, match=r"has shape \(1000, 3\), not \(any, 20\)\. .*needs `shape=`"):
        HostArray(memmap, shape=(None, 20))
    with pytest.raises(ValueError, match=r"has shape \(1000, 3\), not \(any,\)"):
        HostArray(memmap, shape=(None,))
    with pytest.raises(TypeError, match="expected a NumPy array or memmap"):
        HostArray(jnp.asarray(X))


def test_subsample_outside_its_plate(memmap):
    def model(X):
        numpyro.sample("w", dist.Normal(0.0, 1.0))
        with numpyro.plate("data", X.shape[0], subsample_size=BATCH):
            numpyro.subsample(X, event_dim=0)  # event_dim 0: the plate would be at dim -2

    with pytest.raises(ValueError, match=r"needs an enclosing numpyro.plate of size 1000 at dim -2"):
        SGLD(streamed(model), step_size=1e-3).init(jax.random.PRNGKey(0), 0, model_args=(HostArray(memmap),))
