"""The accelerator step of the Pyro kernels (``ppl_sgmcmc.pyro.kernel.STEP_PATH = "accelerator"``), checked on the CPU.

On a GPU, every ``bool(tensor)``, ``float(tensor)``, ``int(tensor)`` or ``.item()`` makes the host wait for the
device. The compiled step after the warm-up must have none between two draws: here those methods raise while the
steps of a draw run, for every kernel whose step compiles. The accelerator step's chain is the CPU step's chain
(the same draws, to float32 round-off) while no step is rejected; a rejected step keeps the chain's position and is
counted at the draw's end.
"""

import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch

from ppl_sgmcmc import pyro as backend
from ppl_sgmcmc.pyro import kernel as kernel_module
from tests.pyro.models import logistic_data


def logistic(X, y):
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with pyro.plate("data", X.shape[0], subsample_size=20):
        logits = (pyro.subsample(X, event_dim=1) * w).sum(-1)
        pyro.sample("y", dist.Bernoulli(logits=logits), obs=pyro.subsample(y, event_dim=0))


def poisson(y):
    rate = pyro.sample("rate", dist.Gamma(2.0, 1.0))
    with pyro.plate("data", y.shape[0], subsample_size=20):
        pyro.sample("y", dist.Poisson(rate), obs=pyro.subsample(y, event_dim=0))


LOGISTIC = logistic_data(200)
COUNTS = (torch.poisson(torch.full((200,), 3.0), generator=torch.Generator().manual_seed(0)),)

#: every kernel of ``ppl_sgmcmc.pyro`` whose step after the warm-up compiles (the others run it eagerly: Santa
#: anneals, the replica-exchange kernels swap chains), on a model it takes
KERNELS = {
    "SGLD": lambda: (backend.SGLD(logistic, step_size=1e-3), LOGISTIC),
    "SGHMC": lambda: (backend.SGHMC(logistic, step_size=1e-3), LOGISTIC),
    "SGNHT": lambda: (backend.SGNHT(logistic, step_size=1e-3), LOGISTIC),
    "PSGLD": lambda: (backend.PSGLD(logistic, step_size=1e-3), LOGISTIC),
    "SGFS": lambda: (backend.SGFS(logistic, alpha=1.0, ridge=1e-2), LOGISTIC),
    "SGRLD": lambda: (backend.SGRLD(poisson, step_size=1e-3), COUNTS),
    "CSGLD": lambda: (backend.CSGLD(logistic, step_size=1e-3, energy_min=0.0, energy_gap=10.0), LOGISTIC),
    "CSGHMC": lambda: (backend.CSGHMC(logistic, step_size=1e-3, energy_min=0.0, energy_gap=10.0), LOGISTIC),
    "Recipe": lambda: (backend.Recipe(logistic, step_size=1e-3, D=1.0), LOGISTIC),
}
STEPS_PER_DRAW = 3

#: The tests compile the same graphs: the logistic model's gradient (every kernel on it), each kernel's step (the CPU
#: step's chain and the refused host sync run the graph the accelerator step compiled: its step size is an input), the
#: Poisson model's gradient (both rejected-step tests). ``ppl_sgmcmc.pyro.compile`` keeps a process's compiled graphs,
#: so the module runs on one pytest-xdist worker (``--dist loadgroup``), which compiles each once.
pytestmark = pytest.mark.xdist_group("pyro_device_step_graphs")


def start(name, path, monkeypatch):
    """``name``'s kernel on ``path``'s step, set up (seed 0) with one draw taken."""
    monkeypatch.setattr(kernel_module, "STEP_PATH", path)
    kernel, data = KERNELS[name]()
    pyro.set_rng_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # CSGLD's grid, a short run
        kernel.setup(0, *data)
        kernel.sample(kernel.initial_params)
    return kernel


class HostSync(RuntimeError):
    pass


def forbid_host_sync(monkeypatch):
    """Make every tensor method that copies a value to the host raise (on a GPU, each waits for the device)."""

    def refuse(name):
        def method(self, *args, **kwargs):
            raise HostSync(f"Tensor.{name} called in a step")

        return method

    for name in ("item", "tolist", "numpy", "cpu", "__bool__", "__float__", "__int__", "__index__"):
        monkeypatch.setattr(torch.Tensor, name, refuse(name))


