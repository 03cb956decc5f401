#!/usr/bin/env python
"""Steps/s and memory against the number of rows N, device-resident against streamed from a disk memmap, and
steps/s against the number of devices the rows are sharded over.

Logistic regression, d = 20 float32 features, minibatches of n = 1000 rows, SGLD with a fixed step size. The
data are written once per N to ``.npy`` files (``--dir``, default a temporary directory; written in chunks,
never held whole in memory). Every measurement runs in a fresh subprocess, which reports:

* ``steps/s``: ``kernel.sample`` in one compiled ``lax.fori_loop`` of ``STEPS`` steps (as ``MCMC`` runs them
  without a progress bar), after a compiled run of 20 untimed steps; the best of ``REPEATS`` runs;
* ``private (GB)``: the process's anonymous resident memory at the end (``RssAnon`` of ``/proc/self/status``):
  what the process owns. A memmap's pages, once read, are resident too but belong to the page cache, which the
  kernel evicts under pressure: they are reported apart as ``file-backed (GB)`` (``RssFile``);
* ``peak (GB)``: ``ru_maxrss``, which counts both.

``resident``: the file loaded into a JAX array (``jnp.asarray(np.load(...))``); ``streamed``: the same file as a
:class:`~ppl_sgmcmc.numpyro.streaming.HostArray` over ``np.load(..., mmap_mode="r")`` under
:class:`~ppl_sgmcmc.numpyro.streaming.streamed` (features and labels both: two host reads per step);
``streamed X``: the features streamed, the labels (a twentieth of the bytes) on the device. ``devices``: N = 1e6 rows
sharded with :func:`~ppl_sgmcmc.numpyro.sharding.shard_rows` over 1, 2 and 4 CPU devices
(``--xla_force_host_platform_device_count``).

Usage (from the repository root)::

    PYTHONPATH=. python benchmarks/large_data.py                   # N = 1e5, 1e6, 1e7; devices 1, 2, 4
    PYTHONPATH=. python benchmarks/large_data.py --max-rows 1e8    # and N = 1e8 streamed (an 8 GB file)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

D, BATCH, STEPS, REPEATS = 20, 1000, 1000, 3
CHUNK = 1_000_000  # rows written at a time

CHILD = rf"""
import json, resource, sys, time
layout, path_X, path_y, devices = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
import jax, jax.numpy as jnp, numpy as np, numpyro, numpyro.distributions as dist
from ppl_sgmcmc.numpyro import SGLD
from ppl_sgmcmc.numpyro.sharding import data_mesh, shard_rows
from ppl_sgmcmc.numpyro.streaming import HostArray, streamed

BATCH, STEPS, REPEATS = {BATCH}, {STEPS}, {REPEATS}


def model(X, y):
    w = numpyro.sample("w", dist.Normal(0, 1).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=BATCH):
        logits = numpyro.subsample(X, event_dim=1) @ w
        numpyro.sample("y", dist.Bernoulli(logits=logits), obs=numpyro.subsample(y, event_dim=0))


def memory():
    status = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return {{key: int(status[key].split()[0]) / 1e6 for key in ("RssAnon", "RssFile")}}


if layout.startswith("streamed"):  # "streamed": X and y on the host; "streamed X": y on the device
    X = HostArray(np.load(path_X, mmap_mode="r"), dtype=np.float32)
    y = HostArray(np.load(path_y, mmap_mode="r")) if layout == "streamed" else jnp.asarray(np.load(path_y))
    kernel = SGLD(streamed(model), step_size=1e-6)
elif layout == "resident":
    X, y, kernel = jnp.asarray(np.load(path_X)), jnp.asarray(np.load(path_y)), SGLD(model, step_size=1e-6)
else:  # sharded over `devices` devices
    X, y = shard_rows(np.load(path_X), np.load(path_y), mesh=data_mesh(jax.devices()[:devices]))
    kernel = SGLD(model, step_size=1e-6)
