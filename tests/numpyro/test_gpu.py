"""The NumPyro kernels on a GPU (skipped where JAX has none; CI has none, run them on a GPU machine).

Nothing in a step depends on the device: the minibatch indices and the noise come from the chain's
``jax.random`` key (counter-based, the same numbers on every backend), so a chain on the GPU is the chain on
the CPU up to float32 round-off. Checked for every kernel with its defaults (the tuned warm-up included)
and with vectorised chains; the ArviZ conversion evaluates the full-data log-likelihood on the device.
"""

import jax
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import MCMC

from ppl_sgmcmc import numpyro as backend

pytestmark = pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU")

KERNELS = ["SGLD", "SGHMC", "SGNHT", "PSGLD", "SGFS", "CSGLD", "CSGHMC"]  # the kernels whose step size is tuned


def logistic(X, y):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=20):
        logits = numpyro.subsample(X, event_dim=1) @ w
        numpyro.sample("y", dist.Bernoulli(logits=logits), obs=numpyro.subsample(y, event_dim=0))


def data(num_data=400):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(num_data, 2)).astype(np.float32)
    y = (X @ np.array([1.0, -0.5]) + rng.logistic(size=num_data) > 0).astype(np.float32)
    return X, y


def run(kernel, device, num_chains=1):
    """``kernel``'s chains with the data and the computation on ``device``."""
    X, y = jax.device_put(data(), device)
    with jax.default_device(device):
        mcmc = MCMC(kernel, num_warmup=300, num_samples=200, num_chains=num_chains, chain_method="vectorized",
                    progress_bar=False)  # fmt: skip
        mcmc.run(jax.random.PRNGKey(0), X, y)
    return mcmc


@pytest.mark.parametrize("name", KERNELS)
def test_a_chain_on_the_gpu_is_the_chain_on_the_cpu(name):
    gpu = run(getattr(backend, name)(logistic), jax.devices("gpu")[0]).get_samples()["w"]
    cpu = run(getattr(backend, name)(logistic), jax.devices("cpu")[0]).get_samples()["w"]
    assert gpu.devices() == {jax.devices("gpu")[0]}
    np.testing.assert_allclose(np.asarray(gpu), np.asarray(cpu), atol=2e-3)


def test_vectorised_chains_and_inference_data_on_the_gpu():
    mcmc = run(backend.SGNHT(logistic), jax.devices("gpu")[0], num_chains=4)
    cpu = run(backend.SGNHT(logistic), jax.devices("cpu")[0], num_chains=4)
    np.testing.assert_allclose(np.asarray(mcmc.get_samples()["w"]), np.asarray(cpu.get_samples()["w"]), atol=2e-3)
    idata = backend.to_inference_data(mcmc)
    expected = backend.to_inference_data(cpu)
    np.testing.assert_allclose(idata.log_likelihood["y"].values, expected.log_likelihood["y"].values, atol=2e-3)
