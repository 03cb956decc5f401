#!/usr/bin/env python
"""Initialisation time and peak memory of a NumPyro kernel against the number of data rows N.

Logistic regression with d = 20 float32 features and a minibatch of n = 1000 rows, N from 1e5 to 1e7
(0.84 GB of features at 1e7). Each N runs in a fresh subprocess, which reports: the data's size, the time of
``kernel.init`` (building the subsampled potential, finding initial values, compiling and computing the first
stochastic gradient), the steady-state steps/s of ``kernel.sample`` under ``jax.jit``, and the process's peak
resident memory (``ru_maxrss``), as a multiple of the data's size. Then, each in a fresh subprocess, the peak of a
whole run from the defaults (SGLD with no step size: the warm-up finds the mode, the preconditioner and the step
size; 4 chains vectorised, 100 warm-up and 100 kept draws of 10 steps) under ``ppl_sgmcmc.numpyro.MCMC`` and under
``numpyro.infer.MCMC``, which closes its sampling loop over the data (JAX then embeds them in the program as a
constant).

Usage (from the repository root)::

    PYTHONPATH=. python benchmarks/large_n.py            # N = 1e5, 1e6, 1e7
    PYTHONPATH=. python benchmarks/large_n.py --quick    # N = 1e5, 1e6
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

DATA = r"""
import json, resource, sys, time
import jax, jax.numpy as jnp, numpyro, numpyro.distributions as dist
from ppl_sgmcmc.numpyro import SGLD

N, d, n = int(sys.argv[1]), 20, 1000
blocks = 100  # made on the device a block of rows at a time: no host copy, no temporaries the size of the data
X = jax.jit(lambda key: jax.lax.map(lambda k: jax.random.normal(k, (N // blocks, d), jnp.float32),
                                    jax.random.split(key, blocks)).reshape(N, d))(jax.random.PRNGKey(1))
y = (X @ jnp.linspace(-1, 1, d) > 0).astype(jnp.float32)
jax.block_until_ready(y)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6


def model(X, y):
    w = numpyro.sample("w", dist.Normal(0, 1).expand([d]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=n):
        numpyro.sample("y", dist.Bernoulli(logits=numpyro.subsample(X, event_dim=1) @ w), obs=numpyro.subsample(y, event_dim=0))
"""

CHILD = DATA + r"""
kernel = SGLD(model, step_size=1e-5)
start = time.perf_counter()
state = kernel.init(jax.random.PRNGKey(0), 0, None, (X, y))
jax.block_until_ready(state)
init = time.perf_counter() - start
step = jax.jit(kernel.sample)
state = step(state, (X, y), {})
jax.block_until_ready(state)
start = time.perf_counter()
for _ in range(500):
    state = step(state, (X, y), {})
jax.block_until_ready(state)
rate = 500 / (time.perf_counter() - start)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
print(json.dumps(dict(N=N, data_gb=(X.nbytes + y.nbytes) / 1e9, init_s=init, steps_per_s=rate, peak_gb=peak,
                      before_kernel_gb=base)))
"""

RUN = DATA + r"""
import warnings
import ppl_sgmcmc.numpyro
driver = ppl_sgmcmc.numpyro.MCMC if sys.argv[2] == "ppl_sgmcmc" else numpyro.infer.MCMC
mcmc = driver(SGLD(model, steps_per_sample=10), num_warmup=100, num_samples=100, num_chains=4,
              chain_method="vectorized", progress_bar=False)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # the verdict on a run this short is not the point
    mcmc.run(jax.random.PRNGKey(0), X, y)
jax.block_until_ready(mcmc.get_samples())
print(json.dumps(dict(peak_gb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6)))
"""


def _child(code: str, *args: object) -> dict:
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    out = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, env=env,
                         check=True)  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="N = 1e5 and 1e6 only")
    args = parser.parse_args()
    sizes = [10**5, 10**6] if args.quick else [10**5, 10**6, 10**7]
    print("| N | data (GB) | kernel.init (s) | steps/s | peak RSS (GB) | peak / data | RSS before the kernel (GB) "
          "| run from the defaults, peak RSS (GB): `ppl_sgmcmc.numpyro.MCMC` | `numpyro.infer.MCMC` |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for N in sizes:
        row = _child(CHILD, N)
        runs = [_child(RUN, N, driver)["peak_gb"] for driver in ("ppl_sgmcmc", "numpyro")]
        print(
            f"| {N:.0e} | {row['data_gb']:.2f} | {row['init_s']:.1f} | {row['steps_per_s']:,.0f} | {row['peak_gb']:.2f} "
            f"| {row['peak_gb'] / row['data_gb']:.1f} | {row['before_kernel_gb']:.2f} | {runs[0]:.2f} | {runs[1]:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
