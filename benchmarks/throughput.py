#!/usr/bin/env python
"""Throughput of the NumPyro SG-MCMC kernels against a hand-written ``lax.scan`` loop and BlackJAX.

Bayesian logistic regression at a9a size (N=32561, d=123, minibatch n=100, prior N(0, 10)).

For every kernel this measures, in one process and side by side:

* **ours**: ``numpyro.infer.MCMC(kernel, num_warmup=0, num_samples=S, progress_bar=False)``.
  Every ``MCMC.run`` retraces and recompiles its loop, so each configuration is run with ``S``
  and ``2S`` samples (each on a fresh ``MCMC``) and the steady-state rate is
  ``S / (t(2S) - t(S))``. The end-to-end wall time of the ``S``-step run and the compile time
  JAX reports for it (trace + lowering + XLA compile, from ``jax.monitoring``) are printed too.
* **scan**: a hand-written ``jax.jit(lax.scan)`` loop calling the same pure update rules of
  :mod:`ppl_sgmcmc.rules` with a hand-written minibatch gradient (``random.randint`` indices,
  ``jax.value_and_grad`` of the ``N/n``-scaled log-likelihood plus the log-prior). It stores every
  position, as ``MCMC`` does. Compiled once; the best of ``--repeats`` timed calls is reported.
* **blackjax**: ``blackjax.sgld`` / ``blackjax.sghmc`` (``num_integration_steps=1``) /
  ``blackjax.sgnht`` stepped inside a ``lax.scan`` with ``blackjax.sgmcmc.gradients.grad_estimator``
  and a ``randint`` minibatch per step, storing every position. Compiled once; best of repeats.
  BlackJAX has no pSGLD, no splitting integrator and no multivariate thermostat: the nearest
  BlackJAX algorithm is listed and marked ``~`` (see ``RESULTS.md`` for what each does per step).

Then the progress-bar path (``progress_bar=True``, one chain, which numpyro runs as a Python loop
with one jitted step and one ``get_diagnostics_str`` call per iteration; tqdm output goes to
``/dev/null``), with and without the kernel's diagnostics string, and vectorised chains
(``num_chains=4, chain_method="vectorized"``) for SGNHT against a ``vmap``-ped scan loop.

Usage (from the repository root)::

    PYTHONPATH=. python benchmarks/throughput.py            # ~3 min on 2 CPU cores
    PYTHONPATH=. python benchmarks/throughput.py --quick    # smoke test, ~30 s
    PYTHONPATH=. python benchmarks/throughput.py --steps 40000 --repeats 3
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import sys
import time

# The machine is small (2 cores) and the per-step work is tiny (a 100x123 mat-vec); XLA's default
# CPU threading is kept (its effect was within noise here), and recorded. Set before importing jax.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import numpyro  # noqa: E402
import numpyro.distributions as dist  # noqa: E402
from jax import lax, random  # noqa: E402
from numpyro.infer import MCMC  # noqa: E402

import blackjax  # noqa: E402
from blackjax.sgmcmc.gradients import grad_estimator  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from models.datasets import load_a9a  # noqa: E402
from ppl_sgmcmc.numpyro import PSGLD, SGHMC, SGLD, SGNHT  # noqa: E402
from ppl_sgmcmc.rules import StochasticGradient, psgld, sghmc, sgld, sgnht  # noqa: E402

BATCH = 100
PRIOR_VAR = 10.0


def model(X, y=None):
    w = numpyro.sample("w", dist.Normal(0, PRIOR_VAR**0.5).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=BATCH):
        Xb = numpyro.subsample(X, event_dim=1)
        yb = numpyro.subsample(y, event_dim=0) if y is not None else None
        numpyro.sample("y", dist.Bernoulli(logits=Xb @ w), obs=yb)


# ----------------------------------------------------------------------------------------------
# The kernels: (label, NumPyro kernel factory, pure rule, rule hyper-parameters, step size,
#               blackjax baseline name or None, whether the blackjax baseline is only the nearest)
# Step sizes keep every chain finite on a9a (checked at the end of each measurement).
# ----------------------------------------------------------------------------------------------
def kernel_specs():
    t = dict(temperature=1.0)
    return [
        ("SGLD", lambda: SGLD(model, step_size=5e-6), sgld, dict(t), 5e-6, "sgld", False),
        (
            "SGHMC splitting",
            lambda: SGHMC(model, step_size=1e-3, friction=1.0, integrator="splitting"),
            sghmc,
            dict(t, friction=1.0, integrator="splitting"),
            1e-3,
            "sghmc",
            True,
        ),
        (
            "SGHMC euler",
            lambda: SGHMC(model, step_size=1e-3, friction=1.0, integrator="euler"),
            sghmc,
            dict(t, friction=1.0, integrator="euler"),
            1e-3,
            "sghmc",
            True,
        ),
        (
            "SGNHT multivar. splitting",
            lambda: SGNHT(model, step_size=1e-3, diffusion=1.0),
            sgnht,
            dict(t, diffusion=1.0, multivariate=True, integrator="splitting"),
            1e-3,
            "sgnht",
            True,
        ),
        (
            "SGNHT multivar. euler",
            lambda: SGNHT(model, step_size=1e-3, diffusion=1.0, integrator="euler"),
            sgnht,
            dict(t, diffusion=1.0, multivariate=True, integrator="euler"),
            1e-3,
            "sgnht",
            True,
        ),
        (
            "SGNHT scalar euler",
            lambda: SGNHT(model, step_size=1e-3, diffusion=1.0, thermostat="scalar", integrator="euler"),
            sgnht,
            dict(t, diffusion=1.0, multivariate=False, integrator="euler"),
            1e-3,
            "sgnht",
            False,
        ),
        ("PSGLD", lambda: PSGLD(model, step_size=1e-6), psgld, dict(t, alpha=0.99, eps=1e-5), 1e-6, None, False),
    ]


QUICK_KERNELS = ("SGLD", "SGNHT multivar. splitting")


# ----------------------------------------------------------------------------------------------
# Timing helpers
# ----------------------------------------------------------------------------------------------
class CompileClock:
    """Sums the trace, lowering and XLA-compile durations JAX reports while it is active."""

    EVENTS = (
        "/jax/core/compile/jaxpr_trace_duration",
        "/jax/core/compile/jaxpr_to_mlir_module_duration",
        "/jax/core/compile/backend_compile_duration",
    )

    def __init__(self):
        self.total = 0.0
        self.active = False
        jax.monitoring.register_event_duration_secs_listener(self._listen)

    def _listen(self, event, duration, **kwargs):
        if self.active and event in self.EVENTS:
            self.total += duration

    @contextlib.contextmanager
    def measure(self):
        self.total, self.active = 0.0, True
        try:
            yield self
        finally:
            self.active = False


CLOCK = None


def time_mcmc(make_kernel, X, y, num_samples, seed=0, **mcmc_kwargs):
    """Wall time of one fresh ``MCMC.run`` (+ ``get_samples``), its compile time, and the MCMC."""
    mcmc = MCMC(make_kernel(), num_warmup=0, num_samples=num_samples, **mcmc_kwargs)
    sink = open(os.devnull, "w")  # tqdm writes to sys.stderr as it is when the bar is created
    with CLOCK.measure() as clock, contextlib.redirect_stderr(sink):
        start = time.perf_counter()
        mcmc.run(random.PRNGKey(seed), X, y)
        jax.block_until_ready(mcmc.get_samples())
        elapsed = time.perf_counter() - start
    sink.close()
    return elapsed, clock.total, mcmc


def steady_rate(make_kernel, X, y, steps, repeats=1, **mcmc_kwargs):
    """Steady-state steps/s of ``MCMC.run`` from an S-step and a 2S-step run (fresh ``MCMC`` each).

    ``rate``: ``S / ((t(2S) - c(2S)) - (t(S) - c(S)))`` with ``t`` the wall time of a run and ``c`` the
    compile time JAX reports for it: the difference cancels the fixed per-run costs (model tracing,
    init, eager set-up), and subtracting ``c`` removes the recompile's jitter, which on a loaded
    2-core machine is larger than the sampling time itself. ``rate_raw``: ``S / (t(2S) - t(S))``.
    With ``repeats > 1`` the S and 2S runs are interleaved and the fastest of each is used."""
    runs = {steps: [], 2 * steps: []}
    for r in range(repeats):
        for s in (steps, 2 * steps):
            t, c, mcmc = time_mcmc(make_kernel, X, y, s, seed=r, **mcmc_kwargs)
            runs[s].append((t, c))
    t1 = min(t for t, _ in runs[steps])
    t2 = min(t for t, _ in runs[2 * steps])
    n1 = min(t - c for t, c in runs[steps])
    n2 = min(t - c for t, c in runs[2 * steps])
    rate = steps / (n2 - n1) if n2 > n1 else float("nan")
    rate_raw = steps / (t2 - t1) if t2 > t1 else float("nan")
    e2e, compile_time = min(runs[steps])
    state = mcmc.last_state
    finite = bool(np.all(np.isfinite(np.asarray(jax.tree.leaves(state.z)[0]))))
    ndiv = int(np.sum(np.asarray(state.num_diverging)))
    return dict(rate=rate, rate_raw=rate_raw, e2e=e2e, compile=compile_time, finite=finite, num_diverging=ndiv)


def best_time(fn, *args, repeats=3):
    """Compile ``fn`` once, then the fastest of ``repeats`` timed calls."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return min(times), out


