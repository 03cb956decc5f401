"""The hands-off table: every kernel with its defaults (no step size) against the best of a grid of hand-set
step sizes, on five posteriors with a reference.

Each kernel (SGLD, SGHMC, SGNHT, PSGLD, SGFS, CSGLD of ``ppl_sgmcmc.numpyro``) runs as ``Kernel(model,
steps_per_sample=k)``: the warm-up finds an approximate mode, builds a Laplace preconditioner (dense, the
default for up to 256 coordinates) and tunes the step size from the measured gradient noise; SGFS's default is
α = 0 from an approximate mode. 4 chains, ``chain_method="vectorized"``, minibatches drawn with replacement. The
targets (:func:`targets`):

1. **linreg**: conjugate linear regression, N = 5000, d = 6 features with correlation 0.7^|j-k|, noise sd 1,
   prior N(0, 1), minibatch 100; the exact Gaussian posterior is the reference. Run with the default dense
   mass and with ``dense_mass=False``.
2. **ill-conditioned**: linear regression whose exact posterior covariance has condition number 1e4:
   ``X = Z diag(s) Qᵀ`` with ``ZᵀZ = N I`` (orthonormalised Gaussian columns) and a random rotation ``Q``, so
   that the posterior precision is ``Q diag(N s² + 1) Qᵀ``, with eigenvalues log-spaced from 50 to 5e5 (d = 6,
   N = 5000, minibatch 100; posterior sds 0.0014-0.14 along rotated, hence correlated, directions). Diagonal and
   dense mass, as target 1.
3. **a9a**: ``models.logistic_regression.model`` (minibatch 100) against the cached NUTS summaries of
   ``benchmarks/a9a_vs_nuts.py``, compared on the 16 281 test rows' predictive probabilities. The default rows
   use the dense mass, as the main job does; ``dense_mass=False`` is its own row.
4. **hierarchical**: 8 groups of 500 rows, ``y ~ N(x β_g, σ)``, ``β_g ~ N(μ, τ)``, ``μ ~ N(0, 5)``,
   ``τ ~ HalfNormal(1)``, ``σ ~ HalfNormal(5)``, minibatch 100, against NUTS (4 × 2000 draws), on μ, τ, σ, β.
5. **MLP**: regression of ``sin(x) + N(0, 0.3²)`` on 2000 points ``x ~ U(-3, 3)`` with one hidden layer of 20
   tanh units, N(0, 1) priors, minibatch 100, against NUTS (4 × 1000 draws) in function space: the predictions
   at 50 test inputs ``linspace(-4, 4, 50)``.

The NUTS references of targets 4 and 5 (full data, 1000 warm-up draws, 4 chains, seed 0) are cached as draws in
``benchmarks/results/hier_nuts.npz`` (every site) and ``mlp_nuts.npz`` (``f``: the predictions at the test
inputs), with their wall clock; ``--refresh-nuts`` reruns them (or a missing file is recomputed).

**Per cell** (a kernel on a target): the error of each compared quantity's mean in reference sds,
``|mean - ref mean| / ref sd`` (median and max over the coordinates, test rows or test inputs), the sd ratio
to the reference (median, min, max), the kernel Stein discrepancy ``ppl_sgmcmc.diagnostics.ksd`` (500 draws,
300 on a9a; in one set of coordinates per target: the reference covariance where there is one, else the first
run's adapted preconditioner), the wall clock (``MCMC.run`` with compilation, mode finding and warm-up), the
step sizes the warm-up chose (per chain) and the noise ratio over the kept draws (median, 90th percentile). A
cell **passes** when every mean is within 0.2 reference sd and every sd ratio within [0.8, 1.25]; its
``score`` is ``max(max error / 0.2, max |log sd ratio| / log 1.25)``, at most 1 for a pass.

**Hand-tuned.** For each kernel and target, 5 fixed step sizes (``--grid-points``) with no adaptation or mode finding
(``Kernel(model, step_size=h)``: what a user had before; the warm-up is burn-in from the init strategy's point),
the same run lengths; the best by ``score`` is reported (an oracle choice: it uses the reference). The step sizes
are log-spaced from ``h_n/10`` to ``max(10 h_n, h_s)``: ``h_n`` is the step at which a fixed step in the model's
own coordinates meets the algorithm's target noise ratio (0.1; SGNHT 1.0), ``h_s`` its stability limit, from the
full-data Hessian ``H`` and the variance ``V`` of 256 minibatch gradients at the last draw of the target's first
default run's first chain (the first kernel of ``--kernels``; ``grid_scales`` in the json records each
kernel's): ``h_n = 2 r / max V`` and ``h_s = 1/λ_max(H)`` for SGLD and CSGLD; ``h_s = 1/sqrt(λ_max(H))`` for
SGNHT (D = 1) and SGHMC, whose friction is set to ``A = 2 sqrt(λ_max(H))`` (critical damping of the stiffest
direction; its default ``A = 1`` is far underdamped in the model's coordinates, where the gradient noise then
heats the chain: ``h_n = 2 r A / max V``); for pSGLD the same as SGLD with its RMSprop preconditioner ``G`` at
that point (``h_n = 2 r / max GV``, ``h_s = 1/λ_max(G^½ H G^½)``). SGFS's grid is ``α ∈ {0, 1, 3, 10, 30}``
(``B`` = its Fisher: the step is ``1/(1 + α²)`` of α = 0's).

**Reference vs itself.** For scale, each table starts with the reference against itself: for the linear
regressions, 8000 independent exact draws; for NUTS, one half of its chains against the other.

Usage (from the repository root)::

    .venv/bin/python -m benchmarks.hands_off                     # the whole table (hours on 2 cores)
    .venv/bin/python -m benchmarks.hands_off --quick             # 1/5-1/10 of the steps, 3-point grids
    .venv/bin/python -m benchmarks.hands_off --targets linreg MLP --kernels SGLD SGNHT --no-grid
    .venv/bin/python -m benchmarks.hands_off --targets a9a --kernels SGLD SGHMC --grid-points 3
    .venv/bin/python -m benchmarks.hands_off --tables            # print the tables of the results file

Writes ``benchmarks/results/hands_off.json`` (``hands_off_quick.json`` with ``--quick``) after each kernel; a
run of a subset updates the cells it ran, so that runs of different targets or kernels can share the file (it is
locked while written). Prints one Markdown table per target.
"""

