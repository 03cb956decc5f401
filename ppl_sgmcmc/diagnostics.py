"""Sample-quality diagnostics: the kernel Stein discrepancy (KSD) of a set of draws, and two checks of a
finished run that say when not to trust its samples.

Effective sample sizes and R-hat say whether chains agree with one another; they cannot see the
asymptotic bias of a stochastic-gradient sampler (a step size that is too large, a noisy gradient
that is not corrected for), because every chain shares it. The kernel Stein discrepancy compares the
draws with the *target* itself, through its score ``s(x) = ∇ log p(x) = -∇U(x)`` (full-data gradient
of the potential ``U``) evaluated at the draws, and needs no normalising constant.

With the inverse multiquadric (IMQ) kernel ``k(x, y) = (c² + |x - y|²)^β``, ``c > 0``, ``β ∈ (-1, 0)``,
the Langevin Stein kernel is (``r = x - y``, ``u = c² + |r|²``, ``d`` the dimension)::

    k0(x, y) = ∇x·∇y k + ∇x k · s(y) + ∇y k · s(x) + k s(x)ᵀs(y)
             = s(x)ᵀs(y) u^β + 2β u^(β-1) (s(y) - s(x))ᵀr - 2βd u^(β-1) - 4β(β-1) u^(β-2) |r|²

and the KSD of draws ``x_1..x_m`` is ``KSD = sqrt((1/m²) Σ_ij k0(x_i, x_j))``. For targets with a
Lipschitz score that are distantly dissipative (roughly: strongly log-concave outside a ball) and
``β ∈ (-1, 0)``, a sequence of samples whose KSD goes to zero converges weakly to ``p``, and one that
converges to ``p`` in Wasserstein distance has KSD going to zero (Gorham & Mackey, "Measuring Sample
Quality with Kernels", ICML 2017; with Gaussian or Matérn kernels, or ``β < -1``, the KSD can go to
zero for samples that do not converge when ``d >= 3``). The values are relative: compare runs (step
sizes, kernels, run lengths) on the same target and parameterisation, not against a fixed threshold.

- :func:`imq_ksd`: the quadratic-time V-statistic above, computed in blocks of rows (memory
  ``O(chunk_size · m)``), optionally in preconditioned coordinates.
- :func:`imq_ksd_linear`: a linear-time unbiased estimate of ``KSD²`` from disjoint pairs of draws
  (Liu, Lee & Jordan, "A Kernelized Stein Discrepancy for Goodness-of-fit Tests", ICML 2016), with
  its standard error, for large ``m``.
- :func:`flatten_draws`: ``{site: (chains, draws, ...)}`` → an ``(m, d)`` array whose rows are
  ``jax.flatten_util.ravel_pytree`` of each draw (sites in sorted order), the layout both KSD
  functions take.

On a finished ``MCMC`` run of a ppl_sgmcmc kernel (``numpyro.infer.MCMC`` or ``pyro.infer.MCMC``; the
backend is imported only when a run of it is given, so this module needs no ``torch``):

- :func:`ksd`: the KSD of the run's (thinned) draws against the full-data posterior, with the full-data
  score computed over the data in minibatches (each backend's ``full_data_score``) and in the coordinates
  of the run's adapted preconditioner.
- :func:`step_halving_check`: continues each chain with half the step size (and twice the steps per draw)
  and reports the posterior means and standard deviations that moved beyond their Monte Carlo error, the
  signature of a discretisation bias.
- :func:`verdict`: the end-of-run verdict (:mod:`ppl_sgmcmc.verdict`: R-hat, bulk and tail ESS, burn-in left
  in the draws, the noise ratio over the kept draws) of any finished run, with its warning.
- :func:`energy_noise`: for CSGLD and CSGHMC, the standard deviation ``σ`` of the minibatch energy at the
  run's draws, from the per-datum log-likelihoods over the full data, against the energy grid's ``Δu`` and the
  temperature: the noise that biases their importance weights, which halving the step size does not show.

Precision follows JAX's default (float32 unless ``jax_enable_x64`` is on); a KSD near ``1/sqrt(m)``
of a large sample is a small difference of larger terms, so prefer float64 to compare such values
closely.
"""

import contextlib
import importlib
import math
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping
from functools import partial
from numbers import Integral, Real
from statistics import NormalDist
from typing import TYPE_CHECKING, Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.linalg import solve_triangular
from jax.typing import ArrayLike

from ppl_sgmcmc import algorithms
from ppl_sgmcmc import verdict as _verdict
from ppl_sgmcmc._run_view import Pointwise, Run, fixed_rows

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = [
    "NOISE_GAP_RATIO",
    "NOISE_SPREAD",
    "NOISE_TEMPERATURE_RATIO",
    "EnergyNoiseResult",
    "KSDResult",
    "LinearKSD",
    "StepHalvingResult",
    "energy_noise",
    "fixed_rows",
    "flatten_draws",
    "imq_ksd",
    "imq_ksd_linear",
    "ksd",
    "step_halving_check",
    "verdict",
]

# entries of one (chunk_size, m) block when `chunk_size=None`: ~8 MiB per float32 array
_AUTO_BLOCK_ENTRIES = 2**21


class LinearKSD(NamedTuple):
    """The linear-time estimate of :func:`imq_ksd_linear`."""

    ksd2: float
    """Unbiased estimate of ``KSD²`` (may be negative when ``KSD²`` is near zero)."""
    stderr: float
    """Its standard error, ``sd(h) / sqrt(n_pairs)`` (``nan`` with a single pair)."""
    n_pairs: int
    """The number of disjoint pairs averaged."""


# --- input checks ---------------------------------------------------------------------------------
def _check_params(c: float, beta: float, fn: str) -> tuple[float, float]:
    if isinstance(c, bool) or not isinstance(c, Real) or not math.isfinite(c) or c <= 0:
        raise ValueError(f"{fn}: `c` must be a finite positive number, got {c!r}.")
    if isinstance(beta, bool) or not isinstance(beta, Real) or not -1 < beta < 0:
        raise ValueError(
            f"{fn}: `beta` must lie strictly between -1 and 0 (the range in which the IMQ KSD detects "
            f"non-convergence; Gorham & Mackey 2017), got {beta!r}."
        )
    return float(c), float(beta)


def _check_inputs(
    samples: ArrayLike, scores: ArrayLike, preconditioner: ArrayLike | None, fn: str
) -> tuple[jax.Array, jax.Array]:
    """``(m, d)`` samples and scores as JAX arrays of one float dtype, in preconditioned coordinates."""
    x, s = np.asarray(samples), np.asarray(scores)
    if x.ndim != 2:
        raise ValueError(
            f"{fn}: `samples` must be a 2-D array (m draws, d coordinates), got shape {x.shape}; "
            "flatten a dict of draws with `flatten_draws`."
        )
    if s.shape != x.shape:
        raise ValueError(f"{fn}: `scores` must have the shape of `samples` {x.shape}, got {s.shape}.")
    m, d = x.shape
    if m < 2:
        raise ValueError(f"{fn}: `samples` must hold at least 2 draws, got {m}.")
    if d < 1:
        raise ValueError(f"{fn}: `samples` must have at least one coordinate, got shape {x.shape}.")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{fn}: `samples` has non-finite entries.")
    if not np.all(np.isfinite(s)):
        raise ValueError(
            f"{fn}: `scores` has non-finite entries (a score ∇log p that overflowed: the draws may have "
            "diverged)."
        )
    dtype = jax.dtypes.canonicalize_dtype(np.result_type(np.float32, x.dtype, s.dtype))
    xj, sj = jnp.asarray(x, dtype), jnp.asarray(s, dtype)
    if preconditioner is not None:
        g = np.asarray(preconditioner)
        xj, sj = _whiten(xj, sj, g, fn)
    return xj, sj