# ----------------------------------------------------------------------------------------------
# Baseline (a): hand-written lax.scan with the same pure rules
# ----------------------------------------------------------------------------------------------
def make_hand_gradient(X, y):
    N = X.shape[0]

    def energy(w, idx):
        Xb, yb = X[idx], y[idx]
        logits = Xb @ w
        loglik = jnp.sum(yb * logits - jax.nn.softplus(logits))
        logprior = -0.5 * jnp.sum(w * w) / PRIOR_VAR
        return -(logprior + (N / BATCH) * loglik)

    value_and_grad = jax.value_and_grad(energy)

    def gradient(w, idx):
        value, grad = value_and_grad(w, idx)
        # mean per-datum score (pSGLD): the data part of -grad, divided by N
        score = -(grad - w / PRIOR_VAR) / N
        return StochasticGradient(value, grad, score)

    return gradient


def make_scan_chain(rule, hyper, step_size, X, y, steps):
    N, d = X.shape
    gradient = make_hand_gradient(X, y)

    def one_step(x, rule_state, key):
        key, key_draw, key_noise = random.split(key, 3)
        idx = random.randint(key_draw, (BATCH,), 0, N)
        x, rule_state, _ = rule.step(
            x, rule_state, lambda z: gradient(z, idx), random.normal(key_noise, x.shape), step_size, **hyper
        )
        return x, rule_state, key

    def chain(key):
        key, key_init = random.split(key)
        x0 = jnp.zeros(d)
        rule_state = rule.init(x0, random.normal(key_init, (d,)), **hyper)

        def body(carry, _):
            x, rule_state, key = one_step(*carry)
            return (x, rule_state, key), x

        _, xs = lax.scan(body, (x0, rule_state, key), None, length=steps)
        return xs

    return chain, one_step


