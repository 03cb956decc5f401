#!/usr/bin/env python
"""Throughput of the NumPyro SG-MCMC kernels against a hand-written ``lax.scan`` loop and BlackJAX.

Bayesian logistic regression at a9a size (N=32561, d=123, minibatch n=100, prior N(0, 10)).

For every kernel this measures, in one process and side by side:

* **ours**: ``numpyro.infer.MCMC(kernel, num_warmup=0, num_samples=s, progress_bar=False)``.
  Every ``MCMC.run`` retraces and recompiles (2-6 s here, more than the sampling itself), so a
  run's sampling time is taken from the moment JAX reports (``jax.monitoring``) that the XLA
  compilation of numpyro's sampling loop ended, to the end of the run. Runs alternate ``S`` and
  ``2S`` samples on fresh ``MCMC`` objects; the best run is reported, and the difference estimate
  ``S / (sampling(2S) - sampling(S))`` is printed as a cross-check, with the end-to-end wall time
  of an ``S``-step run and the compile time JAX reports for it.
* **scan**: a hand-written ``jax.jit(lax.scan)`` loop calling the same pure update rules of
  :mod:`ppl_sgmcmc.rules` with a hand-written minibatch gradient (``random.randint`` indices,
  ``jax.value_and_grad`` of the ``N/n``-scaled log-likelihood plus the log-prior). It stores every
  position, as ``MCMC`` does. Compiled once; best of its timed calls, which are interleaved with
  the MCMC runs (the machine is shared and its speed drifts by up to 2x).
* **blackjax**: ``blackjax.sgld`` / ``blackjax.sghmc`` / ``blackjax.sgnht`` stepped in a ``lax.scan``
  with ``blackjax.sgmcmc.gradients.grad_estimator`` and a ``randint`` minibatch per call, storing
  every returned position; timed like the scan loop. BlackJAX has no pSGLD, no splitting
  integrator and no multivariate thermostat, and its SGHMC re-draws the momentum every call; the
  nearest BlackJAX algorithm is listed and marked ``~``. BlackJAX SGHMC runs
  ``num_integration_steps=10`` per call (one minibatch per call; its rate counts integration
  steps): with ``num_integration_steps=1`` its gradient is dead code (see ``make_blackjax_chain``).
* **sgmcmcjax**: SGMCMCJax 0.2.13's ``build_sgld_kernel`` / ``build_sgnht_kernel`` / ``build_psgld_kernel``
  stepped in a ``lax.scan`` (its own minibatch: ``random.choice`` with replacement), storing every position;
  timed like the scan loop. Its SGNHT is Euler with a scalar thermostat (``~`` for the multivariate rows); it has
  no SGHMC that draws one minibatch per step. It imports the ``host_callback`` module removed from JAX:
  ``benchmarks/sgmcmcjax_shim.py`` stubs it, in the benchmark's process only.

Then: the progress-bar path (``progress_bar=True``, one chain, which numpyro runs as a Python loop
with one jitted step and one ``get_diagnostics_str`` call per iteration; tqdm writes to
``/dev/null``), with one SG-MCMC step per draw and with ``steps_per_sample=20`` (twenty steps per
Python iteration; rates counted in SG-MCMC steps) and with ``ppl_sgmcmc.numpyro.MCMC`` (the kernel updates the
bar from inside NumPyro's compiled loop; against ``progress_bar=False`` timed alongside); vectorised chains
(``num_chains=4, chain_method="vectorized"``) for
SGNHT against a ``vmap``-ped scan loop; the kernel's ``sample`` vs the hand-written step in a bare ``lax.scan``;
and jaxpr / optimised-HLO op counts of one step.

With ``--pyro`` (or ``--pyro-only``), the Pyro backend (:mod:`ppl_sgmcmc.pyro`) on the same problem and
kernels, in PyTorch: ``pyro.infer.MCMC`` with each kernel against a hand-written torch loop doing the
same minibatch gradient and the same rule function (see ``pyro_section``), plus where a Pyro
gradient's time goes (Pyro's usual trace, the kernel's eager handler, the traced graph).

Usage (from the repository root)::

    PYTHONPATH=. python benchmarks/throughput.py             # ~11 min on 2 idle CPU cores
    PYTHONPATH=. python benchmarks/throughput.py --quick     # two kernels, fewer rows, ~4 min
    PYTHONPATH=. python benchmarks/throughput.py --steps 160000 --rounds 4
    PYTHONPATH=. python benchmarks/throughput.py --pyro-only --rounds 3   # the Pyro rows only
    PYTHONPATH=. python benchmarks/throughput.py --repeated-runs  # compilation of repeated runs, ~3 min
    PYTHONPATH=. python benchmarks/throughput.py --kernels-on-one-model  # start compiled once per model, ~3 min
    PYTHONPATH=. python benchmarks/throughput.py --health-callback  # the in-loop health report's cost, ~1 min
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import sys
import time
import warnings
from functools import partial

# The machine is small (2 cores) and the per-step work is tiny (a 100x123 mat-vec); XLA's default
# CPU threading is kept (its effect was within noise here), and recorded. Set before importing jax.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import blackjax  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import numpyro  # noqa: E402
import numpyro.distributions as dist  # noqa: E402
from blackjax.sgmcmc.gradients import grad_estimator  # noqa: E402
from jax import lax, random  # noqa: E402
from numpyro.infer import MCMC  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.sgmcmcjax_shim import import_sgmcmcjax  # noqa: E402
from models.datasets import load_a9a  # noqa: E402
from ppl_sgmcmc.algorithms import call_kwargs  # noqa: E402
from ppl_sgmcmc.numpyro import MCMC as InLoopBarMCMC  # noqa: E402
from ppl_sgmcmc.numpyro import PSGLD, SGHMC, SGLD, SGNHT, prng  # noqa: E402
from ppl_sgmcmc.rules import StochasticGradient, psgld, sghmc, sgld, sgnht  # noqa: E402

BATCH = 100
PRIOR_VAR = 10.0
# BlackJAX SGHMC: integration steps per call (its default); its steps/s counts integration steps
BLACKJAX_SGHMC_STEPS = 10


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
        ("SGLD", lambda **kw: SGLD(model, step_size=5e-6, **kw), sgld, dict(t), 5e-6, "sgld", False),
        (
            "SGHMC splitting",
            lambda **kw: SGHMC(model, step_size=1e-3, friction=1.0, integrator="splitting", **kw),
            sghmc,
            dict(t, friction=1.0, integrator="splitting"),
            1e-3,
            "sghmc",
            True,
        ),
        (
            "SGHMC euler",
            lambda **kw: SGHMC(model, step_size=1e-3, friction=1.0, integrator="euler", **kw),
            sghmc,
            dict(t, friction=1.0, integrator="euler"),
            1e-3,
            "sghmc",
            True,
        ),
        (
            "SGNHT multivar. splitting",
            lambda **kw: SGNHT(model, step_size=1e-3, diffusion=1.0, **kw),
            sgnht,
            dict(t, diffusion=1.0, thermostat="multivariate", integrator="splitting"),
            1e-3,
            "sgnht",
            True,
        ),
        (
            "SGNHT multivar. euler",
            lambda **kw: SGNHT(model, step_size=1e-3, diffusion=1.0, integrator="euler", **kw),
            sgnht,
            dict(t, diffusion=1.0, thermostat="multivariate", integrator="euler"),
            1e-3,
            "sgnht",
            True,
        ),
        (
            "SGNHT scalar euler",
            lambda **kw: SGNHT(model, step_size=1e-3, diffusion=1.0, thermostat="scalar", integrator="euler", **kw),
            sgnht,
            dict(t, diffusion=1.0, thermostat="scalar", integrator="euler"),
            1e-3,
            "sgnht",
            False,
        ),
        ("PSGLD", lambda **kw: PSGLD(model, step_size=1e-6, **kw), psgld, dict(t, alpha=0.99, eps=1e-5), 1e-6, None, False),
    ]


QUICK_KERNELS = ("SGLD", "SGNHT multivar. splitting")
# chains of the vectorised rows (--quick: the first)
VECTORIZED_CHAINS = (4, 16)
# steps_per_sample of the amortised progress-bar rows
AMORTISE = 20


# ----------------------------------------------------------------------------------------------
# Timing helpers
# ----------------------------------------------------------------------------------------------
class CompileClock:
    """Records the compilations JAX reports (``jax.monitoring``) while it is active: the summed trace,
    lowering and XLA-compile time, and the moment each XLA compilation ended."""

    EVENTS = (
        "/jax/core/compile/jaxpr_trace_duration",
        "/jax/core/compile/jaxpr_to_mlir_module_duration",
        "/jax/core/compile/backend_compile_duration",
    )

    def __init__(self):
        self.total = 0.0
        self.compiles = []  # (perf_counter at the end, fun_name, seconds) of each XLA compilation
        self.active = False
        jax.monitoring.register_event_duration_secs_listener(self._listen)

    def _listen(self, event, duration, **kwargs):
        if self.active and event in self.EVENTS:
            self.total += duration
            if event == self.EVENTS[-1]:
                self.compiles.append((time.perf_counter(), str(kwargs.get("fun_name", "")), duration))

    @contextlib.contextmanager
    def measure(self):
        self.total, self.compiles, self.active = 0.0, [], True
        try:
            yield self
        finally:
            self.active = False


CLOCK = None

# The XLA computation that runs MCMC's sampling loop: the whole loop (progress_bar=False) or, with a
# progress bar and one chain, the one step numpyro's Python loop calls.
#: The compiled sampling loops: NumPyro's, and ``ppl_sgmcmc.numpyro.MCMC``'s own collection loop.
LOOP_FUNCTIONS = ("jit(_fori_collect_loop)", "jit(_body_fn)", "jit(_collect_draws)")


def time_mcmc(make_kernel, X, y, num_samples, seed=0, mcmc_class=MCMC, **mcmc_kwargs):
    """One fresh ``MCMC.run`` (+ ``get_samples``): ``(wall time, compile time, sampling time, mcmc)``.

    The sampling time runs from the end of the last compilation of the loop (``LOOP_FUNCTIONS``)
    to the end of the run. Without a progress bar the loop is dispatched asynchronously, so the
    small compilations numpyro does afterwards (reshapes of the collected samples) overlap it;
    with numpyro's progress bar the loop is synchronous, and they are subtracted. ``mcmc_class``:
    ``numpyro.infer.MCMC`` or ``ppl_sgmcmc.numpyro.MCMC`` (whose bar is drawn from inside the compiled
    loop: nothing subtracted)."""
    mcmc = mcmc_class(make_kernel(), num_warmup=0, num_samples=num_samples, **mcmc_kwargs)
    if mcmc_kwargs.get("progress_bar", True):
        mcmc.progress_bar = True  # numpyro turns it off when it sees a CI or pytest-xdist environment
    sink = open(os.devnull, "w")  # tqdm writes to sys.stderr as it is when the bar is created
    with CLOCK.measure() as clock, contextlib.redirect_stderr(sink):
        start = time.perf_counter()
        mcmc.run(random.PRNGKey(seed), X, y)
        jax.block_until_ready(mcmc.get_samples())
        end = time.perf_counter()
    sink.close()
    loop_end_compile = [i for i, (_, name, _) in enumerate(clock.compiles) if name in LOOP_FUNCTIONS]
    if not loop_end_compile:
        raise RuntimeError(f"no compilation of {LOOP_FUNCTIONS} seen: {[c[1] for c in clock.compiles]}")
    last = loop_end_compile[-1]
    sampling = end - clock.compiles[last][0]
    if mcmc_kwargs.get("progress_bar", True) and mcmc_class is MCMC:
        sampling -= sum(duration for _, _, duration in clock.compiles[last + 1 :])
    return end - start, clock.total, sampling, mcmc


def steady_rate(make_kernel, X, y, steps, rounds=2, between=(), **mcmc_kwargs):
    """Steady-state steps/s of ``MCMC.run`` (a fresh ``MCMC`` per run; every run recompiles).

    ``rounds`` runs of alternately ``S`` and ``2S`` samples, each timed from the end of the
    compilation of its sampling loop to its end (see :func:`time_mcmc`). ``rate`` is the best run
    (the machine is shared and its speed drifts by up to 2x; see RESULTS.md); ``rate_diff`` is the
    difference estimate ``S / (min sampling time(2S) - min sampling time(S))``, which cancels any
    fixed cost left in the sampling time. ``between``: callables run after every run (baselines
    timed in the same stretch of time)."""
    runs = {steps: [], 2 * steps: []}
    rate = 0.0
    for r in range(rounds):
        s = steps if r % 2 == 0 else 2 * steps
        t, c, sampling, mcmc = time_mcmc(make_kernel, X, y, s, seed=r, **mcmc_kwargs)
        runs[s].append((t, c, sampling))
        rate = max(rate, s / sampling)
        for fn in between:
            fn()
    rate_diff = float("nan")
    if runs[2 * steps]:
        diff = min(r[2] for r in runs[2 * steps]) - min(r[2] for r in runs[steps])
        rate_diff = steps / diff if diff > 0 else float("nan")
    e2e, compile_time, _ = min(runs[steps])
    state = mcmc.last_state
    finite = bool(np.all(np.isfinite(np.asarray(jax.tree.leaves(state.z)[0]))))
    ndiv = int(np.sum(np.asarray(state.num_diverging)))
    return dict(rate=rate, rate_diff=rate_diff, e2e=e2e, compile=compile_time, finite=finite, num_diverging=ndiv)


def best_time(fn, *args, repeats=3, compile=True):
    """The fastest of ``repeats`` timed calls of ``fn`` (compiled by a first, untimed call)."""
    if compile:
        jax.block_until_ready(fn(*args))
    best = (float("inf"), None)
    for _ in range(repeats):
        start = time.perf_counter()
        out = jax.block_until_ready(fn(*args))
        best = min(best, (time.perf_counter() - start, out), key=lambda r: r[0])
    return best


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


def make_scan_chain(rule, hyper, step_size, X, y, steps, draws="jax"):
    """The hand-written chain and its step. ``draws="jax"`` (the reference): ``jax.random`` as a user
    writes it; ``"unrolled"``: the same numbers through :data:`ppl_sgmcmc.numpyro.prng.UNROLLED`, as the kernel
    draws them, so that what is left between the two is the kernel's own work."""
    N, d = X.shape
    gradient = make_hand_gradient(X, y)
    split, wrap = (prng.split, prng.unrolled) if draws == "unrolled" else (random.split, lambda key: key)

    def one_step(x, rule_state, key):
        key, key_draw, key_noise = split(key, 3)
        idx = (random.bits(wrap(key_draw), (BATCH,), jnp.uint32) % N).astype(jnp.int32)  # as ours, for N <= 2^18
        x, rule_state, _ = rule.step(
            x, rule_state, lambda z: gradient(z, idx), random.normal(wrap(key_noise), x.shape), step_size, **hyper
        )
        return x, rule_state, key

    def chain(key):
        key, key_init = random.split(key)
        x0 = jnp.zeros(d)
        rule_state = rule.init(x0, random.normal(key_init, (d,)), **call_kwargs(rule.init, hyper))

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
        # num_integration_steps=1 is degenerate: the step returns the position only, the position move
        # uses the freshly drawn momentum, so the gradient is dead code (XLA drops it: no dot, no gather)
        # and the chain is a gradient-free random walk. With K steps per call, K-1 gradients are used.
        algo = blackjax.sghmc(grad_fn, num_integration_steps=BLACKJAX_SGHMC_STEPS, alpha=hyper["friction"])
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

        calls = steps // BLACKJAX_SGHMC_STEPS if name == "sghmc" else steps
        _, xs = lax.scan(body, (state, key), None, length=calls)
        return xs

    return chain


