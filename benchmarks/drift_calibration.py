#!/usr/bin/env python
"""Calibration data for a check that a chain is still approaching the typical set after the warm-up: the windowed
energy-drop statistic below, which the end-of-run verdict's drift test (``ppl_sgmcmc.verdict``, a Geweke test)
was weighed against (RESULTS.md, "Hard geometry", "The end-of-run verdict").

Statistic, per chain, on the minibatch potential energy ``Ũ_t`` of the kept draws
(``extra_fields=("potential_energy",)``), over consecutive windows doubling from 32 draws:

* ``drop``: how far a window's mean lies above the next window's mean, in the next window's sd; the largest over
  windows and chains. ``--floor`` prints it also against ``max(window sd, 3 sqrt(d/2))``;
* ``z``: the same difference in batch-means standard errors (8 batches a window).

Cases (each a NumPyro run; ``--cases`` picks some):

* ``hands-off``: every default cell of ``benchmarks/hands_off.py`` (draws thinned by 25 or 100): healthy or
  biased, but not approaching; about 10 minutes on 2 cores;
* ``sgfs``: SGFS-f at a given ``alpha=0`` (no mode finding) from ``init_to_uniform``, 200 warm-up draws, on a
  conjugate 2-weight regression, seeds 0-7: some chains still approach the mode during the kept draws;
* ``slow``: stationary but slowly mixing chains, one draw per step, started at an exact posterior draw: hand-set
  SGLD and SGNHT at h = 1e-5, 1e-6, 1e-7 on linreg and the ill-conditioned Gaussian, minibatches of 100, N/2 and N
  (N: exact gradients).

Usage (from the repository root)::

    PYTHONPATH=. python benchmarks/drift_calibration.py                  # all cases, ~20 min
    PYTHONPATH=. python benchmarks/drift_calibration.py --cases sgfs     # ~1 min
"""

from __future__ import annotations

import argparse
import warnings
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC, init_to_value

from benchmarks import hands_off as H
from ppl_sgmcmc import numpyro as sg

FIRST, BATCHES = 32, 8


def windows(length: int) -> list[tuple[int, int]]:
    """Consecutive windows of draws doubling from :data:`FIRST`."""
    edges = [0, FIRST]
    while edges[-1] * 2 <= length:
        edges.append(edges[-1] * 2)
    return list(zip(edges[:-1], edges[1:]))


