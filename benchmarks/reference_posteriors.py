"""External ground truth: the hands-off kernels against reference posteriors that this project did not compute.

**The posteriors** come from posteriordb (https://github.com/stan-dev/posteriordb): each has a Stan model, its data
and reference draws from long Stan NUTS runs (10 chains × 1000 draws). Kept are those with a data plate of N >= 400
rows: the ARM regressions on ``earnings`` (N = 1192), ``kidiq`` and ``kidiq_with_mom_work`` (434), four years of
``nes`` (476-1350), brms's ``diamonds`` (5000 rows, 24 correlated predictors) and the two-component Gaussian mixture
``low_dim_gauss_mix`` (1000). Each Stan model is translated by hand (:func:`linear_model`, :func:`kidiq_model`,
:func:`diamonds_model`, :func:`gauss_mix_model`), once for both backends: a model takes the language (:class:`PPL`:
NumPyro's or Pyro's ``sample``, ``plate``, ``subsample`` and distributions) as its first argument. The same
parameters, constraints, priors and transformed data, the likelihood in a ``"data"`` plate subsampled to
``batch_size`` rows (``None``: all). Where the Stan model has no prior (Stan's implicit flat prior on ``beta`` and
on ``sigma > 0``), the translation uses ``Normal(0, width)`` and ``HalfNormal(width)`` with ``width =
10^ceil(log10(100 max|y|))``, far wider than the posterior; each posterior's metadata says so. Each translation was
checked against the reference draws with a short full-data NumPyro NUTS run (dense mass, 2 chains × (500 + 500),
seed 0): it passes when every parameter's mean is within 0.15 reference sd and every sd within 15 %; the result is
stored with the posterior, and a posterior that fails is dropped (``--build`` lists it). The Pyro translation is
checked against the NumPyro one (:func:`pyro_translation_check`, at the start of each posterior's Pyro cells): their
full-data log joint densities, in float64, must differ by one constant (to 1e-8 relative) at 10 reference draws and
10 points far in the tails; a posterior that fails runs no Pyro cell.

**The data** live in ``benchmarks/reference_data/`` (``<posterior>.npz``: the data after Stan's transformed data,
the reference's means, sds and covariance over all 10 000 draws, 1000 thinned draws, and ``meta``, a JSON
string: provenance, prior notes, the posterior correlation matrix's condition number and the translation
check), with a README giving provenance and citations. ``--build SNAPSHOT`` regenerates the folder from a
posteriordb snapshot (a checkout, or a bare git directory whose ``HEAD`` is read), rerunning the checks.

**Per cell** (a posterior × a kernel: SGLD, SGHMC, SGNHT, PSGLD, CSGLD), hands-off: ``Kernel(model)`` with no step
size, the minibatch ``subsample_size = max(32, round(0.08 N))``. On NumPyro (``--backend numpyro``, the default;
cells keyed by the kernel's name) ``ppl_sgmcmc.numpyro.MCMC(kernel, num_warmup=W, num_samples=S, num_chains=4,
chain_method="vectorized")``, every step kept. On Pyro (``--backend pyro``; cells keyed ``pyro:<kernel>``, in
``reference_posteriors_pyro*.json``) ``pyro.infer.MCMC(Kernel(model, steps_per_sample=5), warmup_steps=W // 5,
num_samples=S // 5, num_chains=4)``: the same W and S steps per chain, every 5th kept; the chains run one after the
other in the process (``torch.set_num_threads(1)``, ``pyro.set_rng_seed(seed)``), and each chain is judged alone at
its end. CSGLD's draws are importance-weighted (per-chain self-normalised weights, as ``ppl_sgmcmc.importance``),
its moments are the weighted ones. Measured: ``max_p |mean_p - ref mean_p| / ref sd_p`` and the sd ratios ``sd_p /
ref sd_p`` (min, max) over the parameters ``p`` (the Stan model's parameters, constrained); the cell **passes** when
the max error is <= 0.2 and every sd ratio is in [0.8, 1.25]. Every warning the run raises is recorded
(``warnings.catch_warnings(record=True)``, ``simplefilter("always")``; the first 200 characters of each distinct
text). A cell's **status**: ``pass``; ``warn``, failed but the run raised a ``RuntimeWarning`` (or an exception);
``silent``, failed without a ``RuntimeWarning``: the library's worst outcome. Each cell also records ``verdict``,
the end-of-run verdict on all its chains together (``ppl_sgmcmc.diagnostics.verdict``, without warning: R-hat, bulk
and tail ESS, drift, the noise ratio's upper quantile), and its ``steps``.

Usage (from the repository root)::

    .venv/bin/python -m benchmarks.reference_posteriors                 # W = 10 000, S = 40 000 steps per chain
    .venv/bin/python -m benchmarks.reference_posteriors --quick         # W = 2000, S = 8000
    .venv/bin/python -m benchmarks.reference_posteriors --quick --kernels SGLD SGNHT --posteriors diamonds-diamonds
    .venv/bin/python -m benchmarks.reference_posteriors --backend pyro --kernels SGNHT --steps 4000 16000
    .venv/bin/python -m benchmarks.reference_posteriors --table           # the table of both backends' files
    .venv/bin/python -m benchmarks.reference_posteriors --build /path/to/posteriordb   # regenerate the data

Writes ``benchmarks/results/reference_posteriors.json`` (``reference_posteriors_quick.json`` with ``--quick``;
``reference_posteriors_pyro[_quick].json`` with ``--backend pyro``; ``--steps W S`` overrides the preset's steps
but not the file); a run of a subset updates the cells it ran (added to the file as it is when the cell ends, so
runs of other subsets can share it). Prints a Markdown table of both backends' files (posterior, N, d, condition
number, then per kernel and backend: status, max error / sd ratio range) and the counts of pass, warn, silent,
per column with the steps used.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import io
import json
import math
import os
import platform
import subprocess
import time
import warnings
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import numpyro  # noqa: E402
import numpyro.distributions as dist  # noqa: E402
from numpyro.distributions import constraints  # noqa: E402
from numpyro.infer import NUTS  # noqa: E402

from ppl_sgmcmc import numpyro as sg  # noqa: E402

HERE = Path(__file__).resolve().parent
DATA = HERE / "reference_data"
RESULTS = HERE / "results"
KERNELS = ("SGLD", "SGHMC", "SGNHT", "PSGLD", "CSGLD")
BACKENDS = ("numpyro", "pyro")
CHAINS, BATCH_FRACTION, MIN_BATCH = 4, 0.08, 32
MEAN_BOUND, SD_BOUNDS = 0.2, (0.8, 1.25)
STEPS = {"quick": (2000, 8000), "full": (10_000, 40_000)}  # (W, S) per chain
CHECK_MEAN, CHECK_SD = 0.15, 0.15  # the translation check's bounds (in reference sds; relative)
KEPT_DRAWS = 1000
PYRO_STEPS_PER_SAMPLE = 5  # Pyro: each kept draw is every 5th step (amortises Pyro's per-draw cost)


# --- the models: hand translations of posteriordb's Stan models, written once for both backends -------------
@dataclass(frozen=True)
class PPL:
    """What a model needs of its probabilistic programming language: NumPyro's or Pyro's ``sample``, ``plate``,
    ``subsample`` and distributions, the array library's ``stack`` and the ordered-vector prior."""

    sample: Callable[..., Any]
    plate: Callable[..., Any]
    subsample: Callable[..., Any]
    dist: Any
    stack: Callable[..., Any]
    sorted_normal: Callable[[float, int], Any]