from __future__ import annotations

import argparse
import datetime
import fcntl
import json
import math
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import arviz as az  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import numpyro  # noqa: E402
import numpyro.distributions as dist  # noqa: E402
from jax.flatten_util import ravel_pytree  # noqa: E402
from numpyro.handlers import seed  # noqa: E402
from numpyro.infer import MCMC, NUTS  # noqa: E402
from numpyro.infer.util import potential_energy  # noqa: E402

from benchmarks.a9a_vs_nuts import NUTS_CACHE, load_reference, machine, predictive_moments  # noqa: E402
from models.datasets import load_a9a  # noqa: E402
from models.logistic_regression import model as a9a_model  # noqa: E402
from ppl_sgmcmc import numpyro as sg  # noqa: E402
from ppl_sgmcmc.diagnostics import ksd  # noqa: E402
from ppl_sgmcmc.importance import resample  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
KERNELS = ("SGLD", "SGHMC", "SGNHT", "PSGLD", "SGFS", "CSGLD")
#: The noise ratio each kernel's tuned step aims at (the library's defaults), for the hand-tuned grid's centre.
TARGET_RATIO = {"SGLD": 0.1, "SGHMC": 0.1, "SGNHT": 1.0, "PSGLD": 0.1, "CSGLD": 0.1}
SGFS_ALPHAS = (0.0, 1.0, 3.0, 10.0, 30.0)
GRID_POINTS = 5
CHAINS, BATCH = 4, 100
MEAN_BOUND, SD_BOUNDS = 0.2, (0.8, 1.25)
PSGLD_EPS = 1e-5  # PSGLD's default λ


# --- the targets -----------------------------------------------------------------------------------------
@dataclass
class Target:
    """A posterior with a reference: the model (its data plate subsampled to ``batch_size``; ``None``: all
    rows), its data, the run lengths (steps per chain) and how draws are compared with the reference."""

    name: str
    model: Callable[..., None]
    args: tuple
    num_data: int
    warmup: int
    samples: int
    thin: int
    #: draws ``{site: (chains, draws, ...)}`` -> the compared quantities' means and sds, ``(K,)`` each
    moments: Callable[[dict[str, np.ndarray]], tuple[np.ndarray, np.ndarray]]
    ref_mean: np.ndarray
    ref_sd: np.ndarray
    #: the reference against itself: ``(mean, sd, ref mean, ref sd)`` of two independent samples
    self_check: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
    self_label: str
    ksd_draws: int = 500
    #: the reference's own draws ``{site: (chains, draws, ...)}`` for its KSD, or ``None``
    ref_draws: dict[str, np.ndarray] | None = None
    #: the KSD's coordinates (``Γ`` of ``ksd``), or ``None``: the first run's adapted ones
    ksd_preconditioner: np.ndarray | None = None
    ref_seconds: float = math.nan
    note: str = ""
    variants: dict[str, dict[str, Any]] = field(default_factory=lambda: {"default": {}})


def linreg_model(X: jax.Array, y: jax.Array, batch_size: int | None = BATCH) -> None:
    """Linear regression with unit noise and a N(0, 1) prior on the weights."""
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=batch_size):
        Xb = numpyro.subsample(X, event_dim=1)
        yb = numpyro.subsample(y, event_dim=0)
        numpyro.sample("y", dist.Normal(Xb @ w, 1.0), obs=yb)