# ----------------------------------------------------------------------------------------------
# Baseline (c): SGMCMCJax 0.2.13 (shimmed for current JAX: benchmarks/sgmcmcjax_shim.py)
# ----------------------------------------------------------------------------------------------
# the SGMCMCJax kernel timed against each of ours ("~": the nearest algorithm, not the same update)
SGMCMCJAX = {
    "SGLD": "sgld",
    "SGNHT multivar. splitting": "~sgnht",
    "SGNHT multivar. euler": "~sgnht",
    "SGNHT scalar euler": "sgnht",
    "PSGLD": "psgld",
}


def make_sgmcmcjax_chain(name, hyper, step_size, X, y, steps):
    """``key -> positions`` of an SGMCMCJax chain of ``steps`` steps (``lax.scan`` over its ``kernel(i, key,
    state)``, storing every position). Its minibatch is ``random.choice`` with replacement. Its SGNHT is Euler with
    a scalar thermostat in the coordinates ``v = h p`` of Ding et al.'s Algorithm 2: its ``dt`` is ``h²`` and its
    ``a`` is ``A h``."""
    kernels = import_sgmcmcjax()
    d = X.shape[1]

    def logprior(w):
        return -0.5 * jnp.sum(w * w) / PRIOR_VAR

    def loglik(w, x, t):  # one datum; SGMCMCJax vmaps it over the minibatch
        logit = x @ w
        return t * logit - jax.nn.softplus(logit)

    data = (X, y)
    name = name.lstrip("~")
    if name == "sgld":
        init, kernel, get_params = kernels.build_sgld_kernel(step_size, loglik, logprior, data, BATCH)
    elif name == "psgld":
        init, kernel, get_params = kernels.build_psgld_kernel(
            step_size, loglik, logprior, data, BATCH, alpha=hyper["alpha"], eps=hyper["eps"]
        )
    else:
        init, kernel, get_params = kernels.build_sgnht_kernel(
            step_size**2, loglik, logprior, data, BATCH, a=hyper["diffusion"] * step_size
        )

    def chain(key):
        key, key_init = random.split(key)
        state = init(key_init, jnp.zeros(d))

        def body(carry, i):
            state, key = carry
            key, key_step = random.split(key)
            state = kernel(i, key_step, state)
            return (state, key), get_params(state)

        _, xs = lax.scan(body, (state, key), jnp.arange(steps))
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
    rs = rule.init(x0, x0, **call_kwargs(rule.init, hyper))
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
def decompose(spec, X, y, steps, repeats, num_chains=None):
    """Steps/s of the kernel's own ``sample`` and of the hand-written step, each in a bare ``lax.scan``
    (compiled once, best of ``repeats``), with and without storing every position: separates the
    cost of the kernel's step from that of ``MCMC``'s collection loop. With ``num_chains``, both are
    vectorised (the kernel's own ``vmap`` from an array of keys; ``jax.vmap`` of the hand step)."""
    label, make_kernel, rule, hyper, step_size, *_ = spec
    kernel = make_kernel()
    d = X.shape[1]
    _, one_step = make_scan_chain(rule, hyper, step_size, X, y, steps)
    _, one_step_unrolled = make_scan_chain(rule, hyper, step_size, X, y, steps, draws="unrolled")
    if num_chains is None:
        state0 = kernel.init(random.PRNGKey(0), 0, None, (X, y), {})
        key0, x0 = random.PRNGKey(0), jnp.zeros(d)
        rs0 = rule.init(x0, x0 + 1.0, **call_kwargs(rule.init, hyper))
    else:
        key0, x0 = random.split(random.PRNGKey(0), num_chains), jnp.zeros((num_chains, d))
        state0 = kernel.init(key0, 0, {"w": x0}, (X, y), {})
        rs0 = jax.vmap(lambda x: rule.init(x, x + 1.0, **call_kwargs(rule.init, hyper)))(x0)
        one_step, one_step_unrolled = jax.vmap(one_step), jax.vmap(one_step_unrolled)

    def ours(collect):
        def body(state, _):
            state = kernel.sample(state, (X, y), {})
            return state, (state.z["w"] if collect else None)

        return jax.jit(lambda state: lax.scan(body, state, None, length=steps))

    def hand(collect, one_step):
        def body(carry, _):
            carry = one_step(*carry)
            return carry, (carry[0] if collect else None)

        return jax.jit(lambda carry: lax.scan(body, carry, None, length=steps))

    fns = {}
    for collect in (False, True):
        fns[("ours", collect)] = (ours(collect), state0)
        fns[("hand", collect)] = (hand(collect, one_step), (x0, rs0, key0))
        fns[("hand unrolled", collect)] = (hand(collect, one_step_unrolled), (x0, rs0, key0))
    return interleaved_rates(fns, steps, repeats)