def _normal_plate(ppl: PPL, X: Any, y: Any, offset: Any, beta: Any, sigma: Any, batch_size: int | None) -> None:
    """``y ~ Normal(offset + X beta, sigma)`` over the rows, subsampled to ``batch_size``."""
    with ppl.plate("data", X.shape[0], subsample_size=batch_size):
        Xb = ppl.subsample(X, event_dim=1)
        yb = ppl.subsample(y, event_dim=0)
        ppl.sample("y", ppl.dist.Normal(offset + Xb @ beta, sigma), obs=yb)


def linear_model(ppl: PPL, X: Any, y: Any, width: float, batch_size: int | None = None) -> None:
    """The ARM regressions (``earnings``, ``kidiq_with_mom_work``, ``nes``): ``y ~ normal(X beta, sigma)``, ``X``'s
    first column the intercept's ones. Stan has no prior (flat): ``Normal(0, width)`` and ``HalfNormal(width)``."""
    beta = ppl.sample("beta", ppl.dist.Normal(0.0, width).expand([X.shape[1]]).to_event(1))
    sigma = ppl.sample("sigma", ppl.dist.HalfNormal(width))
    _normal_plate(ppl, X, y, 0.0, beta, sigma, batch_size)


def kidiq_model(ppl: PPL, X: Any, y: Any, width: float, batch_size: int | None = None) -> None:
    """The ``kidiq`` regressions: as :func:`linear_model` but ``sigma ~ cauchy(0, 2.5)`` (half-Cauchy on
    ``sigma > 0``); ``beta`` has no prior in Stan (flat): ``Normal(0, width)``."""
    beta = ppl.sample("beta", ppl.dist.Normal(0.0, width).expand([X.shape[1]]).to_event(1))
    sigma = ppl.sample("sigma", ppl.dist.HalfCauchy(2.5))
    _normal_plate(ppl, X, y, 0.0, beta, sigma, batch_size)


