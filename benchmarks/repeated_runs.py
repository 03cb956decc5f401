#!/usr/bin/env python
"""Memory across repeated runs in one process: what a notebook user pays for rerunning a cell.

Each run builds a new kernel and a new ``MCMC`` for the same small model, as a rerun cell does, runs it and
drops it; the process's resident memory (RSS) is printed after each run, and the growth per run is fitted
(least squares) over the runs after the first ``--skip`` (those pay for compilation and warm caches). A
library that keeps something per kernel instance (compiled programs keyed on fresh closures, module-level
dicts, ...) shows up here as a steady growth per run.

Model: Bayesian logistic regression, ``N`` synthetic rows (default 2000) and ``d=5`` features, the
likelihood in a plate subsampled to ``n`` rows (default 100), ``SGLD``; a given step size and a tuned one
(``step_size=None``: the warm-up finds a mode, a preconditioner and the step size). Backends:

* ``numpyro``: ``numpyro.infer.MCMC`` (``--mcmc numpyro``) or ``ppl_sgmcmc.numpyro.MCMC`` (``--mcmc ppl``, the
  default; the end-of-run verdict included), without a progress bar unless ``--progress-bar``;
* ``pyro``: ``pyro.infer.MCMC`` with ``ppl_sgmcmc.pyro.SGLD``, for comparison.

What grew (issue 31): NumPyro compiles its sampling loop (``numpyro.util.fori_collect``) as a module-level jitted
function with the run's step function as a static argument, so JAX's compilation caches kept every run's
program, and through the step function its kernel and ``MCMC`` object, for the life of the process: 9-13 MB
per run here (NUTS under ``numpyro.infer.MCMC`` grows the same way). ``ppl_sgmcmc.numpyro.MCMC`` now compiles
a loop of its own per run, which JAX's caches key weakly and drop with the run: no growth. Under
``numpyro.infer.MCMC`` the growth is NumPyro's and remains.

Usage (from the repository root)::

    PYTHONPATH=. taskset -c 1 .venv/bin/python benchmarks/repeated_runs.py              # both backends, ~10 min
    PYTHONPATH=. .venv/bin/python benchmarks/repeated_runs.py --backend numpyro --runs 15
    PYTHONPATH=. .venv/bin/python benchmarks/repeated_runs.py --backend numpyro --trace   # + what grew (tracemalloc)
"""

from __future__ import annotations

import argparse
import gc
import os
import time
import tracemalloc
import warnings
from collections.abc import Callable

import numpy as np


