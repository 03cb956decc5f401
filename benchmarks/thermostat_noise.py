"""What the noise ratio says about SGNHT: is ``c = 1/D`` the right scale when the thermostat absorbs the noise?

The noise ratio (``ppl_sgmcmc.noise``) of coordinate ``k`` is ``r_k = h c_k V_kk / (2 τ)``: ``V`` the minibatch
gradient's noise covariance in the rule's coordinates, ``c = 1`` for SGLD and ``c = 1/D`` for SGNHT (``D`` its
injected diffusion). For SGLD, ``1 + r_k`` is the first-order variance inflation along ``k`` (Welling & Teh, ICML
2011). SGNHT's thermostat ``ξ`` adapts its friction to the total noise (Ding, Fang, Babbush, Chen, Skeel & Neven,
"Bayesian Sampling Using Stochastic Gradient Thermostats", NeurIPS 2014): the scalar thermostat settles at ``ξ ≈ D
+ h mean_k(V_kk)/2``, the multivariate one of Li, Chen, Fan & Carin (AAAI 2016) at ``ξ_k ≈ D + h V_kk/2``. This
script measures what is left.

**Posterior.** ``θ ∈ R^4`` with prior ``N(0, Λ⁻¹)`` and ``N = 10 000`` rows ``y_i ~ N(θ, N (I - Λ)⁻¹)``, so that the
posterior is ``N(μ, I)`` exactly, and the minibatch (``n = 100``, with replacement) gradient's noise covariance is
``V = (N/n)(I - Λ)`` in the posterior's own coordinates. ``Λ = Q diag(0.1, 0.5, 0.9, 0.99) Qᵀ``: with ``Q = I`` the
noise is **diagonal** (``V_kk`` = 90, 50, 10, 1), with a random rotation ``Q`` it is **correlated**.

**Runs.** SGLD, SGHMC (friction ``A = 1``, which leaves the noise in the draws as SGLD does, with ``c = 1/A``), SGNHT
(multivariate thermostat, the default) and SGNHT with the scalar thermostat, each at hand-set step sizes (no warm-up
tuning, the identity metric), 4 chains of 2000 + 200 000 steps from ``μ``, every 20th kept. Per run: the draws'
covariance ``C`` against ``I`` (its diagonal and its eigenvalues), ``h V_kk / 2`` (the noise ratio with ``c = 1`` or
``1/A`` or ``1/D``, ``A = D = 1``), the noise ratio the kernel reported (median over the draws) and, for the rules
with a momentum, the eigenvalues of the kept momenta's covariance: the **kinetic temperature**, ``τ I`` without
gradient noise, whose excess along a direction is the heat the friction leaves there. The Monte Carlo error of a
variance ratio here is about 2 %.

Usage (from the repository root; about 3 minutes on one core)::

    .venv/bin/python -m benchmarks.thermostat_noise

Prints the table for ``RESULTS.md`` (Bayesian neural networks: "The noise ratio of SGNHT") and writes
``benchmarks/results/thermostat_noise.json``.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import init_to_value

from ppl_sgmcmc.numpyro import MCMC, SGHMC, SGLD, SGNHT

N, BATCH, LAMBDA = 10_000, 100, np.array([0.1, 0.5, 0.9, 0.99])
#: The step sizes of each sampler: SGLD's and SGHMC's ``h V_kk / 2`` reach 0.225 and 0.9, SGNHT's 0.45, 2.25 and 9.
STEP_SIZES = {"SGLD": (0.005, 0.02), "SGHMC": (0.005, 0.02), "SGNHT": (0.01, 0.05, 0.2),
              "SGNHT, scalar thermostat": (0.01, 0.05, 0.2)}  # fmt: skip
STEPS, THIN, WARMUP, CHAINS = 200_000, 20, 2_000, 4
RESULTS = Path(__file__).resolve().parent / "results" / "thermostat_noise.json"


def posterior(correlated: bool) -> dict[str, Any]:
    """The model's arrays, its data, the exact posterior mean and the noise covariance ``V``."""
    d = LAMBDA.size
    Q = np.linalg.qr(np.random.default_rng(1).normal(size=(d, d)))[0] if correlated else np.eye(d)
    Lam = Q @ np.diag(LAMBDA) @ Q.T
    precision = (np.eye(d) - Lam) / N  # the likelihood's precision per row
    Y = np.random.default_rng(0).multivariate_normal(np.zeros(d), np.linalg.inv(precision), size=N)
    return {"Lam": jnp.asarray(Lam, jnp.float32), "precision": jnp.asarray(precision, jnp.float32),
            "Y": jnp.asarray(Y, jnp.float32), "mean": (np.eye(d) - Lam) @ Y.mean(0),
            "V": (N / BATCH) * (np.eye(d) - Lam)}  # fmt: skip


