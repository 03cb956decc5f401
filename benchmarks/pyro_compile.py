#!/usr/bin/env python
"""Compiling the Pyro backend's potential: eager Pyro, the hand-written FX simplifier, ``torch.compile``
and ``torch.jit.trace``, side by side in one process.

The Pyro kernels trace one evaluation of the minibatch potential and its gradient ``(Ũ_t, ∇Ũ_t)``,
forward and backward, into an ATen graph (``make_fx`` on fake tensors, see
:mod:`ppl_sgmcmc.pyro.compile`) and call that graph every step. What to do with the graph before
calling it is the question here. For each model, per call of the potential and its gradient at a
fixed point and minibatch:

* **eager**: the kernel's eager path (``compile_potential=False``): the model under one handler, autograd;
* **traced graph**: the ``make_fx`` graph run as traced (``torch.fx`` interpreter-free generated Python);
* **FX simplifier**: that graph after the hand-written ``simplify`` (constant folding, no-op removal)
  that ``ppl_sgmcmc/pyro/compile.py`` held up to commit ``832e808`` (the kernels' default until this
  benchmark); its source is read with ``git show`` (``--simplifier-rev``, or ``--simplifier-file``);
* **torch.compile**: ``torch.compile(graph, dynamic=False, fullgraph=True)`` (TorchInductor, C++ on
  CPU), mode ``"default"`` and ``"reduce-overhead"``; compile time cold (a fresh Inductor cache
  directory for the whole run, unless ``--warm-cache``) and warm (a freshly traced copy of the same
  graph compiled again: what a second kernel or chain pays);
* **jit.trace**: ``torch.jit.freeze(torch.jit.trace(graph))``;
* **library**: ``ppl_sgmcmc.pyro.compile.trace`` as the kernels call it now (trace, compile, checks
  against the eager model at two points);
* **torch.compile(model)** (not with ``--quick``): ``torch.compile`` of the traced function itself
  (the model's Python with ``torch.autograd.grad``), to show why the kernels trace with ``make_fx`` first.

Then a full SGLD step through the kernel (``kernel.sample`` in a Python loop: minibatch draw, the
gradient, noise, the update, the finiteness check) with the eager model, the FX simplifier's graph,
the library's compiled graph and the jit.trace graph plugged into the same kernel.

Models: the throughput benchmark's Bayesian logistic regression on a9a (N=32561, d=123, n=100, prior
N(0, 10); ``models/data/a9a.npz``); a small linear regression (d=5 weights and a HalfNormal noise
scale, N=10,000 synthetic, n=100), also with per-datum scores (the batched backward of SGFS, not with
``--quick``); semi-collapsed LDA (``models.lda_pyro``) on Reuters (395 documents, V=4258, K=30,
minibatches of 5 documents, ``gibbs_sweeps=(3, 2)``: the graph holds the log joint of the 2 kept
sweeps; the sweeps themselves run eagerly in every variant).

Timing: ``torch.set_num_threads(1)`` (torch's default threads make the small model many times slower
on a 2-core machine); every variant is timed once per round, rounds interleaved, best and median of
the rounds reported; ratios are to the FX simplifier of the same round set. Compile times are one
measurement each (first call included), reported apart from the per-call times.

Usage (from the repository root)::

    PYTHONPATH=. .venv/bin/python benchmarks/pyro_compile.py            # ~6-8 min on 2 cores
    PYTHONPATH=. .venv/bin/python benchmarks/pyro_compile.py --quick    # ~2-3 min
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIMPLIFIER_REV = "832e808e5897374dcfcd2f9b8ae3b78482797012"  # the last commit with the hand-written simplifier
BATCH = 100
PRIOR_VAR = 10.0


# --------------------------------------------------------------------------------------------------
# models
# --------------------------------------------------------------------------------------------------
def a9a_model(X, y=None):
    """The throughput benchmark's ``pyro_model``: logistic regression, prior N(0, 10), n=100."""
    import pyro
    import pyro.distributions as dist

    w = pyro.sample("w", dist.Normal(0.0, PRIOR_VAR**0.5).expand([X.shape[1]]).to_event(1))
    with pyro.plate("data", X.shape[0], subsample_size=BATCH):
        Xb = pyro.subsample(X, event_dim=1)
        yb = pyro.subsample(y, event_dim=0) if y is not None else None
        pyro.sample("y", dist.Bernoulli(logits=Xb @ w), obs=yb)


