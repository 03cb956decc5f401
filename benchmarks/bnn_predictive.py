"""Small Bayesian networks: every NumPyro kernel against full-data NUTS on predictive quantities.

What Izmailov, Vikram, Hoffman & Wilson, "What Are Bayesian Neural Network Posteriors Really Like?" (ICML 2021)
and the NeurIPS 2021 approximate-inference competition (Wilson et al., "Evaluating Approximate Inference in Bayesian
Deep Learning", NeurIPS 2021 Competition and Demonstration Track, PMLR 176, 2022) measure: not the weights (whose
posterior is a sea of symmetric modes) but the predictive distribution, against HMC's. Each kernel of
``ppl_sgmcmc.numpyro`` (SGLD, SGHMC, SGNHT, PSGLD, SGFS, CSGLD) runs as ``Kernel(model, steps_per_sample=thin)``
with its defaults (no step size: the warm-up finds a mode, builds a dense Laplace preconditioner and tunes the step
from the measured gradient noise; SGHMC and SGNHT then take SVRG's gradient), SGHMC and SGNHT with the minibatch
gradient, the other kernels with ``gradient="svrg"`` (where the kernel accepts it; a refusal is recorded), SGNHT and
SGHMC with SVRG at four times the kept steps and at four times the warm-up's too, and SGNHT with its matrix
thermostat (``thermostat="matrix"``), with either gradient (:data:`ROWS`). 4 chains, ``chain_method="vectorized"``,
minibatches of 100 drawn with replacement, seed 0, one run per row (``benchmarks.hands_off.run_cell``: the wall
clock includes compilation, mode finding and warm-up; its warnings are collected). CSGLD's draws are
importance-resampled by their weights first.

**Metrics** (method: all 4 chains' draws; HMC: all of NUTS's):

* Regression: the **Wasserstein-2 distance** between the method's and HMC's predictive distributions of ``y`` at
  each test input ``x`` (the competition's regression metric), ``W2 = (∫₀¹ (F⁻¹(u) - G⁻¹(u))² du)^½`` in
  one dimension, estimated from the quantiles of the two predictive samples at the levels
  ``u = (j + ½)/1000``, each draw θ contributing ``f(x; θ) + σ ε_r`` at the 20 normal quantiles
  ``ε_r = Φ⁻¹((r + ½)/20)`` (``σ = 0.3``, the model's noise; a quadrature of the noise, the same in both samples,
  so that only the draws' Monte Carlo error is left), averaged over the test inputs inside the data's range and
  outside it separately (in units of y; the noise sd is 0.3). Also, as ``benchmarks/hands_off.py`` reports
  them, the error of the predictive mean of ``f(x)`` in HMC sds, ``|mean - HMC mean| / HMC sd``, and the sd ratio
  to HMC (median, min-max over the inputs). A cell **passes** by hands_off's rule: every mean error ≤ 0.2 HMC sd
  and every sd ratio in [0.8, 1.25].
* Classification: **agreement**, the fraction of test rows where the argmax of the method's Bayesian model
  average ``p(y | x) = mean_θ softmax(f(x; θ))`` equals that of HMC's (Izmailov et al.'s, the competition's
  first metric), and **total variation**, the mean over the test rows of ``½ Σ_k |p_method(k | x) - p_HMC(k | x)|``
  (its second). Also the model average's test accuracy. A cell **passes** when it is within twice the distance of
  HMC's halves from each other: disagreement ``1 - agreement`` ≤ 2 × the halves' and TV ≤ 2 × the halves' TV. (Both
  carry Monte Carlo error, which falls as ``(1/E + 1/E_HMC)^½`` in the effective draws; the halves have 2 × 1000
  NUTS draws each, HMC in all 4000, so an exact sampler passes with about 270 effective draws in all.)

Each table starts with **HMC against itself**: NUTS's chains 1-2 against 3-4 (the same metrics, the halves in the
roles of method and reference). A NUTS reference **counts** only if its halves agree: in regression when they
pass hands_off's rule; in classification when their agreement is ≥ 0.95 and their TV ≤ 0.05. The output says
whether it does.

**Targets** (:func:`targets`):

1. **MLP** (regression): ``benchmarks.hands_off``'s MLP exactly, ``sin(x) + N(0, 0.3²)`` on 2000 points
   ``x ~ U(-3, 3)``, one hidden layer of 20 tanh units (61 weights), N(0, 1) priors, minibatch 100, its 50 test
   inputs ``linspace(-4, 4, 50)`` (36 inside the data's range [-3, 3], 14 outside) and its cached NUTS reference
   ``benchmarks/results/mlp_nuts.npz`` (4 × 1000 draws after 1000 warm-up); 20,000 warm-up + 200,000 kept steps
   per chain, thinned by 100: the hands-off table's lengths.
2. **a9a-BNN** (classification): the first 2000 training rows of a9a (``models.datasets.load_a9a()``), projected
   on their first 10 principal components (each scaled to unit variance on those rows); ``models.bnn.classifier``
   with one hidden layer of 10 tanh units and 2 classes (132 weights), N(0, 1) priors, a categorical likelihood in
   a plate subsampled to 100 rows; compared on all 16 281 test rows. NUTS on the full data (4 chains one after the
   other, 1000 warm-up + 1000 draws each, seed 0): its per-chain model averages at the test rows are cached in
   ``benchmarks/results/bnn_predictive_a9a_nuts.npz`` (``--refresh-nuts`` reruns it). The same lengths as the MLP.
   (A 10-class network on the shipped MNIST subset's first 10 principal components, 5 or 10 hidden units, was tried
   first and left: its NUTS chains stayed in modes whose predictions differ, TV up to 0.10-0.13 between two chains
   (with 5 units against 0.01-0.06 between one chain's halves), the halves' agreement 0.94-0.95 with TV 0.06-0.09, so
   that the reference would not count. On a9a NUTS's chains differ by their Monte Carlo error: TV 0.004-0.006 between
   chains, 0.006-0.008 between one chain's halves, in a 4 × (200 + 400) trial.)

Usage (from the repository root)::

    .venv/bin/python -m benchmarks.bnn_predictive                   # both tables (35 min on one core; NUTS +5)
    .venv/bin/python -m benchmarks.bnn_predictive --quick           # 1/10 of the steps, a smoke check
    .venv/bin/python -m benchmarks.bnn_predictive --targets MLP --kernels SGLD SGNHT --rows default svrg
    .venv/bin/python -m benchmarks.bnn_predictive --tables          # print the tables of the results file

Writes ``benchmarks/results/bnn_predictive.json`` (``bnn_predictive_quick.json`` with ``--quick``) after every
row; a run of a subset updates the rows it ran. Prints one Markdown table per target.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from statistics import NormalDist
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import numpyro  # noqa: E402

from benchmarks import hands_off as h  # noqa: E402
from benchmarks.a9a_vs_nuts import machine  # noqa: E402
from models.bnn import classifier, predict_proba  # noqa: E402
from models.datasets import load_a9a  # noqa: E402
from ppl_sgmcmc import diagnostics  # noqa: E402

RESULTS = h.RESULTS
KERNELS = h.KERNELS
#: The rows of each table: label -> ``(kernel options, (warm-up factor, kept-steps factor), kernels)``; ``None``:
#: every kernel.
ROWS: dict[str, tuple[dict[str, Any], tuple[int, int], tuple[str, ...] | None]] = {
    "default": ({}, (1, 1), None),
    "minibatch": ({"gradient": "minibatch"}, (1, 1), ("SGHMC", "SGNHT")),  # their default is SVRG's gradient
    "svrg": ({"gradient": "svrg"}, (1, 1), ("SGLD", "PSGLD", "SGFS", "CSGLD")),
    "svrg 4x": ({"gradient": "svrg"}, (1, 4), ("SGHMC", "SGNHT")),
    "svrg 4x, 4x warm-up": ({"gradient": "svrg"}, (4, 4), ("SGHMC", "SGNHT")),
    "matrix thermostat, minibatch": ({"thermostat": "matrix", "gradient": "minibatch"}, (1, 1), ("SGNHT",)),
    "matrix thermostat, svrg": ({"thermostat": "matrix", "gradient": "svrg"}, (1, 1), ("SGNHT",)),
}  # fmt: skip
MLP_NOISE = 0.3
QUANTILE_LEVELS = (np.arange(1000) + 0.5) / 1000
NOISE_NODES = 20  # the noise's quadrature nodes per draw in the predictive's quantiles
#: A classification reference counts when its halves agree at least this well.
SELF_AGREEMENT, SELF_TV = 0.95, 0.05
SELF_FACTOR = 2.0  # a classification cell passes within this many times HMC's halves' distance
A9A_ROWS, A9A_COMPONENTS, A9A_HIDDEN, A9A_NUTS_DRAWS = 2000, 10, 10, 1000
A9A_NUTS = RESULTS / "bnn_predictive_a9a_nuts.npz"
WARNING_CHARS = 150


# --- the metrics -----------------------------------------------------------------------------------------
def predictive_quantiles(f: np.ndarray, sigma: float) -> np.ndarray:
    """The quantiles at :data:`QUANTILE_LEVELS` of the predictive ``y = f(x; θ) + σ ε`` at each test input, from
    draws ``f`` of shape ``(draws, inputs)``, each draw contributing ``f + σ ε_r`` at the :data:`NOISE_NODES`
    normal quantiles ``ε_r = Φ⁻¹((r + ½)/R)`` (a quadrature of the noise, the same for every sample, so that only
    the draws' Monte Carlo error is left): ``(levels, inputs)``."""
    eps = np.array([NormalDist().inv_cdf((r + 0.5) / NOISE_NODES) for r in range(NOISE_NODES)])
    return np.stack([np.quantile((f[:, j, None] + sigma * eps).ravel(), QUANTILE_LEVELS) for j in range(f.shape[1])],
                    axis=1)  # fmt: skip


def wasserstein2(f: np.ndarray, f_ref: np.ndarray, sigma: float) -> np.ndarray:
    """Per test input, the 1-D W2 distance between the predictives of draws ``f`` and ``f_ref`` (``(draws,
    inputs)`` each), from their quantiles."""
    diff = predictive_quantiles(f, sigma) - predictive_quantiles(f_ref, sigma)
    return np.sqrt(np.mean(diff**2, axis=0))


def regression_metrics(f: np.ndarray, f_ref: np.ndarray, inside: np.ndarray) -> dict[str, Any]:
    """W2 (mean over the inputs inside and outside the data's range), and hands_off's mean errors and sd ratios
    (:func:`benchmarks.hands_off.compare`) of draws ``f`` against ``f_ref``, both ``(draws, inputs)``."""
    w2 = wasserstein2(f, f_ref, MLP_NOISE)
    out = h.compare(f.mean(0), f.std(0, ddof=1), f_ref.mean(0), f_ref.std(0, ddof=1))
    return {"w2_inside": float(w2[inside].mean()), "w2_outside": float(w2[~inside].mean()),
            "w2_max": float(w2.max()), "w2": w2.tolist(), **out}  # fmt: skip


def classification_metrics(p: np.ndarray, p_ref: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Agreement and total variation of model averages ``p`` against ``p_ref`` (``(rows, classes)`` each), and
    ``p``'s accuracy and mean log predictive density on the test ``labels``."""
    rows = np.arange(labels.size)
    return {"agreement": float(np.mean(p.argmax(1) == p_ref.argmax(1))),
            "tv": float(np.mean(0.5 * np.abs(p - p_ref).sum(1))),
            "accuracy": float(np.mean(p.argmax(1) == labels)),
            "log_density": float(np.mean(np.log(np.maximum(p[rows, labels], 1e-30))))}  # fmt: skip


# --- the targets -----------------------------------------------------------------------------------------
@dataclasses.dataclass
class Predictive:
    """A target of this table: hands_off's :class:`~benchmarks.hands_off.Target` (model, data, lengths) with
    how the draws become predictions and how those are compared with HMC's."""

    name: str
    kind: str  # "regression" or "classification"
    target: h.Target
    #: draws ``{site: (chains, draws, ...)}`` -> predictions: ``f`` ``(draws, inputs)`` or the model average
    predict: Callable[[dict[str, np.ndarray]], np.ndarray]
    #: HMC's predictions (all chains) and its halves' (chains 1-2, 3-4)
    reference: np.ndarray
    halves: tuple[np.ndarray, np.ndarray]
    metrics: Callable[[np.ndarray, np.ndarray], dict[str, Any]]
    ref_label: str
    ref_seconds: float
    note: str


def mlp_predictive(steps: tuple[int, int, int]) -> Predictive:
    """hands_off's MLP target and NUTS reference, compared in predictive space."""
    target = h.mlp_target(steps, False)
    nuts, seconds = h.nuts_reference(RESULTS / "mlp_nuts.npz", h.mlp_model, target.args, 1000, False,
                                     h._mlp_predictions)  # fmt: skip
    f = nuts["f"]  # (chains, draws, inputs)
    inside = np.abs(h.MLP_TEST[:, 0]) <= 3.0
    inputs = f.shape[-1]

    def predict(samples: dict[str, np.ndarray]) -> np.ndarray:
        return h._mlp_predictions(samples)["f"].reshape(-1, inputs).astype(np.float64)

    return Predictive("MLP", "regression", target, predict, f.reshape(-1, inputs),
                      (f[:2].reshape(-1, inputs), f[2:].reshape(-1, inputs)),
                      lambda a, b: regression_metrics(a, b, inside), "HMC (NUTS), chains 1-2 against 3-4", seconds,
                      f"Predictive of y = f(x) + N(0, 0.3²) at 50 test inputs in [-4, 4]: {int(inside.sum())} inside "
                      f"the data's range [-3, 3], {int((~inside).sum())} outside. NUTS: {f.shape[0]} chains × "
                      f"{f.shape[1]} draws ({seconds:.0f} s).")  # fmt: skip


def a9a_data() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The first :data:`A9A_ROWS` training rows of a9a and all its test rows, on the training rows' first
    :data:`A9A_COMPONENTS` principal components, each scaled to unit variance there: ``(X, y, X_test, y_test)``,
    labels ``int32`` 0/1."""
    X, y, X_test, y_test = load_a9a()
    X, y = X[:A9A_ROWS], y[:A9A_ROWS]
    mean = X.mean(0)
    _, s, vt = np.linalg.svd(X - mean, full_matrices=False)
    project = vt[:A9A_COMPONENTS].T / (s[:A9A_COMPONENTS] / math.sqrt(X.shape[0]))
    return (((X - mean) @ project).astype(np.float32), y.astype(np.int32),
            ((X_test - mean) @ project).astype(np.float32), y_test.astype(np.int32))  # fmt: skip


def a9a_model(X: jax.Array, y: jax.Array, batch_size: int | None = h.BATCH) -> None:
    """``models.bnn.classifier`` with one hidden layer of :data:`A9A_HIDDEN` tanh units, 2 classes, N(0, 1)."""
    classifier(X, y, hidden=(A9A_HIDDEN,), num_classes=2, activation="tanh", batch_size=batch_size)


def a9a_predictive(steps: tuple[int, int, int], refresh: bool) -> Predictive:
    """The a9a network and its NUTS reference (per-chain model averages at the test rows, cached)."""
    X, y, X_test, y_test = a9a_data()
    args = (jnp.asarray(X), jnp.asarray(y))
    test = jnp.asarray(X_test)

    def chain_averages(samples: dict[str, Any]) -> dict[str, np.ndarray]:
        chains = next(iter(samples.values())).shape[0]
        return {"p": np.stack([np.asarray(predict_proba({k: v[c] for k, v in samples.items()}, test,
                                                        activation="tanh")) for c in range(chains)])}  # fmt: skip

    nuts, seconds = h.nuts_reference(A9A_NUTS, a9a_model, args, A9A_NUTS_DRAWS, refresh, chain_averages)
    p = nuts["p"]  # (chains, rows, classes)

    def predict(samples: dict[str, np.ndarray]) -> np.ndarray:
        flat = {k: jnp.asarray(v).reshape(-1, *v.shape[2:]) for k, v in samples.items()}
        return np.asarray(predict_proba(flat, test, activation="tanh"), np.float64)

    def moments(samples: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        return predict(samples).ravel(), np.ones(p[0].size)  # run_cell's hands_off numbers, dropped in run_row

    target = h.Target("a9a-BNN", a9a_model, args, X.shape[0], *steps, moments=moments, ref_mean=p.mean(0).ravel(),
                      ref_sd=np.ones(p[0].size), self_check=(p[0], p[0], p[0], p[0]), self_label="", note="")  # fmt: skip
    weights = A9A_COMPONENTS * A9A_HIDDEN + A9A_HIDDEN + A9A_HIDDEN * 2 + 2
    return Predictive("a9a-BNN", "classification", target, predict, p.mean(0), (p[:2].mean(0), p[2:].mean(0)),
                      lambda a, b: classification_metrics(a, b, y_test), "HMC (NUTS), chains 1-2 against 3-4",
                      seconds, f"The first {A9A_ROWS} training rows of a9a on {A9A_COMPONENTS} principal components; "
                      f"{A9A_COMPONENTS}-{A9A_HIDDEN}-2 tanh network, {weights} weights, categorical likelihood; "
                      f"compared on the {y_test.size:,} test rows. NUTS: {p.shape[0]} chains × (1000 + "
                      f"{A9A_NUTS_DRAWS}) draws ({seconds:.0f} s).")  # fmt: skip


def targets(names: list[str], quick: bool, refresh: bool) -> list[Predictive]:
    """The targets named, with their lengths ``(warm-up steps, kept steps, thinning)`` per chain: the hands-off
    table's (20,000, 200,000, 100), or a tenth of the steps thinned by 20 with ``quick``."""
    steps = (2_000, 20_000, 20) if quick else (20_000, 200_000, 100)
    make = {"MLP": lambda: mlp_predictive(steps), "a9a-BNN": lambda: a9a_predictive(steps, refresh)}
    return [make[name]() for name in names]


# --- the rows --------------------------------------------------------------------------------------------
def self_check(pred: Predictive) -> dict[str, Any]:
    """HMC's halves against each other, and whether the reference counts (the module docstring)."""
    out = pred.metrics(*pred.halves)
    if pred.kind == "regression":
        counts = bool(out["pass"])
    else:
        counts = out["agreement"] >= SELF_AGREEMENT and out["tv"] <= SELF_TV
        out["accuracy"] = pred.metrics(pred.reference, pred.reference)["accuracy"]  # HMC's own model average
    return {"label": pred.ref_label, "seconds": pred.ref_seconds, "counts": counts, **out}


def run_row(
    kernel: str, pred: Predictive, options: dict[str, Any], factor: tuple[int, int], scale: dict[str, Any]
) -> dict[str, Any]:
    """One run: hands_off's cell (wall clock, step sizes, warnings, ...), its predictive metrics against HMC and
    whether it passes (``scale``: HMC against itself; ``factor``: the warm-up's and the kept steps' multiples)."""
    target = dataclasses.replace(pred.target, warmup=pred.target.warmup * factor[0],
                                 samples=pred.target.samples * factor[1])  # fmt: skip
    try:
        cell, run = h.run_cell(kernel, target, options)
    except (TypeError, ValueError) as err:  # an option the kernel does not take
        return {"refused": f"{type(err).__name__}: {str(err).splitlines()[0]}", "options": options}
    cell["options"] = options
    cell["warmup_steps"], cell["kept_steps"] = target.warmup, target.samples
    cell["warnings"] = [w[:WARNING_CHARS] for w in cell.get("warnings", [])]
    if run is None or cell.get("nonfinite"):
        return cell
    if pred.kind == "classification":
        for key in ("mean_err_median", "mean_err_max", "sd_ratio_median", "sd_ratio_min", "sd_ratio_max", "score"):
            cell.pop(key, None)
    metrics = pred.metrics(pred.predict(run[1]), pred.reference)
    cell.update(metrics)
    judged = diagnostics.verdict(run[0], warn=False, judge="predictions")  # the verdict a network's user asks for
    cell["predictions_verdict"] = {"ok": judged.ok, "rhat": judged.rhat, "ess_bulk": judged.ess_bulk}
    if pred.kind == "classification":
        cell["pass"] = (1 - metrics["agreement"] <= SELF_FACTOR * (1 - scale["agreement"])
                        and metrics["tv"] <= SELF_FACTOR * scale["tv"])  # fmt: skip
    return cell


# --- the tables ------------------------------------------------------------------------------------------
def _steps(cell: dict[str, Any]) -> str:
    steps = cell.get("step_size")
    if not steps:
        return "—"
    if all(s is None or math.isinf(s) for s in steps):
        return "ε = ∞ (α = 0)"
    return ", ".join(h._fmt(s, 2) for s in steps)


#: The warnings' kinds, by a phrase of their text (the full texts are in the results file).
WARNING_KINDS = {"noise ratio is": "noise", "ran off": "run-off", "not a sample of the posterior yet": "verdict",
                 "too short for reliable": "verdict (short)", "preconditioner changed": "preconditioner",
                 "rejected as non-finite": "rejections", "is diverging": "runaway", "has not moved": "frozen",
                 "is not larger than the number of parameters": "SGFS's Fisher",
                 "agree on the model's predictions but not on its parameters": "verdict (symmetric)"}  # fmt: skip


def _warnings(cell: dict[str, Any]) -> str:
    found = cell.get("warnings") or []
    kinds = [next((kind for phrase, kind in WARNING_KINDS.items() if phrase in w), w[:40]) for w in found]
    return ", ".join(kinds) if kinds else "none"


def _predictions_verdict(cell: dict[str, Any]) -> str:
    judged = cell.get("predictions_verdict")
    if judged is None:
        return "—"
    return "pass" if judged["ok"] else f"fail (R-hat {judged['rhat']:.3f}, ESS {judged['ess_bulk']:.0f})"


def table_row(kind: str, kernel: str, row: str, cell: dict[str, Any]) -> str:
    columns = 9 if kind == "regression" else 8  # after the kernel and row
    if "refused" in cell:
        return f"| {kernel} | {row} | refused: {cell['refused'][:160]} |" + " |" * (columns - 1)
    if cell.get("nonfinite"):
        return (f"| {kernel} | {row} | non-finite draws |" + " |" * (columns - 5)
                + f" {cell['seconds']:.0f} | {_steps(cell)} | **fail** | {_warnings(cell)} | — |")  # fmt: skip
    verdict = "pass" if cell["pass"] else "**fail**"
    seconds = f"{cell['seconds']:.0f}"
    if kind == "regression":
        return (f"| {kernel} | {row} | {cell['w2_inside']:.4f} | {cell['w2_outside']:.4f} | "
                f"{cell['mean_err_median']:.3f} / {cell['mean_err_max']:.3f} | "
                f"{cell['sd_ratio_median']:.3f} ({cell['sd_ratio_min']:.3f}-{cell['sd_ratio_max']:.3f}) | "
                f"{seconds} | {_steps(cell)} | {verdict} | {_warnings(cell)} | {_predictions_verdict(cell)} |")  # fmt: skip
    return (f"| {kernel} | {row} | {cell['agreement']:.3f} | {cell['tv']:.4f} | {cell['accuracy']:.3f} | "
            f"{seconds} | {_steps(cell)} | {verdict} | {_warnings(cell)} | {_predictions_verdict(cell)} |")  # fmt: skip


def print_table(name: str, entry: dict[str, Any]) -> None:
    """A target's Markdown table from its results ``entry``."""
    run, kind, ref = entry["settings"], entry["kind"], entry["reference"]
    print(f"\n### {name}: {run['chains']} chains × ({run['warmup_steps']:,} warm-up + {run['sample_steps']:,}) "
          f"steps, thinned by {run['thin']} (\"4x\": 4 × the kept steps; \"4x warm-up\": 4 × the warm-up's). "
          f"{run['note']}\n")  # fmt: skip
    if kind == "regression":
        print("| kernel | row | W2 inside | W2 outside | mean err / HMC sd: median / max | sd ratio: median (min-max) "
              "| wall (s) | step size(s) | pass | warnings | verdict on the predictions |")  # fmt: skip
        print("|---|---|---:|---:|---:|---:|---:|---|---|---|---|")
    else:
        print("| kernel | row | agreement | TV | accuracy | wall (s) | step size(s) | pass | warnings | "
              "verdict on the predictions |")  # fmt: skip
        print("|---|---|---:|---:|---:|---:|---|---|---|---|")
    counts = "counts" if ref["counts"] else "**does not count**"
    hmc = {**ref, "pass": ref["counts"], "step_size": None, "warnings": []}
    print(table_row(kind, "HMC", f"chains 1-2 vs 3-4 ({counts})", hmc))
    for row in ROWS:
        for kernel in KERNELS:
            cell = entry["rows"].get(row, {}).get(kernel)
            if cell is not None:
                print(table_row(kind, kernel, row, cell))
    if kind == "regression":
        print(f"\nHMC's halves: W2 inside {ref['w2_inside']:.4f}, outside {ref['w2_outside']:.4f} (the scale of "
              "Monte Carlo error); the reference counts when its halves pass hands_off's rule.")  # fmt: skip
    else:
        print(f"\nHMC's own model average: test accuracy {ref['accuracy']:.3f}. A row passes when agreement ≥ "
              f"{1 - SELF_FACTOR * (1 - ref['agreement']):.4f} and TV ≤ {SELF_FACTOR * ref['tv']:.4f} ({SELF_FACTOR:g} "
              f"× HMC's halves' distance); the reference counts when its halves' agreement ≥ {SELF_AGREEMENT} and TV ≤ "
              f"{SELF_TV}.")  # fmt: skip


# --- the driver ------------------------------------------------------------------------------------------
def save(out: Path, name: str, entry: dict[str, Any], quick: bool) -> dict[str, Any]:
    """Merge a target's ``entry`` into the results file ``out`` (the rows it did not run kept)."""
    text = out.read_text() if out.exists() else ""
    results = json.loads(text) if text else {"targets": {}}
    previous = results["targets"].get(name, {})
    rows = {row: {**previous.get("rows", {}).get(row, {}), **cells} for row, cells in entry["rows"].items()}
    results["targets"][name] = {**previous, **entry, "rows": {**previous.get("rows", {}), **rows}}
    results["settings"] = {"date": datetime.date.today().isoformat(), "machine": machine(), "jax": jax.__version__,
                           "numpyro": numpyro.__version__, "quick": quick}  # fmt: skip
    out.write_text(json.dumps(h.finite(results), indent=1) + "\n")
    return results


def run_target(
    pred: Predictive, kernels: list[str], rows: list[str], save_entry: Callable[[dict[str, Any]], Any]
) -> dict[str, Any]:
    """The target's rows for ``kernels``, saved after each run."""
    t = pred.target
    entry: dict[str, Any] = {
        "kind": pred.kind,
        "settings": {"warmup_steps": t.warmup, "sample_steps": t.samples, "thin": t.thin, "chains": h.CHAINS,
                     "batch_size": h.BATCH, "note": pred.note},
        "reference": self_check(pred),
        "rows": {},
    }  # fmt: skip
    counts = "counts" if entry["reference"]["counts"] else "DOES NOT COUNT"
    print(f"  {pred.name}: HMC against itself {_brief(pred.kind, entry['reference'])}, {counts}", flush=True)
    for row in rows:
        options, factor, only = ROWS[row]
        for kernel in kernels:
            if only is not None and kernel not in only:
                continue
            cell = run_row(kernel, pred, options, factor, entry["reference"])
            entry["rows"].setdefault(row, {})[kernel] = cell
            print(f"    {kernel} {row}: {_brief(pred.kind, cell)}", flush=True)
            save_entry(entry)
    return entry


def _brief(kind: str, cell: dict[str, Any]) -> str:
    if "refused" in cell:
        return f"refused: {cell['refused'][:120]}"
    if cell.get("nonfinite"):
        return f"non-finite draws ({cell['seconds']:.0f} s)"
    if kind == "regression":
        text = (f"W2 {cell['w2_inside']:.4f} / {cell['w2_outside']:.4f}, err {cell['mean_err_max']:.3f}, sd ratio "
                f"{cell['sd_ratio_min']:.3f}-{cell['sd_ratio_max']:.3f}")  # fmt: skip
    else:
        text = f"agreement {cell['agreement']:.3f}, TV {cell['tv']:.4f}, accuracy {cell['accuracy']:.3f}"
    if "seconds" in cell and "step_size" in cell:
        text += f", {cell['seconds']:.0f} s, steps {_steps(cell)}, warnings {len(cell.get('warnings', []))}"
    return text + (f", {'pass' if cell['pass'] else 'fail'}" if "pass" in cell else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1/10 of the steps (thinned by 20), a smoke check")
    parser.add_argument("--targets", nargs="+", default=["MLP", "a9a-BNN"], choices=["MLP", "a9a-BNN"])
    parser.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=KERNELS)
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    parser.add_argument("--tables", action="store_true", help="print the tables of the results file, run nothing")
    parser.add_argument("--refresh-nuts", action="store_true", help="rerun NUTS on a9a-BNN (about 7 min on one core)")
    args = parser.parse_args()
    h.run_and_report(RESULTS / ("bnn_predictive_quick.json" if args.quick else "bnn_predictive.json"), args.quick,
                     args.tables, lambda: targets(args.targets, args.quick, args.refresh_nuts),
                     lambda pred, checkpoint: run_target(pred, args.kernels, args.rows, checkpoint), save,
                     print_table)  # fmt: skip


if __name__ == "__main__":
    main()
