"""Sample-quality diagnostics: the kernel Stein discrepancy (KSD) of a set of draws.

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

Precision follows JAX's default (float32 unless ``jax_enable_x64`` is on); a KSD near ``1/sqrt(m)``
of a large sample is a small difference of larger terms, so prefer float64 to compare such values
closely.
"""

import math
from collections.abc import Mapping
from functools import partial
from numbers import Integral, Real
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

__all__ = ["LinearKSD", "flatten_draws", "imq_ksd", "imq_ksd_linear"]

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
        if g.shape != (d,):
            raise ValueError(f"{fn}: `preconditioner` must be a vector of shape ({d},), got {g.shape}.")
        if not (np.all(np.isfinite(g)) and np.all(g > 0)):
            raise ValueError(f"{fn}: `preconditioner` must have finite, strictly positive entries.")
        root = jnp.sqrt(jnp.asarray(g, dtype))
        xj, sj = xj / root, sj * root
    return xj, sj


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
    # (s(y) - s(x))ᵀr from cancelling catastrophically when the draws sit far from the origin
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
    Without it, all coordinates share the length scale ``c``, so the value depends on units.

    :param samples: ``(m, d)`` draws ``x_i`` (unconstrained coordinates; see :func:`flatten_draws`).
    :param scores: ``(m, d)`` scores ``s(x_i) = ∇ log p(x_i) = -∇U(x_i)`` with the *full-data*
        potential ``U`` (a minibatch gradient adds its noise to the KSD).
    :param c: the IMQ kernel's length scale ``c > 0`` (default 1).
    :param beta: the IMQ exponent ``β ∈ (-1, 0)`` (default ``-1/2``).
    :param preconditioner: optional ``(d,)`` positive vector ``Γ`` (see above).
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
    :param preconditioner: optional ``(d,)`` positive vector ``Γ`` (see :func:`imq_ksd`).
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
