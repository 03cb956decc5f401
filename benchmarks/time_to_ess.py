"""Time to a right posterior against N: ESS per second of logistic-regression weights, SG-MCMC against NUTS.

**Data.** Synthetic logistic regressions shaped like a9a at N rows: each row is a row of a9a's training set drawn
with replacement (:func:`make_data`), so the design keeps a9a's 123 binary features in one-hot groups (about 14
ones a row) and its rare categories, the features that make a9a's posterior hard (directions that only the prior
pins down next to directions with sd ~0.01); the labels are drawn from the model, ``y_i ~ Bernoulli(sigmoid(x_iᵀ
w*))``, with ``w*`` the mean of the cached a9a NUTS posterior (:data:`benchmarks.a9a_vs_nuts.NUTS_CACHE`), which
gives about a9a's share of positive labels. The model is the main job's,
:func:`models.logistic_regression.model` (prior ``N(0, 10)``, minibatches of 100 rows).

**Methods** (each (N, method) a fresh subprocess pinned by the caller, 4 chains, seed 0):

* ``sgnht``, ``sgld``: the library's defaults, ``ppl_sgmcmc.numpyro.SGNHT(model, steps_per_sample=THIN)`` and
  ``SGLD(model, steps_per_sample=THIN)`` with no step size (the warm-up finds a mode, builds the preconditioner
  and tunes the step size), 4 chains vectorised under ``ppl_sgmcmc.numpyro.MCMC``;
* ``nuts``: full-data NUTS hands-off, ``NUTS(model, dense_mass=True)`` from NumPyro's default initialisation,
  4 chains one after the other;
* ``nuts_map``: full-data NUTS helped: the mode found by L-BFGS (SciPy) and Newton steps on the full data, the Laplace mass
  matrix (the inverse of the potential's Hessian there) kept fixed, only the step size adapted;
* ``hmcecs``: NumPyro's ``HMCECS(NUTS(model, dense_mass=True), num_blocks=10, proxy=HMCECS.taylor_proxy(MAP))``
  on subsamples of :data:`ECS_SUBSAMPLE` rows (the energy-conserving subsampling of Dang, Quiroz, Kohn, Tran and
  Villani, "Hamiltonian Monte Carlo with Energy Conserving Subsampling", JMLR 2019), the MAP found as above;
* ``laplace_is``: the reference where full-data NUTS is unaffordable (N = 1e6), not a sampler under test:
  self-normalised importance sampling of the exact posterior from a multivariate t (:data:`IS_DOF` degrees of
  freedom, :data:`IS_DRAWS` independent draws) centred at the mode found as above, with the Laplace covariance (the
  inverse Hessian of the potential there); the exact potential in float64 over all rows, in blocks. Its ESS is the
  importance sampling's, ``1 / sum(w_s²)`` over the normalised weights (every weight's ``w_ess``), and its cell
  keeps the Pareto k of the weights' tail (ArviZ's ``psislw``; a warning above 0.7, where the estimates are not
  reliable).

**Measured**: the wall time of the whole run (data on hand; compilation, mode finding, warm-up and sampling),
the warm-up's and the sampling's share, the process's CPU time (``time.process_time``: on a shared machine
wall time measures the load too), ArviZ's bulk ESS of each of the 123 weights (min and median) and the ESS per
CPU second of the whole run (the run is pinned to one core: on a quiet machine, its wall time). Each run is
capped at ``--cap`` seconds of wall time; a run over it is recorded as
``capped`` (it is not affordable at that N), and the method is not run at the larger N of the same invocation
(every method's cost grows with N). **Checked** against a reference at the same N (:data:`REFERENCES`: full-data
NUTS, ``nuts_map`` where it finished, else ``nuts``, else the importance sampling ``laplace_is``; the table names
the reference of each row): the largest ``|mean_j - mean*_j| / sd*_j`` over the weights, the
largest standardised difference ``|z_j| = |mean_j - mean*_j| / sqrt(sd_j²/ess_j + sd*_j²/ess*_j)`` (about 3.3
at most over 123 weights when the difference is all Monte Carlo error) and the range of the sd ratios
``sd_j / sd*_j`` (``ess*_j``: for ``laplace_is`` the importance sampling's ESS).

Usage (from the repository root)::

    taskset -c 1 .venv/bin/python -m benchmarks.time_to_ess --n 1e4 1e5          # every method
    taskset -c 1 .venv/bin/python -m benchmarks.time_to_ess --n 1e6 --methods sgnht sgld nuts_map
    taskset -c 1 .venv/bin/python -m benchmarks.time_to_ess --n 1e6 --methods laplace_is --cap 3600  # the reference
    taskset -c 1 .venv/bin/python -m benchmarks.time_to_ess --quick               # N = 1e4, short runs

Writes ``benchmarks/results/time_to_ess.json`` (``time_to_ess_quick.json`` with ``--quick``; a run updates only
the cells it ran), prints the table for ``RESULTS.md`` and draws ``benchmarks/results/time_to_ess.png``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
METHODS = ("sgnht", "sgld", "sgnht_cv", "sgld_cv", "nuts", "nuts_map", "hmcecs", "laplace_is")
#: The references of the check, the first at hand (a reference is checked against those before it).
REFERENCES = ("nuts_map", "nuts", "laplace_is")
LABELS = {"sgnht": "SGNHT defaults", "sgld": "SGLD defaults", "sgnht_cv": 'SGNHT, `gradient="control_variates"`',
          "sgld_cv": 'SGLD, `gradient="control_variates"`', "nuts": "NUTS hands-off",
          "nuts_map": "NUTS, MAP start + Laplace mass", "hmcecs": "HMCECS (Taylor proxy)",
          "laplace_is": "importance sampling, Laplace t proposal"}  # fmt: skip
#: :func:`make_data` and the reference's Newton steps: the rows of a block of their float64 sums.
DATA_ROWS = 2**16
#: SG-MCMC: warm-up and kept steps per chain, the kernel's thinning, minibatch rows.
SG_WARMUP, SG_STEPS, THIN, BATCH = 20_000, 100_000, 50, 100
#: NUTS and HMCECS: warm-up and kept draws per chain (``nuts_map`` adapts only its step size).
NUTS_WARMUP, NUTS_SAMPLES, NUTS_MAP_WARMUP = 500, 500, 200
ECS_SUBSAMPLE, ECS_BLOCKS = 1000, 10
#: ``laplace_is``: proposal draws, the t proposal's degrees of freedom (tails heavier than the Laplace
#: approximation's, so that the weights' tail stays light where the posterior is skewed), the rows of a block of
#: the exact potential (a block's linear predictors, rows x draws in float64: 128 MB). At N = 1e6, 4000 draws gave
#: an importance-sampling ESS of 947 (a quarter of the draws): 8000 give about 1900, above the 1000 at which the
#: reference's own Monte Carlo error (sd / sqrt(ESS) ~ 0.03 sd) is small next to an SG-MCMC run's; the cost is
#: linear in the draws. At N = 1e4 the posterior is further from the Laplace approximation (its rare categories):
#: 8000 draws give an ESS of 63 (Pareto k 0.76), and ``nuts_map`` is the reference there.
IS_DRAWS, IS_DOF, IS_ROWS = 8000, 20.0, 2000
#: Pareto k of the importance weights' tail above which importance sampling's estimates are unreliable.
PARETO_K_MAX = 0.7
#: Newton steps after L-BFGS in the reference's mode search, and the main job's prior variance.
NEWTON_STEPS, PRIOR_VARIANCE = 20, 10.0
CHAINS, SEED = 4, 0
#: The plot's open markers: runs whose worst weight has fewer effective draws (the end-of-run verdict's 100 a chain).
MIXED_ESS = 100 * CHAINS
#: ``--quick``: shorter runs (N = 1e4 unless ``--n`` is given).
QUICK = {"SG_WARMUP": 4_000, "SG_STEPS": 20_000, "NUTS_WARMUP": 200, "NUTS_SAMPLES": 200, "NUTS_MAP_WARMUP": 100}


def make_data(N: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """``N`` rows of a9a's training features drawn with replacement and labels drawn from the model at the
    cached NUTS posterior mean: ``(X (N, 123) float32, y (N,) float32)``; the logits in float64, :data:`DATA_ROWS`
    rows at a time (a float64 copy of ``X`` would be 9.8 GB at 1e7 rows)."""
    from benchmarks.a9a_vs_nuts import load_reference
    from models.datasets import load_a9a

    X_a9a = load_a9a()[0]
    w_true = np.asarray(load_reference()["w_mean"], np.float64)
    rng = np.random.default_rng(seed)
    X = X_a9a[rng.integers(0, X_a9a.shape[0], N)]
    logits = np.concatenate([X[start : start + DATA_ROWS] @ w_true for start in range(0, N, DATA_ROWS)])
    y = (rng.random(N) < 1.0 / (1.0 + np.exp(-logits))).astype(np.float32)
    return X, y


# --- one (N, method), in a child process ------------------------------------------------------------------
def _map_and_laplace(X: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The full-data posterior mode (L-BFGS, then :data:`NEWTON_STEPS` Newton steps in float64) and the inverse
    Hessian of the potential there, in float64."""
    # L-BFGS stops where float32 energies no longer resolve its steps, far from the mode at large N (a Newton
    # decrement of 1e3 at 1e5 rows). Newton steps finish the search, with the model's gradient and Hessian in float64
    # (the main job's model: a float32 Hessian's rounding errors on common features' entries reach the size of the
    # rare features' curvatures, and its steps stall several posterior sds from the mode)
    w = _lbfgs_mode(X, y)
    for _ in range(NEWTON_STEPS):
        gradient, hessian = _gradient_and_hessian(X, y, w)
        w = w - np.linalg.solve(hessian, gradient)
    return w, np.linalg.inv(_gradient_and_hessian(X, y, w)[1])


