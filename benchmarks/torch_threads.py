#!/usr/bin/env python
"""Pyro backend: the cost of a step with torch's default intra-op threads against ``torch.set_num_threads(1)``.

A Pyro SGLD step (``ppl_sgmcmc.pyro.SGLD``, the compiled potential, the library's defaults) is timed two ways:

* **MCMC**: ``pyro.infer.MCMC(kernel, warmup_steps=0, num_samples=S, disable_progbar=True)``; time per step
  between the first and the last draw (a ``hook_fn`` time-stamps the draws; setup and the one-off
  compilation of the potential, which happen before the first draw, are excluded);
* **loop**: the kernel's own ``setup`` and ``kernel.sample`` in a Python loop (no per-draw overhead of
  ``MCMC``), after a first, untimed ``sample`` that compiles the potential.

Models (Bayesian logistic regression, prior N(0, 10), synthetic data, minibatch n=100 by Pyro's own plate;
``--batch`` changes n):

* **small**: d=5, N=2000;
* **a9a-size**: d=123, N=32561 (binary features with a9a's density, about 14 ones per row).

Thread settings, each in a **fresh subprocess** so that nothing of another setting (the thread pool, the
Inductor code compiled for a thread count) leaks into it:

* ``1``: ``torch.set_num_threads(1)`` before anything else;
* ``default``: torch left alone (``torch.get_num_threads()`` at the start of the process, which is the
  number of cores unless ``OMP_NUM_THREADS`` says otherwise);
* ``late`` (not with ``--quick``): torch's default during setup and the compilation of the potential, and
  ``torch.set_num_threads(1)`` only afterwards (at the first draw). TorchInductor writes the thread count
  into the C++ code it generates, so this shows what setting it after the kernel has compiled still buys.
* any integer ``k`` given in ``--settings``: ``torch.set_num_threads(k)``.

Every (model, setting) pair runs once per round, rounds interleaved; inside a subprocess the MCMC and loop
timings are repeated and their best kept. Reported: ms per step, best and median over the rounds, and the
ratio default / 1 (and late / 1) of the best times.

Usage (from the repository root)::

    .venv/bin/python benchmarks/torch_threads.py --quick    # about 1.5 min on 2 shared cores
    .venv/bin/python benchmarks/torch_threads.py            # about 4-6 min
    .venv/bin/python benchmarks/torch_threads.py --settings 1,2,4,default --models a9a --batch 1000
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BATCH = 100
PRIOR_VAR = 10.0
MODELS = {
    # name: (label, N, d, SGLD step size)
    "small": ("small (d=5, N=2000)", 2000, 5, 1e-4),
    "a9a": ("a9a-size (d=123, N=32561)", 32561, 123, 5e-6),
}


# --------------------------------------------------------------------------------------------------
# the child: one model, one thread setting, in a fresh process
# --------------------------------------------------------------------------------------------------
def model(X, y=None, batch=BATCH):
    import pyro
    import pyro.distributions as dist

    w = pyro.sample("w", dist.Normal(0.0, PRIOR_VAR**0.5).expand([X.shape[1]]).to_event(1))
    with pyro.plate("data", X.shape[0], subsample_size=batch):
        Xb = pyro.subsample(X, event_dim=1)
        yb = pyro.subsample(y, event_dim=0) if y is not None else None
        pyro.sample("y", dist.Bernoulli(logits=Xb @ w), obs=yb)


def data(N, d):
    import torch

    g = torch.Generator().manual_seed(0)
    if d > 20:  # a9a-like: binary features, about 14 ones in 123 columns
        X = (torch.rand(N, d, generator=g) < 14 / 123).float()
        w = 0.5 * torch.randn(d, generator=g)
        logits = X @ w - (X @ w).mean()
    else:
        X = torch.randn(N, d, generator=g)
        logits = X @ torch.randn(d, generator=g)
    y = torch.bernoulli(torch.sigmoid(logits), generator=g)
    return X, y


def child(name, setting, steps, repeats, batch):
    import warnings

    warnings.simplefilter("ignore")
    import torch  # the default thread count is read before anything else touches torch

    default_threads = torch.get_num_threads()
    if setting not in ("default", "late"):
        torch.set_num_threads(int(setting))
    import pyro
    from pyro.infer import MCMC

    from ppl_sgmcmc.pyro import SGLD

    _, N, d, step_size = MODELS[name]
    X, y = data(N, d)

    def go_single():
        if setting == "late" and torch.get_num_threads() != 1:
            torch.set_num_threads(1)

    def mcmc_ms(num_samples):
        """ms per step between the first and the last draw, and the seconds to the first draw (setup and the
        compilation of the potential, or the reuse of its graph)."""
        stamps = []

        def hook(kernel, params, stage, i):
            go_single()
            stamps.append(time.perf_counter())

        mcmc = MCMC(SGLD(model, step_size=step_size), warmup_steps=0, num_samples=num_samples,
                    disable_progbar=True, hook_fn=hook)  # fmt: skip
        pyro.set_rng_seed(0)
        start = time.perf_counter()
        mcmc.run(X, y, batch)
        return (stamps[-1] - stamps[0]) / (len(stamps) - 1) * 1e3, stamps[0] - start

    def loop_ms(num_steps):
        kernel = SGLD(model, step_size=step_size)
        pyro.set_rng_seed(0)
        kernel.setup(0, X, y, batch)
        params = kernel.sample(kernel.initial_params)  # compiles the potential (or reuses its graph)
        go_single()
        start = time.perf_counter()
        for _ in range(num_steps):
            params = kernel.sample(params)
        ms = (time.perf_counter() - start) / num_steps * 1e3
        kernel.cleanup()
        return ms

    mcmc, loop, first = [], [], []
    for _ in range(repeats):
        ms, s = mcmc_ms(steps)
        mcmc.append(ms)
        first.append(s)
        loop.append(loop_ms(steps))
    first_s = first[0]  # the first run compiles the potential; later kernels reuse the compiled graph
    out = dict(model=name, setting=setting, default_threads=default_threads, threads=torch.get_num_threads(),
               mcmc=min(mcmc), loop=min(loop), first_s=first_s, torch=torch.__version__,
               pyro=pyro.__version__)  # fmt: skip
    print(json.dumps(out), flush=True)


# --------------------------------------------------------------------------------------------------
# the parent
# --------------------------------------------------------------------------------------------------
def cpu_model():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def run_child(name, setting, steps, repeats, batch):
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        name,
        setting,
        str(steps),
        str(repeats),
        str(batch),
    ]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        sys.exit(f"the subprocess for {name}/{setting} failed:\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps and rounds, settings 1 and default")
    parser.add_argument("--steps", type=int, default=None, help="SG-MCMC steps per timing (quick 200; 1000)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds of subprocesses (quick 2; 3)")
    parser.add_argument("--repeats", type=int, default=None, help="timings per subprocess, best kept (quick 1; 2)")
    parser.add_argument("--settings", default=None, help="comma-separated: 1, default, late, or a thread count")
    parser.add_argument("--models", default="small,a9a", help="comma-separated: small, a9a")
    parser.add_argument("--batch", type=int, default=BATCH, help="the minibatch size n (default 100)")
    parser.add_argument(
        "--child", nargs=5, metavar=("MODEL", "SETTING", "STEPS", "REPEATS", "N"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)
    if args.child:
        name, setting, steps, repeats, batch = args.child
        return child(name, setting, int(steps), int(repeats), int(batch))

    steps = args.steps or (200 if args.quick else 1000)
    rounds = args.rounds or (2 if args.quick else 3)
    repeats = args.repeats or (1 if args.quick else 2)
    settings = (args.settings or ("1,default" if args.quick else "1,default,late")).split(",")
    names = args.models.split(",")
    for s in settings:
        if s not in ("default", "late") and not s.isdigit():
            parser.error(f"unknown setting {s!r}")
    for n in names:
        if n not in MODELS:
            parser.error(f"unknown model {n!r}")

    t0 = time.perf_counter()
    print("# Pyro: torch threads (benchmarks/torch_threads.py)")
    print()
    print(f"    command: {' '.join([os.path.basename(sys.executable)] + sys.argv)}")
    print(f"    date: {datetime.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')}; load average at start: "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")  # fmt: skip
    print(f"    machine: {cpu_model()}, os.cpu_count() {os.cpu_count()}, usable {len(os.sched_getaffinity(0))}; "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '(unset)')}; python {platform.python_version()}")  # fmt: skip
    print(f"    minibatch n={args.batch}; timing: {steps} steps per timing, {repeats} timing(s) per subprocess "
          f"(best kept), {rounds} interleaved rounds of fresh subprocesses; ms per step")  # fmt: skip
    print(flush=True)

    results = {}  # (model, setting) -> [child outputs]
    for r in range(rounds):
        for name in names:
            for setting in settings:
                out = run_child(name, setting, steps, repeats, args.batch)
                results.setdefault((name, setting), []).append(out)
                print(f"  round {r + 1}: {name:<5} {setting:>7} ({out['threads']} thread(s) while timed): "
                      f"MCMC {out['mcmc']:7.3f} ms, loop {out['loop']:7.3f} ms, to first draw {out['first_s']:.1f} s",
                      file=sys.stderr, flush=True)  # fmt: skip

    first = next(iter(results.values()))[0]
    print(f"    torch {first['torch']}, pyro {first['pyro']}; torch.get_num_threads() at the start of a fresh "
          f"process (the default): {first['default_threads']}")  # fmt: skip
    print()
    print("| model | torch threads | MCMC: ms/step, best (median) | ratio to 1 thread | kernel.sample loop: ms/step, "
          "best (median) | ratio to 1 thread |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|")
    for name in names:
        base = results.get((name, "1"))
        for setting in settings:
            outs = results[(name, setting)]
            label = {
                "default": f"default ({outs[0]['default_threads']})",
                "late": "default while compiling, then 1",
            }.get(setting, setting)
            cells = []
            for key in ("mcmc", "loop"):
                vals = [o[key] for o in outs]
                ratio = f"{min(vals) / min(o[key] for o in base):.2f}" if base else ""
                cells += [f"{min(vals):.3f} ({statistics.median(vals):.3f})", ratio]
            print(f"| {MODELS[name][0]}, n={args.batch} | {label} | " + " | ".join(cells) + " |")
    print()
    print(f"    load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
          f"wall time {time.perf_counter() - t0:.0f} s")  # fmt: skip


if __name__ == "__main__":
    main()
