"""Variance-reduced gradients: minibatch, control variates and SVRG, against BlackJAX and SGMCMCJax.

Two posteriors with a reference:

* **a9a**: ``models.logistic_regression.model`` (N = 32 561, d = 123, minibatch 100), against the cached NUTS
  summaries of ``benchmarks/a9a_vs_nuts.py`` (:data:`benchmarks.a9a_vs_nuts.NUTS_CACHE`: 4 × 1000 draws);
* **linreg**: the conjugate linear regression of ``benchmarks/hands_off.py`` (N = 5000, d = 6, minibatch 100),
  against its exact posterior.

**Coordinates.** a9a's posterior sds run from ~0.01 to ~3, so SGLD at one step size needs a preconditioner. Every
sampler here runs in the same whitened coordinates ``u = L⁻¹ (w - ŵ)``: ``ŵ`` the exact mode (Newton on the full
data, float64), ``L Lᵀ`` the inverse Hessian there (the Laplace preconditioner that ppl_sgmcmc's warm-up builds;
for linreg the exact posterior covariance). ppl_sgmcmc runs the unchanged model through a NumPyro ``reparam``
handler (:class:`Whiten`); BlackJAX and SGMCMCJax get the same log-prior and per-datum log-likelihood in ``u``.
All run SGLD, ``u ← u + h ∇log p̂(u) + sqrt(2h) ξ``, at the same step ``h`` (:data:`STEP_SIZES`: 0.05 on linreg,
0.01 on a9a), 4 chains from ``u = 0`` (the mode), minibatches of 100 rows drawn with replacement, control variates
centred at the mode.

**Measured.**

(a) *Gradient-noise variance near the mode*: at 32 posterior points (NUTS draws for a9a, exact draws for
    linreg), the trace of the covariance (in ``u``) of 256 estimates of ∇U by ppl_sgmcmc's estimators
    (``ppl_sgmcmc.gradients`` on the kernel's own minibatch potential): minibatch; control variates centred at
    the mode; SVRG centred at another posterior draw (its centre is the chain's position up to one epoch, N/n
    steps, earlier: about independent at this step size). Also the kernels' own running estimate,
    ``sample_stats.noise_variance``, median over the kept draws of the runs in (b).
(b) *Posterior sd error at the same gradient budget*: each chain gets ``B`` minibatch-gradient evaluations
    (``--budget``): minibatch SGLD ``B`` steps; control variates ``(B - N/n)/2`` (two minibatch gradients a step
    and one full-data gradient, worth N/n); SVRG ``B/3`` (two a step and a full-data gradient every N/n steps).
    The first 10 % are burn-in, every 10th step is kept. Per coordinate of ``w``, ``sd / reference sd - 1``
    (median, 90th percentile and max of its absolute value, and how many beyond 5 %), with the median Monte Carlo
    error of the ratio ``1/sqrt(2 ESS)``; and the coordinates that control variates leave worst, with how many
    rows of data their feature is non-zero in.
    SGLD's discretisation alone widens the sds by about ``h/4`` (``1/(1 - h/2)`` in variance on N(0, I)).
(c) *Cost per step*: steps per second of one chain, each sampler's step compiled into one ``lax.fori_loop`` of
    :data:`TIMED_STEPS` steps, timed 10 times interleaved (the best kept) in the same run; the ratio to
    ppl_sgmcmc's minibatch SGLD.
(d) *Side by side*, in the same run, (b) and (c) for BlackJAX 1.7's SGLD (``blackjax.sgld``) with its
    ``blackjax.sgmcmc.gradients.grad_estimator`` and ``control_variates``, and for SGMCMCJax 0.2.13's
    ``build_sgldCV_kernel`` and ``build_sgld_SVRG_kernel``. SGMCMCJax 0.2.13 imports
    ``jax.experimental.host_callback``, which current JAX removed (it uses it only for its progress bars);
    :func:`benchmarks.sgmcmcjax_shim.import_sgmcmcjax` puts a stub module in ``sys.modules`` before importing it.

Usage (from the repository root)::

    .venv/bin/python -m benchmarks.variance_reduction            # B = 100 000 gradients per chain, ~15 min
    .venv/bin/python -m benchmarks.variance_reduction --quick    # B = 10 000, ~6 min (on 2 busy cores)

Prints the tables for ``RESULTS.md`` and writes ``benchmarks/results/variance_reduction.json``
(``variance_reduction_quick.json`` with ``--quick``).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import blackjax  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import numpyro  # noqa: E402
import numpyro.distributions as dist  # noqa: E402
from jax import lax  # noqa: E402
from jax.flatten_util import ravel_pytree  # noqa: E402
from numpyro.diagnostics import effective_sample_size  # noqa: E402
from numpyro.handlers import reparam  # noqa: E402
from numpyro.infer import MCMC  # noqa: E402
from numpyro.infer.reparam import Reparam  # noqa: E402

from benchmarks.a9a_vs_nuts import load_reference, machine  # noqa: E402
from benchmarks.hands_off import linreg_model, linreg_target  # noqa: E402
from benchmarks.sgmcmcjax_shim import import_sgmcmcjax  # noqa: E402
from models.datasets import load_a9a  # noqa: E402
from models.logistic_regression import model as a9a_model  # noqa: E402
from ppl_sgmcmc import gradients  # noqa: E402
from ppl_sgmcmc import numpyro as sg  # noqa: E402
from ppl_sgmcmc.numpyro.potential import ModelTarget  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
CHAINS, BATCH, SEED = 4, 100, 0
#: SGLD's step in the whitened coordinates, per problem: its discretisation widens the sds by about h/4.
STEP_SIZES = {"linreg": 0.05, "a9a": 0.01}
THIN, BURN_IN = 10, 0.1
NOISE_POINTS, NOISE_DRAWS = 32, 256
TIMED_STEPS = 2000


# --- the problems ----------------------------------------------------------------------------------------
class Whiten(Reparam):
    """Sample site ``w`` as ``w = mode + L u`` with ``u`` the latent: the site's prior is kept exactly (a factor
    ``log p(w) - log N(u; 0, I)`` next to ``u ~ N(0, I)``, so ``u``'s density is ``p(mode + L u)``)."""

    def __init__(self, mode: jax.Array, L: jax.Array) -> None:
        self.mode, self.L = mode, L

    def __call__(self, name: str, fn: Any, obs: Any) -> tuple[None, jax.Array]:
        base = dist.Normal(0.0, 1.0).expand([self.mode.shape[0]]).to_event(1)
        u = numpyro.sample(f"{name}_u", base)
        w = self.mode + self.L @ u
        numpyro.factor(f"{name}_prior", fn.log_prob(w) - base.log_prob(u))
        return None, w