state = kernel.init(jax.random.PRNGKey(0), 0, None, (X, y))
# the steps in one compiled loop (as MCMC runs them without a progress bar)
run = jax.jit(lambda state, data, steps: jax.lax.fori_loop(0, steps, lambda _, s: kernel.sample(s, data, {{}}), state))
state = jax.block_until_ready(run(state, (X, y), 20))
times = []
for _ in range(REPEATS):
    start = time.perf_counter()
    state = jax.block_until_ready(run(state, (X, y), STEPS))
    times.append(time.perf_counter() - start)
rate = STEPS / min(times)
peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
print(json.dumps(dict(steps_per_s=rate, peak_gb=peak_gb, platform=jax.default_backend(), devices=len(jax.devices()),
                      **memory())))
"""


def write_data(directory: Path, rows: int) -> tuple[Path, Path]:
    """``X`` (rows × D, float32, standard normal) and ``y`` (Bernoulli of a fixed linear predictor) as ``.npy``
    files, written ``CHUNK`` rows at a time."""
    path_X, path_y = directory / f"X_{rows}.npy", directory / f"y_{rows}.npy"
    if path_X.exists() and path_y.exists():
        return path_X, path_y
    X = np.lib.format.open_memmap(path_X, mode="w+", dtype=np.float32, shape=(rows, D))
    y = np.lib.format.open_memmap(path_y, mode="w+", dtype=np.float32, shape=(rows,))
    rng, w = np.random.default_rng(0), np.linspace(-1, 1, D, dtype=np.float32)
    for start in range(0, rows, CHUNK):
        block = rng.standard_normal((min(CHUNK, rows - start), D), dtype=np.float32)
        X[start : start + len(block)] = block
        y[start : start + len(block)] = rng.random(len(block)) < 1 / (1 + np.exp(-block @ w))
    X.flush(), y.flush()
    del X, y
    return path_X, path_y


def measure(layout: str, paths: tuple[Path, Path], devices: int = 1) -> dict[str, float]:
    path = os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=path, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    out = subprocess.run(
        [sys.executable, "-c", CHILD, layout, *map(str, paths), str(devices)],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    if out.returncode:
        raise RuntimeError(f"the {layout!r} measurement failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def platform() -> str:
    """The platform JAX computes on in the children (asked in a subprocess: this process never imports JAX)."""
    code = "import jax; print(jax.default_backend(), jax.devices()[0].device_kind)"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-rows", type=float, default=1e7, help="largest N (1e8: streamed only, 8 GB)")
    parser.add_argument("--dir", type=Path, default=None, help="where to write the data files")
    parser.add_argument("--resident-max-rows", type=float, default=1e7, help="largest N loaded into memory")
    args = parser.parse_args()
    directory = args.dir or Path(tempfile.mkdtemp(prefix="large_data_"))
    directory.mkdir(parents=True, exist_ok=True)
    sizes = [10**k for k in range(5, 9) if 10**k <= args.max_rows]
    print(f"data in {directory}; d = {D}, n = {BATCH}, SGLD, {STEPS} timed steps; JAX platform {platform()}\n")
    print("| N | file (GB) | layout | steps/s | private (GB) | file-backed (GB) | peak (GB) |")
    print("|---:|---:|---|---:|---:|---:|---:|")
    for rows in sizes:
        paths = write_data(directory, rows)
        size = sum(path.stat().st_size for path in paths) / 1e9
        for layout in ("resident", "streamed", "streamed X"):
            if layout != "streamed" and rows > args.resident_max_rows:
                continue
            row = measure(layout, paths)
            print(
                f"| 1e{len(str(rows)) - 1} | {size:.2f} | {layout} | {row['steps_per_s']:,.0f} | {row['RssAnon']:.2f} "
                f"| {row['RssFile']:.2f} | {row['peak_gb']:.2f} |",
                flush=True,
            )
    print("\n| devices (N = 1e6, sharded rows) | steps/s | private (GB) |")
    print("|---:|---:|---:|")
    paths = write_data(directory, 10**6)
    for devices in (1, 2, 4):
        row = measure("sharded", paths, devices)
        if row["devices"] < devices:  # a GPU backend has the devices it has (the flag forces CPU devices only)
            print(f"| {devices}: only {row['devices']} {row['platform']} device(s) | | |")
            break
        print(f"| {devices} | {row['steps_per_s']:,.0f} | {row['RssAnon']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