def diamonds_model(ppl: PPL, X: Any, y: Any, batch_size: int | None = None) -> None:
    """brms's ``diamonds``: ``b ~ normal(0, 1)``, ``Intercept ~ student_t(3, 8, 10)``, ``sigma ~ student_t(3, 0,
    10)`` truncated to ``sigma > 0`` (a half-t), ``Y ~ normal(Intercept + Xc b, sigma)`` with ``Xc`` the centred
    predictors (Stan's transformed data, computed by ``--build``)."""
    b = ppl.sample("b", ppl.dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    intercept = ppl.sample("Intercept", ppl.dist.StudentT(3.0, 8.0, 10.0))
    sigma = ppl.sample("sigma", ppl.dist.FoldedDistribution(ppl.dist.StudentT(3.0, 0.0, 10.0)))
    _normal_plate(ppl, X, y, intercept, b, sigma, batch_size)


class SortedNormal(dist.Distribution):
    """The order statistics of ``k`` independent ``Normal(0, scale)``: Stan's ``ordered[k] mu; mu ~ normal(0,
    scale)`` (the same density on the ordered vectors, normalised), with a ``sample`` for the kernels' init."""

    arg_constraints: dict = {}
    support = constraints.ordered_vector

    def __init__(self, scale: float, k: int) -> None:
        self.scale, self.k = scale, k
        super().__init__(batch_shape=(), event_shape=(k,))

    def sample(self, key: jax.Array, sample_shape: tuple = ()) -> jax.Array:
        return jnp.sort(self.scale * jax.random.normal(key, (*sample_shape, self.k)), axis=-1)

    def log_prob(self, value: jax.Array) -> jax.Array:
        return dist.Normal(0.0, self.scale).log_prob(value).sum(-1) + math.lgamma(self.k + 1)


def gauss_mix_model(ppl: PPL, y: Any, batch_size: int | None = None) -> None:
    """``low_dim_gauss_mix``: ``ordered[2] mu ~ normal(0, 2)``, ``sigma[k] ~ normal(0, 2)`` on ``sigma > 0``,
    ``theta ~ beta(5, 5)``, ``y ~ theta normal(mu[1], sigma[1]) + (1 - theta) normal(mu[2], sigma[2])``."""
    mu = ppl.sample("mu", ppl.sorted_normal(2.0, 2))
    sigma = ppl.sample("sigma", ppl.dist.HalfNormal(2.0).expand([2]).to_event(1))
    theta = ppl.sample("theta", ppl.dist.Beta(5.0, 5.0))
    mixing = ppl.dist.Categorical(probs=ppl.stack([theta, 1.0 - theta]))
    with ppl.plate("data", y.shape[0], subsample_size=batch_size):
        yb = ppl.subsample(y, event_dim=0)
        ppl.sample("y", ppl.dist.MixtureSameFamily(mixing, ppl.dist.Normal(mu, sigma)), obs=yb)


MODELS: dict[str, Callable[..., None]] = {"linear": linear_model, "kidiq": kidiq_model, "diamonds": diamonds_model,
                                          "gauss_mix": gauss_mix_model}
NUMPYRO = PPL(numpyro.sample, numpyro.plate, numpyro.subsample, dist, jnp.stack, SortedNormal)


def pyro_ppl() -> PPL:
    """Pyro's :class:`PPL` (imported on first use: a NumPyro run does not load torch)."""
    import pyro
    import torch

    class TorchSortedNormal(pyro.distributions.TorchDistribution):
        """:class:`SortedNormal` for Pyro."""

        arg_constraints: dict = {}
        support = pyro.distributions.constraints.ordered_vector

        def __init__(self, scale: float, k: int) -> None:
            self.scale, self.k = scale, k
            super().__init__(batch_shape=torch.Size(), event_shape=torch.Size([k]), validate_args=False)

        def sample(self, sample_shape: torch.Size | list[int] | tuple[int, ...] = ()) -> torch.Tensor:
            return torch.sort(self.scale * torch.randn(*sample_shape, self.k), dim=-1).values

        def log_prob(self, value: torch.Tensor) -> torch.Tensor:
            return torch.distributions.Normal(0.0, self.scale).log_prob(value).sum(-1) + math.lgamma(self.k + 1)

    return PPL(pyro.sample, pyro.plate, pyro.subsample, pyro.distributions, torch.stack, TorchSortedNormal)


# --- the posteriors: Stan's transformed data, per posteriordb posterior ------------------------------------
def _columns(*cols: np.ndarray) -> np.ndarray:
    return np.stack([np.ones_like(cols[0]), *cols], axis=1)


def _sd(x: np.ndarray) -> float:
    return float(np.std(x, ddof=1))  # Stan's sd()


def _earnings(transform: Callable[[np.ndarray, np.ndarray], np.ndarray],
              response: Callable[[np.ndarray], np.ndarray] = np.log) -> Callable[[dict], tuple]:
    return lambda d: (transform(np.asarray(d["height"], float), np.asarray(d["male"], float)),
                      response(np.asarray(d["earn"], float)))


def _kid(transform: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Callable[[dict], tuple]:
    return lambda d: (transform(np.asarray(d["mom_hs"], float), np.asarray(d["mom_iq"], float)),
                      np.asarray(d["kid_score"], float))


def _mom_work(d: dict) -> tuple[np.ndarray, np.ndarray]:
    work = np.asarray(d["mom_work"])
    return _columns(work == 2, work == 3, work == 4).astype(float), np.asarray(d["kid_score"], float)


def _nes(d: dict) -> tuple[np.ndarray, np.ndarray]:
    age = np.asarray(d["age_discrete"])
    cols = [np.asarray(d[k], float) for k in ("real_ideo", "race_adj")]
    cols += [(age == a).astype(float) for a in (2, 3, 4)]
    cols += [np.asarray(d[k], float) for k in ("educ1", "gender", "income")]
    return _columns(*cols), np.asarray(d["partyid7"], float)


def _diamonds(d: dict) -> tuple[np.ndarray, np.ndarray]:
    X = np.asarray(d["X"], float)[:, 1:]
    return X - X.mean(0), np.asarray(d["Y"], float)


def _z(x: np.ndarray, scale: float = 1.0) -> np.ndarray:
    return (x - x.mean()) / (scale * _sd(x))


#: posteriordb posterior -> (model, Stan's data -> (X, y) after its transformed data; ``X = None``: no predictors)
POSTERIORS: dict[str, tuple[str, Callable[[dict], tuple]]] = {
    "diamonds-diamonds": ("diamonds", _diamonds),
    "earnings-earn_height": ("linear", _earnings(lambda h, m: _columns(h), lambda e: e)),
    "earnings-log10earn_height": ("linear", _earnings(lambda h, m: _columns(h), np.log10)),
    "earnings-logearn_height": ("linear", _earnings(lambda h, m: _columns(h))),
    "earnings-logearn_height_male": ("linear", _earnings(lambda h, m: _columns(h, m))),
    "earnings-logearn_interaction": ("linear", _earnings(lambda h, m: _columns(h, m, h * m))),
    "earnings-logearn_interaction_z": ("linear", _earnings(lambda h, m: _columns(_z(h), m, _z(h) * m))),
    "earnings-logearn_logheight_male": ("linear", _earnings(lambda h, m: _columns(np.log(h), m))),
    "kidiq-kidscore_interaction": ("kidiq", _kid(lambda hs, iq: _columns(hs, iq, hs * iq))),
    "kidiq-kidscore_momhs": ("kidiq", _kid(lambda hs, iq: _columns(hs))),
    "kidiq-kidscore_momhsiq": ("kidiq", _kid(lambda hs, iq: _columns(hs, iq))),
    "kidiq-kidscore_momiq": ("kidiq", _kid(lambda hs, iq: _columns(iq))),
    "kidiq_with_mom_work-kidscore_interaction_c": (
        "linear", _kid(lambda hs, iq: _columns(hs - hs.mean(), iq - iq.mean(), (hs - hs.mean()) * (iq - iq.mean())))),
    "kidiq_with_mom_work-kidscore_interaction_c2": (
        "linear", _kid(lambda hs, iq: _columns(hs - 0.5, iq - 100.0, (hs - 0.5) * (iq - 100.0)))),
    "kidiq_with_mom_work-kidscore_interaction_z": (
        "linear", _kid(lambda hs, iq: _columns(_z(hs, 2.0), _z(iq, 2.0), _z(hs, 2.0) * _z(iq, 2.0)))),
    "kidiq_with_mom_work-kidscore_mom_work": ("linear", _mom_work),
    "nes1972-nes": ("linear", _nes),
    "nes1984-nes": ("linear", _nes),
    "nes1992-nes": ("linear", _nes),
    "nes2000-nes": ("linear", _nes),
    "low_dim_gauss_mix-low_dim_gauss_mix": ("gauss_mix", lambda d: (None, np.asarray(d["y"], float))),
}  # fmt: skip


@dataclass
class Posterior:
    """A posterior of ``reference_data/``: its model and arguments (``batch_size`` excluded), the parameters'
    names (Stan's: ``beta[2]`` is ``beta[..., 1]``) and the reference's moments over them."""

    name: str
    model: Callable[..., None]
    args: tuple
    num_data: int
    names: list[str]
    ref_mean: np.ndarray
    ref_sd: np.ndarray
    meta: dict[str, Any]

    @property
    def batch_size(self) -> int:
        return max(MIN_BATCH, round(BATCH_FRACTION * self.num_data))


def model_args(kind: str, X: np.ndarray | None, y: np.ndarray, width: float | None,
               as_array: Callable[[np.ndarray], Any] = lambda a: jnp.asarray(a, jnp.float32)) -> tuple:
    """The model's positional arguments from the stored data (``as_array``: to the backend's float32 array)."""
    if X is None:  # gauss_mix
        return (as_array(y),)
    return (as_array(X), as_array(y)) if kind == "diamonds" else (as_array(X), as_array(y), width)


def _torch_float32(a: np.ndarray) -> Any:
    import torch

    return torch.as_tensor(np.asarray(a, np.float32))


def load(name: str, backend: str = "numpyro") -> Posterior:
    """The stored posterior, its model and arguments in ``backend``'s language (``"numpyro"`` or ``"pyro"``)."""
    ppl, as_array = (NUMPYRO, lambda a: jnp.asarray(a, jnp.float32)) if backend == "numpyro" else (
        pyro_ppl(), _torch_float32)  # fmt: skip
    with np.load(DATA / f"{name}.npz") as f:
        meta = json.loads(str(f["meta"]))
        X = f["X"] if "X" in f.files else None
        args = model_args(meta["model"], X, f["y"], meta["prior_width"], as_array)
        return Posterior(name, functools.partial(MODELS[meta["model"]], ppl), args, int(f["y"].shape[0]),
                         meta["parameters"], f["ref_mean"].astype(np.float64), f["ref_sd"].astype(np.float64),
                         meta)  # fmt: skip


def available() -> list[str]:
    return sorted(p.stem for p in DATA.glob("*.npz"))


def flatten(samples: dict[str, np.ndarray], names: list[str], sample_dims: int) -> np.ndarray:
    """Draws ``{site: (*sample dims, ...)}`` as an array ``(*sample dims, len(names))`` in Stan's names' order."""
    out = []
    for name in names:
        site, _, index = name.partition("[")
        value = np.asarray(samples[site], np.float64)
        out.append(value[(..., int(index[:-1]) - 1)] if index else value.reshape(value.shape[:sample_dims]))
    return np.stack(out, axis=-1)


def errors(mean: np.ndarray, sd: np.ndarray, post: Posterior) -> dict[str, float]:
    """``max |mean - ref mean| / ref sd`` and the sd ratios' range."""
    ratio = sd / post.ref_sd
    return {"mean_err_max": float(np.max(np.abs(mean - post.ref_mean) / post.ref_sd)),
            "sd_ratio_min": float(ratio.min()), "sd_ratio_max": float(ratio.max())}


# --- --build: the data folder from a posteriordb snapshot --------------------------------------------------
class Snapshot:
    """posteriordb's files from a checkout or from a bare git directory (``git show HEAD:...``)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.bare = not (path / "posterior_database").is_dir()

    def _git(self, *args: str) -> bytes:
        where = ["--git-dir", str(self.path)] if self.bare else ["-C", str(self.path)]
        return subprocess.run(["git", *where, *args], check=True, capture_output=True).stdout

    def commit(self) -> str:
        try:
            return self._git("rev-parse", "HEAD").decode().strip()
        except (subprocess.CalledProcessError, FileNotFoundError):
            return "unknown (not a git checkout)"

    def read(self, path: str, database: bool = True) -> bytes:
        """The file at ``path`` under ``posterior_database/`` (``database=False``: under the repository root)."""
        path = f"posterior_database/{path}" if database else path
        return self._git("show", f"HEAD:{path}") if self.bare else (self.path / path).read_bytes()

    def json(self, path: str) -> Any:
        if path.endswith(".zip"):
            with zipfile.ZipFile(io.BytesIO(self.read(path))) as z:
                return json.loads(z.read(z.namelist()[0]))
        return json.loads(self.read(path))


def translation_check(post: Posterior) -> dict[str, Any]:
    """Full-data NUTS (dense mass, 2 chains × (500 + 500), seed 0) on the translation against the reference."""
    mcmc = numpyro.infer.MCMC(NUTS(post.model, dense_mass=True), num_warmup=500, num_samples=500, num_chains=2,
                              chain_method="sequential", progress_bar=False)  # fmt: skip
    start = time.perf_counter()
    mcmc.run(jax.random.PRNGKey(0), *post.args, batch_size=None)
    flat = flatten({k: np.asarray(v) for k, v in mcmc.get_samples().items()}, post.names, 1)
    out = errors(flat.mean(0), flat.std(0, ddof=1), post)
    out["pass"] = bool(out["mean_err_max"] <= CHECK_MEAN and abs(out["sd_ratio_min"] - 1) <= CHECK_SD
                       and abs(out["sd_ratio_max"] - 1) <= CHECK_SD)  # fmt: skip
    return {**out, "seconds": round(time.perf_counter() - start, 1),
            "method": "NumPyro NUTS, dense mass, full data, 2 chains x (500 warm-up + 500), seed 0, float32",
            "bounds": f"mean within {CHECK_MEAN} ref sd, sd within {CHECK_SD:.0%}"}


def _unflatten(row: np.ndarray, names: list[str], shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """One draw in Stan's names' order as ``{site: value}`` (the inverse of :func:`flatten`)."""
    out = {site: np.zeros(shape) for site, shape in shapes.items()}
    for value, name in zip(row, names):
        site, _, index = name.partition("[")
        out[site][(int(index[:-1]) - 1,) if index else ()] = value
    return out


def pyro_translation_check(name: str, num_points: int = 20, seed: int = 0) -> dict[str, Any]:
    """The Pyro translation's full-data log joint density against the NumPyro one's (checked against the
    reference draws by :func:`translation_check`) at ``num_points`` points, in float64: half of them reference
    draws, half a reference draw moved by a standard normal step in the unconstrained space (a point far out in
    the tails). It passes when the densities differ by one constant: ``max |diff - diff_0| <= 1e-8 (1 + max
    |log density|)``."""
    import pyro
    import torch
    from numpyro.distributions.transforms import biject_to

    with np.load(DATA / f"{name}.npz") as f:
        meta, draws = json.loads(str(f["meta"])), f["ref_draws"].astype(np.float64)
        X, y = (f["X"] if "X" in f.files else None), f["y"]
    kind, names = meta["model"], meta["parameters"]
    jax.config.update("jax_enable_x64", True)
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        np_model = functools.partial(MODELS[kind], NUMPYRO)
        py_model = functools.partial(MODELS[kind], pyro_ppl())
        np_args = model_args(kind, X, y, meta["prior_width"], lambda a: jnp.asarray(a, jnp.float64))
        py_args = model_args(kind, X, y, meta["prior_width"], lambda a: torch.as_tensor(np.asarray(a, np.float64)))
        trace = numpyro.handlers.trace(numpyro.handlers.seed(np_model, 0)).get_trace(*np_args, batch_size=None)
        sites = {k: s["fn"].support for k, s in trace.items() if s["type"] == "sample" and not s["is_observed"]}
        shapes = {k: tuple(trace[k]["value"].shape) for k in sites}
        rng = np.random.default_rng(seed)
        points = []
        for row in draws[:: len(draws) // (num_points // 2)][: num_points // 2]:
            point = _unflatten(row, names, shapes)
            points.append(point)
            points.append({k: np.asarray(biject_to(sites[k])(biject_to(sites[k]).inv(jnp.asarray(v))
                                                             + rng.standard_normal(v.shape)))
                           for k, v in point.items()})  # fmt: skip
        log_np, log_py = [], []
        for point in points:
            log_np.append(float(numpyro.infer.util.log_density(np_model, np_args, {"batch_size": None}, point)[0]))
            data = {k: torch.tensor(np.array(v)) for k, v in point.items()}
            conditioned = pyro.poutine.trace(pyro.poutine.condition(py_model, data=data))
            log_py.append(float(conditioned.get_trace(*py_args, batch_size=None).log_prob_sum()))
    finally:
        jax.config.update("jax_enable_x64", False)
        torch.set_default_dtype(default_dtype)
    diff = np.asarray(log_py) - np.asarray(log_np)
    spread, scale = float(np.max(np.abs(diff - diff[0]))), float(np.max(np.abs(log_np)))
    return {"pass": bool(spread <= 1e-8 * (1.0 + scale)), "points": len(points), "constant": float(diff[0]),
            "spread": spread, "max_abs_log_density": scale,
            "method": "full-data log joint of the Pyro translation minus the NumPyro one's, float64, at reference "
                      "draws and at reference draws moved N(0, 1) in unconstrained space; pass: one constant to "
                      "1e-8 (1 + max |log density|)"}  # fmt: skip


def build_one(snap: Snapshot, name: str, commit: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """One posterior's metadata and arrays (with its translation check)."""
    kind, design = POSTERIORS[name]
    info = snap.json(f"posteriors/{name}.json")
    data = snap.json(f"data/data/{info['data_name']}.json.zip")
    chains = snap.json(f"reference_posteriors/draws/draws/{name}.json.zip")
    names = list(chains[0])
    draws = np.stack([np.stack([np.asarray(c[k], np.float64) for k in names], -1) for c in chains])  # (C, D, d)
    X, y = design(data)
    flat = draws.reshape(-1, len(names))
    mean, sd, cov = flat.mean(0), flat.std(0, ddof=1), np.cov(flat, rowvar=False)
    corr = cov / np.outer(sd, sd)
    width = float(10.0 ** math.ceil(math.log10(100 * np.max(np.abs(y)))))
    prior_note = {"linear": f"Stan has no prior on beta and sigma (improper flat); here beta ~ Normal(0, {width:g}), "
                            f"sigma ~ HalfNormal({width:g})",
                  "kidiq": f"Stan has no prior on beta (improper flat); here beta ~ Normal(0, {width:g})",
                  "diamonds": "as Stan (all priors proper)",
                  "gauss_mix": "as Stan (ordered mu with a normal(0, 2) density; all priors proper)"}[kind]  # fmt: skip
    data_info = snap.json(f"data/info/{info['data_name']}.info.json")
    meta: dict[str, Any] = {
        "posterior": name, "data": info["data_name"], "stan_model": info["model_name"], "model": kind,
        "posteriordb_commit": commit, "parameters": names, "N": int(y.shape[0]), "d": len(names),
        "prior_width": width if kind in ("linear", "kidiq") else None, "prior_note": prior_note,
        "condition_number": float(np.linalg.cond(corr)),
        "reference": f"posteriordb reference draws: {len(chains)} chains x {draws.shape[1]} draws (Stan NUTS); "
                     f"moments over all of them, {KEPT_DRAWS} thinned draws kept",
        "data_references": data_info.get("references"), "data_urls": data_info.get("urls"),
        "data_title": data_info.get("title"),
        "stan_code": snap.read(f"models/stan/{info['model_name']}.stan").decode(),
    }  # fmt: skip
    arrays = {"y": y.astype(np.float32), "ref_mean": mean.astype(np.float32), "ref_sd": sd.astype(np.float32),
              "ref_cov": cov.astype(np.float32),
              "ref_draws": flat[:: flat.shape[0] // KEPT_DRAWS][:KEPT_DRAWS].astype(np.float32)}  # fmt: skip
    if X is not None:
        arrays["X"] = X.astype(np.float32)
    post = Posterior(name, functools.partial(MODELS[kind], NUMPYRO), model_args(kind, X, y, width), int(y.shape[0]),
                     names, mean, sd, meta)  # fmt: skip
    meta["translation_check"] = translation_check(post)
    return meta, arrays


def build(snapshot: Path, names: list[str]) -> None:
    snap = Snapshot(snapshot)
    commit = snap.commit()
    DATA.mkdir(exist_ok=True)
    dropped = []
    for name in names:
        print(f"{name} ...", flush=True)
        meta, arrays = build_one(snap, name, commit)
        check = meta["translation_check"]
        print(f"  N {meta['N']}, d {meta['d']}, condition number {meta['condition_number']:.3g}; check "
              f"{'pass' if check['pass'] else 'FAIL'}: max err {check['mean_err_max']:.3f}, sd ratios "
              f"{check['sd_ratio_min']:.3f}-{check['sd_ratio_max']:.3f} ({check['seconds']} s)", flush=True)
        path = DATA / f"{name}.npz"
        if check["pass"]:
            np.savez_compressed(path, meta=np.array(json.dumps(meta)), **arrays)
        else:
            path.unlink(missing_ok=True)
            dropped.append(meta)
    bib = snap.read("bibliography/references.bib").decode()
    citation = snap.read("CITATION.cff", database=False).decode()
    write_readme(commit, [load(p).meta for p in available()], dropped, bib, citation)


def _bib_entry(bib: str, key: str) -> str:
    start = bib.find("{" + key + ",")
    if start < 0:
        return key
    start = bib.rfind("@", 0, start)
    end = bib.find("\n}", start)
    return " ".join(bib[start : end + 2].split())


def _urls(urls: str | list[str] | None) -> str:
    return urls if isinstance(urls, str) else ", ".join(urls or [])


def write_readme(commit: str, kept: list[dict[str, Any]], dropped: list[dict[str, Any]], bib: str,
                 citation: str) -> None:
    rows = "\n".join(
        f"| {m['posterior']} | {m['N']} | {m['d']} | {m['condition_number']:.3g} | "
        f"{'pass' if m['translation_check']['pass'] else 'fail'} ({m['translation_check']['mean_err_max']:.3f}, "
        f"{m['translation_check']['sd_ratio_min']:.3f}-{m['translation_check']['sd_ratio_max']:.3f}) | "
        f"{m['prior_note']} |" for m in kept)  # fmt: skip
    gone = "\n".join(f"- {m['posterior']}: translation check failed (max err {m['translation_check']['mean_err_max']:.3f}, "
                     f"sd ratios {m['translation_check']['sd_ratio_min']:.3f}-"
                     f"{m['translation_check']['sd_ratio_max']:.3f})" for m in dropped) or "- none"  # fmt: skip
    refs = sorted({r for m in kept for r in ([m["data_references"]] if isinstance(m["data_references"], str)
                                             else m["data_references"] or [])})  # fmt: skip
    cites = "\n".join(f"- `{r}`: {_bib_entry(bib, r)}" for r in refs)
    sources = "\n".join(sorted({f"- {m['data']}: {m['data_title']} ({_urls(m['data_urls'])})" for m in kept}))
    (DATA / "README.md").write_text(f"""# Reference posteriors (external ground truth)

Generated by `python -m benchmarks.reference_posteriors --build SNAPSHOT` from a snapshot of
[posteriordb](https://github.com/stan-dev/posteriordb), commit `{commit}`, on {datetime.date.today()}.
Read by `benchmarks/reference_posteriors.py` (its module docstring describes the benchmark).

Per posterior, `<posterior>.npz` holds: `y` (and `X`, the design matrix after the Stan model's transformed data:
a first column of ones for the ARM regressions' `beta[1]`, brms's centred predictors for diamonds), `ref_mean`,
`ref_sd`, `ref_cov` (over all 10 000 reference draws, in the order of `meta["parameters"]`), `ref_draws`
({KEPT_DRAWS} draws, every 10th), all float32, and `meta` (a JSON string: provenance, the Stan code, the prior
note, the condition number of the reference's correlation matrix and the translation check). The reference draws
are posteriordb's (Stan NUTS, 10 chains x 1000 draws); nothing here was sampled by this project except the
translation checks.

**Translation check**: full-data NumPyro NUTS of the hand translation (dense mass, 2 chains x (500 warm-up + 500
draws), seed 0, float32) against the reference: passes when every parameter's mean is within {CHECK_MEAN} reference
sd and every sd within {CHECK_SD:.0%} of the reference's. Column: result (max mean error in ref sds, sd ratio range).

| posterior | N | d | condition number | translation check | priors |
|---|---|---|---|---|---|
{rows}

Dropped (not stored):

{gone}

Not used: `nes1976`, `nes1980`, `nes1988` and `nes1996` (the same model as the four `nes` years kept, on other
years' surveys). posteriordb's other posteriors with reference draws have no data plate of N >= 400 rows (time
series, ODE and GP models, the 8 schools; `mesquite` has N = 46, `sblrc`/`sblri` N = 100) or, like the
basketball HMMs, a likelihood that is not a sum over exchangeable rows.

## Licence and citation

posteriordb is distributed under the BSD 3-Clause licence (Copyright (c) 2011-2024, Stan Developers and their
Assignees). Its data sets come from published sources; cite them as posteriordb's data info files do:

{cites}

Data sources (posteriordb's info files):

{sources}

Cite posteriordb itself as its `CITATION.cff` asks:

```yaml
{citation.strip()}
```

and, as posteriordb's README asks, Stan: Carpenter B., Gelman A., Hoffman M. D., Lee D., Goodrich B., Betancourt M.,
Brubaker M., Guo J., Li P., and Riddell A. (2017). Stan: A probabilistic programming language. Journal of
Statistical Software 76(1). 10.18637/jss.v076.i01
""")


# --- the runner ---------------------------------------------------------------------------------------------
def moments(samples: dict[str, np.ndarray], fields: dict[str, Any], names: list[str]) -> tuple[np.ndarray, ...]:
    """Means and sds over the draws ``{site: (chains, draws, ...)}``; with a ``log_weight`` field (CSGLD) the
    per-chain self-normalised importance-weighted ones, averaged over chains, and the weights' Kish ESS
    fraction."""
    flat = flatten(samples, names, 2)  # (C, D, d)
    if "log_weight" not in fields:
        x = flat.reshape(-1, flat.shape[-1])
        return x.mean(0), x.std(0, ddof=1), np.array(1.0)
    log_w = np.asarray(fields["log_weight"], np.float64)
    w = np.exp(log_w - log_w.max(axis=1, keepdims=True))
    w /= w.sum(axis=1, keepdims=True) * w.shape[0]  # each chain's weights sum to 1/C
    mean = np.einsum("cn,cnd->d", w, flat)
    var = np.einsum("cn,cnd->d", w, (flat - mean) ** 2)
    return mean, np.sqrt(var), np.array(1.0 / np.sum(w**2) / w.size)


def _sample_numpyro(post: Posterior, kernel_name: str, steps: tuple[int, int], seed: int) -> tuple:
    """A hands-off NumPyro run: ``(the run, draws {site: (chain, draw, ...)}, extra fields, tuned step sizes)``."""
    kernel = getattr(sg, kernel_name)(post.model)
    mcmc = sg.MCMC(kernel, num_warmup=steps[0], num_samples=steps[1], num_chains=CHAINS, chain_method="vectorized",
                   progress_bar=False)  # fmt: skip
    mcmc.run(jax.random.PRNGKey(seed), *post.args, batch_size=post.batch_size)
    samples = {k: np.asarray(v) for k, v in mcmc.get_samples(group_by_chain=True).items()}
    return mcmc, samples, mcmc.get_extra_fields(group_by_chain=True), mcmc.last_state.step_size


def _sample_pyro(post: Posterior, kernel_name: str, steps: tuple[int, int], seed: int) -> tuple:
    """A hands-off Pyro run (``pyro.infer.MCMC``, the chains one after the other, :data:`PYRO_STEPS_PER_SAMPLE`
    steps a draw): as :func:`_sample_numpyro`."""
    import pyro

    from ppl_sgmcmc import pyro as sp

    pyro.set_rng_seed(seed)
    kernel = getattr(sp, kernel_name)(post.model, steps_per_sample=PYRO_STEPS_PER_SAMPLE)
    mcmc = pyro.infer.MCMC(kernel, warmup_steps=steps[0] // PYRO_STEPS_PER_SAMPLE,
                           num_samples=steps[1] // PYRO_STEPS_PER_SAMPLE, num_chains=CHAINS, disable_progbar=True)  # fmt: skip
    mcmc.run(*post.args, batch_size=post.batch_size)
    samples = {k: v.detach().cpu().numpy() for k, v in mcmc.get_samples(group_by_chain=True).items()}
    stats = sp.sample_stats(mcmc)
    fields = {"log_weight": stats["log_weight"]} if "log_weight" in stats else {}
    return mcmc, samples, fields, stats["step_size"][:, -1]


def _verdict(mcmc: Any) -> dict[str, Any]:
    """The end-of-run verdict on all the run's chains together (``ppl_sgmcmc.diagnostics.verdict``, no warning)."""
    from ppl_sgmcmc.diagnostics import verdict

    try:
        v = verdict(mcmc, warn=False)
    except Exception as err:
        return {"error": f"{type(err).__name__}: {str(err)[:200]}"}
    return {"ok": bool(v.ok), "rhat": v.rhat, "rhat_of": v.rhat_of, "ess_bulk": v.ess_bulk, "ess_tail": v.ess_tail,
            "drift": v.drift, "drift_of": v.drift_of, "noise_ratio": v.noise_ratio, "noise_limit": v.noise_limit}


def run_cell(post: Posterior, kernel_name: str, steps: tuple[int, int], seed: int,
             backend: str = "numpyro") -> dict[str, Any]:
    """One hands-off run of ``kernel_name`` on ``post`` with ``backend``: its errors, warnings and status, and the
    verdict on all its chains together (``verdict``: on Pyro each chain is judged alone during the run)."""
    cell: dict[str, Any] = {"batch_size": post.batch_size, "seed": seed}
    if backend == "pyro":
        cell["steps_per_sample"] = PYRO_STEPS_PER_SAMPLE
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            sample = _sample_pyro if backend == "pyro" else _sample_numpyro
            mcmc, samples, fields, step_size = sample(post, kernel_name, steps, seed)
        except Exception as err:  # a refusal is recorded; the table goes on
            cell["error"] = f"{type(err).__name__}: {str(err)[:200]}"
    cell["seconds"] = round(time.perf_counter() - start, 1)
    cell["runtime_warnings"] = sorted({str(w.message)[:200] for w in caught if issubclass(w.category, RuntimeWarning)})
    cell["other_warnings"] = sorted({f"{w.category.__name__}: {str(w.message)[:200]}" for w in caught
                                     if not issubclass(w.category, RuntimeWarning)})  # fmt: skip
    passed = False
    if "error" not in cell:
        cell["verdict"] = _verdict(mcmc)
        mean, sd, ess = moments(samples, fields, post.names)
        cell["step_size"] = np.asarray(step_size).ravel().tolist()
        if "log_weight" in fields:
            cell["weight_ess_fraction"] = float(ess)
        if np.all(np.isfinite(mean)) and np.all(np.isfinite(sd)):
            cell.update(errors(mean, sd, post))
            passed = (cell["mean_err_max"] <= MEAN_BOUND and SD_BOUNDS[0] <= cell["sd_ratio_min"]
                      and cell["sd_ratio_max"] <= SD_BOUNDS[1])  # fmt: skip
        else:
            cell["nonfinite"] = True
    cell["pass"] = passed
    cell["status"] = "pass" if passed else "warn" if cell["runtime_warnings"] or "error" in cell else "silent"
    return cell


def fmt_cell(cell: dict[str, Any] | None) -> str:
    if cell is None:
        return ""
    if "mean_err_max" not in cell:
        return f"{cell['status']} ({'error' if 'error' in cell else 'non-finite'})"
    return f"{cell['status']} {cell['mean_err_max']:.2f} / {cell['sd_ratio_min']:.2f}-{cell['sd_ratio_max']:.2f}"


def column(backend: str, kernel: str) -> str:
    """A cell's key: the kernel's name on NumPyro, ``pyro:`` and the name on Pyro."""
    return kernel if backend == "numpyro" else f"{backend}:{kernel}"


def results_path(backend: str, quick: bool) -> Path:
    return RESULTS / f"reference_posteriors{'' if backend == 'numpyro' else '_' + backend}{'_quick' if quick else ''}.json"


def table(*results: dict[str, Any]) -> str:
    """The cells of ``results`` (one per backend) in one Markdown table, and the counts per column."""
    cells: dict[str, dict[str, Any]] = {}
    posteriors: dict[str, Any] = {}
    for r in results:
        posteriors.update(r["posteriors"])
        preset = [r["settings"]["num_warmup"], r["settings"]["num_samples"]] if "settings" in r else []
        for name, row in r["cells"].items():  # a cell without its steps ran at its file's settings
            cells.setdefault(name, {}).update({k: {"steps": preset, **c} for k, c in row.items()})
    kernels = [column(b, k) for b in BACKENDS for k in KERNELS if any(column(b, k) in row for row in cells.values())]
    lines = ["| posterior | N | d | cond | " + " | ".join(kernels) + " |", "|---" * (4 + len(kernels)) + "|"]
    for name, row in sorted(cells.items()):
        p = posteriors[name]
        lines.append(f"| {name} | {p['N']} | {p['d']} | {p['condition_number']:.3g} | "
                     + " | ".join(fmt_cell(row.get(k)) for k in kernels) + " |")  # fmt: skip

    def counts(statuses: list[str]) -> str:
        return ", ".join(f"{statuses.count(s)} {s}" for s in ("pass", "warn", "silent")) + f" (of {len(statuses)})"

    def steps(k: str) -> str:
        used = sorted({tuple(row[k].get("steps", ())) for row in cells.values() if k in row})
        return ", ".join(f"W {w}, S {s}" for w, s in used)

    per_kernel = [f"{k} ({steps(k)}): {counts([row[k]['status'] for row in cells.values() if k in row])}"
                  for k in kernels]  # fmt: skip
    lines += ["", "Cells: " + counts([c["status"] for row in cells.values() for c in row.values()])
              + f"; cell: status, max |mean err| in ref sds / sd ratio min-max; pass: err <= {MEAN_BOUND}, "
              f"sd ratios in [{SD_BOUNDS[0]}, {SD_BOUNDS[1]}]", "", "Per column: " + "; ".join(per_kernel) + "."]  # fmt: skip
    return "\n".join(lines)


def repository_state() -> str:
    """This repository's commit, and whether its working tree differs from it (the library measured)."""
    try:
        git = ["git", "--no-optional-locks", "-C", str(HERE.parent)]
        commit = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run([*git, "status", "--porcelain", "--", "ppl_sgmcmc"], check=True, capture_output=True,
                               text=True).stdout.strip()  # fmt: skip
    except (subprocess.CalledProcessError, FileNotFoundError):
        return "unknown"
    return commit + (" with uncommitted changes to ppl_sgmcmc/" if dirty else "")


def _settings(backend: str, steps: tuple[int, int]) -> dict[str, Any]:
    out = {"num_warmup": steps[0], "num_samples": steps[1], "num_chains": CHAINS,
           "batch": f"max({MIN_BATCH}, round({BATCH_FRACTION} N))", "mean_bound": MEAN_BOUND, "sd_bounds": SD_BOUNDS,
           "machine": platform.processor() or platform.machine(), "repository": repository_state()}  # fmt: skip
    if backend == "numpyro":
        return {**out, "chain_method": "vectorized", "jax": jax.__version__, "numpyro": numpyro.__version__}
    import pyro
    import torch

    return {**out, "driver": "pyro.infer.MCMC (chains one after the other)", "steps_per_sample": PYRO_STEPS_PER_SAMPLE,
            "warmup_steps": steps[0] // PYRO_STEPS_PER_SAMPLE, "kept_draws": steps[1] // PYRO_STEPS_PER_SAMPLE,
            "torch_threads": torch.get_num_threads(), "torch": torch.__version__, "pyro": pyro.__version__}  # fmt: skip


def _read(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {"cells": {}, "posteriors": {}}


def _write(path: Path, results: dict[str, Any], name: str, key: str) -> None:
    """Adds the cell ``results["cells"][name][key]`` to the file as it is now (another run may have added cells
    since this one started), atomically."""
    current = _read(path)
    current["settings"] = results["settings"]
    current["posteriors"][name] = results["posteriors"][name]
    current["cells"].setdefault(name, {})[key] = results["cells"][name][key]
    RESULTS.mkdir(exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(current, indent=1))
    os.replace(tmp, path)


def run(names: list[str], kernels: list[str], quick: bool, seed: int, backend: str = "numpyro",
        steps: tuple[int, int] | None = None) -> None:
    """Runs the cells ``names`` × ``kernels`` on ``backend`` (``steps``: (W, S) instead of the preset's, recorded
    with each cell) and prints the table of the results files of both backends."""
    steps = steps or STEPS["quick" if quick else "full"]
    path = results_path(backend, quick)
    results = _read(path)
    if backend == "pyro":
        import torch

        torch.set_num_threads(1)  # small models: one thread (the Pyro guide's advice on a shared machine)
    results["settings"] = _settings(backend, steps)
    for name in names:
        post = load(name, backend)
        info = {k: post.meta[k] for k in ("N", "d", "condition_number", "posteriordb_commit")}
        info["translation_check_pass"] = post.meta["translation_check"]["pass"]
        if backend == "pyro":
            info["pyro_translation_check"] = check = pyro_translation_check(name)
            print(f"{name}: Pyro translation check {'pass' if check['pass'] else 'FAIL'} (log density offset "
                  f"{check['constant']:.3g}, spread {check['spread']:.2g})", flush=True)  # fmt: skip
        results["posteriors"][name] = info
        if backend == "pyro" and not info["pyro_translation_check"]["pass"]:
            continue
        for kernel_name in kernels:
            cell = run_cell(post, kernel_name, steps, seed, backend)
            cell["date"] = datetime.datetime.now().isoformat(timespec="seconds")
            cell["steps"] = list(steps)
            results["cells"].setdefault(name, {})[column(backend, kernel_name)] = cell
            print(f"{name} {column(backend, kernel_name)}: {fmt_cell(cell)} ({cell['seconds']} s)"
                  + (f"; warnings: {cell['runtime_warnings']}" if cell["runtime_warnings"] else ""), flush=True)
            _write(path, results, name, column(backend, kernel_name))
    print(table(*(_read(results_path(b, quick)) for b in BACKENDS)))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", metavar="SNAPSHOT", type=Path,
                        help="regenerate reference_data/ from a posteriordb checkout or bare git directory")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help=f"W, S = {STEPS['quick']} instead of {STEPS['full']}")
    parser.add_argument("--posteriors", nargs="+", metavar="NAME", help="default: all (with --build: all known)")
    parser.add_argument("--kernels", nargs="+", choices=KERNELS, default=list(KERNELS))
    parser.add_argument("--backend", choices=BACKENDS, default="numpyro")
    parser.add_argument("--steps", nargs=2, type=int, metavar=("W", "S"), help="warm-up and sampling steps per chain "
                        "instead of the preset's (the file is still chosen by --quick)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--table", action="store_true", help="print the table of the results files and exit")
    args = parser.parse_args(argv)
    if args.table:
        print(table(*(_read(results_path(b, args.quick)) for b in BACKENDS)))
    elif args.build:
        build(args.build, args.posteriors or list(POSTERIORS))
    else:
        run(args.posteriors or available(), args.kernels, args.quick, args.seed, args.backend,
            tuple(args.steps) if args.steps else None)


if __name__ == "__main__":
    main()