def drift(energies: np.ndarray, floor: float = 0.0) -> tuple[float, float]:
    """``(drop, z)`` of the module docstring, largest over the windows and the chains (rows) of ``energies``;
    ``drop`` against ``max(window sd, floor)``."""
    drop = z = -np.inf
    for u in np.atleast_2d(energies):
        parts = [u[a:b] for a, b in windows(len(u))]
        means = [w.mean() for w in parts]
        sds = [max(w.std(), floor) for w in parts]
        ses = [w[: len(w) // BATCHES * BATCHES].reshape(BATCHES, -1).mean(1).std(ddof=1) / BATCHES**0.5 for w in parts]
        for k in range(len(parts) - 1):
            difference = means[k] - means[k + 1]
            drop = max(drop, difference / sds[k + 1])
            z = max(z, difference / np.hypot(ses[k], ses[k + 1]))
    return float(drop), float(z)


def energies(kernel, args, num_warmup: int, num_samples: int) -> np.ndarray:
    """The kept draws' minibatch potential energies of :data:`~benchmarks.hands_off.CHAINS` vectorised chains,
    ``(chains, draws)``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mcmc = MCMC(kernel, num_warmup=num_warmup, num_samples=num_samples, num_chains=H.CHAINS,
                    chain_method="vectorized", progress_bar=False)  # fmt: skip
        mcmc.run(jax.random.PRNGKey(0), *args, extra_fields=("potential_energy",))
    return np.asarray(mcmc.get_extra_fields(group_by_chain=True)["potential_energy"], np.float64)


def hands_off() -> None:
    print("| target | kernel | variant | drop | z |\n|---|---|---|---:|---:|")
    for target in H.targets(["linreg", "ill-conditioned", "hierarchical", "a9a", "MLP"], quick=False, refresh=False):
        for name in H.KERNELS:
            for label, options in target.variants.items():
                try:
                    U = energies(H.make_kernel(name, target, options), target.args, target.warmup // target.thin,
                                 target.samples // target.thin)  # fmt: skip
                except ValueError as error:  # SGFS refuses some models and options
                    print(f"| {target.name} | {name} | {label} | refused: {str(error)[:60]} | |", flush=True)
                    continue
                print(f"| {target.name} | {name} | {label} | {'{:.3g} | {:.3g}'.format(*drift(U))} |", flush=True)


def sgfs() -> None:
    rng = np.random.default_rng(3)
    N, noise = 1000, 0.5
    X = rng.normal(size=(N, 2)).astype(np.float32)
    y = (X @ np.array([0.8, -0.4]) + noise * rng.normal(size=N)).astype(np.float32)

    def model(X, y):
        w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        with numpyro.plate("data", N, subsample_size=100):
            x = numpyro.subsample(X, event_dim=1)
            numpyro.sample("y", dist.Normal(x @ w, noise), obs=numpyro.subsample(y, event_dim=0))

    X64 = X.astype(np.float64)
    cov = np.linalg.inv(np.eye(2) + X64.T @ X64 / noise**2)
    print("| seed | variance ratio (w) | drop | z |\n|---:|---|---:|---:|")
    for seed in range(8):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mcmc = MCMC(sg.SGFS(model, alpha=0.0), num_warmup=200, num_samples=3000, progress_bar=False)
            mcmc.run(jax.random.PRNGKey(seed), X, y, extra_fields=("potential_energy",))
        ratio = np.var(np.asarray(mcmc.get_samples()["w"]), 0) / np.diag(cov)
        U = np.asarray(mcmc.get_extra_fields()["potential_energy"], np.float64)
        print(f"| {seed} | {np.round(ratio, 2).tolist()} | {'{:.3g} | {:.3g}'.format(*drift(U))} |", flush=True)


def slow() -> None:
    print("| target | n | kernel | h | drop | drop, floor 3 sqrt(d/2) | z | sd ratio (median) |")
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    for target in (H.linreg_target((10_000, 50_000, 25)), H.ill_conditioned_target((10_000, 50_000, 25))):
        N, d = target.args[0].shape
        start = init_to_value(values={"w": jnp.asarray(target.ref_draws["w"][0, 0], jnp.float32)})
        for n in (H.BATCH, N // 2, N):
            for name in ("SGLD", "SGNHT"):
                for h in (1e-5, 1e-6, 1e-7):
                    kernel = getattr(sg, name)(partial(H.linreg_model, batch_size=n), init_strategy=start, step_size=h)
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        mcmc = MCMC(kernel, num_warmup=0, num_samples=16_384, num_chains=4, chain_method="vectorized",
                                    progress_bar=False)  # fmt: skip
                        mcmc.run(jax.random.PRNGKey(1), *target.args, extra_fields=("potential_energy",))
                    U = np.asarray(mcmc.get_extra_fields(group_by_chain=True)["potential_energy"], np.float64)
                    sd = np.median(np.asarray(mcmc.get_samples()["w"]).std(0) / target.ref_sd)
                    (drop, z), (floored, _) = drift(U), drift(U, 3 * (d / 2) ** 0.5)
                    print(f"| {target.name} | {n} | {name} | {h:g} | {drop:.3g} | {floored:.3g} | {z:.3g} | {sd:.2g} |",
                          flush=True)


def main() -> None:
    cases = {"hands-off": hands_off, "sgfs": sgfs, "slow": slow}
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", default=list(cases), choices=list(cases))
    for case in parser.parse_args().cases:
        print(f"\n## {case}\n", flush=True)
        cases[case]()


if __name__ == "__main__":
    main()
