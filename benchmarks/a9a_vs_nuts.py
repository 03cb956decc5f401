"""a9a: the main job's adaptive defaults against full-data NUTS.

The main job (``python -m models.logistic_regression``, :func:`models.logistic_regression.model`) runs
``SGNHT(model, dense_mass=True, adapt_mass_matrix=True)`` with no step size: 4 chains vectorised, 20 000
warm-up and 600 000 kept steps per chain, thinned by 300 inside the kernel (``steps_per_sample=300``),
minibatches of 100 rows, seed 0. This script runs exactly that (without the progress bar) and compares it with
NumPyro's NUTS on the full data (dense mass matrix; 4 chains of 1000 warm-up and 1000 kept draws), on:

* **convergence**: every weight's ``r_hat <= 1.01`` and ``ess_bulk >= 400`` (ArviZ, 4 chains);
* **predictions**: the posterior predictive probability ``p_i = E[sigmoid(x_iᵀ w)]`` of all 16 281 test rows:
  ``|mean - NUTS mean| / NUTS sd`` (median, 95th percentile, fraction above 0.1) and the sd ratio to NUTS
  (median, 5-95 %, fraction outside [0.9, 1.1]). Both carry Monte Carlo error: a mean from draws of effective
  size ``e`` is off by about ``sd/sqrt(e)``, so row ``i`` differs from NUTS by about
  ``m_i = sqrt(sd_i²/e_i + sd*_i²/e*_i) / sd*_i`` (ArviZ's ``ess(method="mean")`` per row, both samplers) even
  when both are exact; the script prints what that error alone predicts next to what is measured, and the
  standardised differences ``z_i = (mean_i - mean*_i) / (m_i sd*_i)`` (sd 1 and 0.3 % beyond 3 if it is all
  Monte Carlo error). The sd ratio's error is estimated the same way from ``ess(method="sd")``;
* **PSIS-LOO** on the full training data: ``p_loo`` within 10 % of NUTS's (and ``elpd_loo``), from the pointwise
  log-likelihood of every draw on all 32 561 rows, in chunks of rows (ArviZ's ``psislw`` and its ``r_eff``);
* **the kernel Stein discrepancy** ``ppl_sgmcmc.diagnostics.ksd(mcmc, num_draws=300)`` (in the run's adapted
  coordinates), next to that of 300 NUTS draws in the same coordinates;
* **wall clock** of the SG-MCMC run (compilation, mode finding and warm-up included) against NUTS's.

``--warmup-cost`` measures instead what the warm-up costs: the main job's run once with a single kept draw
(``THIN`` steps after the warm-up) and once in full, in one process, with JAX's tracing, lowering and compilation
time taken out of each (``jax.monitoring``'s compile events). The full run's time less the short run's is the
sampling of ``SAMPLE_STEPS - THIN`` steps; the short run's time less its compilation and ``THIN`` such steps
is the warm-up (mode finding, the Laplace preconditioner's Hessian, the adaptation windows and their 20 000
steps), reported as a fraction of the whole run and against what 20 000 plain sampling steps cost.

The NUTS reference is cached as summaries (:data:`NUTS_CACHE`: per-weight mean, sd and covariance, each test
row's predictive mean, sd and effective sample sizes, the same for each half of the chains, 300 thinned draws
for the KSD, ``p_loo`` and ``elpd_loo``, the run's settings and wall clock); ``benchmarks/hands_off.py`` reuses
it. It is computed from the NUTS draws (``--nuts-draws PATH.npz`` with an array ``w`` of shape
``(chains, draws, 123)``) or by running NUTS (``--refresh-nuts``, about 16 minutes on 2 cores).

Usage (from the repository root)::

    .venv/bin/python -m benchmarks.a9a_vs_nuts                   # the main job against the cached NUTS, ~2 min
    .venv/bin/python -m benchmarks.a9a_vs_nuts --quick           # 4k warm-up + 40k steps, KSD on 100 draws, ~40 s
    .venv/bin/python -m benchmarks.a9a_vs_nuts --refresh-nuts    # rerun NUTS first (~16 min) and re-cache it
    .venv/bin/python -m benchmarks.a9a_vs_nuts --nuts-draws draws.npz --nuts-seconds 942   # cache saved draws
    .venv/bin/python -m benchmarks.a9a_vs_nuts --warmup-cost     # the warm-up's share of the run, ~3 min
    .venv/bin/python -m benchmarks.a9a_vs_nuts --gradient minibatch   # the main job with the plain minibatch gradient
    .venv/bin/python -m benchmarks.a9a_vs_nuts --gradient svrg --target-noise-ratio 0.25   # a smaller tuned step

Prints the tables for ``RESULTS.md`` and writes ``benchmarks/results/a9a_vs_nuts.json``
(``a9a_vs_nuts_quick.json`` with ``--quick``, ``a9a_vs_nuts_warmup_cost.json`` with ``--warmup-cost``,
``a9a_vs_nuts_minibatch.json`` with ``--gradient minibatch``, ``..._ratio0.25.json`` with ``--target-noise-ratio
0.25``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import time
from collections.abc import Iterator
from pathlib import Path
from statistics import NormalDist
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import arviz as az  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import numpyro  # noqa: E402
from numpyro.infer import MCMC, NUTS  # noqa: E402
from scipy.special import logsumexp  # noqa: E402

from models.datasets import load_a9a  # noqa: E402
from models.logistic_regression import model  # noqa: E402
from ppl_sgmcmc.diagnostics import ksd  # noqa: E402
from ppl_sgmcmc.numpyro import SGNHT  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
NUTS_CACHE = RESULTS / "a9a_nuts_reference.npz"
#: The main job's settings (``models/logistic_regression.py``'s defaults).
WARMUP_STEPS, SAMPLE_STEPS, THIN, CHAINS, BATCH, SEED = 20_000, 600_000, 300, 4, 100, 0
KSD_DRAWS = 300
#: Rows of data (or of the test set) whose log-likelihoods or probabilities are held at once, for all draws.
CHUNK = 2048


# --- draws to summaries ----------------------------------------------------------------------------------
def _row_chunks(X: np.ndarray, chunk: int = CHUNK) -> Iterator[slice]:
    for start in range(0, X.shape[0], chunk):
        yield slice(start, min(start + chunk, X.shape[0]))


def predictive_moments(w: np.ndarray, X_test: np.ndarray, with_ess: bool = False) -> dict[str, np.ndarray]:
    """Per test row, the mean and sd (and, ``with_ess``, ArviZ's ``ess`` of the mean and of the sd) over the draws
    ``w`` ``(chains, draws, d)`` of the predictive probability ``sigmoid(x_iᵀ w)``."""
    chains, draws, d = w.shape
    flat = jnp.asarray(w.reshape(chains * draws, d), jnp.float32)
    parts: dict[str, list[np.ndarray]] = {"mean": [], "sd": [], "ess_mean": [], "ess_sd": []}
    for rows in _row_chunks(X_test):
        p = np.asarray(jax.nn.sigmoid(flat @ jnp.asarray(X_test[rows]).T), np.float64)
        parts["mean"].append(p.mean(0))
        parts["sd"].append(p.std(0, ddof=1))
        if with_ess:
            dataset = az.convert_to_dataset({"p": p.reshape(chains, draws, -1)})
            parts["ess_mean"].append(az.ess(dataset, method="mean").p.values)
            parts["ess_sd"].append(az.ess(dataset, method="sd").p.values)
    return {key: np.concatenate(value) for key, value in parts.items() if value}


def psis_loo(w: np.ndarray, X: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """PSIS-LOO of the draws ``w`` ``(chains, draws, d)`` on all rows of ``(X, y)``, as ``arviz.loo`` computes it
    (``r_eff`` from the weights' ``ess(method="mean")``), over chunks of rows so that the ``draws × N``
    log-likelihood is never held at once."""
    chains, draws, d = w.shape
    samples = chains * draws
    reff = float(np.mean(az.ess(az.convert_to_dataset({"w": w}), method="mean").w.values)) / samples
    flat = jnp.asarray(w.reshape(samples, d), jnp.float32)
    loo_i, lppd, khat = [], 0.0, []
    for rows in _row_chunks(X):
        sign = jnp.asarray(2 * y[rows] - 1)[:, None]
        ll = np.asarray(jax.nn.log_sigmoid(sign * (jnp.asarray(X[rows]) @ flat.T)), np.float64)  # (rows, draws)
        log_weights, k = az.psislw(-ll, reff)
        loo_i.append(logsumexp(log_weights + ll, axis=-1))
        lppd += float(np.sum(logsumexp(ll, axis=-1) - np.log(samples)))
        khat.append(k)
    pointwise, k = np.concatenate(loo_i), np.concatenate(khat)
    elpd = float(pointwise.sum())
    return {
        "elpd_loo": elpd,
        "elpd_loo_se": float(np.sqrt(pointwise.size * np.var(pointwise))),
        "p_loo": lppd - elpd,
        "khat_max": float(k.max()),
        "khat_over_0.7": int(np.sum(k > 0.7)),
    }


def convergence(w: np.ndarray) -> dict[str, float]:
    """The worst weight's ``r_hat``, ``ess_bulk`` and ``ess_tail`` (ArviZ)."""
    summary = az.summary(az.from_dict(posterior={"w": w}), kind="diagnostics")
    return {"r_hat_max": float(summary.r_hat.max()), "ess_bulk_min": float(summary.ess_bulk.min()),
            "ess_tail_min": float(summary.ess_tail.min())}  # fmt: skip


# --- the NUTS reference ----------------------------------------------------------------------------------
def run_nuts(X: np.ndarray, y: np.ndarray, num_warmup: int, num_samples: int, seed: int) -> tuple[np.ndarray, dict]:
    """NUTS with a dense mass matrix on the full data (the same model, ``batch_size=None``), 4 chains one after
    the other: ``(draws (chains, draws, d), settings)``."""
    mcmc = MCMC(NUTS(model, dense_mass=True), num_warmup=num_warmup, num_samples=num_samples, num_chains=CHAINS,
                chain_method="sequential", progress_bar=False)  # fmt: skip
    start = time.perf_counter()
    mcmc.run(jax.random.PRNGKey(seed), jnp.asarray(X), jnp.asarray(y), batch_size=None, extra_fields=("num_steps",))
    w = np.asarray(mcmc.get_samples(group_by_chain=True)["w"])
    seconds = time.perf_counter() - start
    steps = float(np.mean(np.asarray(mcmc.get_extra_fields()["num_steps"])))
    return w, {"seconds": seconds, "mean_num_steps": steps, "source": "NUTS run by benchmarks/a9a_vs_nuts.py"}


def summarize_reference(w: np.ndarray, X: np.ndarray, y: np.ndarray, X_test: np.ndarray,
                        settings: dict[str, Any]) -> dict[str, np.ndarray]:  # fmt: skip
    """The cached summaries of the NUTS draws ``w`` ``(chains, draws, d)`` (see the module docstring)."""
    chains, draws, _ = w.shape
    flat = w.reshape(chains * draws, -1)
    moments = predictive_moments(w, X_test, with_ess=True)
    halves = [predictive_moments(part, X_test) for part in np.array_split(w, 2, axis=0)]
    keep = np.linspace(0, draws - 1, KSD_DRAWS // chains).round().astype(int)
    out: dict[str, Any] = {
        "w_mean": flat.mean(0), "w_sd": flat.std(0, ddof=1), "w_cov": np.cov(flat, rowvar=False),
        "p_mean": moments["mean"], "p_sd": moments["sd"], "p_ess_mean": moments["ess_mean"],
        "p_ess_sd": moments["ess_sd"],
        "p_mean_half": np.stack([h["mean"] for h in halves]), "p_sd_half": np.stack([h["sd"] for h in halves]),
        "ksd_draws": w[:, keep],
    }  # fmt: skip
    out = {key: np.asarray(value, np.float32) for key, value in out.items()}
    scalars = {**psis_loo(w, X, y), **convergence(w)}
    settings = {**settings, "num_chains": chains, "num_samples": draws, "date": datetime.date.today().isoformat(),
                "jax": jax.__version__, "numpyro": numpyro.__version__, "machine": machine()}  # fmt: skip
    out.update({key: np.asarray(value, np.float64) for key, value in scalars.items()})
    out.update({key: np.asarray(value) for key, value in settings.items()})
    return out


def load_reference(path: Path = NUTS_CACHE) -> dict[str, Any]:
    """The cached NUTS summaries: arrays, and scalars (numbers and strings) as Python values."""
    with np.load(path) as data:
        return {key: data[key].item() if data[key].ndim == 0 else data[key] for key in data.files}


def machine() -> str:
    """The CPU model and core count, as ``/proc/cpuinfo`` and ``os.cpu_count`` give them."""
    model_name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            model_name = next(line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{model_name}, {os.cpu_count()} cores"


# --- the comparison --------------------------------------------------------------------------------------
def run_main_job(X: np.ndarray, y: np.ndarray, warmup: int, samples: int, thin: int, gradient: str | None = None,
                 target_noise_ratio: float | None = None) -> tuple[MCMC, float]:  # fmt: skip
    """The main job's kernel (with the gradient estimator ``gradient`` and the warm-up's ``target_noise_ratio``,
    the kernel's defaults if ``None``: SVRG's gradient) and MCMC, run: ``(mcmc, wall-clock seconds)``."""
    kernel = SGNHT(model, dense_mass=True, adapt_mass_matrix=True, steps_per_sample=thin, gradient=gradient,
                   target_noise_ratio=target_noise_ratio)  # fmt: skip
    mcmc = MCMC(kernel, num_warmup=warmup // thin, num_samples=samples // thin, num_chains=CHAINS,
                chain_method="vectorized", progress_bar=False)  # fmt: skip
    start = time.perf_counter()
    mcmc.run(jax.random.PRNGKey(SEED), X, y, batch_size=BATCH)
    mcmc.get_samples()["w"].block_until_ready()
    return mcmc, time.perf_counter() - start


#: JAX's events whose durations are compilation rather than computation (tracing, lowering, XLA's compiler).
COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration",
                  "/jax/core/compile/backend_compile_duration")  # fmt: skip


def timed_main_job(X: np.ndarray, y: np.ndarray, samples: int) -> dict[str, float]:
    """The main job's run with ``samples`` kept steps: its wall clock and the part of it JAX spent compiling."""
    compile_seconds = [0.0]

    def listener(event: str, duration_secs: float, **kwargs: Any) -> None:
        if event in COMPILE_EVENTS:
            compile_seconds[0] += duration_secs

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        _, seconds = run_main_job(X, y, WARMUP_STEPS, samples, THIN)
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    return {"seconds": seconds, "compile_seconds": compile_seconds[0], "sample_steps": samples}


def warmup_cost(X: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """The warm-up's cost in the main job (see the module docstring): a run with one kept draw, then the full
    run, each without its compilation time."""
    short = timed_main_job(X, y, THIN)
    full = timed_main_job(X, y, SAMPLE_STEPS)
    short_run, full_run = (r["seconds"] - r["compile_seconds"] for r in (short, full))
    per_step = (full_run - short_run) / (SAMPLE_STEPS - THIN)
    warmup = short_run - THIN * per_step
    return {"short": short, "full": full, "seconds_per_sampling_step": per_step, "warmup_seconds": warmup,
            "sampling_seconds": SAMPLE_STEPS * per_step, "warmup_fraction_of_run": warmup / full["seconds"],
            "warmup_fraction_without_compile": warmup / full_run,
            "warmup_over_plain_steps": warmup / (WARMUP_STEPS * per_step)}  # fmt: skip


def compare_predictions(run: dict[str, np.ndarray], ref: dict[str, Any]) -> dict[str, float]:
    """The predictive-probability numbers of the module docstring, measured and as Monte Carlo error predicts."""
    normal = NormalDist()
    ref_sd = ref["p_sd"].astype(np.float64)
    err = np.abs(run["mean"] - ref["p_mean"]) / ref_sd
    mc = np.sqrt(run["sd"] ** 2 / run["ess_mean"] + ref_sd**2 / ref["p_ess_mean"]) / ref_sd
    z = (run["mean"] - ref["p_mean"]) / (mc * ref_sd)
    ratio = run["sd"] / ref_sd
    ratio_mc = np.sqrt(1 / (2 * run["ess_sd"]) + 1 / (2 * ref["p_ess_sd"]))  # relative error of each sd
    cdf = np.vectorize(normal.cdf)
    return {
        "mean_err_median": float(np.median(err)), "mean_err_p95": float(np.percentile(err, 95)),
        "mean_err_max": float(err.max()), "mean_err_frac_over_0.1": float(np.mean(err > 0.1)),
        "mc_err_median": float(np.median(mc)),
        "mc_expected_err_median": float(np.median(mc) * normal.inv_cdf(0.75)),
        "mc_expected_frac_over_0.1": float(np.mean(2 * (1 - cdf(0.1 / mc)))),
        "mc_expected_err_p95": float(np.percentile(np.abs(np.random.default_rng(0).normal(size=mc.size)) * mc, 95)),
        "z_sd": float(np.std(z)), "z_frac_over_3": float(np.mean(np.abs(z) > 3)),
        "sd_ratio_median": float(np.median(ratio)), "sd_ratio_p5": float(np.percentile(ratio, 5)),
        "sd_ratio_p95": float(np.percentile(ratio, 95)),
        "sd_ratio_frac_outside_0.9_1.1": float(np.mean((ratio < 0.9) | (ratio > 1.1))),
        "sd_ratio_mc_median": float(np.median(ratio_mc)),
        "mc_expected_sd_frac_outside": float(np.mean(2 * (1 - cdf(np.log(1.1) / ratio_mc)))),
        "run_ess_mean_median": float(np.median(run["ess_mean"])),
        "nuts_ess_mean_median": float(np.median(ref["p_ess_mean"])),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="4k warm-up + 40k steps thinned by 100, KSD on 100 draws")
    parser.add_argument("--refresh-nuts", action="store_true", help="rerun NUTS and rewrite the cache (~16 min)")
    parser.add_argument("--nuts-draws", type=Path, help="cache these NUTS draws (npz with `w`: (chains, draws, 123))")
    parser.add_argument("--nuts-seconds", type=float, default=float("nan"), help="the wall clock of those draws' run")
    parser.add_argument("--nuts-warmup", type=int, default=1000)
    parser.add_argument("--nuts-samples", type=int, default=1000)
    parser.add_argument("--nuts-seed", type=int, default=1)
    parser.add_argument("--warmup-cost", action="store_true", help="time the warm-up against the sampling (~3 min)")
    parser.add_argument("--gradient", choices=["minibatch", "svrg"],
                        help="the kernel's gradient estimator (default: the kernel's, SVRG's with the tuned step; "
                             "results go to a file named after it when given)")  # fmt: skip
    parser.add_argument("--target-noise-ratio", type=float, default=None,
                        help="the warm-up's target noise ratio (default: the kernel's; results go to a file named "
                             "after it when given)")
    args = parser.parse_args()
    warmup, samples, thin, ksd_draws = (4_000, 40_000, 100, 100) if args.quick else (WARMUP_STEPS, SAMPLE_STEPS,
                                                                                     THIN, KSD_DRAWS)  # fmt: skip
    wall = time.perf_counter()
    X, y, X_test, y_test = load_a9a()
    print(f"jax {jax.__version__}, numpyro {numpyro.__version__}, arviz {az.__version__}; {machine()}; "
          f"a9a {X.shape[0]} training rows, {X_test.shape[0]} test rows, {X.shape[1]} features", flush=True)  # fmt: skip
    if args.warmup_cost:
        cost = warmup_cost(X, y)
        cost["settings"] = {"date": datetime.date.today().isoformat(), "machine": machine(),
                            "warmup_steps": WARMUP_STEPS, "sample_steps": SAMPLE_STEPS, "thin": THIN}  # fmt: skip
        out = RESULTS / "a9a_vs_nuts_warmup_cost.json"
        out.write_text(json.dumps(cost, indent=1) + "\n")
        short, full = cost["short"], cost["full"]
        print(f"one kept draw: {short['seconds']:.1f} s ({short['compile_seconds']:.1f} s compiling); full run: "
              f"{full['seconds']:.1f} s ({full['compile_seconds']:.1f} s compiling)\n"
              f"warm-up (mode finding, Hessian, {WARMUP_STEPS:,} adapting steps): {cost['warmup_seconds']:.1f} s = "
              f"{cost['warmup_fraction_of_run']:.1%} of the run ({cost['warmup_fraction_without_compile']:.1%} "
              f"without compiling), {cost['warmup_over_plain_steps']:.2f}x {WARMUP_STEPS:,} sampling steps; "
              f"sampling {SAMPLE_STEPS:,} steps: {cost['sampling_seconds']:.1f} s\nwrote {os.path.relpath(out)}")  # fmt: skip
        return

    if args.refresh_nuts or args.nuts_draws is not None or not NUTS_CACHE.exists():
        nuts_settings = {"num_warmup": args.nuts_warmup, "num_samples": args.nuts_samples, "seed": args.nuts_seed,
                         "dense_mass": True, "chain_method": "sequential"}  # fmt: skip
        if args.nuts_draws is not None and not args.refresh_nuts:
            with np.load(args.nuts_draws) as data:
                w_nuts = np.asarray(data["w"])
            nuts_settings.update(seconds=args.nuts_seconds, source=f"draws from {args.nuts_draws}")
        else:
            print(f"running NUTS ({CHAINS} chains × {args.nuts_warmup} + {args.nuts_samples}) ...", flush=True)
            w_nuts, run_settings = run_nuts(X, y, args.nuts_warmup, args.nuts_samples, args.nuts_seed)
            nuts_settings.update(run_settings)
        NUTS_CACHE.parent.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(NUTS_CACHE, **summarize_reference(w_nuts, X, y, X_test, nuts_settings))
        print(f"cached the NUTS summaries in {os.path.relpath(NUTS_CACHE)}", flush=True)
    ref = load_reference()
    print(f"NUTS reference: {ref['num_chains']} chains × {ref['num_samples']} draws after {ref['num_warmup']} "
          f"warm-up, dense mass, seed {ref['seed']}, {ref['seconds']:.0f} s ({ref['source']}, {ref['date']}); "
          f"r_hat max {ref['r_hat_max']:.3f}, ess_bulk min {ref['ess_bulk_min']:.0f}", flush=True)  # fmt: skip

    mcmc, seconds = run_main_job(X, y, warmup, samples, thin, args.gradient, args.target_noise_ratio)
    w = np.asarray(mcmc.get_samples(group_by_chain=True)["w"], np.float64)
    fields = mcmc.get_extra_fields()
    ratio = np.asarray(fields["noise_ratio"])
    step_sizes = np.asarray(mcmc.last_state.step_size).ravel()
    print(f"SGNHT(dense_mass=True): {seconds:.1f} s for {CHAINS} chains × ({warmup:,} + {samples:,}) steps, thinned "
          f"by {thin}; step sizes {[float(f'{h:.3g}') for h in step_sizes]}; noise ratio median {np.median(ratio):.2f}, "
          f"90th percentile {np.percentile(ratio, 90):.2f}; rejected steps "
          f"{int(np.sum(np.asarray(mcmc.last_state.num_diverging)))}", flush=True)  # fmt: skip

    conv = convergence(w)
    run_moments = predictive_moments(w, X_test, with_ess=True)
    pred = compare_predictions(run_moments, ref)
    loo = psis_loo(w, X, y)
    accuracy = float(np.mean((run_moments["mean"] > 0.5) == y_test))
    nuts_accuracy = float(np.mean((ref["p_mean"] > 0.5) == y_test))
    kernel_ksd = ksd(mcmc, num_draws=ksd_draws)
    nuts_ksd = ksd(mcmc, num_draws=ksd_draws, samples={"w": ref["ksd_draws"]}, preconditioner=kernel_ksd.preconditioner)

    checks = {
        "r_hat <= 1.01 (every weight)": conv["r_hat_max"] <= 1.01,
        "ess_bulk >= 400 (every weight)": conv["ess_bulk_min"] >= 400,
        "p_loo within 10 % of NUTS's": abs(loo["p_loo"] / ref["p_loo"] - 1) <= 0.1,
    }
    results = {
        "settings": {"kernel": "SGNHT(model, dense_mass=True, adapt_mass_matrix=True)", "gradient": args.gradient,
                     "target_noise_ratio": args.target_noise_ratio,
                     "warmup_steps": warmup,
                     "sample_steps": samples, "thin": thin, "chains": CHAINS, "batch_size": BATCH, "seed": SEED,
                     "quick": args.quick, "date": datetime.date.today().isoformat(), "machine": machine()},
        "seconds": seconds, "nuts_seconds": ref["seconds"], "step_sizes": step_sizes.tolist(),
        "noise_ratio_median": float(np.median(ratio)), "noise_ratio_p90": float(np.percentile(ratio, 90)),
        "convergence": conv, "nuts_convergence": {k: ref[k] for k in ("r_hat_max", "ess_bulk_min", "ess_tail_min")},
        "predictions": pred, "loo": loo,
        "nuts_loo": {k: ref[k] for k in ("elpd_loo", "elpd_loo_se", "p_loo", "khat_max", "khat_over_0.7")},
        "test_accuracy": accuracy, "nuts_test_accuracy": nuts_accuracy,
        "ksd": kernel_ksd.ksd, "nuts_ksd": nuts_ksd.ksd, "ksd_draws": kernel_ksd.num_draws,
        "checks": checks,
    }  # fmt: skip
    suffix = "".join([
        "" if args.gradient is None else f"_{args.gradient}",
        "" if args.target_noise_ratio is None else f"_ratio{args.target_noise_ratio:g}",
        "_quick" if args.quick else "",
    ])  # fmt: skip
    out = RESULTS / f"a9a_vs_nuts{suffix}.json"
    out.write_text(json.dumps(results, indent=1) + "\n")

    print("\n| | SGNHT, adaptive defaults | NUTS (dense, full data) |\n|---|---:|---:|")
    rows = [
        ("wall clock (s)", f"{seconds:.0f}", f"{ref['seconds']:.0f}"),
        ("r_hat, max over weights", f"{conv['r_hat_max']:.3f}", f"{ref['r_hat_max']:.3f}"),
        ("ess_bulk, min over weights", f"{conv['ess_bulk_min']:.0f}", f"{ref['ess_bulk_min']:.0f}"),
        ("ess_tail, min over weights", f"{conv['ess_tail_min']:.0f}", f"{ref['ess_tail_min']:.0f}"),
        ("ESS of a test row's mean, median", f"{pred['run_ess_mean_median']:.0f}", f"{pred['nuts_ess_mean_median']:.0f}"),
        ("p_loo", f"{loo['p_loo']:.2f}", f"{ref['p_loo']:.2f}"),
        ("elpd_loo (se)", f"{loo['elpd_loo']:.1f} ({loo['elpd_loo_se']:.1f})",
         f"{ref['elpd_loo']:.1f} ({ref['elpd_loo_se']:.1f})"),
        ("test accuracy", f"{accuracy:.2%}", f"{nuts_accuracy:.2%}"),
        (f"KSD, {kernel_ksd.num_draws} draws, run's coordinates", f"{kernel_ksd.ksd:.3f}", f"{nuts_ksd.ksd:.3f}"),
    ]  # fmt: skip
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print("\nTest-set predictive probabilities (16 281 rows), against NUTS:\n")
    print("| | measured | Monte Carlo error alone predicts |\n|---|---:|---:|")
    print(f"| \\|mean - NUTS\\| / NUTS sd, median | {pred['mean_err_median']:.3f} | {pred['mc_expected_err_median']:.3f} |")
    print(f"| ... 95th percentile | {pred['mean_err_p95']:.3f} | {pred['mc_expected_err_p95']:.3f} |")
    print(f"| ... fraction of rows above 0.1 | {pred['mean_err_frac_over_0.1']:.2%} | "
          f"{pred['mc_expected_frac_over_0.1']:.2%} |")  # fmt: skip
    print(f"| standardised difference z: sd, fraction beyond 3 | {pred['z_sd']:.2f}, {pred['z_frac_over_3']:.2%} "
          "| 1.00, 0.27% |")  # fmt: skip
    print(f"| sd ratio, median (5-95 %) | {pred['sd_ratio_median']:.3f} ({pred['sd_ratio_p5']:.3f}-"
          f"{pred['sd_ratio_p95']:.3f}) | 1 (± {pred['sd_ratio_mc_median']:.3f} per row) |")  # fmt: skip
    print(f"| ... fraction outside [0.9, 1.1] | {pred['sd_ratio_frac_outside_0.9_1.1']:.2%} | "
          f"{pred['mc_expected_sd_frac_outside']:.2%} |")  # fmt: skip
    print("\nChecks: " + "; ".join(f"{name}: {'pass' if ok else 'FAIL'}" for name, ok in checks.items()))
    print(f"wrote {os.path.relpath(out)}; total wall time {time.perf_counter() - wall:.0f} s")


if __name__ == "__main__":
    main()