# ----------------------------------------------------------------------------------------------
# Baseline (b): BlackJAX
# ----------------------------------------------------------------------------------------------
def make_blackjax_chain(name, hyper, step_size, X, y, steps):
    N, d = X.shape

    def logprior(w):
        return -0.5 * jnp.sum(w * w) / PRIOR_VAR

    def loglik(w, datum):  # one datum; grad_estimator vmaps it over the minibatch
        x, t = datum
        logit = x @ w
        return t * logit - jax.nn.softplus(logit)

    grad_fn = grad_estimator(logprior, loglik, N)
    if name == "sgld":
        algo = blackjax.sgld(grad_fn)
    elif name == "sghmc":
        algo = blackjax.sghmc(grad_fn, num_integration_steps=1, alpha=hyper["friction"])
    else:
        algo = blackjax.sgnht(grad_fn, alpha=hyper["diffusion"])

    def chain(key):
        key, key_init = random.split(key)
        x0 = jnp.zeros(d)
        state = algo.init(x0, key_init) if name == "sgnht" else algo.init(x0)

        def body(carry, _):
            state, key = carry
            key, key_draw, key_step = random.split(key, 3)
            idx = random.randint(key_draw, (BATCH,), 0, N)
            state = algo.step(key_step, state, (X[idx], y[idx]), step_size)
            position = state.position if name == "sgnht" else state
            return (state, key), position

        _, xs = lax.scan(body, (state, key), None, length=steps)
        return xs

    return chain


# ----------------------------------------------------------------------------------------------
# HLO of one step: ours (kernel.sample) vs the hand-written step
# ----------------------------------------------------------------------------------------------
def hlo_counts(text):
    lines = [ln.strip() for ln in text.splitlines()]
    instr = [ln for ln in lines if " = " in ln and not ln.startswith(("HloModule", "//"))]

    def count(op):
        return sum(1 for ln in instr if f" {op}(" in ln)

    return dict(
        instructions=len(instr),
        fusions=count("fusion"),
        gathers=count("gather"),
        dots=count("dot"),
        whiles=count("while"),
        conditionals=count("conditional"),
        sorts=count("sort"),
        custom_calls=count("custom-call"),
    )


