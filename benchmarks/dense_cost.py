"""What a dense metric costs per step against a diagonal one, by the number of latent coordinates: the measurement
behind ``ppl_sgmcmc.algorithms.AUTO_DENSE_MAX`` (the default metric is dense up to it).

A dense preconditioner adds three ``d × d`` matrix-vector products to every step (the pulled-back gradient, the
position and, with a momentum, the momentum's map); a diagonal one adds ``O(d)``. Against them stands the
minibatch gradient, ``O(n d)`` for a generalised linear model with a minibatch of ``n`` rows. On a synthetic
logistic regression (N = 20 000 rows, minibatch ``n``, ``d`` features) each kernel runs with its defaults after a
200-step warm-up, ``dense_mass=True`` and ``dense_mass=False``; ``S`` post-warm-up steps of ``kernel.sample`` in
one compiled ``lax.scan`` (one chain, compiled once, best of ``--rounds`` calls) give the time per step. The
ratio dense/diagonal is printed per ``d``.

Usage (from the repository root)::

    .venv/bin/python -m benchmarks.dense_cost                       # d = 16 ... 1024, SGLD and SGNHT, n = 100
    .venv/bin/python -m benchmarks.dense_cost --dims 64 256 --batch 32 --steps 10000
"""

from __future__ import annotations

import argparse
import os
import time
from functools import partial

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import numpyro  # noqa: E402
import numpyro.distributions as dist  # noqa: E402

from benchmarks.throughput import sample_scan  # noqa: E402
from ppl_sgmcmc import numpyro as sg  # noqa: E402

NUM_DATA = 20_000


def model(X: jax.Array, y: jax.Array, batch_size: int) -> None:
    """Logistic regression with a N(0, 1) prior, the data plate subsampled to ``batch_size`` rows."""
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=batch_size):
        Xb = numpyro.subsample(X, event_dim=1)
        numpyro.sample("y", dist.Bernoulli(logits=Xb @ w), obs=numpyro.subsample(y, event_dim=0))


def data(d: int) -> tuple[jax.Array, jax.Array]:
    rng = np.random.default_rng(d)
    X = rng.normal(size=(NUM_DATA, d)).astype(np.float32) / np.sqrt(d)
    y = (X @ rng.normal(size=d) + rng.logistic(size=NUM_DATA) > 0).astype(np.float32)
    return jnp.asarray(X), jnp.asarray(y)


def seconds_per_step(kernel_name: str, dense: bool, d: int, batch: int, steps: int, rounds: int) -> float:
    """The kernel's post-warm-up step, ``steps`` of them in one compiled ``lax.scan`` (compiled once; the best of
    ``rounds`` calls), per step."""
    X, y = data(d)
    kernel = getattr(sg, kernel_name)(partial(model, batch_size=batch), dense_mass=dense)
    mcmc = sg.MCMC(kernel, num_warmup=200, num_samples=1, progress_bar=False, verdict=False)
    mcmc.warmup(jax.random.PRNGKey(0), X, y)
    run = sample_scan(kernel, X, y, steps)
    state = jax.block_until_ready(run(mcmc.post_warmup_state))  # compiled here
    best = np.inf
    for _ in range(rounds):
        start = time.perf_counter()
        state = jax.block_until_ready(run(state))
        best = min(best, time.perf_counter() - start)
    return best / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dims", nargs="+", type=int, default=[16, 64, 128, 256, 512, 1024])
    parser.add_argument("--kernels", nargs="+", default=["SGLD", "SGNHT"])
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"N = {NUM_DATA}, minibatch {args.batch}, S = {args.steps}; µs per post-warm-up step, one chain\n")
    print("| kernel | d | diagonal | dense | dense / diagonal |")
    print("|---|---:|---:|---:|---:|")
    for name in args.kernels:
        for d in args.dims:
            diagonal = seconds_per_step(name, False, d, args.batch, args.steps, args.rounds)
            dense = seconds_per_step(name, True, d, args.batch, args.steps, args.rounds)
            print(f"| {name} | {d} | {1e6 * diagonal:.1f} | {1e6 * dense:.1f} | {dense / diagonal:.2f} |", flush=True)


if __name__ == "__main__":
    main()
