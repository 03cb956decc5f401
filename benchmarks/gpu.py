#!/usr/bin/env python
"""Every GPU row in one run (at most 8 minutes on one GPU machine), printed as Markdown tables.

The sections, in order of priority:

1. ``a9a``, **throughput, NumPyro**: every kernel of ``benchmarks/throughput.py`` (its specs, hand-written
   ``lax.scan`` loop and BlackJAX chains, imported) under :class:`ppl_sgmcmc.numpyro.MCMC`, with the accelerator
   step (``ppl_sgmcmc.numpyro.kernel.STEP_PATH``, the default on a GPU) and with the CPU step forced (the rarely
   taken branches, whose predicates XLA:GPU copies to the host at every step); then the kernels it has no
   hand-written loop for, ours only. A run's rate runs from the end of its loop's XLA compilation
   (``throughput.CompileClock``) to its end.
2. ``vectorized``, **vectorized chains** (4, 64, 1024): SGNHT with ``chain_method="vectorized"`` against the
   ``vmap`` of the hand-written scan, steps/s summed over the chains.
3. ``fnn``, **FNN-400 on MNIST**: ``SGLD.sample`` against the hand-written step (``benchmarks/bnn_step_cost.py``'s
   loops), ms per step, both steps; the Pyro FNN (``bnn_mnist.speed_pyro``, whose tensors stay on the CPU).
4. ``pyro``, **a9a throughput, Pyro**: the kernels of ``throughput.pyro_kernel_specs`` under ``pyro.infer.MCMC``
   with the data on the GPU (``throughput.pyro_mcmc_rate``) against a hand-written torch loop on the GPU doing the
   same minibatch gradient and rule (:func:`torch_device_loop_rate`; ``throughput.torch_hand_rate`` keeps its
   tensors on the CPU).
5. ``sharded``, **sharded rows**: SGLD on a9a with its rows sharded over every device
   (:func:`ppl_sgmcmc.numpyro.sharding.shard_rows`) against the same run on one device.
6. ``streamed``, **streamed data**: ``benchmarks/streaming_blocks.py`` (bare loops and through the kernel), in a
   subprocess.
7. ``tests``, **the GPU tests**: ``tests/numpyro/test_gpu.py``, ``tests/pyro/test_cuda.py`` (skipped without a GPU)
   and the structural tests of ``tests/numpyro/test_accelerator_step.py`` (the step lowered for this machine).

A section that would start after :data:`BUDGET` seconds is skipped; the tests get the time left. A section that
fails prints its error and the run goes on. ``--dry-run`` runs every section at tiny sizes, without the budget
(on a CPU: it checks the script, not the speed).

Usage (from the repository root)::

    PYTHONPATH=. .venv/bin/python benchmarks/gpu.py                 # on a GPU machine, under 8 min
    PYTHONPATH=. .venv/bin/python benchmarks/gpu.py --dry-run       # anywhere; ~15 min on 2 busy CPU cores
    PYTHONPATH=. .venv/bin/python benchmarks/gpu.py --only a9a,vectorized --skip-tests
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time
import traceback
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import random  # noqa: E402

from benchmarks import throughput  # noqa: E402
from ppl_sgmcmc.numpyro import MCMC  # noqa: E402
from ppl_sgmcmc.numpyro import kernel as kernel_module  # noqa: E402

SECTIONS = ("a9a", "vectorized", "fnn", "pyro", "sharded", "streamed", "tests")  # in order of priority
BUDGET = 460  # seconds: a section that would start later is skipped (the tests get what is left, at least 60 s)
FULL = dict(steps=40_000, pyro_steps=2_000, chains=(4, 64, 1024), chain_steps=4_000, fnn_steps=50, stream_steps=4096,
            repeats=3, tests=True, kernels=None)  # fmt: skip
DRY = dict(steps=500, pyro_steps=50, chains=(4,), chain_steps=100, fnn_steps=3, stream_steps=64, repeats=1,
           tests=False, kernels=("SGLD", "SGNHT multivar. splitting", "SGNHT", "CSGLD"))  # fmt: skip


def chosen(specs: list) -> list:
    """The kernels a run measures: all, or the dry run's few (each compiles several loops)."""
    return [spec for spec in specs if SIZE["kernels"] is None or spec[0] in SIZE["kernels"]]


SIZE = FULL


@contextlib.contextmanager
def step_path(path: str | None):
    """The step the kernels compile while open (:data:`ppl_sgmcmc.numpyro.kernel.STEP_PATH`)."""
    before, kernel_module.STEP_PATH = kernel_module.STEP_PATH, path
    try:
        yield
    finally:
        kernel_module.STEP_PATH = before


