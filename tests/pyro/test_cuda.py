"""The Pyro kernels with the model and data on a CUDA device (skipped without one; CI has none, run them on a
GPU machine).

With the CPU step forced (``STEP_PATH = "cpu"``) the chain's randomness comes from its own CPU ``torch.Generator``
and is copied to the position's device, so from the same start a chain on the GPU is the chain on the CPU up to
float32 round-off: checked for every kernel whose step size the warm-up tunes, with its defaults (the compiled
potential included), which also checks that nothing in the kernel mixes devices and that the compiled graph is
used on the GPU (no fallback to the eager model). The start is given: Pyro's ``init_to_uniform`` draws it with the
device's own generator (``torch.rand_like``), so the same seed starts a chain on the GPU elsewhere than on the CPU.
The accelerator step (the default on a GPU) draws from a generator on the GPU, another stream: its steps after the
warm-up are checked to run without a host synchronisation (``torch.cuda.set_sync_debug_mode("error")``).
"""

import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC

from ppl_sgmcmc import pyro as backend
from ppl_sgmcmc.pyro import kernel as kernel_module
from tests.pyro.models import logistic_data

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

KERNELS = ["SGLD", "SGHMC", "SGNHT", "PSGLD", "SGFS", "CSGLD", "CSGHMC"]  # the kernels whose step size is tuned


def logistic(X, y):
    w = pyro.sample("w", dist.Normal(X.new_zeros(X.shape[1]), 1.0).to_event(1))  # on the data's device
    with pyro.plate("data", X.shape[0], subsample_size=20):
        logits = (pyro.subsample(X, event_dim=1) @ w.unsqueeze(-1)).squeeze(-1)  # broadcasts over draws
        pyro.sample("y", dist.Bernoulli(logits=logits), obs=pyro.subsample(y, event_dim=0))


def run(name, device):
    """``name``'s chain with the model and data on ``device``, and the warnings it gave."""
    X, y = (t.to(device) for t in logistic_data(400))
    pyro.set_rng_seed(0)
    start = {"w": torch.tensor([0.5, -0.5], device=device)}
    mcmc = MCMC(getattr(backend, name)(logistic), warmup_steps=300, num_samples=200, initial_params=start,
                disable_progbar=True)  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mcmc.run(X, y)
    return mcmc, [str(w.message) for w in caught]


@pytest.mark.parametrize("name", KERNELS)
def test_a_chain_on_the_gpu_is_the_chain_on_the_cpu(name, monkeypatch):
    monkeypatch.setattr(kernel_module, "STEP_PATH", "cpu")
    gpu, messages = run(name, "cuda")
    cpu, _ = run(name, "cpu")
    assert not [m for m in messages if "could not trace" in m], messages  # the compiled graph runs on the GPU
    w = gpu.get_samples()["w"]
    assert w.device.type == "cuda"
    torch.testing.assert_close(w.cpu(), cpu.get_samples()["w"], atol=2e-3, rtol=0)


@pytest.mark.parametrize("name", KERNELS)
def test_accelerator_step_on_the_gpu_does_not_synchronise(name):
    """After the warm-up, the steps between two draws make the host wait for the GPU nowhere."""
    X, y = (t.to("cuda") for t in logistic_data(400))
    pyro.set_rng_seed(0)
    kernel = getattr(backend, name)(logistic)
    kernel.initial_params = {"w": torch.tensor([0.5, -0.5], device="cuda")}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kernel.setup(300, X, y)
        z = kernel.sample(kernel.initial_params)
        for _ in range(301):
            z = kernel.sample(z)
    assert not [w for w in caught if "could not trace" in str(w.message)]
    assert kernel._graphs[("step", kernel._score_kind)] is not None and kernel._refresh_generator is not None
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(20):
            kernel._step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    kernel.sample(z)
    assert torch.isfinite(kernel.state.z["w"]).all() and kernel.state.z["w"].device.type == "cuda"


def test_inference_data_from_the_gpu(monkeypatch):
    monkeypatch.setattr(kernel_module, "STEP_PATH", "cpu")
    gpu, _ = run("SGNHT", "cuda")
    cpu, _ = run("SGNHT", "cpu")
    idata, expected = backend.to_inference_data(gpu), backend.to_inference_data(cpu)
    torch.testing.assert_close(torch.as_tensor(idata.log_likelihood["y"].values),
                               torch.as_tensor(expected.log_likelihood["y"].values), atol=2e-3, rtol=0)  # fmt: skip
