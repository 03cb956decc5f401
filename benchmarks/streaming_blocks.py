#!/usr/bin/env python
"""How to bring host-resident rows into a compiled SG-MCMC loop: one host callback per step, or one per block of
``K`` steps, read synchronously or ahead by a host thread (double buffering), against the rows on
the device.

A bare loop, not the library: logistic-regression gradient steps (d = 20 float32 features, minibatch n = 1000,
``random.randint`` indices) over N = 1e6 rows held in a ``.npy`` file opened as a memmap (page-cached), in one
compiled ``lax.fori_loop``:

* ``resident``: the rows in a device array, gathered by XLA;
* ``callback, K``: every ``K`` steps one ``jax.pure_callback`` returns the ``K × n`` rows of the next ``K``
  steps (``np.take`` on the memmap's buffer), and the ``K`` steps read their slices (``K = 1``: what
  :class:`~ppl_sgmcmc.numpyro.streaming.streamed` does);
* ``read-ahead, K``: the same, but the callback returns the block a host thread read while the previous block
  ran, and starts the thread on the next block's indices (drawn one block ahead).

Then the same comparison through the library: ``SGLD(model)`` on the device array against
``SGLD(streamed(model, block=K))`` on a :class:`~ppl_sgmcmc.numpyro.streaming.HostArray` of the memmap (labels on
the device), ``kernel.sample`` in one compiled ``lax.fori_loop``.

Each configuration is compiled once and timed round-robin, best of ``--repeats``; printed as µs per step and as
a ratio to ``resident``.

Usage (from the repository root)::

    PYTHONPATH=. python benchmarks/streaming_blocks.py --dir /tmp/large_data   # ~1 min
"""

from __future__ import annotations

import argparse
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax, random

N, D, BATCH = 10**6, 20, 1000


def grad_step(w, rows):
    g = jax.grad(lambda w: jnp.sum(jax.nn.log_sigmoid(rows @ w)))(w)
    return w + 1e-6 * g


def resident(X):
    def run(steps):
        def body(_, carry):
            w, key = carry
            key, sub = random.split(key)
            return grad_step(w, X[random.randint(sub, (BATCH,), 0, N)]), key

        return lax.fori_loop(0, steps, body, (jnp.zeros(D), random.PRNGKey(0)))[0]

    return run


def blocks(read, K, ahead):
    """Steps in blocks of ``K``; ``read(indices, next_indices)`` returns the block's rows."""

    def run(steps):
        def block(_, carry):
            w, key = carry
            key_next = random.split(key)[0]
            indices = random.randint(random.split(key)[1], (K, BATCH), 0, N)
            shape = jax.ShapeDtypeStruct((K, BATCH, D), jnp.float32)
            if ahead:
                next_indices = random.randint(random.split(key_next)[1], (K, BATCH), 0, N)
                rows = jax.pure_callback(read, shape, indices, next_indices)
            else:
                rows = jax.pure_callback(read, shape, indices)
            return lax.fori_loop(0, K, lambda j, w: grad_step(w, rows[j]), w), key_next

        return lax.fori_loop(0, steps // K, block, (jnp.zeros(D), random.PRNGKey(0)))[0]

    return run


class ReadAhead:
    """Returns the rows a thread read for ``indices`` (reading them now on a miss) and starts reading ``ahead``."""

    def __init__(self, buffer):
        self.buffer, self.pool, self.pending = buffer, ThreadPoolExecutor(1), None

    def read(self, indices):
        return np.take(self.buffer, indices, axis=0)

    def __call__(self, indices, ahead):
        key = indices.tobytes()
        if self.pending is not None and self.pending[0] == key:
            rows = self.pending[1].result()
        else:
            rows = self.read(indices)
        self.pending = (ahead.tobytes(), self.pool.submit(self.read, ahead))
        return rows


def through_the_kernel(X_host, X, y, steps, repeats):
    """``{configuration: seconds}`` for ``steps`` SGLD steps: rows on the device, or streamed in blocks."""
    import numpyro
    import numpyro.distributions as dist

    from ppl_sgmcmc.numpyro import SGLD
    from ppl_sgmcmc.numpyro.streaming import HostArray, streamed

    def model(X, y):
        w = numpyro.sample("w", dist.Normal(0, 1).expand([D]).to_event(1))
        with numpyro.plate("data", X.shape[0], subsample_size=BATCH):
            logits = numpyro.subsample(X, event_dim=1) @ w
            numpyro.sample("y", dist.Bernoulli(logits=logits), obs=numpyro.subsample(y, event_dim=0))

    configs = {"resident": (SGLD(model, step_size=1e-6), (X, y))}
    for K in (1, 4, 16, 64):
        configs[f"streamed(block={K})"] = (SGLD(streamed(model, block=K), step_size=1e-6), (HostArray(X_host), y))
    compiled = {}
    for name, (kernel, data) in configs.items():
        state = kernel.init(random.PRNGKey(0), 0, None, data)
        run = jax.jit(lambda state, kernel=kernel, data=data: lax.fori_loop(
            0, steps, lambda _, s: kernel.sample(s, data, {}), state))  # fmt: skip
        jax.block_until_ready(run(state))
        compiled[name] = (run, state)
    return round_robin({name: (lambda run=run, state=state: run(state)) for name, (run, state) in compiled.items()},
                       repeats)


def round_robin(fns, repeats):
    """``{name: fastest time}`` of calling each ``fns[name]()`` ``repeats`` times, interleaved."""
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            jax.block_until_ready(fn())
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def table(best, steps):
    print("| configuration | µs per step | / resident |")
    print("|---|---:|---:|")
    for name, t in best.items():
        print(f"| {name} | {t / steps * 1e6:.1f} | {t / best['resident']:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=None, help="where to write (or find) the data file")
    parser.add_argument("--steps", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    directory = args.dir or Path(tempfile.mkdtemp(prefix="streaming_blocks_"))
    path = directory / f"X_{N}_{D}.npy"
    if not path.exists():
        np.save(path, np.random.default_rng(0).standard_normal((N, D), dtype=np.float32))
    buffer = np.load(path, mmap_mode="r").view(np.ndarray)
    configs = {"resident": resident(jnp.asarray(np.load(path)))}
    for K in (1, 4, 16, 64):
        configs[f"callback, K = {K}"] = blocks(lambda i: np.take(buffer, i, axis=0), K, ahead=False)
    for K in (4, 16, 64):
        configs[f"read-ahead, K = {K}"] = blocks(ReadAhead(buffer), K, ahead=True)
    compiled = {}
    for name, run in configs.items():
        compiled[name] = jax.jit(run, static_argnums=0)
        compiled[name](args.steps).block_until_ready()
    best = round_robin({name: (lambda fn=fn: fn(args.steps)) for name, fn in compiled.items()}, args.repeats)
    print(f"N = {N:.0e}, d = {D}, n = {BATCH}, {args.steps} steps, best of {args.repeats} round-robin runs\n")
    print("Bare loops:\n")
    table(best, args.steps)
    print("\nThrough the kernel (SGLD, `kernel.sample` in a compiled loop):\n")
    y = jnp.asarray((np.asarray(buffer[:, 0]) > 0).astype(np.float32))
    table(through_the_kernel(buffer, jnp.asarray(np.load(path)), y, args.steps, args.repeats), args.steps)


if __name__ == "__main__":
    main()
