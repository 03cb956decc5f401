"""Does SGNHT's matrix thermostat absorb the correlated gradient noise that mSGNHT's diagonal one does not?

``benchmarks/thermostat_noise.py`` measured that the multivariate thermostat of mSGNHT (Li, Chen, Fan & Carin, "High-Order
Stochastic Gradient Thermostats for Bayesian Learning of Deep Models", AAAI 2016), whose friction ``ξ_k`` settles at
``D + h V_kk / 2``, absorbs a diagonal gradient noise ``V`` but not its covariances. The matrix thermostat of
``SGNHT(thermostat="matrix")`` generalises the Nosé-Hoover thermostat of SGNHT (Ding, Fang, Babbush, Chen, Skeel &
Neven, NeurIPS 2014) to a symmetric matrix friction ``Ξ``, updated by ``Ξ ← Ξ + h (p pᵀ - τ I)``: it settles at
``D I + h V / 2`` and absorbs all of ``V`` to first order in ``h``, at ``O(d²)`` a step plus an eigendecomposition of
``Ξ`` for the splitting integrator's ``exp(-Ξ h / 2)``. This script runs the library's rule
(:func:`ppl_sgmcmc.rules.sgnht.step`) with both thermostats on a target whose noise is known.

**Target.** ``θ ∈ R^4``, posterior ``N(0, I)``; the stochastic gradient is ``θ + ε``, ``ε ~ N(0, V)`` with ``V = Q
diag(90, 50, 10, 1) Qᵀ``: the minibatch noise of ``thermostat_noise.py``'s regression (``V = (N/n)(I - Λ)``), drawn
as a Gaussian. ``Q = I`` (diagonal noise) or a random rotation (correlated noise).

**Runs.** The symmetric-splitting integrator (mSGNHT-S) with the multivariate thermostat and with the matrix one, ``D =
1``, ``τ = 1``, the identity metric, hand-set ``h`` (``h V / 2`` up to 2.25 and 9), 4 chains of 2000 + 200 000 steps
from 0, every 20th step kept; the draws' covariance ``C`` against ``I`` (its diagonal and its eigenvalues; Monte Carlo
error about 2 %).

Usage (from the repository root; about 30 s on one core)::

    .venv/bin/python -m benchmarks.matrix_thermostat

Prints the table for ``RESULTS.md`` (Bayesian neural networks: "The noise ratio of SGNHT") and writes
``benchmarks/results/matrix_thermostat.json``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ppl_sgmcmc.rules import StochasticGradient, sgnht

NOISE = np.array([90.0, 50.0, 10.0, 1.0])
STEP_SIZES = (0.05, 0.2)
STEPS, THIN, WARMUP, CHAINS = 200_000, 20, 2_000, 4
RESULTS = Path(__file__).resolve().parent / "results" / "matrix_thermostat.json"


def noise_covariance(correlated: bool) -> np.ndarray:
    """``V``: diagonal, or rotated by a fixed random orthogonal matrix."""
    d = NOISE.size
    Q = np.linalg.qr(np.random.default_rng(1).normal(size=(d, d)))[0] if correlated else np.eye(d)
    return Q @ np.diag(NOISE) @ Q.T


def chain(key: jax.Array, h: float, V: jax.Array, thermostat: str) -> jax.Array:
    """One mSGNHT-S chain of the library's rule (:func:`ppl_sgmcmc.rules.sgnht.step`, ``D = 1``, ``τ = 1``) with the
    ``"multivariate"`` thermostat ``ξ ∈ R^d`` or the ``"matrix"`` one ``Ξ ∈ R^{d×d}``, its kept draws."""
    d = V.shape[0]
    root = jnp.linalg.cholesky(V)

    def step(carry: tuple, key: jax.Array) -> tuple:
        theta, state = carry
        key_gradient, key_noise = jax.random.split(key)
        noise = root @ jax.random.normal(key_gradient, (d,))

        def grad_fn(x: jax.Array) -> StochasticGradient:
            return StochasticGradient(energy=0.5 * x @ x + noise @ x, grad=x + noise, score=-(x + noise))

        theta, state, _ = sgnht.step(theta, state, grad_fn, jax.random.normal(key_noise, (d,)), h, 1.0,
                                     thermostat=thermostat)  # fmt: skip
        return (theta, state), theta

    start = jnp.zeros(d)
    carry = (start, sgnht.init(start, jax.random.normal(key, (d,)), 1.0, thermostat=thermostat))
    keys = jax.random.split(key, WARMUP + STEPS)
    carry, _ = jax.lax.scan(step, carry, keys[:WARMUP])
    return jax.lax.scan(step, carry, keys[WARMUP:])[1][::THIN]


_chains = jax.jit(jax.vmap(chain, in_axes=(0, None, None, None)), static_argnums=(1, 3))


def run(h: float, correlated: bool, thermostat: str) -> dict[str, Any]:
    """One run's numbers (see the module's docstring)."""
    V = noise_covariance(correlated)
    start = time.perf_counter()
    draws = np.asarray(_chains(jax.random.split(jax.random.key(0), CHAINS), h, jnp.asarray(V, jnp.float32), thermostat))
    C = np.cov(draws.reshape(-1, V.shape[0]), rowvar=False)
    return {"thermostat": thermostat, "noise": "correlated" if correlated else "diagonal",
            "h": h, "h max(V) / 2": h * NOISE.max() / 2, "seconds": round(time.perf_counter() - start, 1),
            "variances": np.diag(C).round(3).tolist(), "eigenvalues": np.linalg.eigvalsh(C).round(3).tolist()}  # fmt: skip


def table(rows: list[dict[str, Any]]) -> str:
    """The markdown table of the runs."""
    lines = ["| noise | h (h max V / 2) | thermostat | variances of C | eigenvalues of C |", "|---|---|---|---|---|"]
    for row in rows:
        values = [row["noise"], f"{row['h']:g} ({row['h max(V) / 2']:g})", row["thermostat"],
                  ", ".join(f"{v:.2f}" for v in row["variances"]), ", ".join(f"{v:.2f}" for v in row["eigenvalues"])]  # fmt: skip
        lines.append("| " + " | ".join(values) + " |")
    return "\n".join(lines)


def main() -> None:
    rows = [
        run(h, correlated, thermostat)
        for correlated in (False, True)
        for h in STEP_SIZES
        for thermostat in ("multivariate", "matrix")
    ]
    print(table(rows))
    RESULTS.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