def mcmc_rate(make_kernel, X, y, steps: int, **options) -> float:
    """Steps/s of a :class:`ppl_sgmcmc.numpyro.MCMC` run (no warm-up, no progress bar), summed over its chains: from
    the end of the XLA compilation of its collection loop (``throughput.CompileClock``) to the end of the run."""
    if throughput.CLOCK is None:
        throughput.CLOCK = throughput.CompileClock()
    mcmc = MCMC(make_kernel(), num_warmup=0, num_samples=steps, progress_bar=False, verdict=False, **options)
    with throughput.CLOCK.measure() as clock, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mcmc.run(random.PRNGKey(0), X, y)
        jax.block_until_ready(mcmc.get_samples())
        end = time.perf_counter()
    compiled = [at for at, name, _ in clock.compiles if name == "jit(_collect_draws)"]
    return options.get("num_chains", 1) * steps / (end - compiled[-1])


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}"


def table(header: tuple[str, ...], rows: list[tuple]) -> None:
    print("| " + " | ".join(header) + " |")
    print("|---|" + "---:|" * (len(header) - 1))
    for row in rows:
        # rates with thousands separators; sub-10 values (ms per step on a GPU) with three significant digits
        print("| " + " | ".join((throughput.fmt(v) if abs(v) >= 10 else f"{v:.3g}") if isinstance(v, float) else str(v)
                                for v in row) + " |")  # fmt: skip
    print(flush=True)


def a9a():
    X, y, _, _ = throughput.load_a9a()
    return jnp.asarray(X), jnp.asarray(y)


def _other_kernels() -> dict:
    """The kernels ``throughput.py`` has no hand-written loop for, on its a9a model with given step sizes."""
    from ppl_sgmcmc import numpyro as backend

    model = throughput.model
    return {
        "CSGLD": lambda: backend.CSGLD(model, step_size=5e-6),
        "CSGHMC": lambda: backend.CSGHMC(model, step_size=1e-3),
        "SGFS": lambda: backend.SGFS(model, step_size=1.0),
        "Santa": lambda: backend.Santa(model, step_size=1e-5),
        "Recipe (D = 1: SGLD)": lambda: backend.Recipe(model, step_size=5e-6, D=1.0),
    }


OTHER_KERNELS = _other_kernels()


def section_a9a(size: dict) -> None:
    """Every kernel against the hand-written scan and BlackJAX, with the accelerator and the CPU step."""
    X, y = a9a()
    S, rows = size["steps"], []
    for label, make, rule, hyper, h, bj_name, nearest in chosen(throughput.kernel_specs()):
        fns = {"scan": (jax.jit(throughput.make_scan_chain(rule, hyper, h, X, y, S)[0]), random.PRNGKey(1))}
        if bj_name is not None:
            fns["blackjax"] = (jax.jit(throughput.make_blackjax_chain(bj_name, hyper, h, X, y, S)), random.PRNGKey(2))
        baselines = throughput.interleaved_rates(fns, S, size["repeats"])
        ours = mcmc_rate(make, X, y, S)
        with step_path("cpu"):
            cpu_step = mcmc_rate(make, X, y, S)
        bj = baselines.get("blackjax")
        rows.append((label, ours, cpu_step, baselines["scan"], ratio(ours, baselines["scan"]),
                     "" if bj is None else f"{throughput.fmt(bj)} ({'~' if nearest else ''}{bj_name})",
                     "" if bj is None else ratio(ours, bj)))  # fmt: skip
        print(f"  measured {label}", flush=True)
    for label, make in chosen(list(OTHER_KERNELS.items())):  # no hand-written loop in throughput.py: ours only
        try:
            ours = mcmc_rate(make, X, y, S)
            with step_path("cpu"):
                rows.append((label, ours, mcmc_rate(make, X, y, S), "", "", "", ""))
        except Exception as err:  # noqa: BLE001 - a kernel that does not run on a9a is named, not fatal
            rows.append((label, f"failed: {type(err).__name__}: {str(err)[:80]}", "", "", "", "", ""))
    print(f"\n### a9a, NumPyro: steps/s ({S} and {2 * S} steps)\n")
    table(("kernel", "ours", "ours, CPU step forced", "scan", "ours/scan", "blackjax", "ours/blackjax"), rows)