def rss_mb() -> float:
    """The process's resident set size, MB (``/proc/self/statm``; ``resource`` gives only the peak)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:  # not Linux: the peak, which only grows
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10


def data(N: int, d: int = 5, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(N, d)).astype(np.float32)
    w = rng.normal(size=d)
    y = (rng.random(N) < 1 / (1 + np.exp(-X @ w))).astype(np.float32)
    return X, y


def numpyro_run(args: argparse.Namespace, step_size: float | None) -> Callable[[], None]:
    import jax
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist

    from ppl_sgmcmc import numpyro as sg

    X, y = (jnp.asarray(a) for a in data(args.N))
    n = args.n

    def model(X, y=None):
        w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
        with numpyro.plate("data", X.shape[0], subsample_size=n):
            Xb = numpyro.subsample(X, event_dim=1)
            yb = numpyro.subsample(y, event_dim=0) if y is not None else None
            numpyro.sample("y", dist.Bernoulli(logits=Xb @ w), obs=yb)

    def run() -> None:
        kernel = sg.SGLD(model, step_size=step_size)
        if args.mcmc == "ppl":
            mcmc = sg.MCMC(kernel, num_warmup=args.warmup, num_samples=args.samples)
        else:
            mcmc = numpyro.infer.MCMC(kernel, num_warmup=args.warmup, num_samples=args.samples)
        mcmc.progress_bar = args.progress_bar  # NumPyro turns it off under CI
        mcmc.run(jax.random.PRNGKey(0), X, y)
        jax.block_until_ready(mcmc.get_samples())

    return run


def pyro_run(args: argparse.Namespace, step_size: float | None) -> Callable[[], None]:
    import pyro
    import pyro.distributions as dist
    import torch
    from pyro.infer import MCMC

    from ppl_sgmcmc import pyro as sg

    torch.set_num_threads(1)
    X, y = (torch.as_tensor(a) for a in data(args.N))
    n = args.n

    def model(X, y=None):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
        with pyro.plate("data", X.shape[0], subsample_size=n) as idx:
            pyro.sample("y", dist.Bernoulli(logits=X[idx] @ w), obs=y[idx] if y is not None else None)

    def run() -> None:
        pyro.set_rng_seed(0)
        kernel = sg.SGLD(model, step_size=step_size)
        mcmc = MCMC(kernel, warmup_steps=args.warmup, num_samples=args.samples, disable_progbar=True)
        mcmc.run(X, y)
        mcmc.get_samples()

    return run


def measure(label: str, run: Callable[[], None], args: argparse.Namespace) -> float:
    """Run ``args.runs`` times, print RSS after each, return the fitted growth per run (MB) after ``args.skip``."""
    print(f"\n{label}")
    rss, snapshot = [], None
    for i in range(args.runs):
        start = time.perf_counter()
        run()
        gc.collect()
        rss.append(rss_mb())
        print(f"  run {i + 1:2d}: RSS {rss[-1]:7.1f} MB  ({time.perf_counter() - start:.1f} s)", flush=True)
        if args.trace and i + 1 == args.skip:
            snapshot = tracemalloc.take_snapshot()
    later = np.asarray(rss[args.skip:])
    slope = float(np.polyfit(np.arange(later.size), later, 1)[0]) if later.size > 1 else float("nan")
    print(f"  growth per run after the first {args.skip} runs: {slope:+.2f} MB "
          f"(RSS {rss[min(args.skip, len(rss)) - 1]:.1f} -> {rss[-1]:.1f} MB)")
    if snapshot is not None:
        print("  largest Python allocations grown since then (tracemalloc):")
        for stat in tracemalloc.take_snapshot().compare_to(snapshot, "traceback")[:8]:
            print(f"    {stat.size_diff / 2**10:+9.1f} KiB {stat.count_diff:+6d} blocks  {stat.traceback.format()[-1].strip()}")
    return slope


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["numpyro", "pyro", "both"], default="both")
    parser.add_argument("--mcmc", choices=["ppl", "numpyro"], default="ppl",
                        help="ppl_sgmcmc.numpyro.MCMC or numpyro.infer.MCMC (NumPyro backend)")
    parser.add_argument("--step-size", choices=["given", "tuned", "both"], default="both")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--skip", type=int, default=5, help="runs left out of the growth fit")
    parser.add_argument("--N", type=int, default=2000, help="rows")
    parser.add_argument("--n", type=int, default=100, help="minibatch size")
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--samples", type=int, default=500)
    parser.add_argument("--progress-bar", action="store_true", help="NumPyro backend: with the progress bar")
    parser.add_argument("--trace", action="store_true", help="tracemalloc: the Python allocations that grew")
    parser.add_argument("--warnings", action="store_true",
                        help="show the kernels' warnings (these short runs are not meant to converge)")
    args = parser.parse_args()
    if not args.warnings:
        warnings.simplefilter("ignore")
    if args.trace:
        tracemalloc.start(25)

    sizes = {"given": [0.01], "tuned": [None], "both": [0.01, None]}[args.step_size]
    backends = ["numpyro", "pyro"] if args.backend == "both" else [args.backend]
    results = {}
    for backend in backends:
        for step_size in sizes:
            make = numpyro_run if backend == "numpyro" else pyro_run
            mcmc = f"{args.mcmc} MCMC" if backend == "numpyro" else "pyro MCMC"
            label = f"{backend} ({mcmc}), SGLD, step size {'tuned' if step_size is None else step_size}"
            results[label] = measure(label, make(args, step_size), args)
    print("\ngrowth per run (MB), after the first", args.skip, "runs:")
    for label, slope in results.items():
        print(f"  {slope:+7.2f}  {label}")


if __name__ == "__main__":
    main()