@dataclass
class Problem:
    """A posterior on weights ``w`` with a reference, and the whitening ``w = mode + L u``."""

    name: str
    model: Callable[..., None]
    X: np.ndarray
    y: np.ndarray
    #: ``log p(y_i | x_i, w)`` of one row
    loglik: Callable[[jax.Array, jax.Array, jax.Array], jax.Array]
    logprior: Callable[[jax.Array], jax.Array]
    mode: np.ndarray
    L: np.ndarray
    ref_sd: np.ndarray
    ref_label: str
    #: posterior draws of ``w`` ``(points, d)`` where the gradient noise is measured
    points: np.ndarray

    @property
    def step_size(self) -> float:
        return STEP_SIZES[self.name]

    @property
    def whitened_model(self) -> Callable[..., None]:
        return reparam(self.model, config={"w": Whiten(jnp.asarray(self.mode, jnp.float32),
                                                        jnp.asarray(self.L, jnp.float32))})  # fmt: skip

    def to_w(self, u: np.ndarray) -> np.ndarray:
        return self.mode + np.asarray(u, np.float64) @ self.L.T

    def to_u(self, w: np.ndarray) -> np.ndarray:
        return np.linalg.solve(self.L, (np.asarray(w, np.float64) - self.mode).T).T

    @property
    def epoch(self) -> int:
        return self.X.shape[0] // BATCH

    def whitened_densities(self) -> tuple[Callable, Callable]:
        """``(log-prior(u), log-likelihood(u, (x_i, y_i)))`` in the whitened coordinates (float32)."""
        mode, L = jnp.asarray(self.mode, jnp.float32), jnp.asarray(self.L, jnp.float32)

        def logprior(u: jax.Array) -> jax.Array:
            return self.logprior(mode + L @ u)

        def loglik(u: jax.Array, row: tuple[jax.Array, jax.Array]) -> jax.Array:
            return self.loglik(mode + L @ u, *row)

        return logprior, loglik


