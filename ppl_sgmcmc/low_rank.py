"""A low-rank-plus-diagonal metric, estimated from the warm-up's draws and gradients, backend-neutral.

The metric (the inverse mass matrix, the preconditioner's ``Σ = L Lᵀ``) is

    Σ = diag(σ) (I + U (Λ - I) Uᵀ) diag(σ),      L = diag(σ) (I + U (Λ^(1/2) - I) Uᵀ),

with ``U`` a ``d × r`` matrix of orthonormal columns and ``Λ`` their ``r`` eigenvalues: a diagonal scaling and, in
its coordinates, ``r`` directions stretched or squeezed. Applying ``L``, ``L⁻¹`` or ``Lᵀ`` costs ``O(r d)``, against
``O(d²)`` for a dense ``L``: the warm-up's metric with ``dense_mass="low_rank"`` (SGLD, SGHMC and SGNHT), for
posteriors beyond :data:`~ppl_sgmcmc.algorithms.AUTO_DENSE_MAX` latent coordinates, where a dense one stops paying.

**The estimate** (:func:`estimate`) minimises the Fisher divergence between the posterior and a Gaussian of
covariance ``Σ``, as Seyboldt, Carlson & Carpenter, "Preconditioning Hamiltonian Monte Carlo by minimizing Fisher
divergence" (2024; nutpie's and BlackJAX's ``low_rank_adaptation``): for draws ``x`` with gradients ``g = ∇U(x)``,

1. each coordinate is scaled by ``σ_k² = sd(x_k) / sd(g_k)``;
2. in those coordinates the top :data:`RANK` principal directions of the draws and of the gradients span a
   subspace ``Q`` (at most ``2 RANK`` dimensions), where ``Σ_Q = C_x # C_g⁻¹`` is the geometric mean of the draws'
   covariance ``C_x`` and the inverse of the gradients' ``C_g`` (the unique ``X`` with ``X C_g X = C_x``);
3. its eigenvalues ``λ`` are kept outside a band around 1 and taken towards 1 inside it (:func:`band`).

On a Gaussian of precision ``H``, ``g = H x``, so ``C_g = H C_x H`` and ``C_x # C_g⁻¹ = H⁻¹`` whatever ``C_x`` is:
the estimate is exact from draws that span the directions, however little the chain explored along them. That is
what makes it fit SG-MCMC's warm-up, whose draws are strongly autocorrelated.

**Stochastic gradients.** A minibatch gradient is ``ĝ = g + e`` with noise ``e`` of covariance ``V`` (about ``N/n``
times the Fisher information: at 8 % minibatches ten times the signal), so ``cov(ĝ) = cov(g) + V``: inverted
uncorrected, the noise makes ``Σ`` too small wherever it is large against the gradient's own spread. The history
keeps, per slot of consecutive warm-up steps, the means of the draws and gradients (averaging ``s`` steps divides
the noise by ``s``, and on a Gaussian the mean gradient is still ``H`` times the mean draw) and the slot's
alternating sum of the gradients ``Σ_t (-1)^t ĝ_t / s``, in which ``g`` cancels between consecutive steps and the
noise does not: the same measurement as the kernel's noise estimate (:mod:`ppl_sgmcmc.noise`: the squared
difference of consecutive gradients), per slot. Its per-coordinate variance ``v_k`` is subtracted from the
gradients' variances before they are inverted, in the diagonal step and, projected (``Qᵀ diag(σ² v) Q``), in the
subspace. Three things temper the subtraction, each measured on chains (see the user guide's warm-up page):

* **the chain answers its noise.** Within a slot the chain moves in response to each ``e_t``, and at frequencies
  below its relaxation rate the response cancels the noise in the slot's mean gradient (the time-averaged force
  on a stationary chain is bounded); the alternating sum, at the highest frequency, sees all of it. For SGLD on a
  Gaussian (an AR(1) chain) the fraction of ``V/s`` that reaches the slot mean is about ``ρ²``, ``ρ`` the lag-one
  autocorrelation of the slots' mean draws (:func:`_persistence`): about 1 in directions the chain crosses slowly
  (where the noise matters), about 0 in stiff ones (where it is cancelled);
* **sampling error.** The subtraction is reduced by :data:`CONFIDENCE` standard errors of the difference, and a
  variance is kept within ``[GRADIENT_FLOOR, 1]`` times its measured value;
* **the noise's shape.** Only its per-coordinate variances are used: the covariance of ``2 RANK`` projected noise
  rows from :data:`SLOTS` slots scatters its eigenvalues by about ``±sqrt(2 RANK / SLOTS)`` (Marchenko-Pastur),
  and subtracting it took the estimate further from the truth than leaving it. Where the noise is shaped like the
  posterior's precision (``V ≈ (N/n) H``, a well-specified model near its mode) it inflates ``cov(ĝ)`` by a nearly
  uniform factor, which the step-size tuning absorbs; the correction matters where it is not (coordinates no datum
  moves, such as a hierarchical model's scales, next to noisy ones).

**The representation** (:func:`factors`): ``L`` and ``L⁻¹`` are both of the form ``diag(a) (I + P Qᵀ) diag(b)``,
packed in a ``(2, d, r + 1)`` array: ``[0, :, 0] = a``, ``[1, :, 0] = b``, ``[0, :, 1:] = P``, ``[1, :, 1:] = Q``.
The three-dimensional shape tells it from a diagonal ``(d,)`` and a dense ``(d, d)`` preconditioner in
:mod:`ppl_sgmcmc.adaptation`; a rescaling of the coordinates (``L diag(f)``) multiplies ``b`` (:func:`rescale`).

Written once on the array-API subset shared by ``jax.numpy`` and ``torch``, like the update rules.

**Example** (an exact-gradient Gaussian whose covariance has one direction 25 times wider than the rest)::

    >>> import jax, jax.numpy as jnp
    >>> from ppl_sgmcmc import low_rank
    >>> d = 40
    >>> v = jnp.ones(d) / d**0.5
    >>> cov = jnp.eye(d) + 24.0 * jnp.outer(v, v)
    >>> x = jax.random.multivariate_normal(jax.random.key(0), jnp.zeros(d), cov, (low_rank.SLOTS,))
    >>> g = x @ jnp.linalg.inv(cov)
    >>> history = low_rank.History(jnp.ones(low_rank.SLOTS), x, g, g)  # one draw a slot: its alternating sum is g
    >>> sigma, U, lam, usable = jax.jit(low_rank.estimate)(history)  # one program (as in the warm-up), or eagerly
    >>> scale, inverse = low_rank.factors(sigma, U, lam)
    >>> wide = float(v @ low_rank.apply(scale, low_rank.apply_transpose(scale, v)))  # vᵀ Σ v, 25 in truth
    >>> abs(wide - 25) < 1, bool(usable)
    (True, True)
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from array_api_compat import array_namespace, device, is_jax_namespace, is_torch_namespace

from ppl_sgmcmc.rules._types import Array

__all__ = [
    "BAND",
    "CONFIDENCE",
    "GRADIENT_FLOOR",
    "MIN_SLOTS",
    "RANK",
    "REGULARIZATION",
    "SLOTS",
    "History",
    "apply",
    "apply_transpose",
    "band",
    "estimate",
    "factors",
    "from_diagonal",
    "history",
    "record",
    "rescale",
    "width",
]

#: The warm-up's slow window is split into this many slots of consecutive steps; the history keeps each slot's mean
#: draw and gradient and its alternating gradient sum: ``3 SLOTS d`` numbers.
SLOTS = 128
#: The principal directions taken from the draws and from the gradients: the metric has rank at most ``2 RANK``.
RANK = 16
#: An eigenvalue ``λ`` of the estimate is kept where ``|log λ| >= log BAND[1]``, replaced by 1 where
#: ``|log λ| <= log BAND[0]``, and in between raised to a power rising linearly in ``|log λ|`` from 0 to 1 (nutpie
#: keeps ``λ`` outside ``[1/2, 2]``; the ramp makes the metric a continuous function of what was measured).
BAND = (1.5, 2.0)
#: A coordinate's noise-corrected gradient variance is at least this fraction of its measured one.
GRADIENT_FLOOR = 0.01
#: The subspace's covariances are regularised by this fraction of their mean scale (towards the diagonal
#: metric, ``λ = 1``, in directions the window did not measure).
REGULARIZATION = 1e-3
#: The noise subtracted from the gradients' variances is reduced by this many standard errors of the difference, so
#: that sampling error (``2 RANK`` directions from :data:`SLOTS` slots) does not take a variance to near 0.
CONFIDENCE = 1.0
#: A window whose history fills fewer slots gives no estimate (the metric is kept).
MIN_SLOTS = 8


def width(d: int) -> int:
    """The rank ``r`` of the metric of ``d`` coordinates: ``min(d, 2 RANK)``.

    **Example**::

        >>> from ppl_sgmcmc.low_rank import width
        >>> width(2), width(1000)
        (2, 32)
    """
    return min(d, 2 * RANK)


# --- the packed factor diag(a) (I + P Qᵀ) diag(b) ----------------------------------------------------------------
def _parts(packed: Array) -> tuple[Array, Array, Array, Array]:
    return packed[0, :, 0], packed[1, :, 0], packed[0, :, 1:], packed[1, :, 1:]


def _pack(xp: Any, a: Array, b: Array, P: Array, Q: Array) -> Array:
    return xp.stack([xp.concat([a[:, None], P], axis=1), xp.concat([b[:, None], Q], axis=1)])


def apply(packed: Array, x: Array) -> Array:
    """``F x`` for the packed factor ``F = diag(a) (I + P Qᵀ) diag(b)`` and a vector ``x``: ``O(r d)``."""
    xp = array_namespace(packed, x)
    a, b, P, Q = _parts(packed)
    y = xp.multiply(b, x)
    return xp.multiply(a, y + xp.matmul(P, xp.matmul(y, Q)))


def apply_transpose(packed: Array, g: Array) -> Array:
    """``Fᵀ g`` for a vector ``g``, or ``g F`` (each row mapped by ``Fᵀ``) for an ``n × d`` matrix: ``O(r d)`` a row."""
    xp = array_namespace(packed, g)
    a, b, P, Q = _parts(packed)
    z = xp.multiply(g, a)
    return xp.multiply(z + xp.matmul(xp.matmul(z, P), Q.T), b)


def rescale(scale: Array, inverse: Array, factor: Array) -> tuple[Array, Array]:
    """``(L diag(f), diag(f)⁻¹ L⁻¹)`` of the packed ``L`` and ``L⁻¹``: ``b ⊙ f`` of ``L``, ``a ⊘ f`` of ``L⁻¹``."""
    xp = array_namespace(scale, factor)
    a, b, P, Q = _parts(scale)
    ia, ib, iP, iQ = _parts(inverse)
    return _pack(xp, a, xp.multiply(b, factor), P, Q), _pack(xp, xp.divide(ia, factor), ib, iP, iQ)


def factors(sigma: Array, U: Array, lam: Array) -> tuple[Array, Array]:
    """The packed ``L = diag(σ) (I + U (Λ^(1/2) - I) Uᵀ)`` and ``L⁻¹ = (I + U (Λ^(-1/2) - I) Uᵀ) diag(σ)⁻¹`` of the
    metric ``Σ = diag(σ) (I + U (Λ - I) Uᵀ) diag(σ)`` (``U``: orthonormal columns).

    **Example**::

        >>> import torch
        >>> from ppl_sgmcmc.low_rank import apply, factors
        >>> scale, inverse = factors(torch.tensor([2.0, 1.0]), torch.tensor([[1.0], [0.0]]), torch.tensor([4.0]))
        >>> apply(scale, torch.ones(2)), apply(inverse, apply(scale, torch.tensor([3.0, -1.0])))
        (tensor([4., 1.]), tensor([ 3., -1.]))
    """
    xp = array_namespace(sigma, U)
    one = xp.ones_like(sigma)
    root = xp.sqrt(lam)
    return _pack(xp, sigma, one, U * (root - 1)[None, :], U), _pack(xp, one, 1 / sigma, U * (1 / root - 1)[None, :], U)


def from_diagonal(scale: Array, inverse: Array) -> tuple[Array, Array]:
    """The packed form (of rank :func:`width`, ``P = Q = 0``) of a diagonal ``L`` and its inverse (``(d,)`` arrays)."""
    xp = array_namespace(scale)
    zeros = xp.zeros((scale.shape[0], width(scale.shape[0])), dtype=scale.dtype, device=device(scale))
    one = xp.ones_like(scale)
    return _pack(xp, scale, one, zeros, zeros), _pack(xp, one, inverse, zeros, zeros)


# --- the history of a slow window ------------------------------------------------------------------------------------
class History(NamedTuple):
    """What the warm-up keeps of the current slow window for the estimate, in :data:`SLOTS` slots of consecutive
    steps, in the model's coordinates ``θ``:

    - **counts**: the gradients added to each slot, ``(m,)``;
    - **draws**, **gradients**: their sums of positions and of minibatch gradients ``∇_θ Ũ``, ``(m, d)``;
    - **alternating**: the sums of the gradients with alternating signs (``+`` for a slot's 1st, 3rd, ...),
      ``(m, d)``: the noise without the gradient (see the module docstring).
    """

    counts: Array
    draws: Array
    gradients: Array
    alternating: Array


def history(d: int, like: Array, slots: int = SLOTS) -> History:
    """An empty history of ``slots`` slots of ``d``-vectors, of the dtype, device and namespace of ``like``
    (``slots = 0``: none kept, for a metric that is not low-rank)."""
    xp = array_namespace(like)
    dev = device(like)
    rows = xp.zeros((slots, d), dtype=like.dtype, device=dev)
    return History(xp.zeros((slots,), dtype=like.dtype, device=dev), rows, rows, rows)


def _add_row(xp: Any, rows: Any, slot: Any, row: Any) -> Any:
    """``rows`` with ``row`` added to row ``slot``: ``O(d)``."""
    if is_jax_namespace(xp):
        return rows.at[slot].add(row)
    if is_torch_namespace(xp):
        return rows.index_add(0, xp.reshape(xp.astype(slot, xp.int64), (1,)), row[None, :])
    one_hot = xp.astype(xp.arange(rows.shape[0], device=device(rows)) == slot, rows.dtype)
    return rows + one_hot[:, None] * row[None, :]


def record(state: History, slot: Array, theta: Array, gradient: Array, valid: Any) -> History:
    """``state`` with the draw ``theta`` and its minibatch gradient ``gradient`` (``∇_θ Ũ``) added to slot ``slot``
    if ``valid`` (the step was accepted and its gradient is one of the current coordinates).

    **Example** (gradients 1, 3, 5 in one slot: sum 9, alternating sum 1 - 3 + 5 = 3)::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc import low_rank
        >>> h = low_rank.history(1, jnp.zeros(1), slots=2)
        >>> for g in (1.0, 3.0, 5.0):
        ...     h = low_rank.record(h, jnp.array(1), jnp.zeros(1), jnp.array([g]), True)
        >>> h.counts.tolist(), h.gradients[1].tolist(), h.alternating[1].tolist()
        ([0.0, 3.0], [9.0], [3.0])
    """
    xp = array_namespace(theta)
    weight = xp.astype(xp.asarray(valid, device=device(theta)), theta.dtype)
    count = xp.take(state.counts, xp.reshape(slot, (1,)))[0]
    sign = (1 - 2 * xp.remainder(count, 2)) * weight
    return History(
        _add_row(xp, state.counts[:, None], slot, xp.reshape(weight, (1,)))[:, 0],
        _add_row(xp, state.draws, slot, theta * weight),
        _add_row(xp, state.gradients, slot, gradient * weight),
        _add_row(xp, state.alternating, slot, gradient * sign),
    )


# --- the estimate ------------------------------------------------------------------------------------------------------
def band(lam: Array) -> Array:
    """``λ^w`` with ``w = clip((|log λ| - log BAND[0]) / (log BAND[1] - log BAND[0]), 0, 1)``: 1 near 1, ``λ`` far
    from it, continuous in between.

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.low_rank import band
        >>> [round(v, 3) for v in band(jnp.array([1.2, 1 / 1.2, 1.75, 3.0, 0.1])).tolist()]
        [1.0, 1.0, 1.35, 3.0, 0.1]
    """
    xp = array_namespace(lam)
    low, high = BAND
    distance = xp.abs(xp.log(lam))
    weight = xp.clip((distance - math.log(low)) / math.log(high / low), 0.0, 1.0)
    return xp.exp(weight * xp.log(lam))


def _sqrt_psd(xp: Any, A: Array) -> tuple[Array, Array]:
    """``(A^(1/2), A^(-1/2))`` of a symmetric positive-definite ``A``."""
    values, vectors = xp.linalg.eigh(A)
    root = xp.sqrt(values)
    return (vectors * root[None, :]) @ vectors.T, (vectors / root[None, :]) @ vectors.T


def _geometric_mean(xp: Any, A: Array, B: Array) -> Array:
    """``A # B⁻¹ = B^(-1/2) (B^(1/2) A B^(1/2))^(1/2) B^(-1/2)``: the ``X`` with ``X B X = A``."""
    root, inverse_root = _sqrt_psd(xp, B)
    middle, _ = _sqrt_psd(xp, xp.matmul(xp.matmul(root, A), root))
    X = xp.matmul(xp.matmul(inverse_root, middle), inverse_root)
    return xp.add(X, X.T) / 2


def _top_directions(xp: Any, rows: Array, rank: int) -> Array:
    """The ``rank`` leading right singular vectors of ``rows`` (``m × d``), ``(d, rank)``."""
    _, _, vt = xp.linalg.svd(rows, full_matrices=False)
    return vt[:rank, :].T


def _corrected(xp: Any, measured: Array, subtracted: Array, noise: Array, n: Array) -> Array:
    """A gradient variance less its noise (``subtracted``), less sure the more noise it lost: raised by
    :data:`CONFIDENCE` standard errors of the difference (``sqrt(2/n) (measured + noise)`` from ``n`` slots), and
    kept within ``[GRADIENT_FLOOR measured, measured]``."""
    raised = xp.add(subtracted, CONFIDENCE * xp.sqrt(2 / n) * xp.add(measured, noise))
    return xp.clip(raised, GRADIENT_FLOOR * measured, measured)


def _persistence(xp: Any, centred: Array, weight: Array) -> Array:
    """``ρ²`` for the lag-one autocorrelation ``ρ`` of consecutive filled slots' centred means, per column, clipped to
    ``[0, 1]``: the fraction of the minibatch noise that reaches a slot's mean gradient (module docstring)."""
    pairs = xp.multiply(weight[1:], weight[:-1])[:, None]
    lagged = xp.sum(xp.multiply(xp.multiply(centred[1:, :], centred[:-1, :]), pairs), axis=0)
    total = xp.sum(xp.multiply(centred, centred), axis=0)
    rho = xp.clip(lagged / xp.where(total > 0, total, xp.ones_like(total)), 0.0, 1.0)
    return rho * rho


def estimate(state: History) -> tuple[Array, Array, Array, Array]:
    """The Fisher-divergence estimate of the metric from a window's history (module docstring): ``(σ, U, λ,
    usable)``, the metric ``Σ = diag(σ) (I + U (Λ - I) Uᵀ) diag(σ)`` with :func:`band` applied to ``λ``, and whether
    the history gave an estimate (at least :data:`MIN_SLOTS` slots filled, every number finite).

    Per slot ``j`` of ``s_j`` gradients: the mean draw ``x̄_j``, the mean gradient ``ḡ_j`` and the noise row
    ``n_j = (Σ_t (-1)^t ĝ_t - [s_j odd] ḡ_j) / s_j``, whose covariance is that of the noise in ``ḡ_j``. The
    gradient's variances, and its covariance in the subspace, are those of ``ḡ`` less ``ρ²`` times the noise rows'
    per-coordinate variances, tempered as the module docstring says; the subspace's covariances are regularised by
    :data:`REGULARIZATION` of their mean scale.
    """
    xp = array_namespace(state.draws)
    m, d = state.draws.shape
    filled = state.counts > 0
    weight = xp.astype(filled, state.draws.dtype)
    n = xp.maximum(xp.sum(weight), xp.ones_like(xp.sum(weight)))
    safe = xp.where(filled, state.counts, xp.ones_like(state.counts))[:, None]
    x = state.draws / safe
    g = state.gradients / safe
    odd = xp.remainder(state.counts, 2)[:, None]
    noise = (state.alternating - odd * g) / safe * weight[:, None]
    x_centred = (x - xp.sum(x * weight[:, None], axis=0) / n) * weight[:, None]
    g_centred = (g - xp.sum(g * weight[:, None], axis=0) / n) * weight[:, None]
    var_x = xp.sum(x_centred**2, axis=0) / n
    var_g = xp.sum(g_centred**2, axis=0) / n
    var_n = xp.sum(noise**2, axis=0) / n
    var_n = _persistence(xp, x_centred, weight) * var_n  # the noise that reaches the slots' mean gradients
    var_g = _corrected(xp, var_g, var_g - var_n, var_n, n)
    sigma = (var_x / var_g) ** 0.25
    X, A = x_centred / sigma[None, :], g_centred * sigma[None, :]
    r = width(d)
    rank = min(RANK, m, d)
    combined = xp.concat([_top_directions(xp, X, rank), _top_directions(xp, A, rank)], axis=1)
    Q, _ = xp.linalg.qr(combined)
    Q = Q[:, :r]
    level = xp.mean(xp.sqrt(var_x * var_g))
    eye = xp.eye(r, dtype=Q.dtype, device=device(Q))
    px, pa = X @ Q, A @ Q
    C_x = px.T @ px / n + REGULARIZATION * level * eye
    # the noise's covariance in the subspace from its per-coordinate variances: a 2 RANK × 2 RANK covariance of the
    # noise rows themselves would scatter its eigenvalues by about ±sqrt(2 RANK / SLOTS) (Marchenko-Pastur)
    C_a, C_n = pa.T @ pa / n, (Q.T * (var_n * sigma * sigma)[None, :]) @ Q
    values, vectors = xp.linalg.eigh((C_a - C_n + (C_a - C_n).T) / 2)
    along = xp.linalg.diagonal(vectors.T @ C_a @ vectors), xp.linalg.diagonal(vectors.T @ C_n @ vectors)
    values = _corrected(xp, along[0], values, along[1], n)
    C_g = (vectors * (values + REGULARIZATION * level)[None, :]) @ vectors.T
    # rounding can leave the mean without finite entries (roots of eigenvalues at zero): the estimate is then not
    # usable, and its eigh, which JAX computes as NaN and torch refuses, is taken of the identity instead
    mean = _geometric_mean(xp, C_x, C_g)
    finite = xp.all(xp.isfinite(mean))
    lam, directions = xp.linalg.eigh(xp.where(finite, mean, eye))
    lam = band(xp.maximum(lam, xp.full_like(lam, 1e-30)))
    U = Q @ directions
    usable = (xp.sum(xp.astype(filled, xp.int32)) >= MIN_SLOTS) & xp.all(xp.isfinite(sigma)) & xp.all(sigma > 0)
    usable = usable & finite & xp.all(xp.isfinite(lam)) & xp.all(xp.isfinite(U))
    return sigma, U, lam, usable