def small_model(X, y):
    """Linear regression, d=5, a HalfNormal noise scale (a constrained latent: a log-Jacobian term)."""
    import pyro
    import pyro.distributions as dist

    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    sigma = pyro.sample("sigma", dist.HalfNormal(1.0))
    with pyro.plate("data", X.shape[0], subsample_size=BATCH):
        pyro.sample("y", dist.Normal(pyro.subsample(X, event_dim=1) @ w, sigma), obs=pyro.subsample(y, event_dim=0))


def cases(quick):
    """``[(label, make_kernel(compile_potential) -> kernel, model args, model kwargs, score kind, steps
    per round of the full step (0: none))]``."""
    import torch

    from models.datasets import load_a9a
    from ppl_sgmcmc.pyro import SGLD

    X_np, y_np, _, _ = load_a9a()
    X, y = torch.from_numpy(X_np), torch.from_numpy(y_np)
    g = torch.Generator().manual_seed(0)
    Xs = torch.randn(10_000, 5, generator=g)
    ys = Xs @ torch.randn(5, generator=g) + 0.5 * torch.randn(10_000, generator=g)
    steps = 600 if quick else 2000
    out = [
        ("a9a logistic regression (d=123)", lambda c: SGLD(a9a_model, step_size=5e-6, compile_potential=c),
         (X, y), {}, False, steps),
        ("small linear regression (d=5+1)", lambda c: SGLD(small_model, step_size=1e-4, compile_potential=c),
         (Xs, ys), {}, False, steps),
    ]  # fmt: skip
    if not quick:
        out.append(("small, per-datum scores (SGFS)", lambda c: SGLD(small_model, step_size=1e-4, compile_potential=c),
                    (Xs, ys), {}, "per_example", 0))  # fmt: skip
    out.append(lda_case(quick))
    return out


def lda_case(quick):
    import numpy as np
    import torch

    from models import lda_pyro
    from models.datasets import load_corpus
    from ppl_sgmcmc.pyro import SGLD

    corpus = load_corpus("reuters")
    docs = [corpus.tokens(d) for d in range(corpus.num_documents)]
    length = max(len(d) for d in docs)
    words = np.zeros((len(docs), length), dtype=np.int64)
    mask = np.zeros((len(docs), length), dtype=bool)
    for i, d in enumerate(docs):
        words[i, : len(d)], mask[i, : len(d)] = d, True
    words, mask = torch.from_numpy(words), torch.from_numpy(mask)

    def make(c):
        return SGLD(
            lda_pyro.lda_model, step_size=1e-3, gibbs_sites=["z"], gibbs_sweeps=(3, 2),
            gibbs_fn=lda_pyro.make_gibbs_fn(words, mask, 0.1, "gaussian"),
            gibbs_init=lda_pyro.make_gibbs_init(words, mask, "gaussian"), compile_potential=c,
        )  # fmt: skip

    kwargs = dict(vocab_size=corpus.vocab_size, num_topics=30, alpha=0.1, parametrisation="gaussian", batch_size=5)
    return (f"LDA on Reuters (K=30, V={corpus.vocab_size}, 5 docs of <= {length} tokens)", make, (words, mask),
            kwargs, False, 6 if quick else 15)  # fmt: skip