def sample_scan(kernel, X, y, steps):
    """``jax.jit`` of ``steps`` calls of ``kernel.sample`` in a bare ``lax.scan``, storing nothing: state -> state."""

    def body(state, _):
        return kernel.sample(state, (X, y), {}), None

    return jax.jit(lambda state: lax.scan(body, state, None, length=steps)[0])


def step_costs(spec, X, y, steps, repeats):
    """What each piece of bookkeeping in the kernel's step costs: steps/s of ``kernel.sample`` in a bare
    ``lax.scan`` (compiled once, interleaved best of ``repeats``) with the pieces taken out one at a time by
    patching the kernel class (the health checks' branch, ``_update_health``; the gradient-noise estimate,
    ``_measure_noise``; the divergence guard, ``_all_finite`` made constant so that XLA drops its ``where``),
    and the hand-written step. Only for this measurement: a patched kernel is not a valid sampler."""
    from unittest import mock

    import ppl_sgmcmc.numpyro.kernel as kernel_module

    label, make_kernel, rule, hyper, step_size, *_ = spec
    no_health = mock.patch.object(kernel_module.SGMCMCKernel, "_update_health", lambda self, state, before: state)
    no_noise = mock.patch.object(
        kernel_module.SGMCMCKernel, "_measure_noise",
        lambda self, noise_state, gradient, rule_state, accepted, i, position: (noise_state, gradient.grad * 0, accepted),
    )  # fmt: skip
    no_guard = mock.patch.object(kernel_module, "_all_finite", lambda tree: jnp.asarray(True))
    variants = {
        "as run": (),
        "no health branch": (no_health,),
        "no noise estimate": (no_noise,),
        "neither": (no_health, no_noise),
        "neither, no guard": (no_health, no_noise, no_guard),
    }
    fns = {}
    for name, patches in variants.items():
        with contextlib.ExitStack() as stack:
            for patch in patches:
                stack.enter_context(patch)
            kernel = make_kernel()
            state0 = kernel.init(random.PRNGKey(0), 0, None, (X, y), {})
            fns[name] = (sample_scan(kernel, X, y, steps).lower(state0).compile(), state0)
    x0 = jnp.zeros(X.shape[1])
    rs0 = rule.init(x0, x0 + 1.0, **call_kwargs(rule.init, hyper))
    for name, draws in (("hand step", "jax"), ("hand step, unrolled draws", "unrolled")):
        _, one_step = make_scan_chain(rule, hyper, step_size, X, y, steps, draws=draws)
        hand = jax.jit(
            lambda carry, one_step=one_step: lax.scan(lambda c, _: (one_step(*c), None), carry, None, length=steps)[0]
        )
        fns[name] = (hand, (x0, rs0, random.PRNGKey(0)))
    return interleaved_rates(fns, steps, repeats)