def logistic_mode(X: np.ndarray, y: np.ndarray, prior_var: float) -> tuple[np.ndarray, np.ndarray]:
    """The exact mode of the logistic regression posterior and the Hessian of ``U`` there (Newton, float64)."""
    X, y = np.asarray(X, np.float64), np.asarray(y, np.float64)
    w = np.zeros(X.shape[1])
    for _ in range(50):
        p = 1 / (1 + np.exp(-(X @ w)))
        hessian = X.T @ (X * (p * (1 - p))[:, None]) + np.eye(X.shape[1]) / prior_var
        step = np.linalg.solve(hessian, X.T @ (y - p) - w / prior_var)
        w = w + step
        if np.max(np.abs(step)) < 1e-10:
            break
    p = 1 / (1 + np.exp(-(X @ w)))
    return w, X.T @ (X * (p * (1 - p))[:, None]) + np.eye(X.shape[1]) / prior_var


def a9a_problem() -> Problem:
    X, y, _, _ = load_a9a()
    mode, hessian = logistic_mode(X, y, 10.0)
    ref = load_reference()
    points = ref["ksd_draws"].reshape(-1, X.shape[1]).astype(np.float64)
    rng = np.random.default_rng(SEED)
    return Problem(
        "a9a", a9a_model, X, y,
        loglik=lambda w, x, t: -jax.nn.softplus(-(2 * t - 1) * (x @ w)),
        logprior=lambda w: dist.Normal(0.0, 10**0.5).log_prob(w).sum(),
        mode=mode, L=np.linalg.cholesky(np.linalg.inv(hessian)), ref_sd=np.asarray(ref["w_sd"], np.float64),
        ref_label=f"NUTS ({ref['num_chains']} × {ref['num_samples']} draws, cached)",
        points=points[rng.permutation(len(points))[: 2 * NOISE_POINTS]],
    )  # fmt: skip


def linreg_problem() -> Problem:
    target = linreg_target((0, 0, 1))  # hands_off's data and exact posterior (run lengths unused here)
    X, y = (np.asarray(a) for a in target.args)
    cov = np.asarray(target.ksd_preconditioner, np.float64)
    rng = np.random.default_rng(SEED)
    return Problem(
        "linreg", linreg_model, X, y,
        loglik=lambda w, x, t: dist.Normal(x @ w, 1.0).log_prob(t),
        logprior=lambda w: dist.Normal(0.0, 1.0).log_prob(w).sum(),
        mode=np.asarray(target.ref_mean, np.float64), L=np.linalg.cholesky(cov), ref_sd=target.ref_sd,
        ref_label="exact posterior", points=rng.multivariate_normal(target.ref_mean, cov, size=2 * NOISE_POINTS),
    )  # fmt: skip