# --------------------------------------------------------------------------------------------------
# the variants
# --------------------------------------------------------------------------------------------------
def load_simplifier(rev, path):
    """The hand-written simplifier module of ``ppl_sgmcmc/pyro/compile.py`` at ``rev`` (or from ``path``)."""
    if path is None:
        source = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{rev}:ppl_sgmcmc/pyro/compile.py"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        path = Path(tempfile.mkdtemp()) / "fx_simplifier.py"
        path.write_text(source)
    spec = importlib.util.spec_from_file_location("fx_simplifier", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_fx_graph(fn, inputs):
    import pyro
    from torch.fx.experimental.proxy_tensor import make_fx

    with pyro.validation_enabled(False), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return make_fx(fn, tracing_mode="fake", _allow_non_fake_inputs=True)(*inputs)


def timed(build):
    """``(result, seconds)`` of ``build()``."""
    start = time.perf_counter()
    result = build()
    return result, time.perf_counter() - start


def setup_target(make_kernel, args, kwargs, score, compile_potential=False):
    """A kernel set up on the model, its target, a fixed point, a fixed minibatch (with the kept Gibbs
    sweeps for LDA) and the traceable ``(fn, inputs, check)`` there."""
    import pyro
    import torch

    from ppl_sgmcmc.pyro.gibbs import GibbsTarget

    kernel = make_kernel(compile_potential)
    pyro.set_rng_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kernel.setup(0, *args, **kwargs)
    target = kernel._target
    if score == "per_example":
        target.enable_per_example_scores()
    flat = target.layout.ravel(target.initial_params())
    generator = torch.Generator().manual_seed(0)
    drawn, _ = target.draw(generator, target.init_batch(generator))
    if isinstance(target, GibbsTarget):
        indices, seed = drawn
        batch = (indices, target.local_samples(flat, indices, seed))
    else:
        batch = drawn
    key = ("gradient", score)
    fn, inputs, check = target.traceable(key, flat, batch)
    return kernel, target, key, flat, batch, fn, inputs, check


def build_variants(case, simplifier, quick, log):
    """``{name: (callable(*inputs), compile seconds cold, compile seconds warm, note)}``, the eager path,
    and the traced function's inputs; each variant checked against the eager path at the point."""
    import torch

    from ppl_sgmcmc.pyro import compile as compile_

    label, make_kernel, args, kwargs, score, _ = case
    kernel, target, key, flat, batch, fn, inputs, check = setup_target(make_kernel, args, kwargs, score)
    eager = target._eager_gradient(flat, batch, score)
    expected = [eager.energy, eager.grad, eager.score, eager.per_example][: 2 + bool(score) + (score == "per_example")]
    variants = {}

    def add(name, build, warm=None, note="", cached=False):
        """``cached``: the graph was compiled before in this run, its time goes to the warm column."""
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                call, cold_s = timed(lambda: _first_call(build(), inputs))
                warm_s = timed(lambda: _first_call(warm(), inputs))[1] if warm is not None else None
                if cached:
                    cold_s, warm_s = None, cold_s
        except Exception as err:  # noqa: BLE001 - report, go on
            log(f"    {name}: FAILED ({type(err).__name__}: {str(err).strip().splitlines()[0][:200]})")
            return
        got = call(*inputs)
        agrees = len(got) == len(expected) and all(compile_.close(a, b) for a, b in zip(got, expected))
        variants[name] = dict(call=call, cold=cold_s, warm=warm_s, agrees=agrees, note=note)
        times = ", ".join(f"{what} {t:.2f} s" for what, t in (("cold", cold_s), ("again", warm_s)) if t is not None)
        log(f"    {name}: ready ({times}); agrees with eager: {agrees}")

    graph, trace_s = timed(lambda: make_fx_graph(fn, inputs))
    ops = sum(n.op == "call_function" for n in graph.graph.nodes)
    log(f"  {label}: make_fx trace {trace_s:.2f} s, {ops} ATen ops")
    variants["eager (compile_potential=False)"] = dict(
        call=lambda *_: target._eager_gradient(flat, batch, score), cold=None, warm=None, agrees=True, note=""
    )
    add("traced graph, as traced", lambda: compile_.CompiledFunction(make_fx_graph(fn, inputs)))

    def simplified():
        g = simplifier.simplify(make_fx_graph(fn, inputs))
        simplified.ops = sum(n.op == "call_function" for n in g.graph.nodes)
        return compile_.CompiledFunction(g)

    add("FX simplifier (hand-written, old default)", simplified)
    variants.get("FX simplifier (hand-written, old default)", {})["note"] = f"{getattr(simplified, 'ops', '?')} ops"

    def inductor(mode):
        return lambda: compile_.CompiledFunction(
            torch.compile(make_fx_graph(fn, inputs), dynamic=False, fullgraph=True, mode=mode)
        )

    add("torch.compile, mode=default", inductor("default"), warm=inductor("default"))
    add("torch.compile, mode=reduce-overhead", inductor("reduce-overhead"))

    def jit():
        traced = torch.jit.trace(make_fx_graph(fn, inputs), inputs, check_trace=False)
        return compile_.CompiledFunction(torch.jit.freeze(traced.eval()))

    add("torch.jit.trace + freeze", jit)

    def library():
        compiled = compile_.trace(fn, inputs, check, "bench")
        if compiled is None:
            raise RuntimeError("the library fell back to eager")
        return compiled

    add("library: compile.trace (make_fx + torch.compile + checks)", library, cached=True)
    if "library: compile.trace (make_fx + torch.compile + checks)" in variants:
        again = timed(library)[1]  # an identical graph: the compiled module is reused (compile._memo)
        variants["library: compile.trace (make_fx + torch.compile + checks)"]["note"] = (
            f"an identical graph again: {again:.2f} s"
        )
        log(f"    library, an identical graph again: {again:.2f} s")
    if not quick and "LDA" not in label:
        add("torch.compile(model) directly, no make_fx", lambda: _direct(torch.compile(fn, dynamic=False)))
    return variants, inputs, (kernel, target, key, flat, batch)


def _first_call(call, inputs):
    call(*inputs)
    return call


def _direct(compiled_fn):
    import torch

    def call(*inputs):
        with torch.enable_grad():
            return tuple(compiled_fn(*inputs))

    return call


def time_calls(variants, inputs, rounds, target_s, log):
    """Per-call µs of each variant: ``rounds`` interleaved rounds of about ``target_s`` seconds each."""
    counts = {}
    for name, v in variants.items():  # calls per round, from a short calibration
        start, n = time.perf_counter(), 0
        while time.perf_counter() - start < 0.05 or n < 3:
            v["call"](*inputs)
            n += 1
        counts[name] = max(5, int(target_s * n / (time.perf_counter() - start)))
    per_call = {name: [] for name in variants}
    for r in range(rounds):
        for name, v in variants.items():
            call, n = v["call"], counts[name]
            start = time.perf_counter()
            for _ in range(n):
                call(*inputs)
            per_call[name].append((time.perf_counter() - start) / n * 1e6)
        log(f"    round {r + 1}/{rounds} done")
    return per_call, counts


def time_steps(case, variants, rounds, steps, log):
    """Steps/s of ``kernel.sample`` in a loop, with the eager model or one variant's graph plugged in."""
    import pyro
    import torch

    label, make_kernel, args, kwargs, score, _ = case
    plugged = {
        "eager (compile_potential=False)": None,
        "FX simplifier (hand-written, old default)": "FX simplifier (hand-written, old default)",
        "library: torch.compile": "library: compile.trace (make_fx + torch.compile + checks)",
        "torch.jit.trace + freeze": "torch.jit.trace + freeze",
    }
    plugged = {k: v for k, v in plugged.items() if v is None or v in variants}
    rates = {name: [] for name in plugged}
    for r in range(rounds):
        for name, source in plugged.items():
            kernel, target, key, flat, batch, *_ = setup_target(make_kernel, args, kwargs, score)
            if source is not None:
                target._compiled[key] = variants[source]["call"]  # the graphs take the same inputs
            pyro.set_rng_seed(1)
            params = kernel.sample(kernel.initial_params)
            start = time.perf_counter()
            for _ in range(steps):
                params = kernel.sample(params)
            rates[name].append(steps / (time.perf_counter() - start))
            assert all(bool(torch.isfinite(v).all()) for v in params.values()), (label, name)
            kernel.cleanup()
        log(f"    steps round {r + 1}/{rounds} done")
    return rates


# --------------------------------------------------------------------------------------------------
def machine():
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        model = next((ln.split(":", 1)[1].strip() for ln in lscpu.splitlines() if ln.startswith("Model name")), "?")
    except OSError:
        model = platform.processor() or "?"
    gcc = shutil.which("gcc")
    gcc_version = (
        subprocess.run([gcc, "--version"], capture_output=True, text=True).stdout.splitlines()[0] if gcc else "none"
    )
    return model, os.cpu_count(), gcc_version


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and steps, no per-datum scores (~2-3 min)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved timing rounds (default 5; --quick 3)")
    parser.add_argument("--warm-cache", action="store_true", help="keep Inductor's usual cache (compile times warm)")
    parser.add_argument("--simplifier-rev", default=SIMPLIFIER_REV, help="git revision holding the FX simplifier")
    parser.add_argument("--simplifier-file", type=Path, default=None, help="or its source file")
    parser.add_argument("--no-lda", action="store_true", help="skip the LDA model")
    args = parser.parse_args(argv)
    rounds = args.rounds or (3 if args.quick else 5)
    call_s = 0.15 if args.quick else 0.3
    if not args.warm_cache:  # cold compile times: a fresh Inductor cache, read when torch first compiles
        cache = tempfile.mkdtemp(prefix="inductor-cache-")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
    sys.path.insert(0, str(ROOT))

    t_start = time.perf_counter()
    import pyro
    import torch

    torch.set_num_threads(1)
    simplifier = load_simplifier(args.simplifier_rev, args.simplifier_file)
    model, cores, gcc = machine()
    print("# Pyro: compiling the potential (benchmarks/pyro_compile.py)")
    print()
    print(f"    command: {' '.join([os.path.basename(sys.executable)] + sys.argv)}")
    print(f"    date: {datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}; load average at start: "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")  # fmt: skip
    print(f"    machine: {model}, {cores} cores; python {platform.python_version()}, torch {torch.__version__}, "
          f"pyro {pyro.__version__}, {gcc}")  # fmt: skip
    print(
        f"    torch threads: 1 (torch.set_num_threads(1)); Inductor cache: "
        f"{'the usual one (--warm-cache)' if args.warm_cache else 'fresh for this run (cold compile times)'}"
    )
    print(f"    FX simplifier: ppl_sgmcmc/pyro/compile.py at {args.simplifier_file or args.simplifier_rev[:7]}")
    print(f"    timing: {rounds} interleaved rounds per variant, ~{call_s} s of calls each; best and median")
    print(flush=True)

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    _, init_s = timed(lambda: _first_call(torch.compile(lambda x: (x * 2).sum(), dynamic=False), (torch.ones(3),)))
    log(f"one-off torch.compile initialisation (a trivial function): {init_s:.2f} s")
    results = []
    for case in cases(args.quick):
        if args.no_lda and "LDA" in case[0]:
            continue
        log(f"{case[0]}")
        variants, inputs, _ = build_variants(case, simplifier, args.quick, log)
        per_call, counts = time_calls(variants, inputs, rounds, call_s, log)
        rates = time_steps(case, variants, max(2, rounds - 1), case[5], log) if case[5] else {}
        results.append((case, variants, per_call, counts, rates))

    print(f"One-off `torch.compile` initialisation in the process (a trivial function): {init_s:.1f} s.")
    for case, variants, per_call, _counts, rates in results:
        base = min(per_call.get("FX simplifier (hand-written, old default)", [float("nan")]))
        eager = min(per_call["eager (compile_potential=False)"])
        print()
        print(f"## {case[0]}{'' if not case[4] else ', ' + str(case[4])}: µs per potential+gradient call")
        print()
        print("| variant | compile s (cold cache) | compile s (again) | µs/call best | median | "
              "FX simplifier / this | eager / this | agrees with eager |")  # fmt: skip
        print("|---|---:|---:|---:|---:|---:|---:|---|")
        for name, v in variants.items():
            times = per_call[name]
            best = min(times)
            cold = "" if v["cold"] is None else f"{v['cold']:.2f}"
            warm = "" if v["warm"] is None else f"{v['warm']:.2f}"
            note = f" ({v['note']})" if v["note"] else ""
            print(
                f"| {name}{note} | {cold} | {warm} | {best:,.0f} | {statistics.median(times):,.0f} | "
                f"{base / best:.2f} | {eager / best:.2f} | {v['agrees']} |"
            )
        if rates:
            steps = case[5]
            fx = max(rates.get("FX simplifier (hand-written, old default)", [float("nan")]))
            print()
            print(
                f"Full SGLD step, `kernel.sample` loop, {steps} steps per run, best and median of "
                f"{len(next(iter(rates.values())))} interleaved runs:"
            )
            print()
            print("| graph in the kernel | steps/s best | median | µs/step | this / FX simplifier |")
            print("|---|---:|---:|---:|---:|")
            for name, r in rates.items():
                print(
                    f"| {name} | {max(r):,.1f} | {statistics.median(r):,.1f} | {1e6 / max(r):,.0f} | {max(r) / fx:.2f} |"
                )
    print()
    print(f"Total {time.perf_counter() - t_start:.0f} s; load average at the end "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}.")  # fmt: skip


if __name__ == "__main__":
    main()