def tuned_costs(X, y, steps, repeats, warmup=1000):
    """Steps/s of ``kernel.sample`` after the warm-up of a kernel left at its defaults (the step size tuned, a
    diagonal or, with ``dense_mass=True``, a dense preconditioner: the rule then moves ``u = L⁻¹θ``), against the
    same algorithm with a given step size and no preconditioner, each in a bare ``lax.scan`` (compiled once,
    interleaved best of ``repeats``) from the state its ``warmup`` steps ended at: what the configuration most
    users run pays after the warm-up."""
    kernels = {
        "SGLD, given h": SGLD(model, step_size=5e-6),
        "SGLD, tuned": SGLD(model),
        "SGNHT, given h": SGNHT(model, step_size=1e-3),
        "SGNHT, tuned": SGNHT(model),
        "SGNHT, tuned, dense_mass": SGNHT(model, dense_mass=True),
    }
    fns = {}
    for name, kernel in kernels.items():
        state = sample_scan(kernel, X, y, warmup)(kernel.init(random.PRNGKey(0), warmup, None, (X, y), {}))
        fns[name] = (sample_scan(kernel, X, y, steps).lower(state).compile(), state)
    return interleaved_rates(fns, steps, repeats)


def interleaved_rates(fns, steps, repeats):
    """``{name: (jitted fn, arg)}`` -> ``{name: steps/s}``: compile all, then time them round-robin,
    ``repeats`` rounds, and keep each one's fastest call."""
    best = {}
    for name, (fn, arg) in fns.items():
        jax.block_until_ready(fn(arg))
        best[name] = float("inf")
    for _ in range(repeats):
        for name, (fn, arg) in fns.items():
            start = time.perf_counter()
            jax.block_until_ready(fn(arg))
            best[name] = min(best[name], time.perf_counter() - start)
    return {name: steps / t for name, t in best.items()}


# ----------------------------------------------------------------------------------------------
# Pyro backend (--pyro adds this section, --pyro-only runs only it): the kernels of ppl_sgmcmc.pyro
# under pyro.infer.MCMC against a hand-written torch loop doing the same minibatch gradient and update
# ----------------------------------------------------------------------------------------------
PYRO_STEPS = 3000  # Pyro runs ~1-5k steps/s here: S steps per timed run (--pyro-steps)


def pyro_model(X, y=None):
    """``model`` above, in Pyro."""
    import pyro
    import pyro.distributions as pdist

    w = pyro.sample("w", pdist.Normal(0.0, PRIOR_VAR**0.5).expand([X.shape[1]]).to_event(1))
    with pyro.plate("data", X.shape[0], subsample_size=BATCH):
        Xb = pyro.subsample(X, event_dim=1)
        yb = pyro.subsample(y, event_dim=0) if y is not None else None
        pyro.sample("y", pdist.Bernoulli(logits=Xb @ w), obs=yb)


def pyro_kernel_specs():
    """``(label, factory(**kwargs) -> ppl_sgmcmc.pyro kernel, rule, rule hyper-parameters, step size)``,
    the rows of :func:`kernel_specs` with the same hyper-parameters."""
    from ppl_sgmcmc import pyro as pyro_kernels

    specs = []
    for label, make_numpyro_kernel, rule, hyper, step_size, *_ in kernel_specs():
        numpyro_kernel = make_numpyro_kernel()
        cls = getattr(pyro_kernels, type(numpyro_kernel).__name__)
        options = dict(hyper)

        def make(cls=cls, options=options, step_size=step_size, **kwargs):
            return cls(pyro_model, step_size=step_size, **options, **kwargs)

        specs.append((label, make, rule, hyper, step_size))
    return specs


def torch_hand_rate(rule, hyper, step_size, X, y, steps, seed=0):
    """Steps/s of a hand-written torch loop: ``torch.randint`` indices from a ``torch.Generator``,
    ``X[idx]``, the ``N/n``-scaled log-likelihood plus the log-prior, ``torch.autograd.grad``, noise from
    the generator, the **same** rule function of :mod:`ppl_sgmcmc.rules`, and every position stored
    (as ``MCMC`` stores each sample). No divergence check."""
    import torch

    N, d = X.shape
    generator = torch.Generator().manual_seed(seed)
    x = torch.zeros(d)
    state = rule.init(x, torch.randn(d, generator=generator), **call_kwargs(rule.init, hyper))
    out = torch.empty(steps, d)

    def gradient(idx):
        def grad_fn(w):
            w = w.detach().requires_grad_()
            logits = X[idx] @ w
            loglik = (y[idx] * logits - torch.nn.functional.softplus(logits)).sum()
            energy = 0.5 * (w * w).sum() / PRIOR_VAR - (N / BATCH) * loglik
            (grad,) = torch.autograd.grad(energy, w)
            score = -(grad - w.detach() / PRIOR_VAR) / N  # mean per-datum score (pSGLD)
            return StochasticGradient(energy.detach(), grad, score)

        return grad_fn

    start = time.perf_counter()
    for i in range(steps):
        idx = torch.randint(N, (BATCH,), generator=generator)
        x, state, _ = rule.step(x, state, gradient(idx), torch.randn(d, generator=generator), step_size, **hyper)
        out[i] = x
    rate = steps / (time.perf_counter() - start)
    assert bool(torch.isfinite(out[-1]).all())
    return rate


def pyro_mcmc_rate(make_kernel, X, y, steps, **kernel_kwargs):
    """``pyro.infer.MCMC(kernel, warmup_steps=0, num_samples=S, disable_progbar=True)``: steps/s between
    the first and the last draw (a ``hook_fn`` time-stamps them; setup and tracing excluded), the
    end-to-end wall time, and whether any draw diverged. With ``steps_per_sample=k`` it runs ``S/k``
    draws of ``k`` steps."""
    import pyro
    from pyro.infer import MCMC

    k = kernel_kwargs.get("steps_per_sample", 1)
    stamps = []
    mcmc = MCMC(make_kernel(**kernel_kwargs), warmup_steps=0, num_samples=steps // k, disable_progbar=True,
                hook_fn=lambda kernel, params, stage, i: stamps.append(time.perf_counter()))  # fmt: skip
    pyro.set_rng_seed(0)
    start = time.perf_counter()
    mcmc.run(X, y)
    end = time.perf_counter()
    diverged = sum(len(v) for v in mcmc.diagnostics()["divergences"].values())
    return (len(stamps) - 1) * k / (stamps[-1] - stamps[0]), end - start, diverged