def torch_device_loop_rate(rule, hyper, step_size, X, y, steps: int) -> float:
    """Steps/s of ``throughput.torch_hand_rate``'s loop with every tensor on ``X``'s device (indices and noise
    drawn there): what a user writes for the GPU."""
    import torch

    from ppl_sgmcmc.algorithms import call_kwargs
    from ppl_sgmcmc.rules import StochasticGradient

    N, d = X.shape
    generator = torch.Generator(device=X.device).manual_seed(0)
    x = torch.zeros(d, device=X.device)
    state = rule.init(x, torch.randn(d, generator=generator, device=X.device), **call_kwargs(rule.init, hyper))
    out = torch.empty(steps, d, device=X.device)

    def gradient(idx):
        def grad_fn(w):
            w = w.detach().requires_grad_()
            logits = X[idx] @ w
            loglik = (y[idx] * logits - torch.nn.functional.softplus(logits)).sum()
            energy = 0.5 * (w * w).sum() / throughput.PRIOR_VAR - (N / throughput.BATCH) * loglik
            (grad,) = torch.autograd.grad(energy, w)
            return StochasticGradient(energy.detach(), grad, -(grad - w.detach() / throughput.PRIOR_VAR) / N)

        return grad_fn

    torch.cuda.synchronize() if X.is_cuda else None
    start = time.perf_counter()
    for i in range(steps):
        idx = torch.randint(N, (throughput.BATCH,), generator=generator, device=X.device)
        noise = torch.randn(d, generator=generator, device=X.device)
        x, state, _ = rule.step(x, state, gradient(idx), noise, step_size, **hyper)
        out[i] = x
    torch.cuda.synchronize() if X.is_cuda else None
    return steps / (time.perf_counter() - start)


def torch_device():
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def device_pyro_model(X, y=None):
    """``throughput.pyro_model`` with its prior's parameters on the data's device (a prior of Python numbers draws
    its latent on the CPU: ``docs/src/user-guide/gpu.md``)."""
    import pyro
    import pyro.distributions as pdist

    w = pyro.sample("w", pdist.Normal(X.new_zeros(X.shape[1]), throughput.PRIOR_VAR**0.5).to_event(1))
    with pyro.plate("data", X.shape[0], subsample_size=throughput.BATCH):
        Xb = pyro.subsample(X, event_dim=1)
        yb = pyro.subsample(y, event_dim=0) if y is not None else None
        pyro.sample("y", pdist.Bernoulli(logits=Xb @ w), obs=yb)


def section_pyro(size: dict) -> None:
    from unittest import mock

    import torch

    X, y, _, _ = throughput.load_a9a()
    device = torch_device()
    X, y = torch.as_tensor(np.asarray(X), device=device), torch.as_tensor(np.asarray(y), device=device)
    S, rows = size["pyro_steps"], []
    for label, make, rule, hyper, h in chosen(throughput.pyro_kernel_specs()):
        hand = torch_device_loop_rate(rule, hyper, h, X, y, S)
        with warnings.catch_warnings(), mock.patch.object(throughput, "pyro_model", device_pyro_model):
            warnings.simplefilter("ignore")
            ours, _, diverged = throughput.pyro_mcmc_rate(make, X, y, S)  # its kernels built on device_pyro_model
        rows.append((label, ours, hand, ratio(ours, hand), diverged))
        print(f"  measured {label}", flush=True)
    print(f"\n### a9a, Pyro on {device}: steps/s ({S} steps)\n")
    table(("kernel", "ours (pyro.infer.MCMC)", "hand-written torch loop", "ours/hand", "rejected steps"), rows)


def section_fnn(size: dict) -> None:
    from benchmarks import bnn_mnist, bnn_step_cost

    bnn_step_cost.S, bnn_step_cost.ROUNDS = size["fnn_steps"], size["repeats"]
    X, y, _, _ = bnn_mnist._data(False)
    X, y = jnp.asarray(X), jnp.asarray(y)
    ours = bnn_step_cost.per_step(bnn_step_cost.kernel_run(X, y))
    with step_path("cpu"):
        cpu_step = bnn_step_cost.per_step(bnn_step_cost.kernel_run(X, y))
    hand = bnn_step_cost.per_step(bnn_step_cost.hand_run(X, y))
    print(f"\n### FNN-400 on MNIST, NumPyro: ms per step ({size['fnn_steps']} and {2 * size['fnn_steps']} steps)\n")
    table(("loop", "ms per step", "hand/ours"), [("SGLD.sample", ours, ratio(hand, ours)),
                                                 ("SGLD.sample, CPU step forced", cpu_step, ratio(hand, cpu_step)),
                                                 ("hand-written SGLD step", hand, "1.00")])  # fmt: skip
    with contextlib.redirect_stdout(sys.stderr):
        pyro = bnn_mnist.speed_pyro(True, size["fnn_steps"])["pyro"]
    print("### FNN-400 on MNIST, Pyro (bnn_mnist.speed_pyro: its tensors on the CPU)\n")
    table(("loop", "ms per step"), [("SGLD under pyro.infer.MCMC", 1e3 * pyro["mcmc_s_per_step"]),
                                    ("hand-written torch loop", 1e3 * pyro["loop_s_per_step"])])  # fmt: skip


