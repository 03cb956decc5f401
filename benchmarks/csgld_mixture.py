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
    PYTHONPATH=. .venv/bin/python benchmarks/csgld_mixture.py --check   # the checks below, ~1-2 min

Writes ``benchmarks/results/csgld_mixture.png`` and prints a Markdown table for ``RESULTS.md``.

**Checks** (``--check``; formerly ``tests/numpyro/test_csgld.py``'s ``test_csgld_recovers_both_modes_where_sgld_stays``,
``test_importance_resampling_gives_the_target`` and ``test_csghmc_recovers_both_modes``, with their thresholds):
what the paper's mixture measures is that flattening crosses a barrier that SGLD does not, a quality of the
algorithm; the suite tests the parts it rests on on Gaussians with exact answers (``θ`` against the
stochastic-approximation fixed point, the interpolated weights restoring the target, the rule's step against a
reference). Here the kernels run with their defaults where the tests ran them: the energy grid's ``u_min`` from
the first 1000 steps (``calibration_steps``), ``Δu = 1``, ``θ`` learned from uniform and always adapting, 16
vectorised chains from x = 4 (each learns its own ``θ`` and normalises its own weights, so a chain's
self-normalised estimate is one independent replicate: the estimate is the mean over the chains, its MCSE their
sd over 4). Tolerance ``K_SIGMA = 4.5`` MCSEs (``tests/helpers.py``). One PASS/FAIL line per check; exit status
1 if any fails.

* CSGLD, 2.5e4 warm-up steps of learning ``θ`` after the calibration, then 1e5 sampled (10 steps a draw): the
  weighted ``P(x < -1)``, mean and ``E x²`` within ``K_SIGMA`` MCSEs of ``Φ``'s exact values (MCSE ~0.015 on the
  mass: an error of ~0.07 is detected; adapting ``θ`` biases it by ~0.02, 1.3-1.8 MCSE at any length), the weights'
  Kish ESS above 20% of the draws (measured 45%), at least 20 mode switches per chain (with hysteresis: left
  below -3, right above 1; measured 86-121), the unweighted draws about half in each mode (within 0.05), no
  divergent step;
* SGLD with the same 1.26e5 steps: at least 12 of the 16 chains never leave the right mode (measured: 13), and
  its left-mode fraction misses the truth by more than CSGLD's tolerance;
* CSGLD's draws resampled by their weights (per chain, systematic): mean, variance and ``P(x < -1)`` within
  ``K_SIGMA`` MCSEs, ``ess_bulk`` finite and ``r_hat`` < 1.05;
* CSGHMC (h = 0.3, friction 1), 1.5e4 warm-up steps and 6e4 sampled: the CSGLD checks of the weighted estimates
  and the ESS, and at least 10 mode switches per chain.

