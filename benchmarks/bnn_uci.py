#!/usr/bin/env python
"""The UCI regression table of Deng, Lin & Liang, "A Contour Stochastic Gradient Langevin Dynamics Algorithm
for Simulations of Multi-modal Distributions" (NeurIPS 2020), Table 1: test RMSE of SGLD, CSGLD and CSGHMC on a
Bayesian network with one hidden layer of 50 ReLU units (``models.bnn.regressor``: ``N(0, 1)`` weights, noise
precision ``Gamma(6, 6)``) on energy, concrete, yacht and wine-quality-red, 10 % of the rows held out
(``models.datasets.split_uci``, standardised by the training part), minibatch 50.

Each sampler: ``--epochs`` passes over the training rows, the first half burn-in (CSGLD calibrates its energy
grid there), then one draw per epoch; the RMSE (original units) is that of the model average of the draws,
importance-weighted by ``log_weight`` for CSGLD and CSGHMC (:func:`models.bnn.predict_regression`).
Fewer seeds and epochs than the paper's (10 splits; its epoch counts), stated with the results. Step sizes
(ours, the paper's are per-datum learning rates of a different scaling): SGLD and CSGLD ``h = 1e-3``,
CSGHMC ``h = 3e-3`` (friction 1); start ``init_to_uniform(radius=0.1)``.

Usage (repository root; the data are the shipped ``models/data/uci.npz``, copies of ``../shared/data/uci``)::

    .venv/bin/python -m benchmarks.bnn_uci --seeds 3 --epochs 200
    .venv/bin/python -m benchmarks.bnn_uci --quick      # 1 seed, 40 epochs, energy and yacht

Writes ``benchmarks/results/bnn_uci.json`` (``bnn_uci_quick.json``) and a Markdown table on stdout.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import jax
import numpy as np
from numpyro.infer import MCMC, init_to_uniform

from models import bnn
from models.datasets import UCI_NAMES, split_uci
from ppl_sgmcmc.numpyro import CSGHMC, CSGLD, SGLD

RESULTS = Path(__file__).resolve().parent / "results"
BATCH = 50
SAMPLERS = {"SGLD": (SGLD, 1e-3), "CSGLD": (CSGLD, 1e-3), "CSGHMC": (CSGHMC, 3e-3)}


def rmse(name: str, sampler: str, seed: int, epochs: int) -> float:
    """The test RMSE of one sampler on one split."""
    split = split_uci(name, seed)
    per_epoch = max(1, split.X_train.shape[0] // BATCH)
    kind, h = SAMPLERS[sampler]
    kernel = kind(bnn.regressor, step_size=h, steps_per_sample=per_epoch, init_strategy=init_to_uniform(radius=0.1))
    mcmc = MCMC(kernel, num_warmup=epochs // 2, num_samples=epochs - epochs // 2, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(seed), split.X_train, split.y_train, hidden=(50,), batch_size=BATCH,
             extra_fields=("log_weight",) if sampler != "SGLD" else ())  # fmt: skip
    log_weights = mcmc.get_extra_fields()["log_weight"] if sampler != "SGLD" else None
    mean, _ = bnn.predict_regression(mcmc.get_samples(), split.X_test, log_weights=log_weights)
    return float(split.y_std * np.sqrt(np.mean((np.asarray(mean) - split.y_test) ** 2)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    names = ("energy", "yacht") if args.quick else UCI_NAMES
    seeds, epochs = (1, 40) if args.quick else (args.seeds, args.epochs)
    out: dict = {"seeds": seeds, "epochs": epochs, "rmse": {}, "seconds": 0.0}
    start = time.perf_counter()
    for name in names:
        for sampler in SAMPLERS:
            values = [rmse(name, sampler, seed, epochs) for seed in range(seeds)]
            out["rmse"].setdefault(name, {})[sampler] = values
            print(f"{name:17s} {sampler:7s} RMSE {np.mean(values):.3f} ± {np.std(values):.3f}", flush=True)
    out["seconds"] = time.perf_counter() - start
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"bnn_uci{'_quick' if args.quick else ''}.json").write_text(json.dumps(out, indent=1))
    print("\n| data set | " + " | ".join(SAMPLERS) + " |\n|---|" + "---|" * len(SAMPLERS))
    for name, row in out["rmse"].items():
        cells = [f"{np.mean(v):.2f} ± {np.std(v) / np.sqrt(len(v)):.2f}" for v in row.values()]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