def compare_one_step(spec, X, y):
    label, make_kernel, rule, hyper, step_size, *_ = spec
    kernel = make_kernel()
    state = kernel.init(random.PRNGKey(0), 0, None, (X, y), {})
    ours = jax.jit(lambda s: kernel.sample(s, (X, y), {}))
    ours_jaxpr = jax.make_jaxpr(lambda s: kernel.sample(s, (X, y), {}))(state)
    _, one_step = make_scan_chain(rule, hyper, step_size, X, y, 1)
    x0 = jnp.zeros(X.shape[1])
    rs = rule.init(x0, x0, **hyper)
    hand = jax.jit(one_step)
    hand_jaxpr = jax.make_jaxpr(one_step)(x0, rs, random.PRNGKey(0))
    return dict(
        ours=dict(jaxpr_eqns=len(ours_jaxpr.eqns), **hlo_counts(ours.lower(state).compile().as_text())),
        hand=dict(
            jaxpr_eqns=len(hand_jaxpr.eqns),
            **hlo_counts(hand.lower(x0, rs, random.PRNGKey(0)).compile().as_text()),
        ),
    )


# ----------------------------------------------------------------------------------------------
def machine_info():
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return dict(
        cpu=cpu,
        cores=os.cpu_count(),
        python=platform.python_version(),
        jax=jax.__version__,
        jaxlib=getattr(__import__("jaxlib"), "__version__", "?"),
        numpyro=numpyro.__version__,
        blackjax=blackjax.__version__,
        xla_flags=os.environ.get("XLA_FLAGS", "(unset)"),
        backend=jax.default_backend(),
        date=datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        load=" ".join(f"{x:.2f}" for x in os.getloadavg()),
    )


def fmt(x, spec=",.0f"):
    return "—" if x is None or (isinstance(x, float) and np.isnan(x)) else format(x, spec)