def _weights_moments(samples: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    w = np.asarray(samples["w"], np.float64).reshape(-1, samples["w"].shape[-1])
    return w.mean(0), w.std(0, ddof=1)


def _linear_target(name: str, X: np.ndarray, rng: np.random.Generator, steps: tuple[int, int, int]) -> Target:
    """A linear-regression target with its exact posterior (computed in float64 from the float32 data)."""
    N, d = X.shape
    X = X.astype(np.float32)
    y = (X @ rng.normal(size=d) + rng.normal(size=N)).astype(np.float32)
    X64, y64 = X.astype(np.float64), y.astype(np.float64)
    cov = np.linalg.inv(X64.T @ X64 + np.eye(d))
    mean, sd = cov @ X64.T @ y64, np.sqrt(np.diag(cov))
    exact = rng.multivariate_normal(mean, cov, size=(CHAINS, 2000))
    iid_mean, iid_sd = _weights_moments({"w": exact})
    return Target(name, linreg_model, (jnp.asarray(X), jnp.asarray(y)), N, *steps, moments=_weights_moments,
                  ref_mean=mean, ref_sd=sd, self_check=(iid_mean, iid_sd, mean, sd),
                  self_label="8000 independent exact draws", ref_draws={"w": exact[:, :125]},
                  ksd_preconditioner=cov, note=f"exact posterior: sds {sd.min():.2g}-{sd.max():.2g}, condition "
                  f"number of the covariance {np.linalg.cond(cov):.3g}.",
                  variants={"default (dense mass)": {}, "dense_mass=False": {"dense_mass": False}})  # fmt: skip


def linreg_target(steps: tuple[int, int, int]) -> Target:
    rng = np.random.default_rng(1)
    d, N = 6, 5000
    corr = 0.7 ** np.abs(np.subtract.outer(np.arange(d), np.arange(d)))
    X = rng.multivariate_normal(np.zeros(d), corr, size=N)
    return _linear_target("linreg", X, rng, steps)


def ill_conditioned_target(steps: tuple[int, int, int]) -> Target:
    rng = np.random.default_rng(2)
    d, N = 6, 5000
    Z = np.linalg.qr(rng.normal(size=(N, d)))[0] * np.sqrt(N)  # ZᵀZ = N I
    Q = np.linalg.qr(rng.normal(size=(d, d)))[0]
    precision = np.geomspace(50.0, 5e5, d)  # eigenvalues of XᵀX + I: condition number 1e4
    X = Z @ np.diag(np.sqrt((precision - 1.0) / N)) @ Q.T
    return _linear_target("ill-conditioned", X, rng, steps)


def a9a_target(steps: tuple[int, int, int]) -> Target:
    X, y, X_test, _ = load_a9a()
    ref = load_reference()

    def moments(samples: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        m = predictive_moments(np.asarray(samples["w"]), X_test)
        return m["mean"], m["sd"]

    return Target("a9a", a9a_model, (X, y), X.shape[0], *steps, moments=moments,
                  ref_mean=ref["p_mean"].astype(np.float64), ref_sd=ref["p_sd"].astype(np.float64),
                  self_check=(ref["p_mean_half"][0], ref["p_sd_half"][0], ref["p_mean_half"][1], ref["p_sd_half"][1]),
                  self_label=f"NUTS, chains 1-2 against 3-4 ({NUTS_CACHE.name})", ksd_draws=300,
                  ref_draws={"w": ref["ksd_draws"]}, ksd_preconditioner=ref["w_cov"].astype(np.float64),
                  ref_seconds=float(ref["seconds"]), note="Compared on the predictive probabilities of the 16 281 test rows.",
                  variants={"default (dense mass)": {}, "dense_mass=False": {"dense_mass": False}})  # fmt: skip


HIER_GROUPS, HIER_SITES = 8, ("mu", "tau", "sigma", "beta")


def hier_model(x: jax.Array, y: jax.Array, g: jax.Array, batch_size: int | None = BATCH) -> None:
    """Hierarchical regression: a slope per group, drawn around a common mean with a HalfNormal scale."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfNormal(1.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(5.0))
    with numpyro.plate("groups", HIER_GROUPS):
        beta = numpyro.sample("beta", dist.Normal(mu, tau))
    with numpyro.plate("data", x.shape[0], subsample_size=batch_size):
        xb, yb, gb = numpyro.subsample(x, 0), numpyro.subsample(y, 0), numpyro.subsample(g, 0)
        numpyro.sample("y", dist.Normal(xb * beta[gb], sigma), obs=yb)


def _hier_moments(samples: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    draws = np.concatenate([np.asarray(samples[k], np.float64).reshape(-1, 1 if k != "beta" else HIER_GROUPS)
                            for k in HIER_SITES], axis=1)  # fmt: skip
    return draws.mean(0), draws.std(0, ddof=1)


def hier_data() -> tuple[jax.Array, jax.Array, jax.Array]:
    """The prototype's data: ``x ~ N(0, 1)``, slopes ``1 + 0.7 N(0, 1)`` per group, noise sd 2 (seed 0)."""
    rng = np.random.default_rng(0)
    per = 500
    g = np.repeat(np.arange(HIER_GROUPS), per)
    x = rng.normal(size=HIER_GROUPS * per)
    beta = 1.0 + 0.7 * rng.normal(size=HIER_GROUPS)
    y = x * beta[g] + rng.normal(size=x.size) * 2.0
    return jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32), jnp.asarray(g)


def hier_target(steps: tuple[int, int, int], refresh: bool) -> Target:
    args = hier_data()
    nuts, seconds = nuts_reference(RESULTS / "hier_nuts.npz", hier_model, args, 2000, refresh, lambda s: s)
    ref_mean, ref_sd = _hier_moments(nuts)
    half = [_hier_moments({k: v[part] for k, v in nuts.items()}) for part in (slice(0, 2), slice(2, 4))]
    thinned = {k: v[:, :: v.shape[1] // 125] for k, v in nuts.items()}
    unconstrained = np.concatenate([nuts["beta"].reshape(-1, HIER_GROUPS), nuts["mu"].reshape(-1, 1),
                                    np.log(nuts["sigma"]).reshape(-1, 1), np.log(nuts["tau"]).reshape(-1, 1)], axis=1)
    return Target("hierarchical", hier_model, args, args[0].shape[0], *steps, moments=_hier_moments,
                  ref_mean=ref_mean, ref_sd=ref_sd, self_check=(*half[0], *half[1]),
                  self_label="NUTS, chains 1-2 against 3-4", ref_draws=thinned,
                  ksd_preconditioner=np.cov(unconstrained, rowvar=False), ref_seconds=seconds,
                  note="Compared on μ, τ, σ and the 8 slopes β.")  # fmt: skip


MLP_HIDDEN, MLP_TEST = 20, np.linspace(-4.0, 4.0, 50)[:, None]


def mlp_net(p: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    h = jnp.tanh(x @ p["w1"] + p["b1"])
    return (h @ p["w2"])[..., 0] + p["b2"]


def mlp_model(X: jax.Array, y: jax.Array, batch_size: int | None = BATCH) -> None:
    """A one-hidden-layer tanh network with N(0, 1) priors and Gaussian noise of sd 0.3."""
    p = {"w1": numpyro.sample("w1", dist.Normal(0.0, 1.0).expand([1, MLP_HIDDEN]).to_event(2)),
         "b1": numpyro.sample("b1", dist.Normal(0.0, 1.0).expand([MLP_HIDDEN]).to_event(1)),
         "w2": numpyro.sample("w2", dist.Normal(0.0, 1.0).expand([MLP_HIDDEN, 1]).to_event(2)),
         "b2": numpyro.sample("b2", dist.Normal(0.0, 1.0))}  # fmt: skip
    with numpyro.plate("data", X.shape[0], subsample_size=batch_size):
        Xb = numpyro.subsample(X, event_dim=1)
        yb = numpyro.subsample(y, event_dim=0)
        numpyro.sample("y", dist.Normal(mlp_net(p, Xb), 0.3), obs=yb)


def mlp_data() -> tuple[jax.Array, jax.Array]:
    """The prototype's data: 2000 points ``x ~ U(-3, 3)``, ``y = sin(x) + N(0, 0.3²)`` (seed 0)."""
    rng = np.random.default_rng(0)
    x = rng.uniform(-3, 3, size=2000)
    y = np.sin(x) + 0.3 * rng.normal(size=x.size)
    return jnp.asarray(x[:, None], jnp.float32), jnp.asarray(y, jnp.float32)


def _mlp_predictions(samples: dict[str, Any]) -> dict[str, np.ndarray]:
    """NUTS's draws ``(chains, draws, ...)`` -> their predictions at the test inputs ``{"f": (chains, draws, 50)}``."""
    chains = samples["b2"].shape[0]
    params = {k: jnp.asarray(v).reshape(-1, *v.shape[2:]) for k, v in samples.items()}
    f = jax.vmap(lambda p: mlp_net(p, jnp.asarray(MLP_TEST, jnp.float32)))(params)
    return {"f": np.asarray(f).reshape(chains, -1, MLP_TEST.shape[0])}


def _mlp_moments(samples: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    f = _mlp_predictions(samples)["f"].reshape(-1, MLP_TEST.shape[0]).astype(np.float64)
    return f.mean(0), f.std(0, ddof=1)


def mlp_target(steps: tuple[int, int, int], refresh: bool) -> Target:
    args = mlp_data()
    nuts, seconds = nuts_reference(RESULTS / "mlp_nuts.npz", mlp_model, args, 1000, refresh, _mlp_predictions)
    f = nuts["f"].reshape(-1, MLP_TEST.shape[0])
    halves = [(part.mean(0), part.std(0, ddof=1)) for part in np.array_split(f, 2)]
    return Target("MLP", mlp_model, args, args[0].shape[0], *steps, moments=_mlp_moments, ref_mean=f.mean(0),
                  ref_sd=f.std(0, ddof=1), self_check=(*halves[0], *halves[1]),
                  self_label="NUTS, chains 1-2 against 3-4", ref_seconds=seconds,
                  note="Compared on the predictions at 50 test inputs in [-4, 4] (the data cover [-3, 3]).")  # fmt: skip


def nuts_reference(path: Path, model: Callable[..., None], args: tuple, num_samples: int, refresh: bool,
                   keep: Callable[[dict[str, Any]], dict[str, np.ndarray]]) -> tuple[dict[str, np.ndarray], float]:
    """NUTS's draws ``keep(samples)`` ``{name: (chains, draws, ...)}`` and its wall clock, from ``path``, or from
    a run of NUTS on the full data (1000 warm-up draws, 4 chains one after the other, seed 0) when ``refresh``
    or ``path`` is missing, saved there (float32)."""
    if refresh or not path.exists():
        print(f"  running NUTS for {path.name} ({CHAINS} chains × (1000 + {num_samples})) ...", flush=True)
        mcmc = MCMC(NUTS(model), num_warmup=1000, num_samples=num_samples, num_chains=CHAINS,
                    chain_method="sequential", progress_bar=False)  # fmt: skip
        start = time.perf_counter()
        mcmc.run(jax.random.PRNGKey(0), *args, batch_size=None)
        draws = keep({k: np.asarray(v) for k, v in mcmc.get_samples(group_by_chain=True).items()})
        seconds = time.perf_counter() - start
        np.savez_compressed(path, seconds=seconds, **{k: np.asarray(v, np.float32) for k, v in draws.items()})
    with np.load(path) as data:
        return {k: np.asarray(data[k], np.float64) for k in data.files if k != "seconds"}, float(data["seconds"])


# --- one run ---------------------------------------------------------------------------------------------
def compare(mean: np.ndarray, sd: np.ndarray, ref_mean: np.ndarray, ref_sd: np.ndarray) -> dict[str, float]:
    """The cell's error numbers, its score and whether it passes (see the module docstring)."""
    err = np.abs(mean - ref_mean) / ref_sd
    ratio = sd / ref_sd
    score = max(float(err.max()) / MEAN_BOUND, float(np.max(np.abs(np.log(ratio)))) / math.log(SD_BOUNDS[1]))
    if not np.isfinite(score):
        score = math.inf
    return {"mean_err_median": float(np.median(err)), "mean_err_max": float(err.max()),
            "sd_ratio_median": float(np.median(ratio)), "sd_ratio_min": float(ratio.min()),
            "sd_ratio_max": float(ratio.max()), "score": score,
            "pass": bool(err.max() <= MEAN_BOUND and SD_BOUNDS[0] <= ratio.min() and ratio.max() <= SD_BOUNDS[1])}  # fmt: skip


def make_kernel(name: str, target: Target, options: dict[str, Any]) -> Any:
    return getattr(sg, name)(target.model, steps_per_sample=target.thin, **options)


Run = tuple[MCMC, dict[str, np.ndarray]]  # a finished MCMC and its draws {site: (chains, draws, ...)}


def importance_resampled(samples: dict[str, np.ndarray], log_weight: np.ndarray) -> tuple[dict[str, np.ndarray], float]:
    """CSGLD's draws follow the flattened density: resampled by their importance weights (per chain, systematic,
    ``ppl_sgmcmc.importance.resample``) into draws of the posterior, and the weights' Kish ESS over the draws."""
    idata = az.from_dict(posterior=samples, sample_stats={"log_weight": log_weight})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a low weight ESS is reported in the table instead
        posterior = resample(idata, seed=0).posterior
    ess = float(posterior.attrs["importance_weight_ess"]) / log_weight.size
    return {k: np.asarray(posterior[k].values) for k in samples}, ess


def run_cell(name: str, target: Target, options: dict[str, Any], seed_: int = 0) -> tuple[dict[str, Any], Run | None]:
    """One run of kernel ``name`` with ``options``: its numbers (or the error it raised) and the finished run
    (CSGLD's draws importance-resampled)."""
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            kernel = make_kernel(name, target, options)
            # the library's MCMC: NumPyro's, with the end-of-run verdict a user of the README gets
            mcmc = sg.MCMC(kernel, num_warmup=target.warmup // target.thin,
                           num_samples=target.samples // target.thin, num_chains=CHAINS, chain_method="vectorized",
                           progress_bar=False)  # fmt: skip
            mcmc.run(jax.random.PRNGKey(seed_), *target.args)
            samples = {k: np.asarray(v) for k, v in mcmc.get_samples(group_by_chain=True).items()}
        except ValueError as err:
            return {"refused": str(err).split("\n")[0]}, None
    seconds = time.perf_counter() - start
    state = mcmc.last_state
    ratio = np.asarray(mcmc.get_extra_fields()["noise_ratio"], np.float64)
    finite = np.all([np.all(np.isfinite(v)) for v in samples.values()])
    out: dict[str, Any] = {"seconds": seconds, "step_size": np.asarray(state.step_size).ravel().tolist(),
                           "noise_ratio_median": float(np.nanmedian(ratio)) if np.any(np.isfinite(ratio)) else None,
                           "noise_ratio_p90": float(np.nanpercentile(ratio, 90)) if np.any(np.isfinite(ratio)) else None,
                           "rejected_steps": int(np.sum(np.asarray(state.num_diverging))),
                           "warnings": sorted({str(w.message).split("\n")[0][:300] for w in caught
                                               if issubclass(w.category, RuntimeWarning | UserWarning)})}  # fmt: skip
    if isinstance(state.adapt_state, tuple) and not state.adapt_state:
        out["restarts"] = 0
    else:
        out["restarts"] = int(np.sum(np.asarray(state.adapt_state.restarts)))
    if not finite:
        out.update(score=math.inf, **{"pass": False}, nonfinite=True)
        return out, (mcmc, samples)
    fields = mcmc.get_extra_fields(group_by_chain=True)
    if "log_weight" in fields:
        samples, out["weight_ess_fraction"] = importance_resampled(samples, np.asarray(fields["log_weight"]))
    out.update(compare(*target.moments(samples), target.ref_mean, target.ref_sd))
    return out, (mcmc, samples)


def add_ksd(cell: dict[str, Any], run: Run, target: Target) -> None:
    """The run's KSD in the target's coordinates (those of its first run when it has no reference covariance)."""
    if cell.get("nonfinite"):
        cell["ksd"] = None
        return
    mcmc, samples = run
    result = ksd(mcmc, num_draws=target.ksd_draws, samples=samples,
                 preconditioner="adapted" if target.ksd_preconditioner is None else target.ksd_preconditioner)  # fmt: skip
    if target.ksd_preconditioner is None:
        target.ksd_preconditioner = result.preconditioner
    cell["ksd"] = result.ksd


# --- the hand-tuned grid ---------------------------------------------------------------------------------
def grid_scales(target: Target, z: dict[str, jax.Array]) -> dict[str, dict[str, float]]:
    """Each kernel's ``h_n`` and ``h_s`` (and SGHMC's friction; the module docstring) from the full-data Hessian
    and 256 minibatch gradients of the potential at ``z`` (unconstrained)."""
    flat, unravel = ravel_pytree(z)

    def energy(x: jax.Array, key: jax.Array, batch: int | None) -> jax.Array:
        return potential_energy(seed(target.model, key), target.args, {"batch_size": batch}, unravel(x))

    key = jax.random.PRNGKey(0)
    H = np.asarray(jax.hessian(energy)(flat, key, None), np.float64)
    grads = np.asarray(jax.vmap(lambda k: jax.grad(energy)(flat, k, BATCH))(jax.random.split(key, 256)), np.float64)
    V = grads.var(0)
    lam = float(np.max(np.abs(np.linalg.eigvalsh(H))))
    G = 1 / (PSGLD_EPS + np.sqrt(np.mean((grads / target.num_data) ** 2, axis=0)))  # RMSprop's 1/(λ + sqrt(E ḡ²))
    lam_psgld = float(np.max(np.abs(np.linalg.eigvalsh(np.sqrt(np.outer(G, G)) * H))))
    noise = {name: 2 * TARGET_RATIO[name] / float(V.max()) for name in ("SGLD", "SGHMC", "SGNHT", "CSGLD")}
    friction = 2 * math.sqrt(lam)
    return {"SGLD": {"h_n": noise["SGLD"], "h_s": 1 / lam}, "CSGLD": {"h_n": noise["CSGLD"], "h_s": 1 / lam},
            "SGHMC": {"h_n": noise["SGHMC"] * friction, "h_s": 1 / math.sqrt(lam), "friction": friction},
            "SGNHT": {"h_n": noise["SGNHT"], "h_s": 1 / math.sqrt(lam)},
            "PSGLD": {"h_n": 2 * TARGET_RATIO["PSGLD"] / float(np.max(G * V)), "h_s": 1 / lam_psgld}}  # fmt: skip


def grid_options(name: str, scales: dict[str, dict[str, float]], points: int) -> list[dict[str, Any]]:
    """The hand-set runs' options: ``points`` step sizes log-spaced from ``h_n/10`` to ``max(10 h_n, h_s)``
    (SGHMC with its friction; SGFS: its α grid), no mode finding."""
    if name == "SGFS":
        alphas = SGFS_ALPHAS if points == len(SGFS_ALPHAS) else SGFS_ALPHAS[::2]
        return [{"alpha": a, "find_mode": False} for a in alphas]
    scale = scales[name]
    fixed = {"friction": scale["friction"]} if "friction" in scale else {}
    return [{"step_size": float(h), **fixed}
            for h in np.geomspace(scale["h_n"] / 10, max(10 * scale["h_n"], scale["h_s"]), points)]  # fmt: skip


def hand_tuned(name: str, target: Target, scales: dict[str, dict[str, float]], points: int) -> dict[str, Any]:
    """The grid's runs and the best one (by score), with its KSD."""
    runs, best, best_run = [], None, None
    for options in grid_options(name, scales, points):
        cell, run = run_cell(name, target, options)
        cell["options"] = options
        runs.append(cell)
        print(f"    {name} {options}: {_brief(cell)}", flush=True)
        if run is not None and (best is None or cell.get("score", math.inf) < best.get("score", math.inf)):
            best, best_run = cell, run
    if best is not None and best_run is not None:
        add_ksd(best, best_run, target)
        edge = runs.index(best) in (0, len(runs) - 1)
        best = {**best, "grid_edge": edge}
    return {"best": best, "grid": runs}


# --- the tables ------------------------------------------------------------------------------------------
def _brief(cell: dict[str, Any]) -> str:
    if "refused" in cell:
        return f"refused: {cell['refused'][:120]}"
    if cell.get("nonfinite"):
        return f"non-finite draws ({cell['seconds']:.0f} s)"
    return (f"err {cell['mean_err_median']:.3f}/{cell['mean_err_max']:.3f}, sd ratio {cell['sd_ratio_median']:.3f} "
            f"[{cell['sd_ratio_min']:.3f}, {cell['sd_ratio_max']:.3f}], score {cell['score']:.2f}, "
            f"{cell['seconds']:.0f} s")  # fmt: skip


def finite(tree: Any) -> Any:
    """``tree`` for strict JSON: non-finite floats (SGFS's ε = ∞, an unknown wall clock) become ``None``."""
    if isinstance(tree, dict):
        return {k: finite(v) for k, v in tree.items()}
    if isinstance(tree, list | tuple):
        return [finite(v) for v in tree]
    if isinstance(tree, float | np.floating):
        return float(tree) if math.isfinite(tree) else None
    return tree


def _fmt(x: float | None, digits: int = 3) -> str:
    return "—" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.{digits}g}"


def table_row(kernel: str, setting: str, cell: dict[str, Any] | None) -> str:
    if cell is None:
        return f"| {kernel} | {setting} | no run | | | | | | | |"
    if "refused" in cell:
        return f"| {kernel} | {setting} | refused: {cell['refused'][:160]} | | | | | | | |"
    if cell.get("nonfinite"):
        return f"| {kernel} | {setting} | non-finite draws | | | {cell['seconds']:.0f} | | | | fail |"
    steps = cell.get("step_size")
    if steps is None:
        steps_text = "—"
    elif all(h is None or math.isinf(h) for h in steps):
        steps_text = "ε = ∞ (α = 0)"
    else:
        steps_text = ", ".join(_fmt(h, 2) for h in steps)
    ratio = "—" if cell.get("noise_ratio_median") is None else (
        f"{cell['noise_ratio_median']:.2f} / {cell['noise_ratio_p90']:.2f}")  # fmt: skip
    seconds = _fmt(cell.get("seconds"), 0) if cell.get("seconds") is None else f"{cell['seconds']:.0f}"
    verdict = "pass" if cell["pass"] else "**fail**"
    return (f"| {kernel} | {setting} | {cell['mean_err_median']:.3f} / {cell['mean_err_max']:.3f} | "
            f"{cell['sd_ratio_median']:.3f} ({cell['sd_ratio_min']:.3f}-{cell['sd_ratio_max']:.3f}) | "
            f"{_fmt(cell.get('ksd'))} | {seconds} | {steps_text} | {ratio} | {cell['score']:.2f} | {verdict} |")  # fmt: skip


def print_table(name: str, entry: dict[str, Any]) -> None:
    """A target's Markdown table from its results ``entry``."""
    run = entry["settings"]
    print(f"\n### {name}: {run['chains']} chains × ({run['warmup_steps']:,} warm-up + {run['sample_steps']:,}) steps, "
          f"thinned by {run['thin']}. {run['note']}\n")  # fmt: skip
    print("| kernel | setting | mean err / ref sd: median / max | sd ratio: median (min-max) | KSD | wall (s) | "
          "step size(s) | noise ratio: median / p90 | score | pass |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---|---:|---:|---|")
    ref = entry["reference"]
    print(table_row("reference", ref["label"], {**ref, "step_size": None, "noise_ratio_median": None}))
    for kernel, cells in sorted(entry["kernels"].items(), key=lambda item: KERNELS.index(item[0])):
        for variant, cell in cells["default"].items():
            print(table_row(kernel, variant, cell))
        best = cells.get("hand_tuned", {}).get("best")
        if best is not None:
            options = best["options"]
            what = f"α = {options['alpha']:g}" if "alpha" in options else f"h = {options['step_size']:.3g}"
            what += f", friction {options['friction']:.3g}" if "friction" in options else ""
            print(table_row(kernel, f"best of grid: {what}{' (edge)' if best['grid_edge'] else ''}", best))


# --- the driver ------------------------------------------------------------------------------------------
def targets(names: list[str], quick: bool, refresh: bool) -> list[Target]:
    """The targets named, with their run lengths ``(warm-up steps, kept steps, thinning)`` per chain."""
    small, large = ((2_000, 10_000, 10), (4_000, 20_000, 20)) if quick else ((10_000, 50_000, 25),
                                                                            (20_000, 200_000, 100))  # fmt: skip
    make: dict[str, Callable[[], Target]] = {
        "linreg": lambda: linreg_target(small), "ill-conditioned": lambda: ill_conditioned_target(small),
        "a9a": lambda: a9a_target(large), "hierarchical": lambda: hier_target(large, refresh),
        "MLP": lambda: mlp_target(large, refresh)}  # fmt: skip
    return [make[name]() for name in names]


def run_target(target: Target, kernels: list[str], grid: bool, points: int,
               save: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """The target's cells for ``kernels`` (the defaults and, with ``grid``, the hand-set grid of ``points`` step
    sizes), passed to ``save`` after each kernel."""
    start = time.perf_counter()
    mean, sd, ref_mean, ref_sd = target.self_check
    entry: dict[str, Any] = {
        "settings": {"warmup_steps": target.warmup, "sample_steps": target.samples, "thin": target.thin,
                     "chains": CHAINS, "batch_size": BATCH, "note": target.note},
        "grid_points": {},
        "reference": {"label": target.self_label, "seconds": target.ref_seconds, **compare(mean, sd, ref_mean, ref_sd)},
        "kernels": {},
        "grid_scales": {},
    }  # fmt: skip
    scales: dict[str, dict[str, float]] | None = None
    first: MCMC | None = None
    for kernel in kernels:
        print(f"  {target.name} / {kernel}", flush=True)
        cells: dict[str, Any] = {"default": {}}
        for variant, options in target.variants.items():
            if kernel == "SGFS" and options.get("dense_mass"):
                continue  # SGFS preconditions by its own Fisher estimate
            cell, run = run_cell(kernel, target, options)
            if run is not None and not cell.get("nonfinite"):
                add_ksd(cell, run, target)
                if first is None:
                    first = run[0]
                    z0 = jax.tree.map(lambda v: v[0], first.last_state.z)
                    scales = grid_scales(target, z0)
                    if target.ref_draws is not None:
                        entry["reference"]["ksd"] = ksd(first, num_draws=target.ksd_draws, samples=target.ref_draws,
                                                        preconditioner=target.ksd_preconditioner).ksd  # fmt: skip
            label = "default (α = 0 from a mode)" if kernel == "SGFS" else variant
            cells["default"][label] = cell
            print(f"    {label}: {_brief(cell)}, KSD {_fmt(cell.get('ksd'))}, steps {cell.get('step_size')}, "
                  f"noise ratio {_fmt(cell.get('noise_ratio_median'))}/{_fmt(cell.get('noise_ratio_p90'))}", flush=True)
        if grid and scales is not None:
            cells["hand_tuned"] = hand_tuned(kernel, target, scales, points)
            entry["grid_points"][kernel] = len(cells["hand_tuned"]["grid"])
            if kernel in scales:
                entry["grid_scales"][kernel] = scales[kernel]
        entry["kernels"][kernel] = cells
        entry["seconds"] = time.perf_counter() - start
        save(entry)
    return entry


def save_entry(out: Path, name: str, entry: dict[str, Any], quick: bool) -> dict[str, Any]:
    """Merge a target's ``entry`` into the results file ``out`` (the cells of other kernels and targets, and a
    kernel's cells that the run did not make, kept; the file locked while it is read and written, so that runs
    of other targets or kernels may share it)."""
    with open(out, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        text = out.read_text()
        results = json.loads(text) if text else {"targets": {}}
        previous = results["targets"].get(name, {})
        merged = {**previous, **entry}
        for key in ("kernels", "grid_scales", "grid_points"):
            merged[key] = {**previous.get(key, {}), **entry[key]}
        for kernel, cells in entry["kernels"].items():  # a run with --no-grid keeps the kernel's hand-set cells
            merged["kernels"][kernel] = {**previous.get("kernels", {}).get(kernel, {}), **cells}
        results["targets"][name] = merged
        results["settings"] = {"date": datetime.date.today().isoformat(), "machine": machine(),
                               "jax": jax.__version__, "numpyro": numpyro.__version__, "quick": quick}  # fmt: skip
        out.write_text(json.dumps(finite(results), indent=1) + "\n")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1/10 of the steps, 3-point grids")
    parser.add_argument("--targets", nargs="+", default=["linreg", "ill-conditioned", "a9a", "hierarchical", "MLP"],
                        choices=["linreg", "ill-conditioned", "a9a", "hierarchical", "MLP"])  # fmt: skip
    parser.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=KERNELS)
    parser.add_argument("--no-grid", action="store_true", help="only the defaults")
    parser.add_argument("--grid-points", type=int, help=f"step sizes per hand-set grid (default {GRID_POINTS}; "
                        "3 with --quick; SGFS: 5 or 3 values of α)")  # fmt: skip
    parser.add_argument("--tables", action="store_true", help="print the tables of the results file, run nothing")
    parser.add_argument("--refresh-nuts", action="store_true",
                        help="rerun NUTS for the hierarchical model and the MLP (about 2 and 9 min)")
    args = parser.parse_args()
    points = args.grid_points or (3 if args.quick else GRID_POINTS)
    run_and_report(RESULTS / ("hands_off_quick.json" if args.quick else "hands_off.json"), args.quick, args.tables,
                   lambda: targets(args.targets, args.quick, args.refresh_nuts),
                   lambda target, checkpoint: run_target(target, args.kernels, not args.no_grid, points, checkpoint),
                   save_entry)  # fmt: skip


def run_and_report(
    out: Path,
    quick: bool,
    tables: bool,
    make_targets: Callable[[], list[Any]],
    run: Callable[[Any, Callable[[dict[str, Any]], Any]], dict[str, Any]],
    save: Callable[[Path, str, dict[str, Any], bool], dict[str, Any]],
    table: Callable[[str, dict[str, Any]], None] | None = None,
) -> None:
    """Print the tables of the results file ``out`` (``tables``), or run each target of ``make_targets()``
    (``run(target, checkpoint)``, which calls ``checkpoint(entry)`` after each kernel), save its entry into ``out``
    (``save``, merging with the file) and print its table (``table``, default :func:`print_table`)."""
    wall = time.perf_counter()
    table = print_table if table is None else table
    if tables:
        for name, entry in json.loads(out.read_text())["targets"].items():
            table(name, entry)
        return
    print(f"jax {jax.__version__}, numpyro {numpyro.__version__}; {machine()}", flush=True)
    for target in make_targets():
        start = time.perf_counter()
        entry = run(target, lambda e, name=target.name: save(out, name, e, quick))
        results = save(out, target.name, entry, quick)
        table(target.name, results["targets"][target.name])
        print(f"\n({target.name}: {time.perf_counter() - start:.0f} s)", flush=True)
    print(f"\nwrote {os.path.relpath(out)}; total wall time {time.perf_counter() - wall:.0f} s")


if __name__ == "__main__":
    main()