def section_vectorized(size: dict) -> None:
    X, y = a9a()
    specs = {spec[0]: spec for spec in throughput.kernel_specs()}
    label, make, rule, hyper, h = specs["SGNHT multivar. splitting"][:5]
    S, rows = size["chain_steps"], []
    for chains in size["chains"]:
        chain = throughput.make_scan_chain(rule, hyper, h, X, y, S)[0]
        vmapped = jax.jit(jax.vmap(chain))
        scan = throughput.interleaved_rates({"scan": (vmapped, random.split(random.PRNGKey(1), chains))}, S,
                                            size["repeats"])["scan"] * chains  # fmt: skip
        ours = mcmc_rate(make, X, y, S, num_chains=chains, chain_method="vectorized")
        rows.append((chains, ours, scan, ratio(ours, scan)))
    print(f"\n### Vectorized chains, {label} on a9a: steps/s summed over the chains ({S} steps)\n")
    table(("chains", "ours", "vmap of the scan", "ours/scan"), rows)


def section_sharded(size: dict) -> None:
    from ppl_sgmcmc.numpyro.sharding import data_mesh, shard_rows

    X, y = a9a()
    devices = len(jax.devices())
    rows_kept = X.shape[0] - X.shape[0] % devices
    X, y = X[:rows_kept], y[:rows_kept]
    make = {spec[0]: spec for spec in throughput.kernel_specs()}["SGLD"][1]
    one = mcmc_rate(make, X, y, size["steps"])
    Xs, ys = shard_rows(np.asarray(X), np.asarray(y), mesh=data_mesh())
    sharded = mcmc_rate(make, Xs, ys, size["steps"])
    print(f"\n### Sharded rows, SGLD on a9a ({rows_kept} rows): steps/s\n")
    table(("data", "steps/s"), [("one device", one), (f"rows sharded over {devices} device(s)", sharded)])


def run(command: list[str], timeout: int) -> None:
    """``command`` in a subprocess, its output passed on (a failure is printed, not raised)."""
    # this process's JAX holds 75 % of the GPU's memory (its preallocation): a child's JAX that preallocates too
    # probably fails to start its GPU backend and runs on the CPU (the NumPyro GPU tests were then skipped)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])),
               XLA_PYTHON_CLIENT_PREALLOCATE="false")  # fmt: skip
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as late:
        print(f"{late.stdout or ''}\nstopped after {timeout} s (the time budget)")
        return
    print(done.stdout)
    if done.returncode:
        print(f"exit status {done.returncode}:\n{done.stderr[-3000:]}")


def section_streamed(size: dict) -> None:
    print("\n### Streamed data (benchmarks/streaming_blocks.py)\n", flush=True)
    run([sys.executable, "benchmarks/streaming_blocks.py", "--steps", str(size["stream_steps"]), "--repeats",
         str(size["repeats"])], timeout=240)  # fmt: skip


def section_tests(size: dict) -> None:
    print("\n### GPU tests\n", flush=True)
    tests = ["tests/numpyro/test_gpu.py", "tests/pyro/test_cuda.py", "tests/numpyro/test_accelerator_step.py"]
    if not size["tests"]:  # the dry run: collect them only
        tests = ["--collect-only", *tests]
    # the accelerator step's structural tests lower the step for this machine's backend; its same-chain tests
    # compare the two steps on one device, which test_gpu.py does across devices
    select = ["-k", "not test_the_accelerator_step_gives and not test_the_same_draws and not resumed"]
    # the project's addopts name plugins (nbmake, xdist) that a GPU machine's own environment may lack
    run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-o", "addopts=--import-mode=importlib", "-q", "-rs",
         *select, *tests],
        timeout=max(int(size["left"]), 60))  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes: check the script (on the CPU too)")
    parser.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated sections of {SECTIONS}")
    parser.add_argument("--skip-tests", action="store_true", help="leave out the GPU tests")
    args = parser.parse_args(argv)
    global SIZE
    size = SIZE = DRY if args.dry_run else FULL
    sections = [name for name in args.only.split(",") if name and not (args.skip_tests and name == "tests")]
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown section(s) {unknown}; choose from {SECTIONS}")
    start = time.perf_counter()
    print(f"# GPU rows: {jax.devices()} (jax {jax.__version__}), step path "
          f"{kernel_module.STEP_PATH or 'by the data'}{', dry run' if args.dry_run else ''}\n", flush=True)  # fmt: skip
    for name in sections:
        began = time.perf_counter()
        size["left"] = BUDGET - (began - start)
        if size["left"] < (0 if name == "tests" else 30) and not args.dry_run:
            print(f"({name}: skipped, {began - start:.0f} s of the {BUDGET} s budget spent)\n", flush=True)
            continue
        try:
            globals()[f"section_{name}"](size)
        except Exception:  # noqa: BLE001 - one failed section must not lose the others' rows
            print(f"section {name} failed:\n{traceback.format_exc()}")
        print(f"({name}: {time.perf_counter() - began:.0f} s)\n", flush=True)
    print(f"total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