Why these sizes (measured as tests, under the suite's ``-O0`` compilation): the power, the MCSE of the left-mode
mass (~0.015, 0.011-0.017 over seeds), sets the length; the weight ESS is a fraction of the draws at any length.
Adapting ``θ`` while sampling (the default) biases the weighted estimates by O(ω_k): +0.020 ± 0.008 after 1.5e5
steps, +0.011 ± 0.003 after 6e5 (with ``θ`` frozen after the warm-up: 0.407 ± 0.017, 0.397 ± 0.014); it falls as
~L^-0.43 against the MCSE's L^-1/2, so it stays 1.3-1.8 MCSE at any length L. A chain's spread is set by its mode
switches (one per ~1500 steps), not its draws, so 10 steps a draw loses nothing. 64 chains of a quarter of the
length would cost ~0.6 as much, but the bias of adapting ``θ`` would then be ~2.4 MCSE (a failure on ~2% of
seeds). ``u_min`` is calibrated on the first 1000 steps (the chains start where the energy is least) and ``ω_k``
counts from there. SGLD keeps the 16 chains: 3 of them leave the right mode (one switch each), so "most chains stay"
needs them (with 4 chains, two or more would leave on ~17% of seeds).
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
from scipy.stats import norm  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from ppl_sgmcmc.importance import resample, weight_ess, weighted_expectation  # noqa: E402
from ppl_sgmcmc.numpyro import CSGHMC, CSGLD, SGLD  # noqa: E402

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


# --- the checks (``--check``) ----------------------------------------------------------------------------------
K_SIGMA = 4.5  # tests/helpers.py
CHECK_CHAINS = 16
CALIBRATION = 1000  # steps that place u_min (the chains start at the right mode's minimum energy)
P_LEFT = 0.4 * norm.cdf(5) + 0.6 * norm.cdf(-5)  # exact P(x < -1)
SECOND_MOMENT = 0.4 * 37 + 0.6 * 17  # E x² = 25 (the mean is 0)


def check_run(kernel, num_warmup, num_samples):
    """The kernel's 16 vectorised chains from x = 4, ``num_warmup`` and ``num_samples`` draws of 10 steps."""
    mcmc = MCMC(kernel, num_warmup=num_warmup, num_samples=num_samples, num_chains=CHECK_CHAINS,
                chain_method="vectorized", progress_bar=False)  # fmt: skip
    mcmc.run(jax.random.PRNGKey(0), init_params={"x": jnp.full(CHECK_CHAINS, START)})
    return mcmc


def mode_switches(x):
    """Moves between the modes per chain, with hysteresis: left below -3, right above 1."""
    label = np.where(x < -3, -1, np.where(x > 1, 1, 0))
    return np.array([np.sum(row[row != 0][1:] != row[row != 0][:-1]) for row in label])


def per_chain(idata, fn):
    """Each chain's self-normalised estimate of ``E fn(x)``: their mean and its MCSE (sd / sqrt(chains))."""
    values = np.array([float(weighted_expectation(idata.isel(chain=[c]), fn)) for c in range(CHECK_CHAINS)])
    return values.mean(), values.std(ddof=1) / np.sqrt(len(values))


class Checks:
    """PASS/FAIL lines, one per check."""

    def __init__(self):
        self.failed = []

    def __call__(self, name, passed, detail):
        print(f"{'PASS' if passed else 'FAIL'} {name}: {detail}", flush=True)
        if not passed:
            self.failed.append(name)

    def close(self, name, estimate, target, mcse):
        self(name, abs(estimate - target) <= K_SIGMA * mcse,
             f"{estimate:.4f} vs exact {target:.4f} (bar: within {K_SIGMA} MCSE = {K_SIGMA * mcse:.4f})")  # fmt: skip


def check_weighted(checks, mcmc, name):
    """The weighted estimates and the weights' ESS; the no-divergence check; returns the InferenceData."""
    import arviz as az

    idata = az.from_numpyro(mcmc)
    diverging = int(np.sum(np.asarray(mcmc.get_extra_fields()["diverging"])))
    checks(f"{name} divergent steps", diverging == 0, f"{diverging} (bar: 0)")
    for label, fn, target in [("P(x < -1)", lambda post: post["x"] < -1, P_LEFT), ("mean", lambda post: post["x"], 0.0),
                              ("E x²", lambda post: post["x"] ** 2, SECOND_MOMENT)]:  # fmt: skip
        estimate, mcse = per_chain(idata, fn)
        checks.close(f"{name} weighted {label}", estimate, target, mcse)
    draws = idata.posterior.sizes["draw"] * CHECK_CHAINS
    ess = weight_ess(idata)
    checks(f"{name} weight ESS (Kish)", ess > 0.2 * draws, f"{ess:.0f} of {draws} draws (bar: > 20%)")
    return idata


def check():
    """The checks of the module's docstring; exit status 1 if any fails."""
    import arviz as az

    checks = Checks()
    contour = dict(step_size=STEP_SIZE, num_partitions=NUM_PARTITIONS, energy_gap=ENERGY_GAP, zeta=ZETA,
                   calibration_steps=CALIBRATION, steps_per_sample=THIN)  # fmt: skip
    warmup = CALIBRATION // THIN + 2500
    csgld = check_run(CSGLD(potential_fn=energy, **contour), warmup, 10000)
    idata = check_weighted(checks, csgld, "CSGLD")
    x = np.asarray(csgld.get_samples(group_by_chain=True)["x"])
    switches = mode_switches(x)
    checks("CSGLD mode switches per chain", switches.min() >= 20, f"min {switches.min()} (bar: >= 20): {switches}")
    flattened = float((x < -1).mean())
    checks("CSGLD unweighted left-mode fraction", abs(flattened - 0.5) < 0.05, f"{flattened:.3f} (bar: 0.5 ± 0.05)")

    sgld = check_run(SGLD(potential_fn=energy, step_size=STEP_SIZE, steps_per_sample=THIN), warmup, 10000)
    x_sgld = np.asarray(sgld.get_samples(group_by_chain=True)["x"])
    stayed = int(np.sum(mode_switches(x_sgld) == 0))
    checks("SGLD chains that stay in the right mode", stayed >= CHECK_CHAINS * 3 // 4,
           f"{stayed} of {CHECK_CHAINS} (bar: >= {CHECK_CHAINS * 3 // 4})")  # fmt: skip
    miss, se_csgld = abs(float((x_sgld < -1).mean()) - P_LEFT), per_chain(idata, lambda post: post["x"] < -1)[1]
    checks("SGLD misses P(x < -1)", miss > K_SIGMA * se_csgld,
           f"by {miss:.3f} (bar: > CSGLD's tolerance {K_SIGMA * se_csgld:.3f})")  # fmt: skip

    out = resample(idata, seed=0)
    draws = out.posterior["x"].values  # each chain resampled from its own draws: independent replicates
    checks("resampled draws", draws.shape == (CHECK_CHAINS, 10000) and "log_weight" not in out.sample_stats,
           f"shape {draws.shape}, log_weight dropped: {'log_weight' not in out.sample_stats}")  # fmt: skip
    for name, stat, target in [("mean", draws.mean(1), 0.0), ("variance", draws.var(1), SECOND_MOMENT),
                               ("P(x < -1)", (draws < -1).mean(1), P_LEFT)]:  # fmt: skip
        checks.close(f"resampled {name}", stat.mean(), target, stat.std(ddof=1) / np.sqrt(CHECK_CHAINS))
    summary = az.summary(out, var_names=["x"])
    ess_bulk, r_hat = summary.loc["x", "ess_bulk"], summary.loc["x", "r_hat"]
    checks("resampled ArviZ diagnostics", np.isfinite(ess_bulk) and r_hat < 1.05,
           f"ess_bulk {ess_bulk:.0f}, r_hat {r_hat:.3f} (bar: finite, < 1.05)")  # fmt: skip

    kernel = CSGHMC(potential_fn=energy, **dict(contour, step_size=0.3), friction=1.0)
    csghmc = check_run(kernel, CALIBRATION // THIN + 1500, 6000)  # θ learns for 1.5e4 warm-up steps, then 6e4 more
    check_weighted(checks, csghmc, "CSGHMC")
    switches = mode_switches(np.asarray(csghmc.get_samples(group_by_chain=True)["x"]))
    checks("CSGHMC mode switches per chain", switches.min() >= 10, f"min {switches.min()} (bar: >= 10)")
    print(f"{len(checks.failed)} of the checks failed" if checks.failed else "every check passed")
    return 1 if checks.failed else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 4 seeds x 2e4 iterations")
    parser.add_argument("--iterations", type=int, default=1_000_000, help="per chain (default 1e6)")
    parser.add_argument("--seeds", type=int, default=10, help="independent chains (default 10, the paper's)")
    parser.add_argument("--key", type=int, default=0)
    parser.add_argument("--plot", default=os.path.join(HERE, "results", "csgld_mixture.png"))
    parser.add_argument("--check", action="store_true", help="the PASS/FAIL checks (see the docstring), nothing else")
    args = parser.parse_args()
    if args.check:
        sys.exit(check())
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