def _whiten(x: jax.Array, s: jax.Array, gamma: np.ndarray, fn: str) -> tuple[jax.Array, jax.Array]:
    """Draws and scores in the coordinates ``z = L⁻¹ x`` of ``Γ = L Lᵀ`` (a ``(d,)`` vector of variances
    or a ``(d, d)`` covariance), where the scores are ``Lᵀ s``."""
    d = x.shape[1]
    if gamma.shape == (d,):
        if not (np.all(np.isfinite(gamma)) and np.all(gamma > 0)):
            raise ValueError(f"{fn}: `preconditioner` must have finite, strictly positive entries.")
        root = jnp.sqrt(jnp.asarray(gamma, x.dtype))
        return x / root, s * root
    if gamma.shape != (d, d):
        raise ValueError(
            f"{fn}: `preconditioner` must be a vector of shape ({d},) (variances) or a ({d}, {d}) matrix (a "
            f"covariance), got shape {gamma.shape}."
        )
    try:
        if not (np.all(np.isfinite(gamma)) and np.allclose(gamma, gamma.T)):
            raise np.linalg.LinAlgError
        L = np.linalg.cholesky(np.asarray(gamma, np.float64))
    except np.linalg.LinAlgError:
        raise ValueError(f"{fn}: a (d, d) `preconditioner` must be a finite, symmetric, positive definite matrix.") from None
    Lj = jnp.asarray(L, x.dtype)
    return solve_triangular(Lj, x.T, lower=True).T, s @ Lj