# --- (a) the gradient noise at fixed points ------------------------------------------------------------
def noise_traces(problem: Problem) -> dict[str, np.ndarray]:
    """Per point, the trace of the covariance of :data:`NOISE_DRAWS` estimates of ∇U(u) by each estimator, on the
    kernel's own minibatch potential of the whitened model."""
    model, kwargs = problem.whitened_model, {"batch_size": BATCH}
    args = (jnp.asarray(problem.X), jnp.asarray(problem.y))
    target = ModelTarget(model, args, kwargs, jax.random.PRNGKey(SEED), True, "SGLD")
    d = problem.mode.shape[0]
    _, unravel = ravel_pytree({"w_u": jnp.zeros(d)})
    u = jnp.asarray(problem.to_u(problem.points), jnp.float32)
    at, other = u[:NOISE_POINTS], u[NOISE_POINTS:]

    def full_grad_fn(x: jax.Array) -> Any:
        return target.full_gradient(x, unravel, args, kwargs)

    def trace(estimator: gradients.GradientEstimator, point: jax.Array, centre: jax.Array) -> jax.Array:
        state = estimator.init(centre, full_grad_fn if estimator.needs_full_gradient else None)

        def one(key: jax.Array) -> jax.Array:
            batch, _ = target.draw(key, target.init_batch(key))
            grad_fn, _ = estimator.estimate(state, point, lambda x: target.gradient(x, unravel, batch, args, kwargs), 0)
            return grad_fn(point).grad

        g = jax.vmap(one)(jax.random.split(jax.random.PRNGKey(SEED + 1), NOISE_DRAWS))
        return jnp.sum(jnp.var(g, axis=0, ddof=1))

    zero = jnp.zeros((NOISE_POINTS, d), jnp.float32)
    centres = {"minibatch": zero, "control_variates": zero, "svrg": other}  # SVRG: another posterior draw
    out = {}
    for name, centre in centres.items():
        one_point = jax.jit(partial(trace, gradients.ESTIMATORS[name]()))
        out[name] = np.asarray([float(one_point(at[p], centre[p])) for p in range(NOISE_POINTS)])
    return out


# --- the samplers --------------------------------------------------------------------------------------
@dataclass
class Sampler:
    """One SGLD variant: its library, name, gradient evaluations per step (in minibatch gradients) and fixed
    cost (full-data gradients at the start), and how to build its chains."""

    library: str
    name: str
    per_step: float
    fixed: float
    #: ``problem -> (init(key) -> state, step(i, key, state) -> state, position(state) -> u)``
    build: Callable[[Problem], tuple[Callable, Callable, Callable]] | None = None
    gradient: Any = None  # ppl_sgmcmc's ``gradient=`` option

    def steps(self, budget: int, epoch: int) -> int:
        return int((budget - self.fixed * epoch) / self.per_step)


def ours_kernel(problem: Problem, gradient: Any) -> sg.SGLD:
    return sg.SGLD(problem.whitened_model, step_size=problem.step_size, gradient=gradient, find_mode=False,
                   steps_per_sample=THIN)


def blackjax_build(control_variates: bool) -> Callable[[Problem], tuple[Callable, Callable, Callable]]:
    def build(problem: Problem) -> tuple[Callable, Callable, Callable]:
        logprior, loglik = problem.whitened_densities()
        X, y = jnp.asarray(problem.X), jnp.asarray(problem.y)
        d, N = problem.mode.shape[0], X.shape[0]
        grad_fn = blackjax.sgmcmc.gradients.grad_estimator(logprior, loglik, N)
        if control_variates:
            grad_fn = blackjax.sgmcmc.gradients.control_variates(grad_fn, jnp.zeros(d), (X, y))
        sgld = blackjax.sgld(grad_fn)

        def step(i: jax.Array, key: jax.Array, u: jax.Array) -> jax.Array:
            key_batch, key_step = jax.random.split(key)
            rows = jax.random.randint(key_batch, (BATCH,), 0, N)
            return sgld.step(key_step, u, (X[rows], y[rows]), problem.step_size)

        return (lambda key: sgld.init(jnp.zeros(d))), step, (lambda u: u)

    return build


