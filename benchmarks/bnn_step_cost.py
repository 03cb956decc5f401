#!/usr/bin/env python
"""Where an FNN-400 step's time goes: ``SGLD.sample`` on MNIST (d = 478 410 weights, minibatch 100)
against a hand-written SGLD step, in one compiled ``lax.fori_loop`` each, data as arguments.

Rows: the kernel as it is; the kernel with :func:`ppl_sgmcmc.noise.update` replaced by one that returns its
state unchanged (no gradient-noise estimate); the same with the estimate fed zeros instead of the step's
gradient; :func:`ppl_sgmcmc.noise.update` alone on a vector of the same size; the hand-written step. Per step =
(time of ``2S`` steps - time of ``S`` steps) / ``S``, fastest of three rounds.

Usage (from the repository root)::

    PYTHONPATH=. .venv/bin/python benchmarks/bnn_step_cost.py     # ~3 min on 2 cores
"""

from __future__ import annotations

import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax, random

from benchmarks.bnn_mnist import BATCH, INIT, _data, _init_params, hand_sgld_step
from models import bnn
from ppl_sgmcmc import noise
from ppl_sgmcmc.numpyro import SGLD

S, ROUNDS, HIDDEN, H = 50, 3, (400, 400), 1e-5


def per_step(run: Callable[[int], object]) -> float:
    """Milliseconds per step of ``run(steps)``."""
    for n in (S, 2 * S):
        jax.block_until_ready(run(n))
    best = {S: float("inf"), 2 * S: float("inf")}
    for _ in range(ROUNDS):
        for n in (S, 2 * S):
            start = time.perf_counter()
            jax.block_until_ready(run(n))
            best[n] = min(best[n], time.perf_counter() - start)
    return (best[2 * S] - best[S]) / S * 1e3


def kernel_run(X, y):
    kw = dict(hidden=HIDDEN, batch_size=BATCH)
    kernel = SGLD(bnn.classifier, step_size=H, init_strategy=INIT)
    state = kernel.init(random.PRNGKey(1), 0, None, (X, y), kw)
    loop = jax.jit(lambda s, X, y, n: lax.fori_loop(0, n, lambda _, s: kernel.sample(s, (X, y), kw), s),
                   static_argnums=3)  # fmt: skip
    return lambda n: loop(state, X, y, n)


def hand_run(X, y):
    def loop(params, X, y, n):
        step = hand_sgld_step(X, y, H)
        return lax.fori_loop(0, n, lambda i, p: step(p, random.fold_in(random.PRNGKey(2), i)), params)

    loop = jax.jit(loop, static_argnums=3)
    params = _init_params(random.PRNGKey(0), bnn.layer_sizes(784, HIDDEN, 10))
    return lambda n: loop(params, X, y, n)


def noise_alone(d):
    g0 = random.normal(random.PRNGKey(0), (d,))

    def body(i, carry):
        state, g = carry
        state, term = noise.update(state, g * (1 + i * 1e-6), 1.0, True)
        return state, g + term * 1e-9

    loop = jax.jit(lambda n: lax.fori_loop(0, n, body, (noise.init(g0), g0)), static_argnums=0)
    return loop


def main() -> None:
    X, y, _, _ = _data(False)
    X, y = jnp.asarray(X), jnp.asarray(y)
    update = noise.update
    rows = {"kernel.sample (SGLD, given step size)": per_step(kernel_run(X, y))}
    noise.update = lambda state, g, scale, accepted: (state, jnp.zeros_like(g))
    rows["kernel.sample, noise.update a no-op"] = per_step(kernel_run(X, y))
    noise.update = lambda state, g, scale, accepted: update(state, jnp.zeros_like(g), scale, accepted)
    rows["kernel.sample, noise.update fed zeros"] = per_step(kernel_run(X, y))
    noise.update = update
    rows["noise.update alone (d = 478 410)"] = per_step(noise_alone(bnn.num_weights(784, HIDDEN, 10)))
    rows["hand-written SGLD step"] = per_step(hand_run(X, y))
    print(f"FNN-400 on MNIST, minibatch {BATCH}, {S} and {2 * S} steps, fastest of {ROUNDS} rounds\n")
    print("| loop | ms per step |")
    print("|---|---:|")
    for label, ms in rows.items():
        print(f"| {label} | {ms:.2f} |")


if __name__ == "__main__":
    main()
