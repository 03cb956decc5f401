"""The low-rank-plus-diagonal metric against the diagonal one beyond ``AUTO_DENSE_MAX`` (docs: the warm-up page).

A linear regression of ``d = 300`` coefficients whose design has ``XᵀX = N (D + AᵀA)`` exactly (three factors of
loadings ``N(0, 1/4)`` over log-normal ``D``; ``N = 2000``, minibatches of 160, unit noise and prior): the exact
posterior is Gaussian with a precision that is diagonal plus rank 3. Each kernel runs hands-off (no step size)
with ``dense_mass=False`` and with ``dense_mass="low_rank"``, one chain, and reports the
posterior's condition number in the metric the warm-up ended with, the largest mean error in posterior sds and
the range of the sd ratios against the exact posterior.

    python benchmarks/low_rank_metric.py --kernels SGLD SGHMC SGNHT --warmup 10000 --samples 60000
"""

from __future__ import annotations

import argparse
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC

from ppl_sgmcmc import adaptation
from ppl_sgmcmc import numpyro as backend

N, D, BATCH = 2000, 300, 160


def data(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(X, y, posterior mean, posterior covariance)``."""
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(3, D)) * 0.5
    M = np.linalg.cholesky(np.diag(np.exp(rng.normal(size=D))) + A.T @ A).T
    X = (np.linalg.qr(rng.normal(size=(N, D)))[0] * np.sqrt(N) @ M).astype(np.float32)
    y = (X @ (rng.normal(size=D) * 0.3) + rng.normal(size=N)).astype(np.float32)
    cov = np.linalg.inv(X.T.astype(np.float64) @ X + np.eye(D))
    return X, y, cov @ (X.T.astype(np.float64) @ y), cov


def model(X, y):
    w = numpyro.sample("w", dist.Normal(jnp.zeros(D), 1.0).to_event(1))
    with numpyro.plate("data", N, subsample_size=BATCH):
        numpyro.sample("y", dist.Normal(numpyro.subsample(X, event_dim=1) @ w, 1.0),
                       obs=numpyro.subsample(y, event_dim=0))  # fmt: skip


def condition_in_metric(pre: adaptation.Preconditioner, cov: np.ndarray) -> float:
    """The condition number of ``cov`` in the coordinates ``u = L⁻¹ θ``."""
    inverse = np.stack([np.asarray(adaptation.to_u(pre, column), np.float64) for column in jnp.eye(D)], axis=1)
    values = np.linalg.eigvalsh(inverse @ cov @ inverse.T)
    return float(values.max() / values.min())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", nargs="+", default=["SGLD", "SGHMC", "SGNHT"])
    parser.add_argument("--warmup", type=int, default=10000)
    parser.add_argument("--samples", type=int, default=60000)
    args = parser.parse_args()
    warnings.simplefilter("ignore")  # the run's own verdicts: the table says the same against the exact posterior
    X, y, mean, cov = data()
    sd = np.sqrt(np.diag(cov))
    print(f"posterior condition number {np.linalg.cond(cov):.3g}, of its correlation matrix "
          f"{np.linalg.cond(cov / np.outer(sd, sd)):.3g}")  # fmt: skip
    print("| kernel | metric | condition in metric | max mean error (sd) | sd ratios | seconds |")
    print("|---|---|---|---|---|---|")
    for name in args.kernels:
        for dense_mass, label in ((False, "diagonal"), ("low_rank", "low-rank")):
            start = time.perf_counter()
            mcmc = MCMC(getattr(backend, name)(model, dense_mass=dense_mass), num_warmup=args.warmup,
                        num_samples=args.samples, progress_bar=False)  # fmt: skip
            mcmc.run(jax.random.PRNGKey(1), X, y)
            w = np.asarray(mcmc.get_samples()["w"], np.float64)
            seconds = time.perf_counter() - start
            error = np.max(np.abs(w.mean(0) - mean) / sd)
            ratio = w.std(0) / sd
            condition = condition_in_metric(mcmc.last_state.adapt_state.preconditioner, cov)
            print(f"| {name} | {label} | {condition:.3g} | {error:.2f} | {ratio.min():.2f}-{ratio.max():.2f} | "
                  f"{seconds:.0f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
