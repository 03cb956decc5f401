#!/usr/bin/env python
"""The UCI regression table of Deng, Lin & Liang, "A Contour Stochastic Gradient Langevin Dynamics Algorithm
for Simulations of Multi-modal Distributions" (NeurIPS 2020), Table 1: test RMSE of SGLD, CSGLD and CSGHMC on a
Bayesian network with one hidden layer of 50 ReLU units (``models.bnn.regressor``: ``N(0, 1)`` weights, noise
precision ``Gamma(6, 6)``) on energy, concrete, yacht and wine-quality-red, 10 % of the rows held out
(``models.datasets.split_uci``, standardised by the training part), minibatch 50.

The paper's settings (its Section 4.2): 5000 epochs, learning rate ``ε = 5e-6`` (the step of its eq. (8) on
the ``N/n``-scaled minibatch energy, which is this library's ``h``), energy bandwidth ``Δu = 100``, the
temperature ``τ`` and flattening ``ζ`` of its Table 1 per set (:data:`TAU_ZETA`, ``τ`` also for SGLD), and each
run's prediction the model average of 50 draws (here evenly spaced over the second half of the run; the first
half is burn-in, in which CSGLD calibrates ``u_min``). CSGHMC: the paper's "momentum term 0.9" with the
other settings inherited, read in SGD-with-momentum's parametrisation of SGHMC (Chen, Fox & Guestrin, ICML 2014,
Section 3.3): learning rate ``ε = h² = 5e-6`` and ``α = h A = 0.1``. Not the paper's: its ``L2`` coefficient ``1e-4`` and its
noise model (here the ``N(0, 1)`` prior and the ``Gamma(6, 6)`` precision of ``models.bnn.regressor``). The RMSE
(original units) is that of the model average, importance-weighted by ``log_weight`` for CSGLD and CSGHMC
(:func:`models.bnn.predict_regression`). Start ``init_to_uniform(radius=0.1)``.

Usage (repository root; the data are the shipped ``models/data/uci.npz``, copies of ``../shared/data/uci``)::

    .venv/bin/python -m benchmarks.bnn_uci                # the paper's 10 splits and 5000 epochs
    .venv/bin/python -m benchmarks.bnn_uci --quick        # 1 split, 500 epochs, energy and yacht

Writes ``benchmarks/results/bnn_uci.json`` (``bnn_uci_quick.json``) and a Markdown table on stdout.
"""

from __future__ import annotations

import argparse
import json
import math
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
DRAWS = 50
LEARNING_RATE = 5e-6
ENERGY_GAP = 100.0
TAU_ZETA = {"energy": (1.0, 1.0), "concrete": (5.0, 1.0), "yacht": (1.0, 2.5), "wine-quality-red": (5.0, 10.0)}
SAMPLERS = {"SGLD": SGLD, "CSGLD": CSGLD, "CSGHMC": CSGHMC}


def kernel(sampler: str, name: str, per_draw: int):
    """The sampler with the paper's hyper-parameters for the set ``name``, ``per_draw`` steps a draw."""
    tau, zeta = TAU_ZETA[name]
    options: dict = {"temperature": tau, "steps_per_sample": per_draw, "init_strategy": init_to_uniform(radius=0.1)}
    if sampler != "SGLD":
        options.update(zeta=zeta, energy_gap=ENERGY_GAP)
    if sampler == "CSGHMC":
        h = math.sqrt(LEARNING_RATE)
        return CSGHMC(bnn.regressor, step_size=h, friction=0.1 / h, **options)
    return SAMPLERS[sampler](bnn.regressor, step_size=LEARNING_RATE, **options)


def rmse(name: str, sampler: str, seed: int, epochs: int) -> float:
    """The test RMSE of one sampler on one split."""
    split = split_uci(name, seed)
    per_draw = max(1, (epochs // 2) * max(1, split.X_train.shape[0] // BATCH) // DRAWS)
    mcmc = MCMC(kernel(sampler, name, per_draw), num_warmup=DRAWS, num_samples=DRAWS, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(seed), split.X_train, split.y_train, hidden=(50,), batch_size=BATCH,
             extra_fields=("log_weight",) if sampler != "SGLD" else ())  # fmt: skip
    log_weights = mcmc.get_extra_fields()["log_weight"] if sampler != "SGLD" else None
    mean, _ = bnn.predict_regression(mcmc.get_samples(), split.X_test, log_weights=log_weights)
    return float(split.y_std * np.sqrt(np.mean((np.asarray(mean) - split.y_test) ** 2)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--epochs", type=int, default=5000)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    names = ("energy", "yacht") if args.quick else UCI_NAMES
    seeds, epochs = (1, 500) if args.quick else (args.seeds, args.epochs)
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
        cells = [f"{np.mean(v):.2f} ± {np.std(v):.2f}" for v in row.values()]  # ± sd over splits, as the paper
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