@pytest.mark.parametrize("name", KERNELS)
def test_accelerator_step_does_not_wait_for_the_device(name, monkeypatch):
    """Between two draws, the accelerator step never copies a tensor's value to the host; the draw's end does."""
    kernel = start(name, "accelerator", monkeypatch)
    assert kernel._graphs[("step", kernel._score_kind)] is not None  # the compiled step runs
    with monkeypatch.context() as patch:
        forbid_host_sync(patch)
        for _ in range(STEPS_PER_DRAW):
            kernel._step()
    assert torch.is_tensor(kernel.state.diverging)  # not read yet
    kernel.sample(None)  # the draw's end: its outcome comes to the host
    assert kernel.state.diverging is False and kernel.state.i == 2 + STEPS_PER_DRAW


def test_a_step_is_refused_a_host_sync(monkeypatch):
    """The detector of the test above catches the CPU step's read of its rejection."""
    kernel = start("SGLD", "cpu", monkeypatch)
    with monkeypatch.context() as patch:
        forbid_host_sync(patch)
        with pytest.raises(HostSync, match="__bool__"):
            kernel._step()


def chain(name, path, monkeypatch, draws=5):
    kernel = start(name, path, monkeypatch)
    states = []
    for _ in range(draws):
        kernel.sample(None)
        state = kernel.state
        states.append((kernel._flat, *[leaf for leaf in state.rule_state if leaf is not None], *state.noise,
                       state.potential_energy, state.noise_ratio, state.noise_variance))  # fmt: skip
    return kernel, states


@pytest.mark.parametrize("name", ["SGLD", "SGNHT", "PSGLD", "CSGHMC"])
def test_accelerator_step_is_the_cpu_step(name, monkeypatch):
    """Same seed, same chain: the accelerator step draws what the CPU step draws (its extra momentum draws come
    from a stream of their own), to float32 round-off."""
    accelerator, got = chain(name, "accelerator", monkeypatch)
    cpu, expected = chain(name, "cpu", monkeypatch)
    assert accelerator._refresh_generator is not None and cpu._refresh_generator is None
    assert accelerator.diagnostics()["num_diverging"] == cpu.diagnostics()["num_diverging"] == 0
    for a, b in zip(got, expected):
        for x, y in zip(a, b):
            torch.testing.assert_close(torch.as_tensor(x), torch.as_tensor(y), rtol=1e-5, atol=1e-6, equal_nan=True)


@pytest.mark.parametrize("name, step_size", [("SGLD", 0.3), ("SGHMC", 3.0)])
def test_rejected_steps_on_the_accelerator_step(name, step_size, monkeypatch):
    """A step size far too large for a Poisson rate (its log moves so far that ``exp`` overflows): steps are
    rejected by the graph's selects. A rejected step returns to the last finite position (SGLD: where the last
    accepted step started; SGHMC: where it was), the momentum is redrawn, the noise estimate is kept, and the
    draws' rejections are counted at their ends as on the CPU step."""
    monkeypatch.setattr(kernel_module, "STEP_PATH", "accelerator")
    kernel = getattr(backend, name)(poisson, step_size=step_size)
    pyro.set_rng_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the health check's warning about rejected steps
        kernel.setup(0, *COUNTS)
        kernel.sample(kernel.initial_params)
        rejected = 0
        for _ in range(20):
            before, finite_before, noise_before = kernel._flat, kernel._finite_flat, kernel.state.noise
            momentum_before = getattr(kernel.state.rule_state, "momentum", None)
            kernel.sample(None)
            if kernel.state.diverging:
                rejected += 1
                expected = finite_before if name == "SGLD" else before
                assert torch.equal(kernel._flat, expected)
                assert all(torch.equal(a, b) for a, b in zip(kernel.state.noise, noise_before))
                if momentum_before is not None:
                    assert not torch.equal(kernel.state.rule_state.momentum, momentum_before)
            assert torch.isfinite(kernel._flat).all()
    assert kernel._graphs[("step", False)] is not None  # the compiled step rejected them
    diagnostics = kernel.diagnostics()
    assert 0 < rejected == diagnostics["num_diverging"] == len(diagnostics["divergences"])
    assert kernel.state.num_diverging == rejected and isinstance(kernel.state.num_diverging, int)


def test_step_path_is_checked(monkeypatch):
    monkeypatch.setattr(kernel_module, "STEP_PATH", "gpu")
    kernel, data = KERNELS["SGLD"]()
    with pytest.raises(ValueError, match="STEP_PATH is 'gpu'; set it to 'accelerator', 'cpu' or None"):
        kernel.setup(0, *data)