def pyro_sample_loop_rate(make_kernel, X, y, steps):
    """Steps/s of the kernel's own ``setup`` + ``sample`` loop, without ``MCMC`` (no progress-bar logging,
    no copy of each sample): separates the kernel's cost from Pyro's per-draw overhead."""
    import pyro

    kernel = make_kernel()
    pyro.set_rng_seed(0)
    kernel.setup(0, X, y)
    params = kernel.sample(kernel.initial_params)  # traces the potential
    start = time.perf_counter()
    for _ in range(steps):
        params = kernel.sample(params)
    rate = steps / (time.perf_counter() - start)
    kernel.cleanup()
    return rate


def pyro_gradient_costs(X, y, repeats):
    """Microseconds per minibatch gradient ``(Ũ_t, ∇Ũ_t)`` at a fixed point, four ways: by hand; Pyro's
    usual path (``poutine.trace`` of the model conditioned on the latent and the plate's indices,
    ``log_prob_sum``, autograd); the kernel's eager path (one light handler, autograd); and the
    kernel's traced graph, run as traced and compiled by TorchInductor (the default,
    :func:`ppl_sgmcmc.pyro.compile.trace`). Also the number of tensor operations of the traced graph."""
    import pyro
    import torch
    from pyro import poutine

    from ppl_sgmcmc.pyro import SGLD
    from ppl_sgmcmc.pyro import compile as pyro_compile

    N, d = X.shape
    kernel = SGLD(pyro_model, step_size=5e-6)
    pyro.set_rng_seed(0)
    kernel.setup(0, X, y)
    target = kernel._target
    generator = torch.Generator().manual_seed(0)
    flat = 0.1 * torch.randn(d, generator=generator)
    idx = torch.randint(N, (BATCH,), generator=generator)
    batch = {"data": idx}
    fn, inputs, check = target.traceable(("gradient", False), flat, batch)
    raw = pyro_compile.trace(fn, inputs, check, "bench", optimize=False)
    compiled = pyro_compile.trace(fn, inputs, check, "bench")

    def hand():
        w = flat.detach().requires_grad_()
        logits = X[idx] @ w
        energy = 0.5 * (w * w).sum() / PRIOR_VAR - (N / BATCH) * (y[idx] * logits - torch.nn.functional.softplus(logits)).sum()
        return torch.autograd.grad(energy, w)

    def pyro_trace():
        w = flat.detach().requires_grad_()
        conditioned = poutine.condition(pyro_model, data={"w": w, "data": idx})
        energy = -poutine.trace(conditioned).get_trace(X, y).log_prob_sum()
        return torch.autograd.grad(energy, w)

    fns = {
        "hand-written, autograd": hand,
        "Pyro trace + log_prob_sum, autograd": pyro_trace,
        "kernel, eager (one handler), autograd": lambda: target._eager_gradient(flat, batch, False),
        "kernel, traced graph": lambda: raw(*inputs),
        "kernel, traced graph, compiled by Inductor (default)": lambda: compiled(*inputs),
    }
    calls = 500
    best = {}
    with pyro.validation_enabled(False):
        for _ in range(repeats):
            for name, f in fns.items():
                f()
                start = time.perf_counter()
                for _ in range(calls):
                    f()
                best[name] = min(best.get(name, float("inf")), (time.perf_counter() - start) / calls * 1e6)
    ops = {"kernel, traced graph": sum(n.op == "call_function" for n in raw.graph.graph.nodes)}
    kernel.cleanup()
    return best, ops


