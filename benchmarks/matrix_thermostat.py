"""Would a full-matrix thermostat absorb the correlated gradient noise that mSGNHT's diagonal one does not?

``benchmarks/thermostat_noise.py`` measured that the multivariate thermostat of mSGNHT (Li, Chen, Fan & Carin, "High-Order
Stochastic Gradient Thermostats for Bayesian Learning of Deep Models", AAAI 2016), whose friction ``ξ_k`` settles at
``D + h V_kk / 2``, absorbs a diagonal gradient noise ``V`` but not its covariances. The natural generalisation of the
Nosé-Hoover thermostat of SGNHT (Ding, Fang, Babbush, Chen, Skeel & Neven, NeurIPS 2014) to a symmetric matrix
friction ``Ξ``, updated by ``Ξ ← Ξ + h (p pᵀ - τ I)``, would settle at ``D I + h V / 2`` and absorb all of ``V`` to first
order in ``h``, at ``O(d²)`` a step (plus an eigendecomposition of ``Ξ`` for the splitting integrator's
``exp(-Ξ h / 2)``), affordable up to the dense metric's limit. The library does not have it; this script measures
the idea on a **hand-written prototype**, before any change to the kernels.

**Target.** ``θ ∈ R^4``, posterior ``N(0, I)``; the stochastic gradient is ``θ + ε``, ``ε ~ N(0, V)`` with ``V = Q
diag(90, 50, 10, 1) Qᵀ``: the minibatch noise of ``thermostat_noise.py``'s regression (``V = (N/n)(I - Λ)``), drawn
as a Gaussian. ``Q = I`` (diagonal noise) or a random rotation (correlated noise).

**Runs.** The symmetric-splitting integrator (mSGNHT-S) with the diagonal thermostat and with the matrix one, ``D =
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

NOISE = np.array([90.0, 50.0, 10.0, 1.0])
STEP_SIZES = (0.05, 0.2)
STEPS, THIN, WARMUP, CHAINS = 200_000, 20, 2_000, 4
RESULTS = Path(__file__).resolve().parent / "results" / "matrix_thermostat.json"


def noise_covariance(correlated: bool) -> np.ndarray:
    """``V``: diagonal, or rotated by a fixed random orthogonal matrix."""
    d = NOISE.size
    Q = np.linalg.qr(np.random.default_rng(1).normal(size=(d, d)))[0] if correlated else np.eye(d)
    return Q @ np.diag(NOISE) @ Q.T


def chain(key: jax.Array, h: float, V: jax.Array, matrix: bool) -> jax.Array:
    """One mSGNHT-S chain (the diagonal thermostat ``ξ ∈ R^d``, or the matrix one ``Ξ ∈ R^{d×d}``), its kept draws::

        A: θ += (h/2) p,  Ξ += (h/2)(k(p) - I);  B: p ← exp(-Ξ h/2) p;  O: p ← p - h g(θ) + sqrt(2 D h) ζ;  B;  A

    with ``k(p) = p pᵀ`` (matrix) or ``p ⊙ p`` (diagonal), ``D = 1``, ``τ = 1``."""
    d = V.shape[0]
    root, eye = jnp.linalg.cholesky(V), jnp.eye(d)

    def damp(friction: jax.Array, p: jax.Array) -> jax.Array:
        if matrix:
            values, vectors = jnp.linalg.eigh(friction)
            return vectors @ (jnp.exp(-values * h / 2) * (vectors.T @ p))
        return jnp.exp(-friction * h / 2) * p

    def kinetic(p: jax.Array) -> jax.Array:
        return jnp.outer(p, p) - eye if matrix else p * p - 1.0

    def step(carry: tuple, key: jax.Array) -> tuple:
        theta, p, friction = carry
        key_gradient, key_noise = jax.random.split(key)
        theta, friction = theta + h / 2 * p, friction + h / 2 * kinetic(p)
        p = damp(friction, p)
        gradient = theta + root @ jax.random.normal(key_gradient, (d,))
        p = damp(friction, p - h * gradient + jnp.sqrt(2 * h) * jax.random.normal(key_noise, (d,)))
        theta, friction = theta + h / 2 * p, friction + h / 2 * kinetic(p)
        return (theta, p, friction), theta

    start = (jnp.zeros(d), jax.random.normal(key, (d,)), eye if matrix else jnp.ones(d))
    keys = jax.random.split(key, WARMUP + STEPS)
    carry, _ = jax.lax.scan(step, start, keys[:WARMUP])
    return jax.lax.scan(step, carry, keys[WARMUP:])[1][::THIN]


_chains = jax.jit(jax.vmap(chain, in_axes=(0, None, None, None)), static_argnums=(1, 3))


def run(h: float, correlated: bool, matrix: bool) -> dict[str, Any]:
    """One run's numbers (see the module's docstring)."""
    V = noise_covariance(correlated)
    start = time.perf_counter()
    draws = np.asarray(_chains(jax.random.split(jax.random.key(0), CHAINS), h, jnp.asarray(V, jnp.float32), matrix))
    C = np.cov(draws.reshape(-1, V.shape[0]), rowvar=False)
    return {"thermostat": "matrix" if matrix else "diagonal", "noise": "correlated" if correlated else "diagonal",
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
    rows = [run(h, correlated, matrix) for correlated in (False, True) for h in STEP_SIZES for matrix in (False, True)]
    print(table(rows))
    RESULTS.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
