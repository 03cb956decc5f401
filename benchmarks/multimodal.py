#!/usr/bin/env python
"""Multimodal posteriors with known mode weights: does one chain cross between the modes, and does it weigh them
right? SGLD, CSGLD, cyclical SGLD and replica-exchange SGLD, each with its defaults (the step size tuned by the
warm-up), at equal gradient evaluations per chain.

Targets (every chain starts in one mode, so that only a chain that crosses can find the others):

* **mixture**: ``0.25 N(-a u, I) + 0.75 N(a u, I)`` in ``d = 4`` dimensions, ``u = 1/sqrt(d)`` (the unit diagonal),
  ``a = 5``: the modes are 10 standard deviations apart, a barrier of ``a²/2 = 12.5`` nats above the lighter
  mode. Gradients carry ``N(0, I)`` noise (``energy`` exact). Modes: the sign of ``x·u``; weights ``0.25 Φ(a) +
  0.75 Φ(-a)`` and its complement (0.25 and 0.75 to 1e-6); the mean ``0.5 a u`` (exact).
* **csgld**: the CSGLD paper's ``0.4 N(-6, 1) + 0.6 N(4, 1)`` (``benchmarks/csgld_mixture.py``'s energy, with its
  ``N(0, 0.01)`` gradient noise), from ``x = 4``. Modes: left and right of ``b = -1 - ln(1.5)/10``, where the
  two weighted components are equal; weights ``0.4 Φ(b + 6) + 0.6 Φ(b - 4)`` (0.400) and the rest, mean 0.
* **regression**: ``y_i = θ² x_i + ε_i``, ``ε_i ~ N(0, 1)``, ``θ ~ N(0, 1)``, ``N = 20`` points with ``x_i ~ N(0,
  1)`` and ``y`` drawn at ``θ = 1`` (seed 0), minibatches of ``n = 5``: the likelihood depends on ``θ²``, so the
  posterior is symmetric: two modes near ``±1`` of weight exactly 0.5 each, mean exactly 0. From ``θ = 1``.
* **network**: ``y_i = Σ_j v_j tanh(w_j x_i) + ε_i``, two hidden units, ``N(0, 1)`` priors on ``w, v`` and the noise,
  ``N = 200`` points drawn from ``w = (1.5, -1), v = (1, 1)`` (seed 1), minibatches of 20. Flipping unit ``j``,
  ``(w_j, v_j) → (-w_j, -v_j)``, leaves the posterior unchanged, so the four sign patterns of ``(w_1, w_2)`` (the
  modes here) have weight exactly 0.25 each, and every mean is exactly 0. From the teacher's weights.

Per target and kernel, ``--chains`` chains (one vectorised ``MCMC``) of ``--gradients`` gradient evaluations each,
a tenth of them warm-up: SGLD, CSGLD and cyclical SGLD take one gradient a step, ReSGLD (two replicas) two, so it
takes half the steps. Draws are every 10th step. Reported, from the kept draws (CSGLD's importance-weighted):

* **weight error**: ``max_k |ŵ_k - w_k|`` of one chain's estimate, averaged over the chains, and of all chains
  pooled (the estimate a multi-chain run gives: chains that never cross still average to the truth when they start
  spread out; here they all start in one mode, so the pooled error is what crossing buys);
* **mean error**: ``max_i |x̄_i - E x_i|`` of one chain, averaged over the chains, in units of the posterior's
  marginal standard deviation (the same for every coordinate of the mixture; the network's unit is the prior's
  standard deviation, 1);
* **crossings per chain**: changes of mode between draws well inside a mode (the mode's core: past half way from
  the boundary to the mode), the mean over chains and how many chains crossed at all.

Cyclical SGLD: ``cycle_length=50`` draws (500 steps), the default exploration fraction; its peak is the tuned step
size. ReSGLD is ``ppl_sgmcmc.numpyro.ReSGLD`` with its defaults (two replicas, the ladder adapted in the warm-up).
"ReSGLD, set" is its documented setting: ``energy_variance=0`` for the two mixtures, whose energy is exact (only the
gradient carries noise), and ``anchor_every="epoch"`` (variance-reduced energies) for the two models with
minibatches, charged 6 gradient evaluations a step (2 gradients, 2 minibatch energies at the anchors, and the
anchors' full-data energies: 2 passes over the data per epoch).

Usage (from the repository root; pin to one core for timings)::

    PYTHONPATH=. taskset -c 1 .venv/bin/python benchmarks/multimodal.py            # 2e5 gradients, ~4 min
    PYTHONPATH=. taskset -c 1 .venv/bin/python benchmarks/multimodal.py --quick    # 2e4, ~3 min (compilation)
    PYTHONPATH=. .venv/bin/python benchmarks/multimodal.py --targets regression --kernels SGLD ReSGLD

Prints a Markdown table for ``RESULTS.md`` ("Multimodal posteriors").
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import numpyro  # noqa: E402
import numpyro.distributions as dist  # noqa: E402
from scipy.stats import norm  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import csgld_mixture  # noqa: E402
from ppl_sgmcmc import numpyro as kernels  # noqa: E402
from ppl_sgmcmc.numpyro import CSGLD, MCMC, SGLD  # noqa: E402

THIN = 10  # steps per draw
CYCLE_LENGTH = 50  # cyclical SGLD's draws per cycle


class Target(NamedTuple):
    """A posterior with known modes: the model (or energy) and its arguments, the chains' start, the mode of each
    flat draw (``core_mode(x) -> int array``, -1 outside every mode's core), the true weights and mean, and the
    posterior's marginal standard deviation (the unit of the mean error; the network's: 1, the prior's)."""

    name: str
    model: Callable[..., Any] | None
    potential_fn: Callable[..., Any] | None
    args: tuple
    start: dict[str, np.ndarray]
    core_mode: Callable[[np.ndarray], np.ndarray]
    weights: np.ndarray
    mean: np.ndarray
    scale: float
    description: str


def noisy_gradient(energy: Callable[[Any], Any], sd: float) -> Callable[[Any, Any], Any]:
    """``energy`` with ``N(0, sd²)`` noise added to its gradient (the energy itself exact), as a ``potential_fn(z, key)``."""

    def potential(z: dict, rng_key: Any) -> Any:
        x = z["x"]
        return energy(x) + jnp.sum(sd * jax.random.normal(rng_key, x.shape) * (x - jax.lax.stop_gradient(x)))

    return potential


# --- the targets ----------------------------------------------------------------------------------------------
def mixture_target(d: int = 4, a: float = 5.0, heavy: float = 0.75) -> Target:
    u = np.ones(d) / math.sqrt(d)

    def energy(x: Any) -> Any:
        proj = jnp.dot(x, jnp.asarray(u))
        r2 = jnp.sum(x * x) - proj**2  # the part orthogonal to u: the same in both components
        return -jnp.logaddexp(math.log(1 - heavy) - (proj + a) ** 2 / 2, math.log(heavy) - (proj - a) ** 2 / 2) + r2 / 2

    def core_mode(x: np.ndarray) -> np.ndarray:
        proj = x @ u
        return np.where(proj > a / 2, 1, np.where(proj < -a / 2, 0, -1))

    right = (1 - heavy) * norm.sf(a) + heavy * norm.cdf(a)
    var_coordinate = 1 + (a**2 - ((2 * heavy - 1) * a) ** 2) / d  # each coordinate's: 1 + u_i² Var(x·u)
    return Target("mixture", None, noisy_gradient(energy, 1.0), (), {"x": -a * u}, core_mode,
                  np.array([1 - right, right]), (2 * heavy - 1) * a * u, math.sqrt(var_coordinate),
                  f"{1 - heavy:g} N(-a u, I) + {heavy:g} N(a u, I), d = {d}, a = {a:g}")  # fmt: skip


def csgld_target() -> Target:
    b = -1 - math.log(1.5) / 10

    def core_mode(x: np.ndarray) -> np.ndarray:
        x = x[..., 0]
        return np.where(x > (b + 4) / 2, 1, np.where(x < (b - 6) / 2, 0, -1))

    left = 0.4 * norm.cdf(b + 6) + 0.6 * norm.cdf(b - 4)
    return Target("csgld", None, csgld_mixture.energy, (), {"x": np.array([csgld_mixture.START])}, core_mode,
                  np.array([left, 1 - left]), np.zeros(1), math.sqrt(0.4 * 36 + 0.6 * 16 + 1),
                  "0.4 N(-6, 1) + 0.6 N(4, 1) (the CSGLD paper's), gradient noise N(0, 0.01)")  # fmt: skip


def regression_target() -> Target:
    rng = np.random.default_rng(0)
    x = rng.normal(size=20)
    y = x + rng.normal(size=20)

    def model(x: Any, y: Any) -> None:
        theta = numpyro.sample("theta", dist.Normal(0.0, 1.0))
        with numpyro.plate("data", x.shape[0], subsample_size=5):
            numpyro.sample("y", dist.Normal(theta**2 * numpyro.subsample(x, event_dim=0), 1.0),
                           obs=numpyro.subsample(y, event_dim=0))  # fmt: skip

    # the posterior's sd by quadrature (the mean is 0 by symmetry)
    grid = np.linspace(-3, 3, 60001)
    log_post = -(grid**2) / 2 - 0.5 * ((y[None] - grid[:, None] ** 2 * x[None]) ** 2).sum(1)
    p = np.exp(log_post - log_post.max())
    sd = math.sqrt(float((grid**2 * p).sum() / p.sum()))

    def core_mode(draws: np.ndarray) -> np.ndarray:
        t = draws[..., 0]
        return np.where(t > 0.5, 1, np.where(t < -0.5, 0, -1))

    return Target("regression", model, None, (jnp.asarray(x), jnp.asarray(y)), {"theta": np.array(1.0)}, core_mode,
                  np.array([0.5, 0.5]), np.zeros(1), sd,
                  "y = θ² x + ε, N = 20, n = 5, θ ~ N(0, 1): modes ±θ̂, weights 0.5 by symmetry")  # fmt: skip


def network_target() -> Target:
    rng = np.random.default_rng(1)
    x = rng.normal(size=200)
    w0, v0 = np.array([1.5, -1.0]), np.array([1.0, 1.0])
    y = np.tanh(np.outer(x, w0)) @ v0 + rng.normal(size=200)

    def model(x: Any, y: Any) -> None:
        w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        v = numpyro.sample("v", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        with numpyro.plate("data", x.shape[0], subsample_size=20):
            xb = numpyro.subsample(x, event_dim=0)
            numpyro.sample("y", dist.Normal(jnp.tanh(xb[:, None] * w) @ v, 1.0), obs=numpyro.subsample(y, event_dim=0))

    def core_mode(draws: np.ndarray) -> np.ndarray:
        w = draws[..., 2:]  # flat in sorted site order: v, then w
        inside = np.all(np.abs(w) > 0.3, axis=-1)
        return np.where(inside, (w[..., 0] > 0) * 2 + (w[..., 1] > 0), -1)

    return Target("network", model, None, (jnp.asarray(x), jnp.asarray(y)), {"v": v0, "w": w0}, core_mode,
                  np.full(4, 0.25), np.zeros(4), 1.0,
                  "y = Σ_j v_j tanh(w_j x) + ε, 2 units, N = 200, n = 20: 4 sign patterns of w, 0.25 each by "
                  "symmetry")  # fmt: skip


TARGETS = {"mixture": mixture_target, "csgld": csgld_target, "regression": regression_target,
           "network": network_target}  # fmt: skip


# --- the kernels ----------------------------------------------------------------------------------------------
def make_kernel(name: str, target: Target) -> tuple[Any, int]:
    """The kernel and its gradient evaluations per step."""
    fn = {"model": target.model} if target.model is not None else {"potential_fn": target.potential_fn}
    common = dict(steps_per_sample=THIN, **fn)
    if name == "SGLD":
        return SGLD(**common), 1
    if name == "CSGLD":
        return CSGLD(**common), 1
    if name == "cyclical SGLD":
        return SGLD(cycle_length=CYCLE_LENGTH, **common), 1
    if name == "ReSGLD":
        return kernels.ReSGLD(**common), 2
    if name == "ReSGLD, set":  # the documented setting: variance-reduced energies, or exact ones said to be exact
        if target.model is None:  # the energy is exact (only the gradient carries noise)
            return kernels.ReSGLD(energy_variance=0.0, **common), 2
        # per step: 2 gradients, 2 minibatch energies at the anchors, and the anchors' full-data energies (2 passes
        # over the data per epoch of N/n steps: 2 minibatch evaluations a step), each counted as a gradient
        return kernels.ReSGLD(anchor_every="epoch", **common), 6
    raise ValueError(name)


KERNELS = ("SGLD", "CSGLD", "cyclical SGLD", "ReSGLD", "ReSGLD, set")


def flat_draws(samples: dict[str, Any]) -> np.ndarray:
    """``(chains, draws, d)``, the sites in sorted order."""
    parts = [np.asarray(samples[k], np.float64) for k in sorted(samples)]
    return np.concatenate([p.reshape(*p.shape[:2], -1) for p in parts], axis=-1)


def modes(draws: np.ndarray, target: Target) -> np.ndarray:
    """Each draw's mode by the nearest core: the core's label, carried forward through draws between cores (the first
    draws before any core: the start's mode)."""
    core = target.core_mode(draws)
    start = int(target.core_mode(flat_draws({k: np.asarray(v)[None, None] for k, v in target.start.items()}))[0, 0])
    out = np.empty_like(core)
    for c in range(core.shape[0]):
        last = start
        for t, label in enumerate(core[c]):
            last = label if label >= 0 else last
            out[c, t] = last
    return out


def crossings(labels: np.ndarray) -> np.ndarray:
    """Per chain, the number of changes of mode."""
    return np.sum(labels[:, 1:] != labels[:, :-1], axis=1)


def evaluate(target: Target, draws: np.ndarray, log_weight: np.ndarray | None) -> dict[str, float]:
    chains = draws.shape[0]
    w = np.ones(draws.shape[:2]) if log_weight is None else np.exp(log_weight - log_weight.max(axis=1, keepdims=True))
    w = w / w.sum(axis=1, keepdims=True)
    labels = modes(draws, target)
    k = len(target.weights)
    per_chain = np.stack([[np.sum(w[c] * (labels[c] == j)) for j in range(k)] for c in range(chains)])
    pooled = per_chain.mean(axis=0)
    means = np.einsum("cn,cnd->cd", w, draws)
    cross = crossings(labels)
    return {
        "weight_error": float(np.mean(np.max(np.abs(per_chain - target.weights), axis=1))),
        "pooled_weight_error": float(np.max(np.abs(pooled - target.weights))),
        "mean_error": float(np.mean(np.max(np.abs(means - target.mean), axis=1)) / target.scale),
        "crossings": float(cross.mean()),
        "crossed": int(np.sum(cross > 0)),
    }


def run(target: Target, name: str, gradients: int, chains: int, key: int) -> dict[str, Any]:
    kernel, per_step = make_kernel(name, target)
    steps = gradients // per_step
    draws_total = steps // THIN
    warmup = draws_total // 10
    mcmc = MCMC(kernel, num_warmup=warmup, num_samples=draws_total - warmup, num_chains=chains,
                chain_method="vectorized", progress_bar=False, verdict=False)  # fmt: skip
    init = {k: np.broadcast_to(np.asarray(v, np.float32), (chains, *np.shape(v))).copy() for k, v in target.start.items()}
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the health checks' and the defaults' notes: the table says what happened
        mcmc.run(jax.random.PRNGKey(key), *target.args, init_params=init)
    samples = mcmc.get_samples(group_by_chain=True)
    seconds = time.perf_counter() - start
    fields = mcmc.get_extra_fields(group_by_chain=True)
    log_weight = np.asarray(fields["log_weight"], np.float64) if "log_weight" in fields else None
    draws = flat_draws(samples)
    result = evaluate(target, draws, log_weight)
    result.update(seconds=seconds, gradients=steps * per_step, kept=draws.shape[1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2e4 gradient evaluations per chain, 4 chains")
    parser.add_argument("--gradients", type=int, default=200_000, help="per chain, warm-up included (default 2e5)")
    parser.add_argument("--chains", type=int, default=8)
    parser.add_argument("--targets", nargs="+", default=list(TARGETS), choices=list(TARGETS))
    parser.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=list(KERNELS))
    parser.add_argument("--key", type=int, default=0)
    args = parser.parse_args()
    if args.quick:
        args.gradients, args.chains = 20_000, 4
    wall = time.perf_counter()
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores; jax {jax.__version__}, numpyro {numpyro.__version__}; {args.chains} chains x "
          f"{args.gradients:,} gradient evaluations (a tenth warm-up), every {THIN}th step kept")  # fmt: skip
    rows = []
    for target_name in args.targets:
        target = TARGETS[target_name]()
        print(f"\n{target.name}: {target.description}; weights {np.round(target.weights, 4).tolist()}", flush=True)
        for name in args.kernels:
            result = run(target, name, args.gradients, args.chains, args.key)
            rows.append((target.name, name, result))
            print(f"  {name:<14} weight error {result['weight_error']:.3f} (pooled {result['pooled_weight_error']:.3f}), "
                  f"mean error {result['mean_error']:.2f} sd, crossings/chain {result['crossings']:.1f} "
                  f"({result['crossed']}/{args.chains} chains crossed), {result['kept']} kept draws, "
                  f"{result['seconds']:.0f} s", flush=True)  # fmt: skip
    print()
    print("| target | kernel | weight error, one chain | weight error, chains pooled | mean error (sd), one chain "
          "| crossings per chain | chains that crossed | gradients per chain | time (s) |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for target_name, name, r in rows:
        print(f"| {target_name} | {name} | {r['weight_error']:.3f} | {r['pooled_weight_error']:.3f} | "
              f"{r['mean_error']:.2f} | {r['crossings']:.1f} | {r['crossed']}/{args.chains} | {r['gradients']:,} | "
              f"{r['seconds']:.0f} |")  # fmt: skip
    print(f"\ntotal wall time {time.perf_counter() - wall:.0f} s")


if __name__ == "__main__":
    main()