def sgmcmcjax_build(svrg: bool) -> Callable[[Problem], tuple[Callable, Callable, Callable]]:
    def build(problem: Problem) -> tuple[Callable, Callable, Callable]:
        kernels = import_sgmcmcjax()
        logprior, loglik = problem.whitened_densities()
        data = (jnp.asarray(problem.X), jnp.asarray(problem.y))
        d = problem.mode.shape[0]

        def loglik_xy(u: jax.Array, x: jax.Array, t: jax.Array) -> jax.Array:
            return loglik(u, (x, t))

        if svrg:
            init, kernel, get_params = kernels.build_sgld_SVRG_kernel(
                problem.step_size, loglik_xy, logprior, data, BATCH, problem.epoch
            )
        else:
            init, kernel, get_params = kernels.build_sgldCV_kernel(
                problem.step_size, loglik_xy, logprior, data, BATCH, jnp.zeros(d)
            )
        return (lambda key: init(key, jnp.zeros(d))), kernel, get_params

    return build


SAMPLERS = [
    Sampler("ppl_sgmcmc", "minibatch", 1, 0, gradient="minibatch"),
    Sampler("ppl_sgmcmc", "control_variates", 2, 1, gradient="control_variates"),
    Sampler("ppl_sgmcmc", "svrg", 3, 0, gradient="svrg"),
    Sampler("BlackJAX", "minibatch", 1, 0, build=blackjax_build(False)),
    Sampler("BlackJAX", "control_variates", 2, 1, build=blackjax_build(True)),
    Sampler("SGMCMCJax", "SGLD-CV", 2, 1, build=sgmcmcjax_build(False)),
    Sampler("SGMCMCJax", "SGLD-SVRG", 3, 0, build=sgmcmcjax_build(True)),
]


def ours_gradient(sampler: Sampler, d: int) -> Any:
    """ppl_sgmcmc's estimator: control variates centred at the mode, ``u = 0`` (as BlackJAX's and SGMCMCJax's)."""
    if sampler.gradient == "control_variates":
        return gradients.control_variates(centre=jnp.zeros(d))
    return sampler.gradient


# --- (b) the chains --------------------------------------------------------------------------------------
def run_chains(problem: Problem, sampler: Sampler, steps: int) -> tuple[np.ndarray, float, float]:
    """``steps`` steps of each of :data:`CHAINS` chains from the mode: ``(kept draws of u (chains, draws, d),
    wall-clock seconds with compilation, median sample_stats.noise_variance (ppl_sgmcmc only, else NaN))``."""
    burn, kept = int(BURN_IN * steps) // THIN, (steps - int(BURN_IN * steps)) // THIN
    d = problem.mode.shape[0]
    key = jax.random.PRNGKey(SEED)
    start = time.perf_counter()
    if sampler.build is None:
        kernel = ours_kernel(problem, ours_gradient(sampler, d))
        mcmc = MCMC(kernel, num_warmup=burn, num_samples=kept, num_chains=CHAINS, chain_method="vectorized",
                    progress_bar=False)  # fmt: skip
        mcmc.run(key, jnp.asarray(problem.X), jnp.asarray(problem.y), batch_size=BATCH,
                 init_params={"w_u": jnp.zeros((CHAINS, d))})  # fmt: skip
        u = np.asarray(mcmc.get_samples(group_by_chain=True)["w_u"])
        noise = float(np.median(np.asarray(mcmc.get_extra_fields()["noise_variance"])))
        return u, time.perf_counter() - start, noise
    init, step, position = sampler.build(problem)

    def chain(key: jax.Array) -> jax.Array:
        key_init, key_run = jax.random.split(key)

        def block(carry: tuple, _: None) -> tuple[tuple, jax.Array]:
            state, i, key = carry

            def one(j: int, carry: tuple) -> tuple:
                state, key = carry
                key, key_step = jax.random.split(key)
                return step(i + j, key_step, state), key

            state, key = lax.fori_loop(0, THIN, one, (state, key))
            return (state, i + THIN, key), position(state)

        _, draws = lax.scan(block, (init(key_init), 0, key_run), None, length=burn + kept)
        return draws[burn:]

    u = np.asarray(jax.jit(jax.vmap(chain))(jax.random.split(key, CHAINS)))
    return u, time.perf_counter() - start, float("nan")