def pyro_section(steps, rounds, quick):
    """Print the Pyro tables; returns their rows."""
    import pyro
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a 100x123 mat-vec per step: threads only add overhead on 2 shared cores
    X_np, y_np, _, _ = load_a9a()
    X, y = torch.from_numpy(X_np), torch.from_numpy(y_np)
    specs = pyro_kernel_specs()
    if quick:
        specs = [s for s in specs if s[0] in QUICK_KERNELS]
    print()
    print(f"## Pyro: steps/s, one chain, pyro {pyro.__version__}, torch {torch.__version__}, "
          f"torch threads 1 (S={steps}, best of {rounds} interleaved runs)")
    print()
    pyro_mcmc_rate(specs[0][1], X, y, 50)  # first-use costs (imports of torch's tracing machinery)
    rows = []
    for label, make_kernel, rule, hyper, step_size in specs:
        best = {}
        diverged = 0
        for _ in range(rounds):
            timed = {
                "hand": partial(torch_hand_rate, rule, hyper, step_size, X, y, steps),
                "mcmc": partial(pyro_mcmc_rate, make_kernel, X, y, steps),
                "mcmc10": partial(pyro_mcmc_rate, make_kernel, X, y, steps, steps_per_sample=10),
                "loop": partial(pyro_sample_loop_rate, make_kernel, X, y, steps),
                "eager": partial(pyro_mcmc_rate, make_kernel, X, y, steps, compile_potential=False),
            }
            for name, fn in timed.items():
                out = fn()
                if isinstance(out, tuple):
                    rate, e2e, div = out
                    diverged += div
                    if name == "mcmc":
                        best["e2e"] = min(best.get("e2e", float("inf")), e2e)
                else:
                    rate = out
                best[name] = max(best.get(name, 0.0), rate)
        row = dict(kernel=label, diverged=diverged, **best)
        rows.append(row)
        print(f"  measured {label:<26} MCMC {fmt(row['mcmc']):>6}/s  hand {fmt(row['hand']):>6}/s  "
              f"ratio {row['mcmc'] / row['hand']:.2f}", flush=True)
    print()
    print("| kernel | hand-written torch loop | ours: MCMC | ours/hand | ours: MCMC, steps_per_sample=10 | ratio "
          "| ours: kernel.sample loop | ratio | ours, eager model (compile_potential=False) | ratio "
          "| MCMC end-to-end, S steps (s) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        h = r["hand"]
        print(f"| {r['kernel']} | {fmt(h)} | {fmt(r['mcmc'])} | {r['mcmc'] / h:.2f} | {fmt(r['mcmc10'])} "
              f"| {r['mcmc10'] / h:.2f} | {fmt(r['loop'])} | {r['loop'] / h:.2f} | {fmt(r['eager'])} "
              f"| {r['eager'] / h:.2f} | {r['e2e']:.2f} |")
    if any(r["diverged"] for r in rows):
        print("\nWARNING: some Pyro draws diverged:", {r["kernel"]: r["diverged"] for r in rows})
    print()
    print("ours: steps/s between the first and last draw of pyro.infer.MCMC (disable_progbar=True; setup and")
    print("the one-off tracing of the potential excluded, they are in the end-to-end time). hand: the loop of")
    print("torch_hand_rate, with the same rule function. Best of the interleaved runs.")

    costs, ops = pyro_gradient_costs(X, y, max(rounds, 2))
    print()
    print("## Pyro: where the time goes, one minibatch gradient at a fixed point (µs per call, best of "
          f"{max(rounds, 2)}x500 calls)")
    print()
    print("| path | µs per gradient | vs hand-written | tensor ops per call |")
    print("|---|---:|---:|---:|")
    hand = costs["hand-written, autograd"]
    for name, us in costs.items():
        print(f"| {name} | {us:.0f} | {us / hand:.2f}× | {ops.get(name, '')} |")
    torch.set_num_threads(threads)
    sys.stdout.flush()
    return rows


def repeated_runs_section():
    """Compilation paid by repeated runs of one model (``ppl_sgmcmc.numpyro.MCMC`` without a progress bar, whose
    loop has no host callback and can be cached; a9a, SGLD with a given and
    with a tuned step size, 200 warm-up and 2000 draws): a first run, a second ``run`` of the same object, a
    resumed chain (``post_warmup_state``); without and then with JAX's persistent compilation cache (a fresh
    temporary directory, entries of 0.5 s of compilation or more), whose hits and misses are counted. The
    global configuration is restored afterwards."""
    import tempfile

    from jax.experimental.compilation_cache import compilation_cache

    X_np, y_np, _, _ = load_a9a()
    X, y = jnp.asarray(X_np), jnp.asarray(y_np)
    events = []
    jax.monitoring.register_event_duration_secs_listener(lambda e, d, **kw: events.append((e, d)))
    jax.monitoring.register_event_listener(lambda e, **kw: events.append((e, 0.0)))
    names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs")
    before = {name: getattr(jax.config, name) for name in names}
    print()
    print("## Repeated runs: compilation (a9a, 200 warm-up + 2000 draws; seconds)")
    print()
    print("| persistent cache | step size | run | wall | trace + lowering | XLA compilation | cache hits | misses |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as cache_dir:
        for cache in (False, True):
            compilation_cache.reset_cache()
            jax.config.update("jax_compilation_cache_dir", cache_dir if cache else None)
            jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
            for h in (5e-6, None):
                mcmc = InLoopBarMCMC(SGLD(model, step_size=h), num_warmup=200, num_samples=2000, progress_bar=False)
                for label in ("first run", "second run", "resumed"):
                    if label == "resumed":
                        mcmc.post_warmup_state = mcmc.last_state
                    key = mcmc.last_state.rng_key if label == "resumed" else random.PRNGKey(len(label))
                    events.clear()
                    start = time.perf_counter()
                    mcmc.run(key, X, y)
                    jax.block_until_ready(mcmc.get_samples())
                    wall = time.perf_counter() - start

                    def total(*suffixes):
                        return sum(d for e, d in events if e.endswith(suffixes))

                    count = {k: sum(e.endswith(k) for e, _ in events) for k in ("cache_hits", "cache_misses")}
                    print(f"| {'on' if cache else 'off'} | {'tuned' if h is None else h} | {label} | {wall:.2f} "
                          f"| {total('jaxpr_trace_duration', 'jaxpr_to_mlir_module_duration'):.2f} "
                          f"| {total('backend_compile_duration'):.2f} | {count['cache_hits']} "
                          f"| {count['cache_misses']} |", flush=True)
    for name, value in before.items():
        jax.config.update(name, value)
    compilation_cache.reset_cache()


def kernels_on_one_model_section():
    """What a notebook comparing kernels on one model pays: SGLD, SGHMC, SGNHT and pSGLD with tuned step sizes (the
    start's mode search, Hessian and noise probe), one after the other on a9a in one process, each a new
    ``ppl_sgmcmc.numpyro.MCMC`` (200 warm-up + 2000 draws, no progress bar, no persistent cache). Side by side: the
    start's stages kept for the next kernel of the same model (the library's behaviour: the first kernel compiles
    them), and the kept stages dropped before each kernel (every kernel compiles its own start, as before they were
    kept)."""
    from ppl_sgmcmc.numpyro import kernel as kernel_module

    X_np, y_np, _, _ = load_a9a()
    X, y = jnp.asarray(X_np), jnp.asarray(y_np)
    print()
    print("## Kernels compared on one model: the start's compilation (a9a, tuned, 200 warm-up + 2000 draws; seconds)")
    print()
    print("| start stages | kernel | wall | kernel start (`init`) | trace + lowering | XLA compilation |")
    print("|---|---|---:|---:|---:|---:|")
    init = kernel_module.SGMCMCKernel.init
    for kept in (False, True):
        for cls in (SGLD, SGHMC, SGNHT, PSGLD):
            if not kept or cls is SGLD:  # the first kernel of each side compiles the start
                kernel_module._START_STAGES.clear()
            kernel = cls(model)
            timed = {}

            def timed_init(*args, kernel=kernel, timed=timed, **kwargs):
                start = time.perf_counter()
                state = jax.block_until_ready(init(kernel, *args, **kwargs))
                timed["init"] = time.perf_counter() - start
                return state

            kernel.init = timed_init
            with CLOCK.measure() as clock:
                start = time.perf_counter()
                mcmc = InLoopBarMCMC(kernel, num_warmup=200, num_samples=2000, progress_bar=False)
                mcmc.run(random.PRNGKey(0), X, y)
                jax.block_until_ready(mcmc.get_samples())
                wall = time.perf_counter() - start
            compile_time = sum(duration for _, _, duration in clock.compiles)
            print(f"| {'kept' if kept else 'compiled per kernel'} | {cls.__name__} | {wall:.2f} | {timed['init']:.2f} "
                  f"| {clock.total - compile_time:.2f} | {compile_time:.2f} |", flush=True)


def health_callback_section(X, y, steps=20000, repeats=9, calls=2000):
    """The in-loop health report's cost: ``kernel.sample`` of the a9a model (given step size) compiled with the
    health checks' host callback (as under ``numpyro.infer.MCMC``) and without it (as under
    ``ppl_sgmcmc.numpyro.MCMC``, which reports after the run), timed round-robin two ways: ``steps`` steps in
    a bare ``lax.scan`` (NumPyro's loop without a progress bar), and ``calls`` calls of a jitted step from
    Python (NumPyro's loop with its progress bar, or a hand-driven ``jax.jit(kernel.sample)``)."""
    print()
    print(f"## The health report's host callback (a9a; a bare scan of {steps} steps, and {calls} jitted calls "
          f"from Python; best of {repeats})")
    print()
    print("| kernel | scan: with callback (steps/s) | without | cost | calls: with callback (steps/s) | without | cost |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, make in (("SGLD", SGLD), ("SGNHT", SGNHT)):
        fns = {}
        for callback in (True, False):
            kernel = make(model, step_size=1e-4)
            state = kernel.init(random.PRNGKey(0), 0, None, (X, y), {})
            kernel._reports_after_run = not callback  # what `ppl_sgmcmc.numpyro.MCMC` sets during its runs

            def run(state, kernel=kernel):
                def body(s, _):
                    s = kernel.sample(s, (X, y), {})
                    return s, s.z["w"][0]

                return lax.scan(body, state, None, length=steps)

            step = jax.jit(kernel.sample)

            def called(state, step=step):
                for _ in range(calls):
                    state = step(state, (X, y), {})
                return state

            fns["scan", callback] = (jax.jit(run), state)
            fns["calls", callback] = (called, state)
        with warnings.catch_warnings():  # the step size is too large for the noise: the callback says so
            warnings.simplefilter("ignore", RuntimeWarning)
            scans = interleaved_rates({k: v for k, v in fns.items() if k[0] == "scan"}, steps, repeats)
            loops = interleaved_rates({k: v for k, v in fns.items() if k[0] == "calls"}, calls, repeats)
        cells = [f"{fmt(r[w, True])} | {fmt(r[w, False])} | {r[w, False] / r[w, True]:.2f}x"
                 for w, r in (("scan", scans), ("calls", loops))]
        print(f"| {name} | {' | '.join(cells)} |", flush=True)


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
        device=jax.devices()[0].device_kind,
        date=datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        load=" ".join(f"{x:.2f}" for x in os.getloadavg()),
    )


def fmt(x, spec=",.0f"):
    return "—" if x is None or (isinstance(x, float) and np.isnan(x)) else format(x, spec)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=None,
                        help="S: steps of the shorter MCMC run (default 80000: a shorter run's fixed tail weighs "
                             "on a fast step)")
    parser.add_argument("--quick", action="store_true", help="smoke test: two kernels, fewer rows (~4 min)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="MCMC runs per configuration, alternately S and 2S steps (default 2); "
                             "each baseline is timed once per round plus once before")
    parser.add_argument("--pyro", action="store_true", help="add the Pyro backend's rows (torch loop vs Pyro MCMC)")
    parser.add_argument("--pyro-only", action="store_true", help="only the Pyro rows (~2-4 min)")
    parser.add_argument("--health-callback", action="store_true",
                        help="only the cost of the health report's host callback in the compiled loop (~1 min)")
    parser.add_argument("--repeated-runs", action="store_true",
                        help="only the compilation of repeated runs, without and with JAX's persistent cache")
    parser.add_argument("--kernels-on-one-model", action="store_true",
                        help="only the start's compilation for kernels compared on one model (~3 min)")
    parser.add_argument("--pyro-steps", type=int, default=None, help=f"steps per Pyro run (default {PYRO_STEPS})")
    args = parser.parse_args(argv)
    pyro_steps = args.pyro_steps or (1000 if args.quick else PYRO_STEPS)
    steps = args.steps or 80000
    rounds = args.rounds or 2
    repeats = rounds + 1
    pbar_steps = max(steps // 10, 1000)  # the progress-bar path runs 5-20x slower
    vec_steps = max(steps // 2, 4000)

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
    print(f"        steps: S={steps}; {rounds} MCMC runs per configuration (S, 2S, S, ...); "
          f"baselines: best of {repeats} timed calls")
    print(flush=True)

    if args.health_callback:
        health_callback_section(jnp.asarray(X), jnp.asarray(y))
        print(f"\ntotal wall time {time.perf_counter() - t_start:.0f} s")
        return
    if args.repeated_runs:
        repeated_runs_section()
        print(f"\ntotal wall time {time.perf_counter() - t_start:.0f} s")
        return
    if args.kernels_on_one_model:
        kernels_on_one_model_section()
        print(f"\ntotal wall time {time.perf_counter() - t_start:.0f} s")
        return
    if args.pyro_only:
        pyro_section(pyro_steps, rounds, args.quick)
        print(f"\ntotal wall time {time.perf_counter() - t_start:.0f} s; load average at the end "
              + " ".join(f"{x:.2f}" for x in os.getloadavg()))
        return

    specs = kernel_specs()
    if args.quick:
        specs = [s for s in specs if s[0] in QUICK_KERNELS]

    # one-off costs of the first MCMC run in a process (numpyro/jax caches, eager op compiles) must not
    # land in the first measured run: warm up with a short run
    time_mcmc(specs[0][1], X, y, 10, progress_bar=False)

    rows = []
    for spec in specs:
        label, make_kernel, rule, hyper, step_size, bj_name, bj_nearest = spec
        # baselines are compiled first and timed before and after the MCMC runs, so that their
        # best-of spans the same stretch of time (the machine is shared; its speed drifts)
        chain = jax.jit(make_scan_chain(rule, hyper, step_size, X, y, steps)[0])
        chain_unrolled = jax.jit(make_scan_chain(rule, hyper, step_size, X, y, steps, draws="unrolled")[0])
        timed = [(chain, random.PRNGKey(1), []), (chain_unrolled, random.PRNGKey(1), [])]
        if bj_name is not None:
            bj_chain = jax.jit(make_blackjax_chain(bj_name, hyper, step_size, X, y, steps))
            timed.append((bj_chain, random.PRNGKey(2), []))
        sj_name = SGMCMCJAX.get(label)
        if sj_name is not None:
            sj_chain = jax.jit(make_sgmcmcjax_chain(sj_name, hyper, step_size, X, y, steps))
            timed.append((sj_chain, random.PRNGKey(4), []))
        for fn, key, times in timed:
            times.append(best_time(fn, key, repeats=1))
        between = [lambda fn=fn, key=key, times=times: times.append(best_time(fn, key, repeats=1, compile=False))
                   for fn, key, times in timed]
        ours = steady_rate(make_kernel, X, y, steps, rounds=rounds, between=between, progress_bar=False)
        (t_scan, xs), (t_unrolled, _), *rest = [min(times, key=lambda r: r[0]) for _, _, times in timed]
        finite = ours["finite"] and bool(jnp.all(jnp.isfinite(xs[-1])))
        bj = sj = None
        if bj_name is not None:
            t_bj, xs_bj = rest.pop(0)
            bj = steps / t_bj
            finite &= bool(jnp.all(jnp.isfinite(xs_bj[-1])))
        if sj_name is not None:
            t_sj, xs_sj = rest.pop(0)
            sj = steps / t_sj
            finite &= bool(jnp.all(jnp.isfinite(xs_sj[-1])))
        row = dict(
            kernel=label,
            ours=ours["rate"],
            ours_diff=ours["rate_diff"],
            e2e=ours["e2e"],
            compile=ours["compile"],
            scan=steps / t_scan,
            scan_unrolled=steps / t_unrolled,
            blackjax=bj,
            bj_name=(("~" if bj_nearest else "") + bj_name + (f", K={BLACKJAX_SGHMC_STEPS}" if bj_name == "sghmc" else ""))
            if bj_name
            else None,
            sgmcmcjax=sj,
            sj_name=sj_name,
            finite=finite,
            num_diverging=ours["num_diverging"],
        )
        rows.append(row)
        print(
            f"  measured {label:<26} ours {fmt(row['ours']):>7}/s (S/2S difference {fmt(row['ours_diff'])}/s)  "
            f"scan {fmt(row['scan']):>7}/s  scan, unrolled draws {fmt(row['scan_unrolled']):>7}/s  "
            f"blackjax {fmt(bj):>7}/s  sgmcmcjax {fmt(sj):>7}/s  "
            f"all chains finite: {finite}",
            flush=True,
        )

    print()
    print(f"## Steady-state steps/s, one chain, progress_bar=False (S={steps})")
    print()
    print("| kernel | ours steps/s | scan steps/s | ours/scan | scan, unrolled draws | ours/that | blackjax steps/s "
          "| ours/blackjax | sgmcmcjax steps/s | ours/sgmcmcjax | ours, S/2S difference "
          "| ours end-to-end, S steps (s) | of which compile (s) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        bj = "—" if r["blackjax"] is None else f"{fmt(r['blackjax'])} ({r['bj_name']})"
        ratio_bj = "—" if r["blackjax"] is None else f"{r['ours'] / r['blackjax']:.2f}"
        sj = "—" if r["sgmcmcjax"] is None else f"{fmt(r['sgmcmcjax'])} ({r['sj_name']})"
        ratio_sj = "—" if r["sgmcmcjax"] is None else f"{r['ours'] / r['sgmcmcjax']:.2f}"
        print(
            f"| {r['kernel']} | {fmt(r['ours'])} | {fmt(r['scan'])} | {r['ours'] / r['scan']:.2f} "
            f"| {fmt(r['scan_unrolled'])} | {r['ours'] / r['scan_unrolled']:.2f} | {bj} "
            f"| {ratio_bj} | {sj} | {ratio_sj} | {fmt(r['ours_diff'])} | {r['e2e']:.2f} | {r['compile']:.2f} |"
        )
    print()
    print("ours: best run of s / sampling time (from the end of the loop's compilation to the end of the run);")
    print("S/2S difference: S / (sampling time of the 2S run - that of the S run). scan, blackjax, sgmcmcjax: best timed call.")
    print("scan, unrolled draws: the hand-written scan drawing the same numbers through ppl_sgmcmc.numpyro.prng, as")
    print("the kernel does (jax.random's Threefry is a rolled loop on XLA:CPU): what is left is the kernel's own work.")
    print("~name: the nearest BlackJAX algorithm, not the same update (see RESULTS.md). BlackJAX SGHMC, K=10:")
    print("its rate counts integration steps, with one minibatch and one momentum draw per 10 steps: not a")
    print("per-step comparison (with K=1 its gradient is dead code and it runs a gradient-free random walk).")
    sys.stdout.flush()

    # --- progress bar ---------------------------------------------------------------------------
    by_label = {r["kernel"]: r for r in rows}
    print()
    print(f"## Progress bar, one chain (MCMC runs of {pbar_steps} and {2 * pbar_steps} draws; rates in SG-MCMC steps/s)")
    print()
    print("| kernel | progress_bar=False | progress_bar=True | slowdown "
          f"| True, steps_per_sample={AMORTISE} | slowdown | ppl_sgmcmc.numpyro.MCMC, progress_bar=True | slowdown |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for spec in specs:
        label, make_kernel = spec[0], spec[1]
        if label not in (("SGLD",) if args.quick else QUICK_KERNELS):
            continue
        on = steady_rate(make_kernel, X, y, pbar_steps, rounds=rounds, progress_bar=True)
        amortised = steady_rate(partial(make_kernel, steps_per_sample=AMORTISE), X, y, pbar_steps // AMORTISE,
                                rounds=rounds, progress_bar=True)
        amortised_rate = AMORTISE * amortised["rate"]
        # the in-loop bar against progress_bar=False in the same stretch of time, run for run
        off, in_loop = 0.0, 0.0
        for _ in range(rounds):
            off = max(off, steady_rate(make_kernel, X, y, steps, rounds=1, progress_bar=False)["rate"])
            in_loop = max(in_loop, steady_rate(make_kernel, X, y, steps, rounds=1, progress_bar=True,
                                               mcmc_class=InLoopBarMCMC)["rate"])
        base = by_label[label]["ours"]
        print(
            f"| {label} | {fmt(base)} | {fmt(on['rate'])} | {fmt(base / on['rate'], '.1f')}× "
            f"| {fmt(amortised_rate)} | {fmt(base / amortised_rate, '.2f')}× "
            f"| {fmt(in_loop)} | {fmt(off / in_loop, '.2f')}× (vs {fmt(off)} alongside) |",
            flush=True,
        )

    # --- vectorised chains ------------------------------------------------------------------------
    print()
    print(f"## Vectorised chains, chain_method='vectorized' (S={vec_steps}; steps/s of each chain)")
    print()
    print("| kernel | chains | ours (MCMC) | scan, jax.vmap over chains | ours/scan "
          "| kernel.sample, bare scan | hand step, bare scan | sample/hand | hand step, unrolled draws | sample/that |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for spec in kernel_specs():
        if spec[0] not in QUICK_KERNELS:
            continue
        label, make_kernel, rule, hyper, step_size = spec[:5]
        for num_chains in VECTORIZED_CHAINS[:1] if args.quick else VECTORIZED_CHAINS:
            vec_kwargs = dict(progress_bar=False, num_chains=num_chains, chain_method="vectorized")
            vec = steady_rate(make_kernel, X, y, vec_steps, rounds=rounds, **vec_kwargs)
            chain, _ = make_scan_chain(rule, hyper, step_size, X, y, vec_steps)
            keys = random.split(random.PRNGKey(3), num_chains)
            t_vscan, _ = best_time(jax.jit(jax.vmap(chain)), keys, repeats=repeats)
            vscan = vec_steps / t_vscan
            bare = decompose(spec, X, y, vec_steps // 2, repeats, num_chains=num_chains)
            print(
                f"| {label} | {num_chains} | {fmt(vec['rate'])} | {fmt(vscan)} | {vec['rate'] / vscan:.2f} "
                f"| {fmt(bare['ours', False])} | {fmt(bare['hand', False])} "
                f"| {bare['ours', False] / bare['hand', False]:.2f} | {fmt(bare['hand unrolled', False])} "
                f"| {bare['ours', False] / bare['hand unrolled', False]:.2f} |",
                flush=True,
            )

    # --- where the time goes ----------------------------------------------------------------------
    print()
    print(f"## Where the time goes: one step in a bare lax.scan, compiled once (S={steps // 2}, best of {repeats})")
    print()
    print("| kernel | hand step | hand step + store z (= scan column) | kernel.sample | kernel.sample + store z "
          "| MCMC (table above) | sample/hand | hand step, unrolled draws | sample/that |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for spec in specs:
        if spec[0] not in (("SGLD",) if args.quick else ("SGLD", "SGNHT multivar. splitting", "PSGLD")):
            continue
        r = decompose(spec, X, y, steps // 2, repeats)
        print(
            f"| {spec[0]} | {fmt(r['hand', False])} | {fmt(r['hand', True])} | {fmt(r['ours', False])} "
            f"| {fmt(r['ours', True])} | {fmt(by_label[spec[0]]['ours'])} | {r['ours', False] / r['hand', False]:.2f} "
            f"| {fmt(r['hand unrolled', False])} | {r['ours', False] / r['hand unrolled', False]:.2f} |",
            flush=True,
        )

    # --- what the step's bookkeeping costs -----------------------------------------------------------
    print()
    print(f"## What the step's bookkeeping costs: kernel.sample in a bare lax.scan (S={steps // 2}, best of "
          f"{2 * repeats + 1}, interleaved), pieces taken out by patching (not valid samplers)")
    print()
    names = ("as run", "no health branch", "no noise estimate", "neither", "neither, no guard", "hand step",
             "hand step, unrolled draws")
    print("| kernel | " + " | ".join(names) + " |")
    print("|---|" + "---:|" * len(names))
    for spec in specs:
        if spec[0] not in QUICK_KERNELS:
            continue
        r = step_costs(spec, X, y, steps // 2, 2 * repeats + 1)
        print(f"| {spec[0]} | " + " | ".join(f"{fmt(r[n])} ({r[n] / r['hand step']:.2f})" for n in names) + " |",
              flush=True)

    # --- tuned kernels after the warm-up -----------------------------------------------------------------
    print()
    print(f"## Kernels at their defaults (tuned step size, a preconditioner) after a 1000-step warm-up: kernel.sample "
          f"in a bare lax.scan (S={steps // 2}, best of {2 * repeats + 1}, interleaved)")
    print()
    r = tuned_costs(X, y, steps // 2, 2 * repeats + 1)
    print("| " + " | ".join(r) + " |")
    print("|" + "---:|" * len(r))
    print("| " + " | ".join(fmt(v) for v in r.values()) + " |", flush=True)

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

    if args.pyro:
        pyro_section(pyro_steps, rounds, args.quick)

    print()
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"total wall time {time.perf_counter() - t_start:.0f} s; load average at the end {load}")


if __name__ == "__main__":
    main()