def jitted_progress_bar_rate(make_kernel, X, y, steps, progress_bar, repeats=2):
    """Steps/s of a one-chain loop that runs the kernel's ``sample`` and stores ``z`` under one ``jit``,
    with (``progress_bar=True``) or without numpyro's own ``io_callback`` progress bar
    (``numpyro.util.progress_bar_factory``: the bar ``MCMC`` already uses for parallel chains; it calls
    back to the host every ``steps // 20`` iterations). A prototype of a fix for the one-chain
    progress-bar path, not what ``MCMC`` does today. Compiled once (the trip count is an argument);
    then ``S / (t(2S) - t(S))`` from the fastest of ``repeats`` timed calls of each."""
    from numpyro.util import progress_bar_factory

    kernel = make_kernel()
    state0 = kernel.init(random.PRNGKey(0), 0, None, (X, y), {})
    sink = open(os.devnull, "w")

    def body(i, vals):
        state, collection = vals
        state = kernel.sample(state, (X, y), {})
        return state, collection.at[i].set(state.z["w"])

    with contextlib.redirect_stderr(sink):  # tqdm bars are created by the factory, and write later
        if progress_bar:
            # chain id 0 is passed in (numpyro passes -1 and lets the first callback assign it, once per
            # factory); num_samples is left huge so the timed calls never close the bar
            wrapped = progress_bar_factory(10**9, 1, max(steps // 10, 1))(body)

            def loop(state, collection, num):
                return lax.fori_loop(0, num, wrapped, ((state, collection), 0))[0]
        else:

            def loop(state, collection, num):
                return lax.fori_loop(0, num, body, (state, collection))

        loop = jax.jit(loop)
        collection = jnp.zeros((2 * steps, X.shape[1]))
        jax.block_until_ready(loop(state0, collection, 1))
        times = {steps: [], 2 * steps: []}
        for _ in range(repeats):
            for num in times:
                start = time.perf_counter()
                out = jax.block_until_ready(loop(state0, collection, num))
                times[num].append(time.perf_counter() - start)
    sink.close()
    assert bool(jnp.all(jnp.isfinite(out[1][2 * steps - 1])))
    diff = min(times[2 * steps]) - min(times[steps])
    return steps / diff if diff > 0 else float("nan")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=None, help="S: steps of the shorter MCMC run (default 40000)")
    parser.add_argument("--quick", action="store_true", help="smoke test: two kernels, few steps (~30 s)")
    parser.add_argument("--repeats", type=int, default=None, help="timed calls per baseline (default 2)")
    parser.add_argument("--mcmc-repeats", type=int, default=1, help="S/2S MCMC run pairs per kernel (default 1)")
    args = parser.parse_args(argv)
    steps = args.steps or (4000 if args.quick else 40000)
    repeats = args.repeats or (1 if args.quick else 2)
    mcmc_repeats = args.mcmc_repeats
    pbar_steps = max(steps // 25, 200)  # the progress-bar path runs ~20x slower
    vec_steps = max(steps // 4, 1000)

    global CLOCK
    CLOCK = CompileClock()
    t_start = time.perf_counter()
    info = machine_info()
    print("# ppl_sgmcmc throughput benchmark")
    print()
    for k, v in info.items():
        print(f"    {k:>9}: {v}")
    X, y, _, _ = load_a9a()
    X, y = jnp.asarray(X), jnp.asarray(y)
    N, d = X.shape
    print(f"         data: a9a N={N} d={d}, minibatch n={BATCH}, prior N(0, {PRIOR_VAR:g})")
    print(f"        steps: S={steps} (MCMC runs S and 2S steps), baseline timed calls={repeats}, "
          f"MCMC S/2S pairs={mcmc_repeats}")
    print(flush=True)

    specs = kernel_specs()
    if args.quick:
        specs = [s for s in specs if s[0] in QUICK_KERNELS]

    # one-off costs of the first MCMC run in a process (numpyro/jax caches, eager op compiles) must not
    # land in the first measured run: warm up with a short run of every kernel class
    for spec in specs:
        time_mcmc(spec[1], X, y, 10, progress_bar=False)

    rows = []
    for spec in specs:
        label, make_kernel, rule, hyper, step_size, bj_name, bj_nearest = spec
        ours = steady_rate(make_kernel, X, y, steps, repeats=mcmc_repeats, progress_bar=False)
        chain, _ = make_scan_chain(rule, hyper, step_size, X, y, steps)
        t_scan, xs = best_time(jax.jit(chain), random.PRNGKey(1), repeats=repeats)
        finite = ours["finite"] and bool(jnp.all(jnp.isfinite(xs[-1])))
        bj = None
        if bj_name is not None:
            bj_chain = make_blackjax_chain(bj_name, hyper, step_size, X, y, steps)
            t_bj, xs_bj = best_time(jax.jit(bj_chain), random.PRNGKey(2), repeats=repeats)
            bj = steps / t_bj
            finite &= bool(jnp.all(jnp.isfinite(xs_bj[-1])))
        row = dict(
            kernel=label,
            ours=ours["rate"],
            ours_raw=ours["rate_raw"],
            e2e=ours["e2e"],
            compile=ours["compile"],
            scan=steps / t_scan,
            blackjax=bj,
            bj_name=(("~" if bj_nearest else "") + bj_name) if bj_name else None,
            finite=finite,
            num_diverging=ours["num_diverging"],
        )
        rows.append(row)
        print(
            f"  measured {label:<26} ours {fmt(row['ours']):>7}/s (raw difference {fmt(row['ours_raw'])}/s)  "
            f"scan {fmt(row['scan']):>7}/s  blackjax {fmt(bj):>7}/s  all chains finite: {finite}",
            flush=True,
        )

    print()
    print(f"## Steady-state steps/s, one chain, progress_bar=False (S={steps})")
    print()
    print("| kernel | ours steps/s | scan steps/s | ours/scan | blackjax steps/s | ours/blackjax "
          "| ours, raw S/(t(2S)-t(S)) | ours end-to-end, S steps (s) | of which compile (s) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        bj = "—" if r["blackjax"] is None else f"{fmt(r['blackjax'])} ({r['bj_name']})"
        ratio_bj = "—" if r["blackjax"] is None else f"{r['ours'] / r['blackjax']:.2f}"
        print(
            f"| {r['kernel']} | {fmt(r['ours'])} | {fmt(r['scan'])} | {r['ours'] / r['scan']:.2f} | {bj} "
            f"| {ratio_bj} | {fmt(r['ours_raw'])} | {r['e2e']:.2f} | {r['compile']:.2f} |"
        )
    print()
    print("ours = S / (non-compile time of the 2S run - that of the S run); ~name: the nearest BlackJAX")
    print("algorithm, not the same update (see RESULTS.md).")
    sys.stdout.flush()

    # --- progress bar ---------------------------------------------------------------------------
    by_label = {r["kernel"]: r for r in rows}
    print()
    print(f"## Progress bar, one chain (S_pbar={pbar_steps}: runs of S_pbar and 2*S_pbar steps)")
    print()
    print("| kernel | progress_bar=False | progress_bar=True | slowdown | True, diagnostics string off | slowdown "
          "| prototype: jitted loop, no bar | prototype: jitted loop + io_callback bar | slowdown |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for spec in specs:
        label, make_kernel = spec[0], spec[1]
        if label not in (("SGLD",) if args.quick else QUICK_KERNELS):
            continue

        def no_diagnostics(make_kernel=make_kernel):
            kernel = make_kernel()
            kernel.get_diagnostics_str = lambda state: ""  # instance override; the library is untouched
            return kernel

        on = steady_rate(make_kernel, X, y, pbar_steps, repeats=mcmc_repeats, progress_bar=True)
        off_diag = steady_rate(no_diagnostics, X, y, pbar_steps, repeats=mcmc_repeats, progress_bar=True)
        jit_plain = jitted_progress_bar_rate(make_kernel, X, y, steps, progress_bar=False, repeats=repeats)
        jit_bar = jitted_progress_bar_rate(make_kernel, X, y, steps, progress_bar=True, repeats=repeats)
        base = by_label[label]["ours"]
        print(
            f"| {label} | {fmt(base)} | {fmt(on['rate'])} | {fmt(base / on['rate'], '.1f')}× "
            f"| {fmt(off_diag['rate'])} | {fmt(base / off_diag['rate'], '.1f')}× "
            f"| {fmt(jit_plain)} | {fmt(jit_bar)} | {fmt(jit_plain / jit_bar, '.2f')}× |",
            flush=True,
        )

    # --- vectorised chains ------------------------------------------------------------------------
    num_chains = 4
    spec = next(s for s in kernel_specs() if s[0] == "SGNHT multivar. splitting")
    label, make_kernel, rule, hyper, step_size = spec[:5]
    vec = steady_rate(
        make_kernel, X, y, vec_steps, repeats=mcmc_repeats, progress_bar=False, num_chains=num_chains,
        chain_method="vectorized",
    )
    chain, _ = make_scan_chain(rule, hyper, step_size, X, y, vec_steps)
    t_vscan, _ = best_time(jax.jit(jax.vmap(chain)), random.split(random.PRNGKey(3), num_chains), repeats=repeats)
    vscan = vec_steps / t_vscan
    print()
    print(f"## Vectorised chains: {label}, num_chains={num_chains}, chain_method='vectorized' (S={vec_steps})")
    print()
    print("| | steps/s (each chain) | chain-steps/s (all chains) | vs scan |")
    print("|---|---:|---:|---:|")
    print(f"| ours (MCMC, vectorized) | {fmt(vec['rate'])} | {fmt(num_chains * vec['rate'])} | {vec['rate'] / vscan:.2f} |")
    print(f"| scan, jax.vmap over chains | {fmt(vscan)} | {fmt(num_chains * vscan)} | 1.00 |")
    print(f"| ours, one chain (table above) | {fmt(by_label[label]['ours'])} | {fmt(by_label[label]['ours'])} | |")
    sys.stdout.flush()

    # --- HLO of one step ----------------------------------------------------------------------------
    print()
    print("## One step, ours (kernel.sample under jit) vs hand-written step: jaxpr and optimised-HLO op counts")
    print()
    keys = ("jaxpr_eqns", "instructions", "fusions", "gathers", "dots", "whiles", "conditionals", "sorts")
    print("| kernel | side | " + " | ".join(keys) + " |")
    print("|---|---|" + "---:|" * len(keys))
    for spec in specs:
        if spec[0] not in (("SGLD",) if args.quick else ("SGLD", "SGNHT multivar. splitting", "PSGLD")):
            continue
        counts = compare_one_step(spec, X, y)
        for side in ("ours", "hand"):
            print(f"| {spec[0]} | {side} | " + " | ".join(str(counts[side][k]) for k in keys) + " |")

    print()
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"total wall time {time.perf_counter() - t_start:.0f} s; load average at the end {load}")


if __name__ == "__main__":
    main()