def sd_error(problem: Problem, u: np.ndarray) -> dict[str, float]:
    """``|sd / reference sd - 1|`` over the coordinates of ``w`` (median, 90th percentile, max, how many beyond 5 %),
    the ratios, and the median Monte Carlo error of the ratio, ``1/sqrt(2 ESS)``."""
    w = problem.to_w(u)
    ratio = w.reshape(-1, w.shape[-1]).std(0, ddof=1) / problem.ref_sd
    ess = np.asarray(effective_sample_size(w))
    error = np.abs(ratio - 1)
    return {"sd_error_median": float(np.median(error)), "sd_error_p90": float(np.quantile(error, 0.9)),
            "sd_error_max": float(error.max()), "beyond_5pct": int(np.sum(error > 0.05)), "sd_ratio": ratio.tolist(),
            "sd_ratio_median": float(np.median(ratio)),
            "mcse_median": float(np.median(1 / np.sqrt(2 * ess)))}  # fmt: skip


# --- (c) cost per step ---------------------------------------------------------------------------------
def step_loop(problem: Problem, sampler: Sampler) -> Callable[[], Any]:
    """A compiled run of :data:`TIMED_STEPS` steps of one chain (compiled by a first call), to time."""
    d = problem.mode.shape[0]
    key = jax.random.PRNGKey(SEED)
    args = (jnp.asarray(problem.X), jnp.asarray(problem.y))
    if sampler.build is None:
        kernel = sg.SGLD(problem.whitened_model, step_size=problem.step_size, gradient=ours_gradient(sampler, d),
                         find_mode=False)  # fmt: skip
        kwargs = {"batch_size": BATCH}
        state = kernel.init(key, 0, {"w_u": jnp.zeros(d)}, args, kwargs)
        loop = jax.jit(lambda s, a: lax.fori_loop(0, TIMED_STEPS, lambda i, s: kernel.sample(s, a, kwargs), s))

        def run() -> Any:
            return jax.block_until_ready(loop(state, args))
    else:
        init, step, _ = sampler.build(problem)

        def body(i: int, carry: tuple) -> tuple:
            state, key = carry
            key, key_step = jax.random.split(key)
            return step(i, key_step, state), key

        external = jax.jit(lambda key: lax.fori_loop(0, TIMED_STEPS, body, (init(key), key)))

        def run() -> Any:
            return jax.block_until_ready(external(key))

    run()
    return run


def steps_per_second(problem: Problem, rounds: int = 10) -> list[float]:
    """Steps per second of one chain of each sampler, the best of ``rounds`` interleaved timings."""
    loops = [step_loop(problem, sampler) for sampler in SAMPLERS]
    best = [float("inf")] * len(loops)
    for _ in range(rounds):
        for k, loop in enumerate(loops):
            start = time.perf_counter()
            loop()
            best[k] = min(best[k], time.perf_counter() - start)
    return [TIMED_STEPS / seconds for seconds in best]


