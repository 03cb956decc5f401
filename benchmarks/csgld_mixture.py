#!/usr/bin/env python
"""CSGLD on the paper's two-mode mixture: Fig. 1(c) of Deng, Lin & Liang, "A Contour Stochastic Gradient
Langevin Dynamics Algorithm for Simulations of Multi-modal Distributions" (NeurIPS 2020).

Target ``π = 0.4 N(-6, 1) + 0.6 N(4, 1)`` (mean 0), the paper's settings (the CSGLD algorithm page):
τ = 1, step size h = 0.1, m = 50 energy bins of width Δu = 1, ζ = 0.75, ``ω_k = 1/(k^0.6 + 100)``,
gradient noise N(0, 0.01) added to the exact gradient (the energy itself is exact). The grid starts at
``u_min = 1.0`` (the energy's minimum is 1.43 with the normalised density; a grid starting below every
visited energy leaves bin 0 empty, see the CSGLD algorithm page), and it is fixed, so that KSGLD's θ is
defined on it.

The error of the posterior-mean estimate after k iterations, ``|x̄_k - 0|``, averaged over seeds
(independent chains, run as one vectorised ``MCMC``), for

* **SGLD** (the plain running mean);
* **CSGLD** (``ppl_sgmcmc.numpyro.CSGLD``, θ learned from uniform, ``adapt_theta="always"``: the paper's
  algorithm), importance-weighted running mean with the default interpolated weights
  ``ζ log Ψ_θ(Ũ(x))``;
* **KSGLD**: CSGLD with θ fixed to the true partition masses ``θ*(i) = ∫_{bin i} π(x) dx``
  (quadrature), ``initial_theta=θ*, adapt_theta="never"``, weighted the same way.

Every chain starts at x = 4 (the mode of weight 0.6; the paper does not give its start). Draws are
thinned by 10 (``steps_per_sample=10``); the running estimate at iteration k uses the draws up to k.
The paper runs 1e7 iterations; the default here is 1e6 per chain (10 chains).

Usage (from the repository root)::

    PYTHONPATH=. .venv/bin/python benchmarks/csgld_mixture.py           # 10 seeds x 1e6 iterations, ~2 min
    PYTHONPATH=. .venv/bin/python benchmarks/csgld_mixture.py --quick   # smoke run, ~20 s
    PYTHONPATH=. .venv/bin/python benchmarks/csgld_mixture.py --iterations 3000000 --seeds 20

Writes ``benchmarks/results/csgld_mixture.png`` and prints a Markdown table for ``RESULTS.md``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import numpyro  # noqa: E402
from numpyro.infer import MCMC  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from ppl_sgmcmc.numpyro import CSGLD, SGLD  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
STEP_SIZE, NUM_PARTITIONS, ENERGY_GAP, ENERGY_MIN, ZETA = 0.1, 50, 1.0, 1.0, 0.75
GRADIENT_NOISE_SD = 0.1  # N(0, 0.01)
THIN = 10
START = 4.0
TRUE_MEAN = 0.0


def log_density(x):
    return jnp.logaddexp(
        jnp.log(0.4) + jax.scipy.stats.norm.logpdf(x, -6.0, 1.0), jnp.log(0.6) + jax.scipy.stats.norm.logpdf(x, 4.0, 1.0)
    )


def energy(z, rng_key):
    """``U(x) = -log π(x)``, exact, whose gradient carries N(0, 0.01) noise (``x - stop_gradient(x)`` is 0)."""
    x = z["x"]
    noise = GRADIENT_NOISE_SD * jax.random.normal(rng_key, x.shape)
    return jnp.sum(-log_density(x) + noise * (x - jax.lax.stop_gradient(x)))


def true_partition_masses():
    """``θ*(i) = ∫_{bin i} π``: the bin of U(x) on a fine grid (bins in energy, so a bin is two or four
    intervals of x), summed by the midpoint rule; float64."""
    edges = np.linspace(-30.0, 30.0, 2_000_001)
    x = 0.5 * (edges[1:] + edges[:-1])
    dx = edges[1] - edges[0]
    log_pi = np.logaddexp(np.log(0.4) - 0.5 * (x + 6) ** 2, np.log(0.6) - 0.5 * (x - 4) ** 2) - 0.5 * np.log(2 * np.pi)
    u = -log_pi
    j = np.clip(np.ceil((u - ENERGY_MIN) / ENERGY_GAP) - 1, 0, NUM_PARTITIONS - 1).astype(int)
    masses = np.bincount(j, weights=np.exp(log_pi) * dx, minlength=NUM_PARTITIONS)
    return masses, float(u.min())


def kernels(theta_true):
    contour = dict(step_size=STEP_SIZE, num_partitions=NUM_PARTITIONS, energy_gap=ENERGY_GAP, energy_min=ENERGY_MIN,
                   zeta=ZETA, steps_per_sample=THIN)  # fmt: skip
    yield "SGLD", SGLD(potential_fn=energy, step_size=STEP_SIZE, steps_per_sample=THIN)
    yield "CSGLD", CSGLD(potential_fn=energy, **contour)
    yield "KSGLD (θ = truth)", CSGLD(potential_fn=energy, initial_theta=theta_true, adapt_theta="never", **contour)


def run(kernel, seeds, iterations, key):
    mcmc = MCMC(kernel, num_warmup=0, num_samples=iterations // THIN, num_chains=seeds, chain_method="vectorized",
                progress_bar=False)  # fmt: skip
    start = time.perf_counter()
    mcmc.run(jax.random.PRNGKey(key), init_params={"x": jnp.full(seeds, START)})
    x = np.asarray(mcmc.get_samples(group_by_chain=True)["x"], np.float64)
    fields = mcmc.get_extra_fields(group_by_chain=True)
    seconds = time.perf_counter() - start
    lw = np.asarray(fields["log_weight"], np.float64) if "log_weight" in fields else np.zeros_like(x)
    diverging = int(np.sum(np.asarray(fields["diverging"])))
    theta = np.asarray(mcmc.last_state.theta) if hasattr(mcmc.last_state, "theta") else None
    return x, lw, seconds, diverging, theta


def running_weighted_mean(x, lw):
    """Per chain, the self-normalised weighted mean of the draws up to each draw."""
    w = np.exp(lw - lw.max(axis=1, keepdims=True))
    return np.cumsum(w * x, axis=1) / np.cumsum(w, axis=1)


def plot(curves, iters, path, seeds):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for name, err in curves.items():
        mean, sd = err.mean(0), err.std(0, ddof=1)
        (line,) = ax.loglog(iters, mean, label=name)
        ax.fill_between(iters, np.maximum(mean - sd / np.sqrt(seeds), 1e-4), mean + sd / np.sqrt(seeds),
                        color=line.get_color(), alpha=0.2, lw=0)  # fmt: skip
    ax.set_xlabel("iterations")
    ax.set_ylabel("mean absolute error of the posterior-mean estimate")
    ax.set_title(f"0.4 N(-6,1) + 0.6 N(4,1): {seeds} seeds (band: ± s.e.)", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 4 seeds x 2e4 iterations")
    parser.add_argument("--iterations", type=int, default=1_000_000, help="per chain (default 1e6)")
    parser.add_argument("--seeds", type=int, default=10, help="independent chains (default 10, the paper's)")
    parser.add_argument("--key", type=int, default=0)
    parser.add_argument("--plot", default=os.path.join(HERE, "results", "csgld_mixture.png"))
    args = parser.parse_args()
    if args.quick:
        args.iterations, args.seeds = 20_000, 4
        args.plot = os.path.join(HERE, "results", "csgld_mixture_quick.png")

    wall = time.perf_counter()
    theta_true, u_min = true_partition_masses()
    print(f"jax {jax.__version__}, numpyro {numpyro.__version__}; {args.seeds} chains x {args.iterations:,} iterations, "
          f"thinned by {THIN}; minimum energy {u_min:.3f}, grid u_min={ENERGY_MIN}, Δu={ENERGY_GAP}, m={NUM_PARTITIONS}; "
          f"θ*(0..3) = {np.round(theta_true[:4], 4).tolist()}")  # fmt: skip
    iters = THIN * np.arange(1, args.iterations // THIN + 1)
    curves, summary = {}, []
    for name, kernel in kernels(theta_true):
        x, lw, seconds, diverging, theta = run(kernel, args.seeds, args.iterations, args.key)
        estimate = running_weighted_mean(x, lw)
        err = np.abs(estimate - TRUE_MEAN)
        curves[name] = err
        w = np.exp(lw - lw.max(axis=1, keepdims=True))
        left = float(np.mean(np.sum(w * (x < -1), 1) / np.sum(w, 1)))
        ess = float(np.mean(np.sum(w, 1) ** 2 / np.sum(w * w, 1) / x.shape[1]))
        switches = np.mean([np.sum(np.diff(np.sign(row[np.abs(row + 1) > 2] + 1)) != 0) for row in x])
        theta_err = None if theta is None or name == "SGLD" else float(np.max(np.abs(theta - theta_true)))
        summary.append((name, seconds, diverging, left, ess, switches, theta_err))
        print(f"  {name:<18} {seconds:6.1f} s, "
              f"final MAE {err[:, -1].mean():.3f} ± {err[:, -1].std(ddof=1) / np.sqrt(args.seeds):.3f}, "
              f"weighted P(x<-1) {left:.3f} (truth 0.400), weight ESS {ess:.2f} of draws, "
              f"mode switches/chain {switches:.0f}, divergent {diverging}"
              + ("" if theta_err is None else f", max|θ-θ*| {theta_err:.4f}"), flush=True)  # fmt: skip
    plot(curves, iters, args.plot, args.seeds)

    marks = [m for m in (1e3, 1e4, 1e5, 1e6, 1e7) if m <= args.iterations]
    print()
    print("| method | " + " | ".join(f"MAE @ {m:.0e}" for m in marks) + " | weighted P(x < -1) (truth 0.400) | "
          "weight ESS / draws | mode switches per chain | run time (s) |")  # fmt: skip
    print("|---|" + "---:|" * (len(marks) + 4))
    for name, seconds, _diverging, left, ess, switches, _ in summary:
        err = curves[name]
        cells = []
        for m in marks:
            i = int(m) // THIN - 1
            cells.append(f"{err[:, i].mean():.3f} ± {err[:, i].std(ddof=1) / np.sqrt(args.seeds):.3f}")
        print(f"| {name} | " + " | ".join(cells) + f" | {left:.3f} | {ess:.2f} | {switches:.0f} | {seconds:.0f} |")
    print(f"\nplot: {os.path.relpath(args.plot)}; total wall time {time.perf_counter() - wall:.0f} s")


if __name__ == "__main__":
    main()