def _lbfgs_mode(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """L-BFGS (SciPy) on the model's float32 potential over all rows, from zero (its copy of the data on the device
    goes when it returns)."""
    import jax
    import jax.numpy as jnp
    from numpyro.infer.util import potential_energy
    from scipy.optimize import minimize

    from models.logistic_regression import model

    Xj, yj = jnp.asarray(X), jnp.asarray(y)

    def potential(w: jax.Array, X: jax.Array, y: jax.Array) -> jax.Array:  # the data as arguments, not constants
        return potential_energy(model, (X, y), {"batch_size": None}, {"w": w})

    value_and_grad = jax.jit(jax.value_and_grad(potential))

    def fun(w: np.ndarray) -> tuple[float, np.ndarray]:
        value, grad = value_and_grad(jnp.asarray(w, jnp.float32), Xj, yj)
        return float(value), np.asarray(grad, np.float64)

    return minimize(fun, np.zeros(X.shape[1]), jac=True, method="L-BFGS-B", options={"maxiter": 2000}).x


def _gradient_and_hessian(X: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The gradient and Hessian of the main job's potential (prior ``N(0, 10)``, logistic likelihood) at ``w``, in
    float64, :data:`DATA_ROWS` rows at a time."""
    gradient, hessian = w / PRIOR_VARIANCE, np.eye(w.size) / PRIOR_VARIANCE
    for start in range(0, y.size, DATA_ROWS):
        X_rows, y_rows = X[start : start + DATA_ROWS].astype(np.float64), y[start : start + DATA_ROWS]
        p = 1.0 / (1.0 + np.exp(-(X_rows @ w)))
        gradient = gradient + X_rows.T @ (p - y_rows)
        hessian = hessian + (X_rows.T * (p * (1.0 - p))) @ X_rows
    return gradient, hessian


def _warmup_and_sample(mcmc: Any, start: float, X: Any, y: Any, batch: int | None) -> tuple[Any, float, float]:
    """``mcmc``'s warm-up, then its sampling: ``(draws of w (chains, draws, d), seconds from start to the end of the
    warm-up, seconds of sampling)``."""
    import jax

    mcmc.warmup(jax.random.PRNGKey(SEED), X, y, batch_size=batch)
    jax.block_until_ready(mcmc.post_warmup_state)
    warmup = time.perf_counter() - start
    mcmc.run(mcmc.post_warmup_state.rng_key, X, y, batch_size=batch)
    w = mcmc.get_samples(group_by_chain=True)["w"]
    jax.block_until_ready(w)
    return w, warmup, time.perf_counter() - start - warmup


def _tuning(mcmc: Any) -> dict[str, float]:
    """An SG-MCMC run's tuned step size (the median over chains, in the preconditioner's coordinates) and the
    median noise ratio of its draws."""
    extra = mcmc.get_extra_fields()
    return {"step_size": float(np.median(np.asarray(extra["step_size"]))),
            "noise_ratio": float(np.median(np.asarray(extra["noise_ratio"])))}  # fmt: skip


def _run_sg(name: str, X: Any, y: Any, cfg: dict[str, int]) -> tuple[Any, float, float, dict[str, float]]:
    """The SGNHT or SGLD defaults, with control variates for the ``_cv`` methods, 4 chains vectorised (see the
    module docstring)."""
    from models.logistic_regression import model
    from ppl_sgmcmc.numpyro import MCMC, SGLD, SGNHT

    gradient = "control_variates" if name.endswith("_cv") else "minibatch"
    kernel = (SGNHT if name.startswith("sgnht") else SGLD)(model, steps_per_sample=THIN, gradient=gradient)
    mcmc = MCMC(kernel, num_warmup=cfg["SG_WARMUP"] // THIN, num_samples=cfg["SG_STEPS"] // THIN,
                num_chains=CHAINS, chain_method="vectorized", progress_bar=False)  # fmt: skip
    w, warmup, sampling = _warmup_and_sample(mcmc, time.perf_counter(), X, y, BATCH)
    return w, warmup, sampling, _tuning(mcmc)


def _run_nuts(name: str, X: Any, y: Any, cfg: dict[str, int]) -> tuple[Any, float, float, dict[str, float]]:
    """NUTS hands-off, NUTS helped, or HMCECS, 4 chains one after the other (see the module docstring)."""
    from numpyro.infer import HMCECS, MCMC, NUTS, init_to_value

    from models.logistic_regression import model

    start = time.perf_counter()
    num_warmup, batch = cfg["NUTS_WARMUP"], None
    if name == "nuts":
        kernel: Any = NUTS(model, dense_mass=True)
    else:
        mode, inverse_mass = _map_and_laplace(np.asarray(X), np.asarray(y))  # NumPy: float64 (JAX arrays stay float32)
        mode = mode.astype(np.float32)
        init = init_to_value(values={"w": mode})
        if name == "nuts_map":
            kernel = NUTS(model, dense_mass=True, inverse_mass_matrix=inverse_mass, adapt_mass_matrix=False,
                          init_strategy=init)  # fmt: skip
            num_warmup = cfg["NUTS_MAP_WARMUP"]
        else:
            kernel = HMCECS(NUTS(model, dense_mass=True, init_strategy=init), num_blocks=ECS_BLOCKS,
                            proxy=HMCECS.taylor_proxy({"w": mode}))  # fmt: skip
            batch = ECS_SUBSAMPLE
    mcmc = MCMC(kernel, num_warmup=num_warmup, num_samples=cfg["NUTS_SAMPLES"], num_chains=CHAINS,
                chain_method="sequential", progress_bar=False)  # fmt: skip
    return (*_warmup_and_sample(mcmc, start, X, y, batch), {})


def _laplace_is(X: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """Self-normalised importance sampling of the full-data posterior from the multivariate t centred at the mode
    with the Laplace covariance (see the module docstring): the cell's timings, ESS, Pareto k, and each weight's
    mean and sd (a warning where the Pareto k is over :data:`PARETO_K_MAX`)."""
    from arviz import psislw

    start = time.perf_counter()
    mode, covariance = _map_and_laplace(X, y)
    warmup = time.perf_counter() - start
    rng = np.random.default_rng(SEED)
    z = rng.standard_normal((IS_DRAWS, mode.size))
    scale = rng.chisquare(IS_DOF, IS_DRAWS) / IS_DOF
    w = mode + (z @ np.linalg.cholesky(covariance).T) / np.sqrt(scale)[:, None]
    # the proposal's log density up to a constant: (w - mode)ᵀ H (w - mode) = |z|² / scale
    log_q = -0.5 * (IS_DOF + mode.size) * np.log1p(np.sum(z**2, 1) / (scale * IS_DOF))
    # the exact log posterior up to a constant: the prior, and sum_i y_i a_i - log(1 + exp(a_i)) with a_i = x_iᵀ w
    log_p = -0.5 * np.sum(w**2, 1) / PRIOR_VARIANCE
    for row in range(0, y.size, IS_ROWS):
        a = X[row : row + IS_ROWS].astype(np.float64) @ w.T
        log_p += y[row : row + IS_ROWS].astype(np.float64) @ a
        log_p -= np.logaddexp(0.0, a, out=a).sum(0)
    log_weights = log_p - log_q
    weights = np.exp(log_weights - log_weights.max())
    weights /= weights.sum()
    ess = float(1.0 / np.sum(weights**2))
    pareto_k = float(psislw(log_weights)[1])
    if pareto_k > PARETO_K_MAX:
        warnings.warn(f"laplace_is: Pareto k {pareto_k:.2f} over {PARETO_K_MAX}: the estimates are not reliable",
                      RuntimeWarning, stacklevel=1)  # fmt: skip
    mean = weights @ w
    sd = np.sqrt(weights @ (w - mean) ** 2)
    total = time.perf_counter() - start
    return {"wall_s": total, "warmup_s": warmup, "sampling_s": total - warmup,
            "ess_min": ess, "ess_median": ess, "draws": IS_DRAWS, "pareto_k": pareto_k,
            "w_mean": mean.tolist(), "w_sd": sd.tolist(), "w_ess": [ess] * mode.size}  # fmt: skip


def child(N: int, name: str, quick: bool, sg_steps: int | None = None) -> dict[str, Any]:
    """Run ``name`` on the data of ``N`` rows: the row of the table and each weight's mean, sd and bulk ESS
    (``sg_steps``: the SG-MCMC kept steps per chain instead of :data:`SG_STEPS`, with a fifth as many warm-up steps)."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import arviz as az
    import jax.numpy as jnp

    cfg = {key: globals()[key] for key in QUICK} | (QUICK if quick else {})
    if sg_steps is not None:
        cfg |= {"SG_STEPS": sg_steps, "SG_WARMUP": sg_steps // 5}
    X_np, y_np = make_data(N)
    if name == "laplace_is":
        cpu = time.process_time()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cell = _laplace_is(X_np, y_np)
        return {"N": N, "method": name, "cpu_s": time.process_time() - cpu, "positive_rate": float(np.mean(y_np)),
                "warnings": sorted({f"{c.category.__name__}: {str(c.message)[:300]}" for c in caught}), **cell}  # fmt: skip
    X, y = jnp.asarray(X_np), jnp.asarray(y_np)
    del X_np
    cpu = time.process_time()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        w, warmup, sampling, tuning = (_run_sg if name.startswith("sg") else _run_nuts)(name, X, y, cfg)
    cpu = time.process_time() - cpu
    w = np.asarray(w, np.float64)
    ess = az.ess(az.convert_to_dataset({"w": w}), method="bulk").w.values
    rhat = az.rhat(az.convert_to_dataset({"w": w})).w.values
    flat = w.reshape(-1, w.shape[-1])
    total = warmup + sampling
    return {"N": N, "method": name, "wall_s": total, "warmup_s": warmup, "sampling_s": sampling, "cpu_s": cpu,
            "ess_min": float(ess.min()), "ess_median": float(np.median(ess)), "sg_steps": cfg["SG_STEPS"],
            "draws": int(flat.shape[0]), "rhat_max": float(rhat.max()),
            "warnings": sorted({f"{c.category.__name__}: {str(c.message)[:300]}" for c in caught}),
            "positive_rate": float(np.mean(y_np)), **tuning,
            "w_mean": flat.mean(0).tolist(), "w_sd": flat.std(0, ddof=1).tolist(), "w_ess": ess.tolist()}  # fmt: skip


# --- the parent: runs, checks, table, plot ------------------------------------------------------------------
def check(run: dict[str, Any], ref: dict[str, Any]) -> dict[str, float]:
    """``run``'s weights against the reference run ``ref`` (see :func:`_reference`): largest mean error in the
    reference's sds, largest standardised difference, and the range and median of the sd ratios."""
    mean, sd, ess = (np.asarray(run[k]) for k in ("w_mean", "w_sd", "w_ess"))
    mean_ref, sd_ref, ess_ref = (np.asarray(ref[k]) for k in ("w_mean", "w_sd", "w_ess"))
    ratio = sd / sd_ref
    z = (mean - mean_ref) / np.sqrt(sd**2 / ess + sd_ref**2 / ess_ref)
    return {"reference": ref["method"], "mean_err_max": float(np.max(np.abs(mean - mean_ref) / sd_ref)),
            "z_max": float(np.max(np.abs(z))), "sd_ratio_min": float(ratio.min()),
            "sd_ratio_median": float(np.median(ratio)), "sd_ratio_max": float(ratio.max())}  # fmt: skip


def _reference(cells: dict[str, Any], N: int, name: str) -> dict[str, Any] | None:
    """The reference of method ``name`` at ``N``: the first finished cell of :data:`REFERENCES` (``nuts_map``, else
    ``nuts``, else ``laplace_is``), of those before ``name`` for a reference (``None``: ``name``'s cell is the
    reference)."""
    for ref_name in REFERENCES[: REFERENCES.index(name)] if name in REFERENCES else REFERENCES:
        ref = cells.get(f"{N}/{ref_name}")
        if ref is not None and "w_mean" in ref:
            return ref
    return None


def _rate(cell: dict[str, Any], ess: str) -> float:
    """``cell``'s effective draws (``"ess_min"`` or ``"ess_median"``) per second of the process's CPU time: the
    run is pinned to one core, so that on a quiet machine this is its wall time, and on a shared one it leaves out
    the time other jobs held the core."""
    return float(cell[ess] / cell["cpu_s"])


def _rows(N: int) -> str:
    """``N`` as ``1e4`` (a power of ten) or with thousands separators."""
    return f"{N:.0e}".replace("e+0", "e") if f"{N:.0e}" == f"{N:.6e}".replace(".000000", "") else f"{N:,}"


def table(cells: dict[str, Any]) -> str:
    """The Markdown table of every cell, by N then method."""
    lines = ["| N | method | kept steps per chain | ESS per CPU-s, min | median | ESS min / median | wall (s) | warm-up (s) "
             "| sampling (s) | CPU (s) | R-hat max (IS: Pareto k) | max mean error (reference sd), reference | max \\|z\\| "
             "| sd ratio min-median-max |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]  # fmt: skip
    for key in sorted(cells, key=lambda k: (int(k.split("/")[0]), METHODS.index(k.split("/")[1]))):
        cell = cells[key]
        N, name = cell["N"], LABELS[cell["method"]]
        if "capped" in cell:
            lines.append(f"| {_rows(N)} | {name} | | over the cap ({cell['capped']:.0f} s) | | | | | | | | | | |")
            continue
        ref = _reference(cells, N, cell["method"])
        c = check(cell, ref) if ref is not None else None
        fidelity = (f"{c['mean_err_max']:.2f}, `{c['reference']}` | {c['z_max']:.1f} | {c['sd_ratio_min']:.2f}-"
                    f"{c['sd_ratio_median']:.2f}-{c['sd_ratio_max']:.2f}" if c
                    else "the reference | | " if cell["method"] in REFERENCES else "no reference | | ")  # fmt: skip
        converged = f"k {cell['pareto_k']:.2f}" if "pareto_k" in cell else f"{cell.get('rhat_max', math.nan):.2f}"
        steps = f"{cell.get('sg_steps', SG_STEPS):,}" if cell["method"].startswith("sg") else ""
        lines.append(f"| {_rows(N)} | {name} | {steps} | {_rate(cell, 'ess_min'):.2f} | {_rate(cell, 'ess_median'):.2f} | "
                     f"{cell['ess_min']:.0f} / {cell['ess_median']:.0f} | {cell['wall_s']:.0f} | {cell['warmup_s']:.0f} "
                     f"| {cell['sampling_s']:.0f} | {cell['cpu_s']:.0f} | {converged} | "
                     f"{fidelity} |")  # fmt: skip
    return "\n".join(lines)


def plot(cells: dict[str, Any], path: Path) -> None:
    """ESS per CPU second (the smallest over the weights) against N, log-log, one line per method (no point where a run was over
    the cap; an open one where the worst weight has fewer than :data:`MIXED_ESS` effective draws)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name in METHODS:
        runs = sorted((c["N"], _rate(c, "ess_min"), c["ess_min"]) for c in cells.values()
                      if c["method"] == name and "capped" not in c)  # fmt: skip
        if runs:
            (line,) = ax.plot([r[0] for r in runs], [r[1] for r in runs], marker="o", label=LABELS[name])
            unmixed = [(N, rate) for N, rate, ess in runs if ess < MIXED_ESS]
            if unmixed:
                ax.plot(*zip(*unmixed), "o", markerfacecolor="white", color=line.get_color())
    ax.set(xscale="log", yscale="log", xlabel="N (rows)", ylabel="min bulk ESS per CPU second (whole run)",
           title="a9a-shaped logistic regression, d = 123\n(no point: over the time cap; open: min ESS < 400)")  # fmt: skip
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", nargs="+", type=float, default=None, help="rows, e.g. 1e4 1e5 (default 1e4 1e5 1e6)")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--quick", action="store_true", help="short runs, N = 1e4 unless --n says otherwise")
    parser.add_argument("--cap", type=float, default=300.0, help="wall-time cap of each run, seconds (default 300)")
    parser.add_argument("--sg-steps", type=int, default=None, help=f"SG-MCMC kept steps per chain (default "
                        f"{SG_STEPS}), with a fifth as many warm-up steps")  # fmt: skip
    parser.add_argument("--child", nargs=2, metavar=("N", "METHOD"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(int(args.child[0]), args.child[1], args.quick, args.sg_steps)))
        return
    sizes = [int(n) for n in (args.n or ([1e4] if args.quick else [1e4, 1e5, 1e6]))]
    if any(n < 100 for n in sizes):
        parser.error("--n: give row counts of at least 100, e.g. --n 1e4 1e5")
    path = RESULTS / ("time_to_ess_quick.json" if args.quick else "time_to_ess.json")
    env = dict(os.environ, PYTHONPATH=os.getcwd(), JAX_PLATFORMS="cpu")
    capped: set[str] = set()
    for N in sorted(sizes):
        for name in args.methods:
            if name in capped:
                print(f"N={N:.0e} {name}: not run, over the cap at a smaller N", flush=True)
                continue
            command = [sys.executable, "-m", "benchmarks.time_to_ess", "--child", str(N), name]
            command += (["--quick"] if args.quick else []) + ([f"--sg-steps={args.sg_steps}"] if args.sg_steps else [])
            start = time.perf_counter()
            try:
                out = subprocess.run(command, capture_output=True, text=True, env=env, timeout=args.cap)
            except subprocess.TimeoutExpired:
                cell = {"N": N, "method": name, "capped": args.cap}
                capped.add(name)
                print(f"N={N:.0e} {name}: over the cap of {args.cap:.0f} s", flush=True)
            else:
                if out.returncode != 0:
                    print(f"N={N:.0e} {name}: failed\n{out.stderr[-3000:]}", flush=True)
                    continue
                cell = json.loads(out.stdout.strip().splitlines()[-1])
                print(f"N={N:.0e} {name}: {_rate(cell, 'ess_min'):.2f} ESS per CPU second (min), CPU {cell['cpu_s']:.0f} s, "
                      f"wall {cell['wall_s']:.0f} s ({time.perf_counter() - start:.0f} s with data)", flush=True)  # fmt: skip
            # read again before writing: runs of other (N, method) cells may be going on in other processes
            cells = {**(json.loads(path.read_text()) if path.exists() else {}), f"{N}/{name}": cell}
            path.write_text(json.dumps(cells, indent=1))
    cells = json.loads(path.read_text()) if path.exists() else {}
    print(table(cells))
    plot(cells, path.with_suffix(".png"))


if __name__ == "__main__":
    main()