def model(Y: jax.Array, Lam: jax.Array, precision: jax.Array) -> None:
    theta = numpyro.sample("theta", dist.MultivariateNormal(jnp.zeros(Lam.shape[0]), precision_matrix=Lam))
    with numpyro.plate("data", Y.shape[0], subsample_size=BATCH):
        numpyro.sample("y", dist.MultivariateNormal(theta, precision_matrix=precision),
                       obs=numpyro.subsample(Y, event_dim=1))  # fmt: skip


def run(sampler: str, h: float, correlated: bool) -> dict[str, Any]:
    """One run's numbers (see the module's docstring)."""
    target = posterior(correlated)
    options = {"step_size": h, "steps_per_sample": THIN,
               "init_strategy": init_to_value(values={"theta": jnp.asarray(target["mean"], jnp.float32)})}  # fmt: skip
    if sampler == "SGLD":
        kernel = SGLD(model, **options)
    elif sampler == "SGHMC":
        kernel = SGHMC(model, **options)
    else:
        kernel = SGNHT(model, thermostat="scalar" if "scalar" in sampler else "multivariate", **options)
    mcmc = MCMC(kernel, num_warmup=WARMUP // THIN, num_samples=STEPS // THIN, num_chains=CHAINS,
                chain_method="vectorized", progress_bar=False, verdict=False)  # fmt: skip
    start = time.perf_counter()
    with warnings.catch_warnings():  # the noise-ratio warnings: what this script measures
        warnings.simplefilter("ignore")
        mcmc.run(jax.random.PRNGKey(0), target["Y"], target["Lam"], target["precision"],
                 extra_fields=("noise_ratio",) if sampler == "SGLD" else ("noise_ratio", "rule_state.momentum"))  # fmt: skip
    x = np.asarray(mcmc.get_samples()["theta"], np.float64)
    C = np.cov(x, rowvar=False)
    fields = mcmc.get_extra_fields()
    reported = np.asarray(fields["noise_ratio"], np.float64)
    # the kinetic temperature: the eigenvalues of the kept momenta's covariance (``τ I`` without gradient noise)
    kinetic = None
    if sampler != "SGLD":
        momenta = np.asarray(fields["rule_state.momentum"], np.float64)
        kinetic = np.linalg.eigvalsh(momenta.T @ momenta / len(momenta)).round(3).tolist()
    return {
        "sampler": sampler, "h": h, "noise": "correlated" if correlated else "diagonal",
        "seconds": round(time.perf_counter() - start, 1), "variances": np.diag(C).round(3).tolist(),
        "eigenvalues": np.linalg.eigvalsh(C).round(3).tolist(),
        "momentum_eigenvalues": kinetic,
        "h V_kk / 2": (h * np.diag(target["V"]) / 2).round(3).tolist(),
        "reported_noise_ratio_median": round(float(np.nanmedian(reported)), 3),
        "mean_error_max": round(float(np.abs(x.mean(0) - target["mean"]).max()), 4),
    }  # fmt: skip


def table(rows: list[dict[str, Any]]) -> str:
    """The markdown table of the runs."""
    lines = ["| sampler | noise | h | h V_kk / 2 (c = 1, 1/A or 1/D) | reported ratio (median) | variances of C "
             "| eigenvalues of C | eigenvalues of the momenta's covariance |", "|---|---|---:|---|---:|---|---|---|"]  # fmt: skip
    for row in rows:
        values = [row["sampler"], row["noise"], f"{row['h']:g}", ", ".join(f"{v:g}" for v in row["h V_kk / 2"]),
                  f"{row['reported_noise_ratio_median']:.2f}", ", ".join(f"{v:.2f}" for v in row["variances"]),
                  ", ".join(f"{v:.2f}" for v in row["eigenvalues"]),
                  ", ".join(f"{v:.2f}" for v in row["momentum_eigenvalues"] or ()) or "—"]  # fmt: skip
        lines.append("| " + " | ".join(values) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samplers", nargs="+", default=list(STEP_SIZES), choices=list(STEP_SIZES))
    args = parser.parse_args(argv)
    rows = []
    for sampler in args.samplers:
        for correlated in (False, True):
            for h in STEP_SIZES[sampler]:
                rows.append(run(sampler, h, correlated))
                print(json.dumps(rows[-1]), flush=True)
    print(table(rows))
    RESULTS.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