def _chunk(chunk_size: int | None, m: int) -> int:
    if chunk_size is None:
        return max(1, min(m, _AUTO_BLOCK_ENTRIES // m))
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, Integral) or chunk_size <= 0:
        raise ValueError(f"imq_ksd: `chunk_size` must be a positive integer or None, got {chunk_size!r}.")
    return min(int(chunk_size), m)


# --- the Stein kernel -----------------------------------------------------------------------------
def _k0(
    ss: jax.Array, cross: jax.Array, r2: jax.Array, c2: jax.Array, beta: jax.Array, d: int
) -> jax.Array:
    """``k0`` from ``s(x)ᵀs(y)``, ``(s(y) - s(x))ᵀr`` and ``|r|²`` (elementwise)."""
    u = c2 + r2
    k = u**beta
    k1 = k / u  # u^(β-1)
    k2 = k1 / u  # u^(β-2)
    return ss * k + 2 * beta * k1 * cross - 2 * beta * d * k1 - 4 * beta * (beta - 1) * k2 * r2


@partial(jax.jit, static_argnames=("chunk_size",))
def _ksd2_vstat(x: jax.Array, s: jax.Array, c: jax.Array, beta: jax.Array, chunk_size: int) -> jax.Array:
    """``(1/m²) Σ_ij k0(x_i, x_j)``, one ``(chunk_size, m)`` block of rows at a time."""
    m, d = x.shape
    # k0 depends on the draws only through r = x - y: centring keeps the Gram expansions of |r|² and
    # (s(y) - s(x))ᵀr from cancelling catastrophically when the draws sit far from the origin. The draws are
    # first shifted to one of them (exact in floating point there, Sterbenz), then centred on their mean, which
    # is computed from the shifted values and so is accurate whatever order the reduction sums them in
    x = x - x[0]
    x = x - jnp.mean(x, axis=0)
    sq = jnp.sum(x * x, axis=1)  # |y|²
    sx = jnp.sum(s * x, axis=1)  # s(y)ᵀy
    n_blocks = -(-m // chunk_size)
    pad = n_blocks * chunk_size - m
    xb = jnp.pad(x, ((0, pad), (0, 0))).reshape(n_blocks, chunk_size, d)
    sb = jnp.pad(s, ((0, pad), (0, 0))).reshape(n_blocks, chunk_size, d)
    mask = (jnp.arange(n_blocks * chunk_size) < m).reshape(n_blocks, chunk_size)
    c2 = c * c

    def block_sum(args: tuple[jax.Array, jax.Array, jax.Array]) -> jax.Array:
        xi, si, keep = args  # rows x_i: (chunk_size, d); columns y = x_j: all m draws
        r2 = jnp.maximum(jnp.sum(xi * xi, axis=1)[:, None] + sq[None, :] - 2 * xi @ x.T, 0.0)
        # (s(y) - s(x))ᵀ(x - y) = s(y)ᵀx - s(y)ᵀy - s(x)ᵀx + s(x)ᵀy
        cross = xi @ s.T - sx[None, :] - jnp.sum(si * xi, axis=1)[:, None] + si @ x.T
        rows = jnp.sum(_k0(si @ s.T, cross, r2, c2, beta, d), axis=1)
        return jnp.sum(jnp.where(keep, rows, 0.0))

    return jnp.sum(jax.lax.map(block_sum, (xb, sb, mask))) / (m * m)


@jax.jit
def _k0_pairs(
    x: jax.Array, y: jax.Array, sx: jax.Array, sy: jax.Array, c: jax.Array, beta: jax.Array
) -> jax.Array:
    """``k0(x_i, y_i)`` for each row ``i``."""
    r = x - y
    return _k0(
        jnp.sum(sx * sy, axis=1), jnp.sum((sy - sx) * r, axis=1), jnp.sum(r * r, axis=1), c * c, beta, x.shape[1]
    )


# --- public API -----------------------------------------------------------------------------------
def imq_ksd(
    samples: ArrayLike,
    scores: ArrayLike,
    *,
    c: float = 1.0,
    beta: float = -0.5,
    preconditioner: ArrayLike | None = None,
    chunk_size: int | None = None,
    squared: bool = False,
) -> float:
    """Kernel Stein discrepancy of draws with the IMQ kernel (Gorham & Mackey, ICML 2017).

    ``KSD² = (1/m²) Σ_ij k0(x_i, x_j)`` with, for ``r = x - y`` and ``u = c² + |r|²``::

        k0(x, y) = s(x)ᵀs(y) u^β + 2β u^(β-1) (s(y) - s(x))ᵀr - 2βd u^(β-1) - 4β(β-1) u^(β-2) |r|²

    the Langevin Stein kernel ``∇x·∇y k + ∇x k·s(y) + ∇y k·s(x) + k s(x)ᵀs(y)`` of
    ``k(x, y) = u^β`` (see the module docstring). The double sum is a V-statistic over all pairs,
    diagonal included: it is the KSD of the draws' empirical distribution (never negative), and its
    expectation over i.i.d. draws exceeds the population ``KSD²`` by ``O(1/m)``. Cost ``O(m² d)``
    time, ``O(chunk_size · m)`` memory.

    **Preconditioning.** With ``preconditioner=Γ`` (a positive ``(d,)`` vector, e.g. the posterior
    variances or the sampler's diagonal mass-matrix inverse) the KSD is computed in the coordinates
    ``z = x / sqrt(Γ)`` (elementwise), where the target has density ``∝ p(sqrt(Γ) z)`` and score
    ``sqrt(Γ) · s(x)``: it is exactly the IMQ KSD of that transformed target at the transformed draws,
    so it keeps every property above (an invertible linear change of variables preserves distant
    dissipativity), and the kernel's length scale ``c`` is measured in units of ``sqrt(Γ)`` per
    coordinate. Rescaling coordinate ``k`` of the draws by ``a_k`` (scores by ``1/a_k``) together
    with ``Γ_k`` by ``a_k²`` leaves it unchanged. Equivalently, in the original coordinates it uses the
    kernel ``k(x/sqrt(Γ), y/sqrt(Γ))`` and the Stein operator ``g ↦ ∇·(sqrt(Γ) g) + (sqrt(Γ) g)ᵀs``.
    A ``(d, d)`` covariance ``Γ = L Lᵀ`` (``L`` its Cholesky factor; e.g. a dense mass-matrix inverse)
    does the same with ``z = L⁻¹ x`` and the score ``Lᵀ s(x)``: the value depends on ``Γ`` only, as the
    Stein kernel depends on ``z`` only through ``|z - z'|²``, ``s_zᵀ s_z'`` and ``(s_z' - s_z)ᵀ(z - z')``,
    which no rotation of ``z`` changes; a diagonal matrix gives the vector's value.
    Without it, all coordinates share the length scale ``c``, so the value depends on units.

    :param samples: ``(m, d)`` draws ``x_i`` (unconstrained coordinates; see :func:`flatten_draws`).
    :param scores: ``(m, d)`` scores ``s(x_i) = ∇ log p(x_i) = -∇U(x_i)`` with the *full-data*
        potential ``U`` (a minibatch gradient adds its noise to the KSD).
    :param c: the IMQ kernel's length scale ``c > 0`` (default 1).
    :param beta: the IMQ exponent ``β ∈ (-1, 0)`` (default ``-1/2``).
    :param preconditioner: optional ``Γ``: a ``(d,)`` positive vector or a ``(d, d)`` positive definite
        matrix (see above).
    :param chunk_size: rows per block; ``None`` picks ``≈ 2²¹ / m`` (a few MiB per block).
    :param squared: return ``KSD²`` instead of ``KSD``.
    :returns: ``KSD`` (or ``KSD²``) as a Python float.
    :raises ValueError: shapes that are not matching ``(m, d)`` arrays, ``m < 2``, non-finite samples
        or scores, or invalid ``c``, ``beta``, ``preconditioner``, ``chunk_size``.

    **Example** (two draws of ``N(0, 1)``, ``s(x) = -x``: ``KSD² = (1 + 2 - 2·3/2^(5/2)) / 4``; and
    exact draws of ``N(0, I₂)`` against the same draws shifted by 1)::

        >>> import numpy as np
        >>> x = np.array([[0.0], [1.0]])
        >>> round(imq_ksd(x, -x, squared=True), 4), round((3 - 6 / 2**2.5) / 4, 4)
        (0.4848, 0.4848)
        >>> x = np.random.default_rng(0).normal(size=(500, 2))
        >>> imq_ksd(x, -x) < imq_ksd(x + 1.0, -(x + 1.0))
        True
    """
    c, beta = _check_params(c, beta, "imq_ksd")
    x, s = _check_inputs(samples, scores, preconditioner, "imq_ksd")
    chunk = _chunk(chunk_size, x.shape[0])
    ksd2 = float(_ksd2_vstat(x, s, jnp.asarray(c, x.dtype), jnp.asarray(beta, x.dtype), chunk))
    ksd2 = max(ksd2, 0.0)  # a sum of a positive-definite kernel: negative only by rounding
    return ksd2 if squared else math.sqrt(ksd2)


def imq_ksd_linear(
    samples: ArrayLike,
    scores: ArrayLike,
    *,
    c: float = 1.0,
    beta: float = -0.5,
    preconditioner: ArrayLike | None = None,
    key: jax.Array | int | None = None,
) -> LinearKSD:
    """Linear-time unbiased estimate of the IMQ ``KSD²`` from disjoint pairs of draws.

    ``KSD²_lin = (1/n) Σ_i k0(x_{2i-1}, x_{2i})`` over the ``n = ⌊m/2⌋`` disjoint pairs (an odd last
    draw is left out), ``k0`` as in :func:`imq_ksd` (Liu, Lee & Jordan, "A Kernelized Stein
    Discrepancy for Goodness-of-fit Tests", ICML 2016, Section 4). For i.i.d. draws from ``q`` each
    term is an unbiased estimate of the population ``KSD²(q, p)``, so the average is too, with the
    standard error ``sd(k0 terms) / sqrt(n)``; it costs ``O(m d)`` and can be negative. The Stein
    kernel ``k0`` is the same as :func:`imq_ksd`'s, and so is ``preconditioner``.

    **Pairing.** ``key=None`` pairs consecutive rows ``(x_1, x_2), (x_3, x_4), ...`` as Liu et al. do.
    Consecutive draws of a Markov chain are correlated, which biases each term (toward ``k0`` of
    nearby points); pass a ``key`` (a JAX PRNG key or an int seed) to pair the rows by a random
    permutation instead. Over random pairings of a fixed sample the estimate's expectation is the
    U-statistic ``(1/(m(m-1))) Σ_{i≠j} k0(x_i, x_j)``.

    :param samples: ``(m, d)`` draws, ``m >= 2``.
    :param scores: ``(m, d)`` full-data scores ``∇ log p`` at the draws.
    :param c: the IMQ kernel's length scale ``c > 0`` (default 1).
    :param beta: the IMQ exponent ``β ∈ (-1, 0)`` (default ``-1/2``).
    :param preconditioner: optional ``Γ``, a ``(d,)`` vector or ``(d, d)`` matrix (see :func:`imq_ksd`).
    :param key: ``None`` (consecutive pairs) or a PRNG key / int seed for a random pairing.
    :returns: :class:`LinearKSD` ``(ksd2, stderr, n_pairs)``.
    :raises ValueError: as :func:`imq_ksd`.

    **Example** (exact draws of ``N(0, 1)`` against draws of ``N(1, 1)``)::

        >>> import numpy as np
        >>> x = np.random.default_rng(1).normal(size=(4_000, 1))
        >>> good = imq_ksd_linear(x, -x, key=0)
        >>> abs(good.ksd2) < 4 * good.stderr
        True
        >>> bad = imq_ksd_linear(x + 1, -(x + 1), key=0)
        >>> bad.ksd2 > 10 * bad.stderr, bad.n_pairs
        (True, 2000)
    """
    c, beta = _check_params(c, beta, "imq_ksd_linear")
    x, s = _check_inputs(samples, scores, preconditioner, "imq_ksd_linear")
    m = x.shape[0]
    if key is not None:
        if isinstance(key, Integral) and not isinstance(key, bool):
            key = jax.random.key(int(key))
        perm = jax.random.permutation(key, m)
        x, s = x[perm], s[perm]
    n = m // 2
    h = _k0_pairs(
        x[0 : 2 * n : 2],
        x[1 : 2 * n : 2],
        s[0 : 2 * n : 2],
        s[1 : 2 * n : 2],
        jnp.asarray(c, x.dtype),
        jnp.asarray(beta, x.dtype),
    )
    h = np.asarray(h, dtype=np.float64)
    stderr = float(h.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan
    return LinearKSD(float(h.mean()), stderr, n)


def flatten_draws(draws: Mapping[str, ArrayLike], *, batch_ndim: int = 2) -> jax.Array:
    """Stack a dict of draws ``{site: (chains, draws, ...)}`` into an ``(m, d)`` array of rows.

    Row ``i`` is ``jax.flatten_util.ravel_pytree({site: draw_i})[0]`` for the ``i``-th draw in
    C order over the leading ``batch_ndim`` axes (chain-major: all draws of chain 0 first): sites in
    sorted order, each site's event shape raveled in C order, all cast to the sites' common float
    dtype. So ``ravel_pytree`` of one draw gives the ``unravel`` function that maps a row (or a row of
    scores) back to the dict, e.g. to evaluate a potential's gradient there. Pass the *unconstrained*
    latents: the KSD's score is that of the density the draws are compared with.

    :param draws: a mapping of site names to arrays (NumPy, JAX, xarray) sharing their leading
        ``batch_ndim`` axes, e.g. ``mcmc.get_samples(group_by_chain=True)`` or ``dict(idata.posterior)``.
    :param batch_ndim: the number of leading sample axes: 2 for ``(chains, draws, ...)`` (default),
        1 for ``(draws, ...)`` as ``mcmc.get_samples()`` returns.
    :returns: an ``(m, d)`` JAX array, ``m`` the product of the batch axes, ``d`` the total event size.
    :raises ValueError: an empty mapping, a bad ``batch_ndim``, a site with fewer than ``batch_ndim``
        axes, or sites whose batch axes differ.

    **Example**::

        >>> import numpy as np
        >>> draws = {"b": np.zeros((2, 3)), "a": np.ones((2, 3, 2))}
        >>> flat = flatten_draws(draws)
        >>> flat.shape, flat[0].tolist()
        ((6, 3), [1.0, 1.0, 0.0])
    """
    if isinstance(batch_ndim, bool) or not isinstance(batch_ndim, Integral) or batch_ndim < 1:
        raise ValueError(f"flatten_draws: `batch_ndim` must be a positive integer, got {batch_ndim!r}.")
    if not draws:
        raise ValueError("flatten_draws: `draws` is empty.")
    names = sorted(draws)
    arrays = [np.asarray(draws[name]) for name in names]
    batch = None
    for name, a in zip(names, arrays, strict=True):
        if a.ndim < batch_ndim:
            raise ValueError(
                f"flatten_draws: `draws[{name!r}]` has shape {a.shape}, fewer than the {batch_ndim} leading "
                "sample axes (`batch_ndim`)."
            )
        if batch is None:
            batch = a.shape[:batch_ndim]
        elif a.shape[:batch_ndim] != batch:
            raise ValueError(
                f"flatten_draws: the sites of `draws` must share their leading {batch_ndim} sample axes: "
                f"{names[0]!r} has {batch}, {name!r} has {a.shape[:batch_ndim]}."
            )
    m = math.prod(batch)
    dtype = jax.dtypes.canonicalize_dtype(np.result_type(np.float32, *(a.dtype for a in arrays)))
    return jnp.concatenate(
        [jnp.asarray(a.reshape(m, math.prod(a.shape[batch_ndim:])), dtype) for a in arrays], axis=1
    )


# --- run-level diagnostics ------------------------------------------------------------------------
class KSDResult(NamedTuple):
    """The kernel Stein discrepancy of a run's draws, from :func:`ksd`."""

    ksd: float
    """``KSD``, the square root of ``ksd2`` (0 where a linear-time ``ksd2`` is negative)."""
    ksd2: float
    """``KSD²``: the V-statistic of :func:`imq_ksd`, or the linear-time estimate of :func:`imq_ksd_linear`."""
    stderr: float
    """The standard error of the linear-time ``ksd2``; ``nan`` for the V-statistic."""
    num_draws: int
    """The number of draws the KSD was computed from (all chains pooled, thinned)."""
    preconditioner: np.ndarray | None
    """The ``Γ`` the KSD was computed with (see :func:`imq_ksd`), or ``None``: pass it as another run's
    ``preconditioner`` to compare the two runs in the same coordinates."""


class StepHalvingResult(NamedTuple):
    """The comparison of :func:`step_halving_check`."""

    table: "pd.DataFrame"
    """One row per flattened coordinate of the latent sites (``"w[0]"``, ``"scale"``; sites in sorted order,
    constrained values), with the columns ``mean`` and ``sd`` (the run's draws), ``mean_halved`` and
    ``sd_halved`` (the halved-step draws), ``mean_mcse`` and ``sd_mcse`` (the Monte Carlo standard errors of
    the differences) and ``mean_z`` and ``sd_z`` (the differences in units of those errors)."""
    flagged: list[str]
    """The moments that moved beyond ``threshold`` (``"mean of w[0]"``, ``"sd of scale"``); empty when none did."""
    threshold: float
    """The family-wise threshold on ``|z|``: Bonferroni's over all compared moments."""
    step_size: np.ndarray
    """The step size of each compared chain's last step before the check."""
    halved_step_size: np.ndarray
    """The step size of the last step of each chain's halved-step continuation."""


_MCMC_CLASSES = (("numpyro", "numpyro.infer.mcmc"), ("pyro", "pyro.infer.mcmc.api"))


def _run_of(mcmc: Any, fn: str) -> Run:
    """The backend's view of ``mcmc``; the backend is imported only if ``mcmc`` is one of its runs (its
    ``MCMC`` class is then loaded already)."""
    for backend, module in _MCMC_CLASSES:
        cls = getattr(sys.modules.get(module), "MCMC", None)
        if cls is not None and isinstance(mcmc, cls):
            view: Run = importlib.import_module(f"ppl_sgmcmc.{backend}.scores").RunView(mcmc, fn)
            return view
    raise TypeError(
        f"{fn}: `mcmc` must be a numpyro.infer.MCMC or pyro.infer.MCMC object run with a ppl_sgmcmc kernel, got "
        f"{type(mcmc).__name__}."
    )


def _count(value: Any, name: str, fn: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral) or value < minimum:
        raise ValueError(f"{fn}: `{name}` must be an integer >= {minimum}, got {value!r}.")
    return int(value)


def _thin(draws: Mapping[str, np.ndarray], num_draws: int) -> dict[str, np.ndarray]:
    """At most ``num_draws`` of ``{site: (chains, draws, ...)}``, evenly spaced over the chains' draws pooled
    chain-major: ``{site: (m, ...)}``."""
    total = math.prod(next(iter(draws.values())).shape[:2])
    m = min(num_draws, total)
    index = np.arange(m) * total // m
    return {name: a.reshape((total,) + a.shape[2:])[index] for name, a in draws.items()}


def _run_preconditioner(run: Run, preconditioner: Any, fn: str) -> np.ndarray | None:
    """``Γ`` for :func:`imq_ksd`: the chains' adapted ``L Lᵀ`` averaged (a vector for diagonal ``L``), or
    the user's."""
    if isinstance(preconditioner, str):
        if preconditioner != "adapted":
            raise ValueError(
                f"{fn}: `preconditioner` must be \"adapted\", None or an array, got {preconditioner!r}."
            )
        scales = run.preconditioner_scales()
        if scales is None:
            return None
        scales = np.asarray(scales, np.float64)
        if scales.ndim == 2:
            return np.mean(scales**2, axis=0)
        return np.mean(scales @ np.swapaxes(scales, 1, 2), axis=0)
    return None if preconditioner is None else np.asarray(preconditioner, np.float64)


def ksd(
    mcmc: Any,
    num_draws: int = 1000,
    linear: bool = False,
    *,
    samples: Mapping[str, ArrayLike] | None = None,
    preconditioner: str | ArrayLike | None = "adapted",
    c: float = 1.0,
    beta: float = -0.5,
    chunk_size: int | None = None,
    seed: int = 0,
) -> KSDResult:
    """The IMQ kernel Stein discrepancy of a run's draws against the full-data posterior (Gorham & Mackey,
    "Measuring Sample Quality with Kernels", ICML 2017).

    The draws of all chains, pooled, are thinned to at most ``num_draws`` evenly spaced ones; at each, the
    full-data score ``s(θ) = -∇U(θ)`` is computed in the chain's unconstrained, flattened coordinates
    (``U``: the prior, all ``N`` data rows and the log-Jacobian of the transforms) by the backend's
    ``full_data_score`` (:func:`ppl_sgmcmc.numpyro.full_data_score`, :func:`ppl_sgmcmc.pyro.full_data_score`:
    over the data in minibatches, memory bounded); then :func:`imq_ksd` (or, with ``linear``,
    :func:`imq_ksd_linear` on a random pairing) of those draws and scores. A run whose KSD is larger than
    another's on the same target is further from the posterior: a step size too large, a run too short, a
    gradient noise not corrected for. The value has no absolute scale: compare runs, in the same
    coordinates (``preconditioner``).

    **Coordinates.** By default the KSD is computed in the coordinates of the run's adapted preconditioner
    (``adapt_mass_matrix``; ``θ = L u``), ``Γ = L Lᵀ`` averaged over the chains, where the posterior has
    about unit scale in every direction, so that the IMQ kernel's length scale ``c`` fits every coordinate.
    A run without one gets ``Γ = None`` (the raw coordinates). To compare two runs, pass the first result's
    ``preconditioner`` to the second.

    **Cost.** ``m = min(num_draws, draws)`` full-data gradients (each an epoch over the data, ``O(m N)``
    model evaluations of one row) and ``O(m² d)`` for the V-statistic (``O(m d)`` with ``linear``). A
    stochastic ``potential_fn(z, rng)`` has no exact gradient: its score is the mean over 16 draws of
    ``rng``, whose remaining noise adds to the KSD.

    On Pyro the adapted preconditioner is the last chain's, read from ``kernel.last_state`` when that is this
    run's final state (not when Pyro ran the chains in parallel processes, nor after another run of the
    kernel), else ``None``.

    :param mcmc: a ``numpyro.infer.MCMC`` or ``pyro.infer.MCMC`` object, run with a ppl_sgmcmc kernel.
    :param num_draws: the most draws to use, at least 2 (default 1000).
    :param linear: use the linear-time estimate with its standard error instead of the V-statistic.
    :param samples: draws to measure instead of the run's: ``{site: (chains, draws, ...)}`` of every latent
        site, constrained, as ``mcmc.get_samples(group_by_chain=True)`` gives them (e.g. another sampler's
        draws of the same model, or the run's draws shifted, to see how the value moves).
    :param preconditioner: ``"adapted"`` (default; see above), ``None``, or ``Γ`` as :func:`imq_ksd` takes it.
    :param c: the IMQ kernel's length scale (see :func:`imq_ksd`).
    :param beta: the IMQ exponent (see :func:`imq_ksd`).
    :param chunk_size: the V-statistic's rows per block (see :func:`imq_ksd`).
    :param seed: seeds the minibatches of the score's epoch and the linear estimate's pairing.
    :returns: a :class:`KSDResult` ``(ksd, ksd2, stderr, num_draws, preconditioner)``.
    :raises TypeError: ``mcmc`` is not a NumPyro or Pyro ``MCMC`` object of a ppl_sgmcmc kernel.
    :raises ValueError: a run with no draws, a kernel with local Gibbs sites, ``num_draws < 2``, ``samples``
        without the latent sites, or as :func:`imq_ksd`.

    **Example** (SGLD on a standard normal: the run's draws, and the same draws shifted by one)::

        >>> import jax, jax.numpy as jnp
        >>> from numpyro.infer import MCMC
        >>> from ppl_sgmcmc.numpyro import SGLD
        >>> kernel = SGLD(potential_fn=lambda z: 0.5 * jnp.sum(z["x"] ** 2), step_size=0.1, steps_per_sample=5)
        >>> mcmc = MCMC(kernel, num_warmup=100, num_samples=400, progress_bar=False)
        >>> mcmc.run(jax.random.PRNGKey(0), init_params={"x": jnp.zeros(2)})
        >>> result = ksd(mcmc, num_draws=200)
        >>> shifted = ksd(mcmc, num_draws=200, samples={"x": mcmc.get_samples(group_by_chain=True)["x"] + 1.0})
        >>> result.num_draws, result.preconditioner, result.ksd < shifted.ksd
        (200, None, True)
    """
    fn = "ksd"
    num_draws = _count(num_draws, "num_draws", fn, 2)
    seed = _count(seed, "seed", fn, 0)
    run = _run_of(mcmc, fn)
    rows = _thin(run.latents(samples), num_draws)
    x = flatten_draws(rows, batch_ndim=1)
    gamma = _run_preconditioner(run, preconditioner, fn)
    scores = run.scores(rows, seed)
    if linear:
        estimate = imq_ksd_linear(x, scores, c=c, beta=beta, preconditioner=gamma, key=seed)
        ksd2, stderr = estimate.ksd2, estimate.stderr
    else:
        ksd2 = imq_ksd(x, scores, c=c, beta=beta, preconditioner=gamma, chunk_size=chunk_size, squared=True)
        stderr = math.nan
    return KSDResult(math.sqrt(max(ksd2, 0.0)), ksd2, stderr, int(x.shape[0]), gamma)


# --- the step-halving check -----------------------------------------------------------------------
class _HalvedSchedule:
    """A step-size schedule ``h`` halved from step ``start`` on, its clock slowed to match: step
    ``start + j`` of the halved chain takes ``h(start + ⌊j/2⌋) / 2``."""

    def __init__(self, schedule: Callable[[Any], Any], start: int) -> None:
        self.schedule, self.start = schedule, start

    def __call__(self, t: Any) -> Any:
        return self.schedule(self.start + (t - self.start) // 2) / 2


def _halve_tuned(state: Any) -> Any:
    """A chain's state with its tuned (frozen) step size halved."""
    adapt = state.adapt_state
    return state._replace(adapt_state=adapt._replace(step_size=adapt.step_size / 2))


@contextlib.contextmanager
def _kernel_restored(kernel: Any) -> Iterator[None]:
    """Whatever the block changes on ``kernel``'s attributes is undone when it ends."""
    saved = dict(vars(kernel))
    try:
        yield
    finally:
        vars(kernel).clear()
        vars(kernel).update(saved)


def _labels(draws: Mapping[str, np.ndarray]) -> list[str]:
    """The names of the flattened coordinates of ``{site: (chains, draws, ...)}``, as :func:`flatten_draws`
    orders them."""
    labels = []
    for name in sorted(draws):
        shape = draws[name].shape[2:]
        labels += [f"{name}[{','.join(map(str, i))}]" for i in np.ndindex(shape)] if shape else [name]
    return labels


def _moments(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(mean, its MCSE, sd, its MCSE)`` per coordinate of ``(chains, draws, d)`` draws: ``sd/sqrt(ESS)``, and
    by the delta method ``MCSE(var) / (2 sd)`` with ``MCSE(var)`` from the squared deviations' ESS (NumPyro's
    multi-chain effective sample size)."""
    from numpyro.diagnostics import effective_sample_size

    d = x.shape[-1]
    flat = x.reshape(-1, d)
    mean = flat.mean(0)
    squares = (x - mean) ** 2
    with np.errstate(divide="ignore", invalid="ignore"):
        sd = np.sqrt(squares.reshape(-1, d).mean(0))
        mean_se = flat.std(0, ddof=1) / np.sqrt(effective_sample_size(x))
        sd_se = squares.reshape(-1, d).std(0, ddof=1) / np.sqrt(effective_sample_size(squares)) / (2 * sd)
    return mean, mean_se, sd, sd_se


def step_halving_check(
    mcmc: Any, num_samples: int | None = None, *, burn_in: int | None = None, alpha: float = 0.05
) -> StepHalvingResult:
    """Continue each chain with half the step size and report the posterior moments that moved.

    An SG-MCMC chain at step size ``h`` samples a distribution that differs from the posterior by a bias
    of order ``h`` (the discretisation and the gradient noise; Vollmer, Zygalakis & Teh, "Exploration of
    the (Non-)Asymptotic Bias and Variance of Stochastic Gradient Langevin Dynamics", JMLR 17, 2016):
    where that bias matters, the moments move when ``h`` halves. Each chain continues from its final state
    for ``burn_in + num_samples`` draws with the step size halved and twice the steps between kept draws,
    so that they span the same time and are as correlated as the run's (the kernel's ``steps_per_sample``
    is kept and every second draw dropped, which leaves its warm-up bookkeeping untouched); the first
    ``burn_in`` draws are discarded while the chain relaxes to the halved step's distribution. Then, for
    each flattened coordinate of the latent sites, in the **constrained** space the run reports (what
    ``mcmc.get_samples()`` gives, deterministic sites left out), the mean and the standard deviation of
    the run's draws are compared with the continuation's: ``z = (halved - original) / sqrt(MCSE₁² +
    MCSE₂²)``, the Monte Carlo standard errors from NumPyro's multi-chain effective sample sizes. A moment
    is flagged when ``|z|`` exceeds Bonferroni's family-wise threshold ``Φ⁻¹(1 - alpha / (2K))`` over the
    ``K = 2d`` compared moments, and a ``RuntimeWarning`` names the flagged moments. The comparison assumes
    that the run's draws are stationary: a chain still drifting (a warm-up too short) moves its moments
    too. Silence is not proof of no bias: a bias below the Monte Carlo error (a short run) is not seen.

    The step size halved is the one in force: the tuned one of each chain's state (``step_size=None``),
    or the kernel's (a schedule is halved and slowed to the doubled steps, from the final step on). The
    kernel is left as it was (its attributes are restored at the end); other schedules (``temperature``,
    ``friction``) go on with the step counter, which runs twice as fast per unit of time. On Pyro, the
    kernel keeps the final state of the last chain it ran (``kernel.last_state``), so that chain is
    continued and compared, with its own draws; the state must be this run's (chains run one after another,
    in this process).

    **Cost.** ``2 k t (burn_in + num_samples)`` steps per chain (``k`` the kernel's ``steps_per_sample``,
    ``t`` the run's thinning): about 2.4 times the run's sampling phase with the defaults. (SGFS's step is
    proportional to its ``ε`` only for small ``ε``: at large ``ε`` the halved run's draws span less time.)

    :param mcmc: a ``numpyro.infer.MCMC`` or ``pyro.infer.MCMC`` object, run with a ppl_sgmcmc kernel.
    :param num_samples: the halved-step draws kept per chain (at least 2); default: as many as the run's.
    :param burn_in: the halved-step draws discarded first (default: ``num_samples // 5``).
    :param alpha: the family-wise error rate of the comparison (default 0.05).
    :returns: a :class:`StepHalvingResult` ``(table, flagged, threshold, step_size, halved_step_size)``.
    :raises TypeError: ``mcmc`` is not a NumPyro or Pyro ``MCMC`` object of a ppl_sgmcmc kernel.
    :raises ValueError: a run with no draws, an infinite step size (SGFS with ``alpha=0``), bad
        ``num_samples``, ``burn_in`` or ``alpha``, or (Pyro) a kernel whose last state is not this run's.

    **Example** (SGLD with ``h = 1`` on a standard normal samples a variance of ``1/(1 - h/2) = 2``; at
    ``h = 1/2``, ``4/3``: the standard deviations move)::

        >>> import warnings, jax, jax.numpy as jnp
        >>> from numpyro.infer import MCMC
        >>> from ppl_sgmcmc.numpyro import SGLD
        >>> kernel = SGLD(potential_fn=lambda z: 0.5 * jnp.sum(z["x"] ** 2), step_size=1.0)
        >>> mcmc = MCMC(kernel, num_warmup=100, num_samples=2000, progress_bar=False)
        >>> mcmc.run(jax.random.PRNGKey(0), init_params={"x": jnp.zeros(2)})
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     result = step_halving_check(mcmc)
        >>> [name for name in result.flagged if name.startswith("sd")], result.halved_step_size.tolist()
        (['sd of x[0]', 'sd of x[1]'], [0.5])
        >>> result.table.loc["x[0]", ["sd", "sd_halved"]].round(1).tolist(), "sd of x[0]" in str(caught[0].message)
        ([1.4, 1.2], True)
    """
    fn = "step_halving_check"
    if isinstance(alpha, bool) or not isinstance(alpha, Real) or not 0 < alpha < 1:
        raise ValueError(f"{fn}: `alpha` must lie strictly between 0 and 1, got {alpha!r}.")
    run = _run_of(mcmc, fn)
    kernel = run.kernel
    original = run.samples()
    n = next(iter(original.values())).shape[1] if num_samples is None else _count(num_samples, "num_samples", fn, 2)
    burn = n // 5 if burn_in is None else _count(burn_in, "burn_in", fn, 0)
    step_size = kernel._step_size
    if not kernel._tune and not callable(step_size) and not math.isfinite(step_size):
        raise ValueError(f"{fn}: {kernel.name}'s step size is {step_size}: there is no discretisation to halve.")
    with _kernel_restored(kernel):
        adjust = _halve_tuned
        if not kernel._tune:
            kernel._step_size = _HalvedSchedule(step_size, run.step_index()) if callable(step_size) else step_size / 2
            adjust = _unchanged
        continuation = run.continue_chains(adjust, burn + n, spacing=2)
    before = {name: value[continuation.chains] for name, value in original.items()}
    after = {name: value[:, burn:] for name, value in continuation.samples.items()}
    table, flagged, threshold = _compare(before, after, alpha)
    if flagged:
        warnings.warn(
            f"{kernel.name}: {len(flagged)} posterior moment(s) moved beyond their Monte Carlo error when the step "
            f"size was halved: {', '.join(flagged)}. The draws carry a discretisation or gradient-noise bias (or the "
            "run had not reached its stationary distribution: a warm-up too short): use a smaller step size (or, for "
            "a tuned one, a smaller `target_noise_ratio`), or a longer warm-up, and check again.",
            RuntimeWarning,
            stacklevel=2,
        )
    return StepHalvingResult(table, flagged, threshold, continuation.step_size, continuation.halved_step_size)


def _unchanged(state: Any) -> Any:
    return state


def _compare(
    before: Mapping[str, np.ndarray], after: Mapping[str, np.ndarray], alpha: float
) -> tuple["pd.DataFrame", list[str], float]:
    """The table, the flagged moments and the threshold of :func:`step_halving_check`."""
    import pandas as pd

    labels = _labels(before)
    x, y = (np.asarray(flatten_draws(draws), np.float64) for draws in (before, after))
    chains = len(next(iter(before.values())))
    x, y = x.reshape(chains, -1, len(labels)), y.reshape(chains, -1, len(labels))
    mean, mean_se, sd, sd_se = _moments(x)
    mean_h, mean_se_h, sd_h, sd_se_h = _moments(y)
    mean_mcse, sd_mcse = np.hypot(mean_se, mean_se_h), np.hypot(sd_se, sd_se_h)
    with np.errstate(divide="ignore", invalid="ignore"):
        mean_z, sd_z = (mean_h - mean) / mean_mcse, (sd_h - sd) / sd_mcse
    threshold = NormalDist().inv_cdf(1 - alpha / (4 * len(labels)))
    flagged = []
    for label, zm, zs in zip(labels, mean_z, sd_z):
        flagged += [f"{moment} of {label}" for moment, z in (("mean", zm), ("sd", zs)) if abs(z) > threshold]
    table = pd.DataFrame(
        {
            "mean": mean, "mean_halved": mean_h, "mean_mcse": mean_mcse, "mean_z": mean_z,
            "sd": sd, "sd_halved": sd_h, "sd_mcse": sd_mcse, "sd_z": sd_z,
        },  # fmt: skip
        index=pd.Index(labels, name="coordinate"),
    )
    return table, flagged, threshold


# --- the minibatch-energy noise of CSGLD / CSGHMC ---------------------------------------------------
NOISE_GAP_RATIO = 0.5
""":func:`energy_noise` reports a chain whose median ``σ/Δu`` reaches this: a noise of half a bin width moves a
good part of the draws into the neighbouring bins, and with ``energy_gap="auto"`` (``Δu`` the sd of the minibatch
energies, noise included) it means the noise makes at least a quarter of the energy's variance along the chain:
the grid resolves the noise rather than the energy landscape (``σ/Δu`` near 1)."""
NOISE_TEMPERATURE_RATIO = 0.3
""":func:`energy_noise` reports a chain whose median ``σ/τ`` exceeds this: the log weight moves by about
``ζ ε / τ`` for an energy error ``ε``, which inflates the weights by ``e^{ζ²σ²/(2τ²)}`` on average, within a
few percent (at most ``e^{0.045} ≈ 1.05`` with ``ζ = 1``) below this ratio and growing fast above it."""
NOISE_SPREAD = 2.0
""":func:`energy_noise` reports draws whose ``σ`` differ by this factor (the 90th over the 10th percentile over
all chains' draws) when the larger exceeds ``NOISE_TEMPERATURE_RATIO τ``: the inflation ``e^{ζ²σ²/(2τ²)}`` then
differs between the regions (modes) the draws lie in, and the self-normalised weights do not cancel it."""

class EnergyNoiseResult(NamedTuple):
    """The noise of a CSGLD/CSGHMC run's minibatch energies, from :func:`energy_noise`. ``str()`` of it is a
    readable report."""

    table: "pd.DataFrame"
    """One row per chain (index ``chain``) with the columns ``sigma_median`` and ``sigma_max`` (``σ`` over the
    chain's evaluated draws), ``energy_gap`` (the chain's ``Δu``), ``gap_ratio`` (``sigma_median / energy_gap``),
    ``temperature_ratio`` (``sigma_median / τ``) and ``biased`` (``gap_ratio >=`` :data:`NOISE_GAP_RATIO` or
    ``temperature_ratio >`` :data:`NOISE_TEMPERATURE_RATIO`: the chain's weights are probably biased)."""
    sigma: np.ndarray
    """``σ(x)`` at each evaluated draw, ``(chains, draws)`` (draws evenly spaced over each chain's)."""
    temperature: float
    """``τ`` (at the run's last step, for a schedule)."""
    spread: float
    """The 90th over the 10th percentile of ``sigma`` over all chains (``inf`` when only the latter is 0, 1 when
    both are)."""
    flagged: list[str]
    """What was found (``"chain 0: σ/Δu = 1.21 >= 0.5, σ/τ = 6.3 > 0.3"``, ``"σ differs between draws ..."``);
    empty when nothing was."""
    plates: dict[str, tuple[int, int]]
    """The subsampled plates ``{name: (N, n)}`` (empty when every step sees all the data: ``σ = 0``)."""
    replace: bool
    """Whether the kernel draws its minibatches with replacement."""

    def __str__(self) -> str:
        chains, draws = self.sigma.shape
        plates = ", ".join(f"plate {name!r}: N = {size}, n = {n}" for name, (size, n) in self.plates.items())
        how = ("with" if self.replace else "without") + " replacement"
        lines = [
            f"Minibatch-energy noise σ (sd of Ũ_t(x) at {draws} draws per chain; "
            f"{plates + ', ' + how if plates else 'full batches: no noise'}); τ = {self.temperature:g}",
            self.table.to_string(float_format=lambda v: f"{v:.3g}"),
            f"spread of σ over the draws (q90/q10): {self.spread:.3g}",
        ]
        lines += (["flagged:"] + [f"  {item}" for item in self.flagged]) if self.flagged else ["nothing flagged"]
        return "\n".join(lines)


def _per_row(pointwise: Pointwise, fn: str) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
    """``(first row, {plate: ℓ (rows, plate size)})`` of each chunk of ``pointwise``: ``ℓ_i`` the log-likelihood of
    row ``i`` of the plate summed over its observed sites (and over their other dimensions)."""
    for start, chunk in pointwise.chunks:
        rows: dict[str, np.ndarray] = {}
        for site, (plate, dim) in pointwise.sites.items():
            values = np.asarray(chunk[site], np.float64)
            size = pointwise.plates[plate][0]
            if values.ndim <= -dim or values.shape[dim] != size:
                raise ValueError(
                    f"{fn}: the log-likelihood of site {site!r} has the shape {values.shape[1:]} per draw, whose "
                    f"dimension {dim} is not the plate {plate!r} of size {size}."
                )
            per_row = np.moveaxis(values, dim, -1).reshape(len(values), -1, size).sum(axis=1)
            rows[plate] = rows[plate] + per_row if plate in rows else per_row
        yield start, rows


def _noise_sd(pointwise: Pointwise, fn: str) -> np.ndarray:
    """``σ(x) = sqrt(Σ_plates (N²/n) Var_i[ℓ_i(x)] (N - n)/(N - 1)^[without replacement])`` at each draw,
    ``(chains, draws)``, ``ℓ_i`` the summed log-likelihood of row ``i`` of the plate over its observed sites."""
    chains, draws = pointwise.shape
    variance = np.zeros(chains * draws)
    for start, rows in _per_row(pointwise, fn):
        for plate, per_row in rows.items():
            size, n = pointwise.plates[plate]
            factor = size * size / n * (1.0 if pointwise.replace else (size - n) / (size - 1))
            variance[start : start + len(per_row)] += factor * per_row.var(axis=1)
    return np.sqrt(variance).reshape(chains, draws)


def _check_predictions(kernel: Any, fn: str) -> None:
    """Refuse a kernel whose run's predictions the verdict cannot compute (``judge="predictions"``): one built from
    ``potential_fn`` (no model), or with local Gibbs sites (the log-likelihood would need them marginalised)."""
    if kernel._model is None or kernel._gibbs is not None:
        raise ValueError(
            f"{fn}: judging the predictions needs the model's log-likelihood of data rows, which "
            + ("a kernel built from `potential_fn` does not give."
               if kernel._model is None else "a model with local Gibbs sites gives only with them marginalised.")
            + " Judge the parameters (the default) instead."
        )  # fmt: skip


def _row_log_likelihoods(run: Run, fn: str) -> np.ndarray:
    """The log-likelihoods of the :func:`fixed_rows` of each subsampled plate at the draws the verdict reads,
    ``(chains, draws, rows)`` (the plates' rows side by side, in the order of their names)."""
    _check_predictions(run.kernel, fn)
    pointwise = run.pointwise(_verdict.PREDICTION_DRAWS, None, fixed=True)
    if not pointwise.sites:
        raise ValueError(f"{fn}: judging the predictions needs an observed site in a plate with `subsample_size`.")
    chains, draws = pointwise.shape
    rows = [np.concatenate([per_row[plate] for plate in sorted(per_row)], axis=-1)
            for _, per_row in _per_row(pointwise, fn)]  # fmt: skip
    return np.concatenate(rows).reshape(chains, draws, -1)


def _noise_report(sigma: np.ndarray, gap: np.ndarray, tau: float) -> tuple["pd.DataFrame", float, list[str]]:
    """:func:`energy_noise`'s table, spread and findings from ``σ`` at the draws ``(chains, draws)``, each chain's
    ``Δu`` and ``τ``."""
    import pandas as pd

    median = np.median(sigma, axis=1)
    gap_ratio, tau_ratio = median / gap, median / tau
    biased = (gap_ratio >= NOISE_GAP_RATIO) | (tau_ratio > NOISE_TEMPERATURE_RATIO)
    table = pd.DataFrame(
        {
            "sigma_median": median, "sigma_max": sigma.max(axis=1), "energy_gap": gap,
            "gap_ratio": gap_ratio, "temperature_ratio": tau_ratio, "biased": biased,
        },  # fmt: skip
        index=pd.RangeIndex(len(median), name="chain"),
    )
    low, high = np.quantile(sigma, [0.1, 0.9])
    spread = float(high / low) if low > 0 else (math.inf if high > 0 else 1.0)
    flagged = []
    for chain, (g, t) in enumerate(zip(gap_ratio, tau_ratio)):
        found = [f"σ/Δu = {g:.3g} >= {NOISE_GAP_RATIO}"] if g >= NOISE_GAP_RATIO else []
        found += [f"σ/τ = {t:.3g} > {NOISE_TEMPERATURE_RATIO}"] if t > NOISE_TEMPERATURE_RATIO else []
        if found:
            flagged.append(f"chain {chain}: {', '.join(found)}")
    if spread >= NOISE_SPREAD and high > NOISE_TEMPERATURE_RATIO * tau:
        flagged.append(
            f"σ differs between draws by a factor {spread:.3g} (10th-90th percentile {low:.3g}-{high:.3g}): the "
            "weights of different regions are inflated differently"
        )
    return table, spread, flagged


def energy_noise(mcmc: Any, num_draws: int = 100, *, chunk_size: int | None = None) -> EnergyNoiseResult:
    """The noise of a CSGLD/CSGHMC run's minibatch energies, against its energy grid and temperature.

    CSGLD and CSGHMC (W. Deng, G. Lin and F. Liang, "A Contour Stochastic Gradient Langevin Dynamics Algorithm
    for Simulations of Multi-modal Distributions", NeurIPS 2020) place each draw on the energy grid, flatten
    the drift and weight the draw through the **minibatch** energy ``Ũ_t(x) = U(x) + ε_t``, whose noise at a
    fixed ``x`` has the variance (``N`` rows of a plate, minibatches of ``n``, ``ℓ_i(x) = log p(y_i | x)``, the
    variance over the ``N`` rows)::

        σ²(x) = (N² / n) Var_i[ℓ_i(x)]                         (minibatches with replacement)
        σ²(x) = (N² / n) Var_i[ℓ_i(x)] (N - n) / (N - 1)       (without: replace=False)

    summed over the subsampled plates (each draws its minibatch independently); ``σ = 0`` when every step sees
    all the data. The noise smears the partition ``θ`` and moves the log weight ``ζ log Ψ_θ(Ũ_t)`` by about
    ``ζ ε / τ``, which inflates the weights by ``e^{ζ²σ²/(2τ²)}`` on average; the importance weights no longer
    undo the flattening unless ``σ`` is small against the grid's ``Δu`` and the temperature ``τ``, and the
    same everywhere (a noise that differs between modes biases their relative masses). Halving the step size
    does not show it (:func:`step_halving_check` passes): this diagnostic computes ``σ`` from the model.

    At ``num_draws`` draws evenly spaced over each chain, the per-datum log-likelihoods of the observed sites on
    all ``N`` rows are computed by the backend's full-data machinery (that of
    :func:`ppl_sgmcmc.numpyro.full_data_log_likelihood` and :func:`ppl_sgmcmc.pyro.full_data_log_likelihood`,
    ``chunk_size`` draws at a time), summed per row over a plate's observed sites (and over their other
    dimensions), and ``σ`` follows from the formula. Each chain's median ``σ`` is compared with its ``Δu``
    (``mcmc.last_state.energy_gap``; Pyro: ``mcmc.diagnostics()``) and with ``τ``. A ``RuntimeWarning`` names
    what was found when the weights are probably biased:

    - median ``σ/Δu >=`` :data:`NOISE_GAP_RATIO` (the grid resolves the noise; ``energy_gap="auto"`` makes
      ``Δu ≈ σ`` when the noise dominates);
    - median ``σ/τ >`` :data:`NOISE_TEMPERATURE_RATIO` (the inflation ``e^{ζ²σ²/(2τ²)}`` exceeds a few percent);
    - ``σ`` differs between draws by a factor :data:`NOISE_SPREAD` or more (the 90th over the 10th percentile),
      the larger above ``NOISE_TEMPERATURE_RATIO τ`` (different modes, differently inflated).

    The fixes: larger minibatches (``σ²`` falls like ``1/n``), full batches if the data allow; compare the
    weighted results with a run at twice the ``subsample_size``. Silence does not make the weights right: a chain
    that never left its mode (a weight ESS that looks healthy) has no other mode to weigh. Observed sites outside
    the subsampled plates add no noise; ``scale`` handlers and masks are not seen (the log-likelihoods are those
    of ArviZ's ``log_likelihood`` group).

    **Cost.** ``chains × min(num_draws, draws)`` evaluations of the full-data likelihood; ``chunk_size=None``
    evaluates as many draws at once as keep about ``2²²`` log-likelihood values in memory.

    :param mcmc: a ``numpyro.infer.MCMC`` or ``pyro.infer.MCMC`` object, run with a ppl_sgmcmc ``CSGLD`` or
        ``CSGHMC`` kernel built from a model.
    :param num_draws: the draws per chain at which ``σ`` is computed, at least 1 (default 100).
    :param chunk_size: draws evaluated at once (default ``None``: see above).
    :returns: an :class:`EnergyNoiseResult` ``(table, sigma, temperature, spread, flagged, plates, replace)``.
    :raises TypeError: ``mcmc`` is not a NumPyro or Pyro ``MCMC`` object of a ppl_sgmcmc kernel, or its kernel is
        not CSGLD or CSGHMC.
    :raises ValueError: a run with no draws, a kernel built from a ``potential_fn`` (no per-datum likelihood),
        a kernel with local Gibbs sites, an observed site in two subsampled plates, bad ``num_draws`` or
        ``chunk_size``.

    **Example** (two modes, ``θ ≈ ±1``; minibatches of 5 of 20 rows: ``σ`` is several times ``τ = 1`` and close
    to the automatic ``Δu``; Pyro, whose short runs start fast)::

        >>> import warnings, torch, pyro, pyro.distributions as dist
        >>> from pyro.infer import MCMC
        >>> from ppl_sgmcmc.pyro import CSGLD
        >>> def model(y, n):
        ...     theta = pyro.sample("theta", dist.Normal(0.8, 1.0))
        ...     with pyro.plate("data", y.shape[0], subsample_size=n):
        ...         pyro.sample("y", dist.Normal(theta**2, 1.0), obs=pyro.subsample(y, event_dim=0))
        >>> pyro.set_rng_seed(0)
        >>> kernel = CSGLD(model, step_size=1e-3, compile_potential=False)
        >>> mcmc = MCMC(kernel, warmup_steps=200, num_samples=100, disable_progbar=True)
        >>> mcmc.run(1.1 + torch.randn(20), 5)
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     result = energy_noise(mcmc, num_draws=50)
        >>> result.plates, result.sigma.shape, bool(result.table.loc[0, "biased"])
        ({'data': (20, 5)}, (1, 50), True)
        >>> bool(result.table.loc[0, "temperature_ratio"] > 1), "too noisy" in str(caught[0].message)
        (True, True)
    """
    fn = "energy_noise"
    num_draws = _count(num_draws, "num_draws", fn, 1)
    if chunk_size is not None:
        chunk_size = _count(chunk_size, "chunk_size", fn, 1)
    run = _run_of(mcmc, fn)
    kernel = run.kernel
    if not isinstance(kernel, algorithms.CSGLD):
        raise TypeError(
            f"{fn}: the run's kernel is {kernel.name}, not CSGLD or CSGHMC: only their energy grid and importance "
            "weights read the minibatch energy. For another kernel's gradient noise see `ppl_sgmcmc.noise` and "
            "`step_halving_check`."
        )
    if kernel._model is None:
        raise ValueError(
            f"{fn}: this {kernel.name} was built from a `potential_fn`, which has no per-datum log-likelihoods to "
            "compute σ from. Evaluate the stochastic potential `potential_fn(z, rng)` at a point of each mode for a "
            "few hundred draws of its random argument and take their standard deviation; compare it with the "
            "chains' `energy_gap` and the temperature (see 'Minibatch energies bias the weights' on the CSGLD "
            "algorithm page)."
        )
    pointwise = run.pointwise(num_draws, chunk_size)
    sigma = _noise_sd(pointwise, fn)
    gap = np.asarray(run.energy_gaps(), np.float64)
    tau = float(kernel.temperature_at(run.step_index()) if callable(kernel._temperature) else kernel._temperature)
    table, spread, flagged = _noise_report(sigma, gap, tau)
    result = EnergyNoiseResult(table, sigma, tau, spread, flagged, dict(pointwise.plates), pointwise.replace)
    if flagged:
        warnings.warn(
            f"{kernel.name}: the minibatch energies are too noisy for the importance weights to be trusted "
            f"({'; '.join(flagged)}; τ = {tau:g}, median σ per chain {', '.join(f'{s:.3g}' for s in table['sigma_median'])}). "
            "Use larger minibatches (`subsample_size`: σ² falls like 1/n), or full batches if the data allow, and "
            "compare the weighted results with a run at twice the `subsample_size` (see 'Minibatch energies bias "
            "the weights' on the CSGLD algorithm page).",
            RuntimeWarning,
            stacklevel=2,
        )
    return result


def verdict(
    mcmc: Any, *, warn: bool = True, judge: str = "parameters", predictions: Any = None
) -> "_verdict.Verdict":
    """The end-of-run verdict (:mod:`ppl_sgmcmc.verdict`) of a finished run of a ppl_sgmcmc kernel
    (``numpyro.infer.MCMC`` or ``pyro.infer.MCMC``), from its kept draws of every latent site and their noise
    ratios (and the potential energy where it was collected): whether the chains agree (split rank-normalised
    R-hat), hold enough effective draws (bulk and tail ESS), still drifted (burn-in left in the draws), or met
    more gradient noise than the step size allows. :class:`ppl_sgmcmc.numpyro.MCMC` and the Pyro kernels
    (each chain) run it at the end of every run; call it after a ``numpyro.infer.MCMC`` run, or to judge all
    of a Pyro run's chains together.

    A model with symmetries (a network's permutable hidden units, a mixture's labels) is judged on its predictions
    with ``judge="predictions"``: the log-likelihoods of one minibatch's worth of data rows (:func:`fixed_rows`) at
    the judged draws, which the symmetries leave alone (see :mod:`ppl_sgmcmc.verdict`), or the ``predictions``
    given. Judging the parameters (the default), a run whose chains disagree is also judged on those predictions
    where the model gives them, and the verdict says when they agree. The rows' log-likelihoods see the function
    on the data; predictions far from the data (a network's extrapolation) are judged only when given: e.g. the
    draws of ``f(x)`` at the inputs that matter, from ``numpyro.infer.Predictive`` or ``pyro.infer.Predictive``.

    :param mcmc: the finished run.
    :param warn: also warn (one ``RuntimeWarning`` naming what failed and what to do) if it failed.
    :param judge: ``"parameters"`` or ``"predictions"`` (:data:`ppl_sgmcmc.verdict.JUDGES`).
    :param predictions: the predictions to judge, ``(chains, m, k)`` at ``m`` of each chain's draws, evenly spaced
        (``arange(m) * draws // m``; all of them: ``m = draws``); ``None``: the rows' log-likelihoods, at
        :data:`~ppl_sgmcmc.verdict.PREDICTION_DRAWS` draws.
    :return: the :class:`~ppl_sgmcmc.verdict.Verdict`.
    :raises ValueError: for another ``judge``, or ``judge="predictions"`` on a run without a model's
        log-likelihood of data rows (a ``potential_fn``, local Gibbs sites, no observed site in a subsampled plate).

    **Example** (two chains of 2000 draws of a standard normal: they agree)::

        >>> import jax, jax.numpy as jnp
        >>> from numpyro.infer import MCMC
        >>> from ppl_sgmcmc.numpyro import SGLD
        >>> from ppl_sgmcmc.diagnostics import verdict
        >>> kernel = SGLD(potential_fn=lambda z: 0.5 * jnp.sum(z["x"] ** 2), step_size=0.5)
        >>> mcmc = MCMC(kernel, num_warmup=100, num_samples=2000, num_chains=2, chain_method="vectorized",
        ...             progress_bar=False)
        >>> mcmc.run(jax.random.PRNGKey(0), init_params={"x": jnp.zeros((2, 2))})
        >>> verdict(mcmc).ok
        True
    """
    if judge not in _verdict.JUDGES:
        raise ValueError(f"verdict: `judge` must be one of {_verdict.JUDGES}, got {judge!r}.")
    run = _run_of(mcmc, "verdict")
    draws, noise_ratio, energy = run.kept()
    common = {"energy": energy, "noise_ratio": noise_ratio, "noise_limit": run.kernel.noise_ratio_limit,
              "warmup": run.warmup_fit(), "advice": run.kernel.verdict_advice(run.final_rule_state())}  # fmt: skip
    if judge == "predictions":
        given = _row_log_likelihoods(run, "verdict") if predictions is None else predictions
        result = _verdict.assess(draws, predictions=given, judge=judge, **common)
    else:
        result = _verdict.assess(draws, predictions=predictions, **common)
        if result.unmixed and predictions is None:  # do the predictions agree (a model with symmetries)?
            try:
                with warnings.catch_warnings():  # e.g. Pyro's note that the model is evaluated draw by draw
                    warnings.simplefilter("ignore")
                    predictions = _row_log_likelihoods(run, "verdict")
            except Exception:  # noqa: BLE001 - a model whose rows cannot be evaluated keeps the parameters' verdict
                predictions = None
            if predictions is not None:  # the parameters' statistics are not computed again
                on_predictions = _verdict.assess(draws, predictions=predictions, judge="predictions", **common)
                result = _verdict.with_predictions(result, on_predictions)
    if warn:
        _verdict.report(result, run.kernel.name)
    return result