# --- the report ------------------------------------------------------------------------------------------
def run_problem(problem: Problem, budget: int) -> dict[str, Any]:
    print(f"\n## {problem.name}: N = {problem.X.shape[0]}, d = {problem.mode.shape[0]}, n = {BATCH}, "
          f"h = {problem.step_size}, budget {budget} minibatch gradients per chain, reference: {problem.ref_label}",
          flush=True)  # fmt: skip
    traces = noise_traces(problem)
    noise = {key: float(np.median(value)) for key, value in traces.items()}
    print("\n(a) gradient-noise variance (trace, whitened coordinates), median over "
          f"{NOISE_POINTS} posterior points, {NOISE_DRAWS} minibatches each:")
    for key, value in noise.items():
        print(f"  {key:18s} {value:12.4g}   reduction {noise['minibatch'] / value:8.1f}x")
    rates = steps_per_second(problem)
    rows = []
    for sampler, rate in zip(SAMPLERS, rates):
        steps = sampler.steps(budget, problem.epoch)
        u, seconds, noise_variance = run_chains(problem, sampler, steps)
        row = {"library": sampler.library, "estimator": sampler.name, "steps_per_chain": steps,
               "steps_per_second": rate, "run_seconds": seconds, "noise_variance_median": noise_variance,
               **sd_error(problem, u)}  # fmt: skip
        rows.append(row)
        print(f"  ran {sampler.library} {sampler.name}: {seconds:.1f} s", flush=True)
    plain = rates[0]
    print("\n(b)-(d) SGLD at the same step size and gradient budget:\n")
    print("| library | estimator | steps/chain | \\|sd/ref - 1\\| median | 90 % | max | > 5 % | MC error | "
          "sd ratio (median) | noise_variance (median) | steps/s (1 chain) | cost/step vs ours minibatch |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['library']} | {row['estimator']} | {row['steps_per_chain']} | {row['sd_error_median']:.1%} | "
              f"{row['sd_error_p90']:.1%} | {row['sd_error_max']:.1%} | {row['beyond_5pct']} | "
              f"{row['mcse_median']:.1%} | "
              f"{row['sd_ratio_median']:.3f} | "
              f"{row['noise_variance_median']:.4g} | {row['steps_per_second']:.0f} | "
              f"{plain / row['steps_per_second']:.2f} |")  # fmt: skip
    rows_with = np.count_nonzero(problem.X, axis=0)
    ratio = np.asarray(rows[1]["sd_ratio"])
    worst = np.argsort(-np.abs(ratio - 1))[:6]
    print("\nppl_sgmcmc control variates, the worst weights: " + ", ".join(
        f"w[{k}] sd ratio {ratio[k]:.2f} (feature non-zero in {rows_with[k]} rows)" for k in worst))
    return {"noise_trace_median": noise, "noise_traces": {k: v.tolist() for k, v in traces.items()}, "samplers": rows}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a budget of 10 000 gradients per chain")
    parser.add_argument("--budget", type=int, default=None, help="minibatch gradients per chain (default 100 000)")
    parser.add_argument("--problems", nargs="+", choices=["linreg", "a9a"], default=["linreg", "a9a"])
    args = parser.parse_args(argv)
    budget = args.budget or (10_000 if args.quick else 100_000)
    builders = {"linreg": linreg_problem, "a9a": a9a_problem}
    out: dict[str, Any] = {
        "date": datetime.datetime.now().isoformat(timespec="minutes"), "machine": machine(),
        "load_average_before": os.getloadavg(),
        "jax": jax.__version__, "numpyro": numpyro.__version__, "blackjax": blackjax.__version__,
        "sgmcmcjax": importlib.metadata.version("sgmcmcjax"),
        "step_sizes": STEP_SIZES, "batch_size": BATCH, "chains": CHAINS, "budget": budget, "thin": THIN,
        "problems": {},
    }  # fmt: skip
    start = time.perf_counter()
    for name in args.problems:
        out["problems"][name] = run_problem(builders[name](), budget)
    out["seconds"] = time.perf_counter() - start
    out["load_average_after"] = os.getloadavg()
    path = RESULTS / ("variance_reduction_quick.json" if args.quick else "variance_reduction.json")
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"\n{out['seconds']:.0f} s; wrote {path}")


if __name__ == "__main__":
    main()
