"""Warm-up adaptation: the preconditioner (mass matrix) and the step size, backend-neutral.

SG-MCMC has no Metropolis test, so the warm-up cannot tune the step size for an acceptance rate as NUTS
does. What it can measure is the stochastic gradient's noise (:mod:`ppl_sgmcmc.noise`): to first order in
the step size ``h``, a rule's bias on a posterior of unit scale grows with the **noise ratio**
``r = h max_k c_k V_kk / (2τ)``. The warm-up therefore

1. **starts at an approximate mode** (the backends' ``find_mode``: an optimiser on the same minibatch
   potential, from the init strategy's point), where
2. **a Laplace preconditioner** is built from the Hessian ``H`` of the potential (:func:`from_hessian`):
   ``Σ = H⁻¹ = L Lᵀ``, dense or diagonal. The rule then runs in the coordinates ``u = L⁻¹ θ``, where the
   posterior has roughly unit scale in every direction: for SGLD that is the Langevin dynamics
   preconditioned by ``Σ``, for SGHMC/SGNHT the dynamics with mass matrix ``Σ⁻¹``; the target is
   unchanged (:func:`pullback_grad_fn`).
3. **chooses the step size from the measured noise** (:func:`tuned_step_size`): the largest ``h`` whose
   noise ratio is the algorithm's target, capped for the discretisation by the curvature left in ``u``
   (about 1 after a Laplace preconditioner). A short probe at the start (several minibatch gradients at
   one point) gives the first value; each window of the warm-up re-estimates it from the noise the chain
   measured.
4. **refines the preconditioner from the warm-up's own draws** in windows (Stan's windowed adaptation:
   Carpenter et al., "Stan: A Probabilistic Programming Language", Journal of Statistical Software 76(1),
   2017; as NumPyro's ``numpyro/infer/hmc_util.py``): the variance of each coordinate of ``u`` over a slow
   window rescales that coordinate (:func:`adapt_step`), so that a posterior that the Laplace approximation
   got wrong (skewed, heavy-tailed) still ends with coordinates of unit scale. Consecutive SG-MCMC draws are
   strongly correlated, so a window's estimate is shrunk towards the current scale by its effective sample
   size, measured by batch means (:func:`window_variance`), and a coordinate the window did not explore
   (fewer than three quarters of :data:`MIN_EFFECTIVE` effective draws) keeps its scale; from there to
   :data:`MIN_EFFECTIVE` the rescaling is phased in, so that the adaptation stays a continuous function of
   what it measured (a rounding-level difference, as between rows sharded over devices or not, does not
   decide whether a coordinate is rescaled). Only variances are estimated from
   draws: a window holds far too few effective draws for a dense covariance; the Hessian carries the
   correlations.

After the warm-up the preconditioner and the step size are frozen: the chain is a fixed Markov kernel.

* **the schedule** (:func:`adaptation_schedule`): an initial buffer, slow windows doubling in length, a
  terminal buffer, as Stan's, with lengths proportional to the warm-up (15 %, 5 %, 10 %, 20 %, ..., 10 %)
  since an SG-MCMC step moves the chain much less than a NUTS iteration;
* **the estimator** (:class:`WindowMoments`, :func:`window_variance`): a window's moments in
  :data:`BATCHES` consecutive batches, whose means give the effective sample size;
* **the preconditioner** (:class:`Preconditioner`) as a linear change of variables ``θ = L u``
  (:func:`to_u`, :func:`to_theta`, :func:`pullback_grad_fn`, :func:`rescale`);
* **one warm-up step** (:func:`adapt_step`): a pure function of an :class:`AdaptState` with array selects
  only, so that it runs inside ``jax.jit``, ``jax.vmap`` and ``lax.scan`` as well as on ``torch`` tensors.

Everything is written once on the array-API subset shared by ``jax.numpy`` and ``torch`` (the namespace
of the inputs, :func:`array_api_compat.array_namespace`), like the update rules.

**Example** (a Laplace preconditioner of a correlated Gaussian: ``u`` has unit covariance)::

    >>> import jax.numpy as jnp
    >>> from ppl_sgmcmc import adaptation as ad
    >>> H = jnp.array([[4.0, 1.8], [1.8, 1.0]])  # the Hessian of U, the inverse covariance
    >>> pre, curvature = ad.from_hessian(H, dense=True)
    >>> L = pre.scale
    >>> [[abs(round(v, 3)) for v in row] for row in (L.T @ H @ L).tolist()], round(float(curvature), 3)
    ([[1.0, 0.0], [0.0, 1.0]], 1.0)
"""

from __future__ import annotations

import statistics
from typing import Any, NamedTuple

from array_api_compat import array_namespace, device, is_jax_namespace, is_numpy_namespace, is_torch_namespace

from ppl_sgmcmc import low_rank
from ppl_sgmcmc.noise import HORIZON
from ppl_sgmcmc.rules import StochasticGradient
from ppl_sgmcmc.rules._types import Array

__all__ = [
    "AdaptState",
    "NoAdaptation",
    "Preconditioner",
    "WindowMoments",
    "adapt_init",
    "adapt_step",
    "adaptation_schedule",
    "align_noise",
    "ran_off",
    "from_covariance",
    "from_hessian",
    "identity",
    "capped_noise",
    "equalize_noise",
    "hessian_rows",
    "magnitude",
    "minimum_warmup_steps",
    "newton_direction",
    "pullback_grad_fn",
    "rescale",
    "rescaling_weight",
    "settle_bound",
    "settled",
    "to_theta",
    "to_u",
    "tuned_step_size",
    "window_ends",
    "window_moments",
    "window_variance",
]

#: The buffers and the first slow window as fractions of the warm-up (NumPyro's and Stan's proportions
#: for short warm-ups: 15 %, 10 %, and a first window of 5 % here).
INIT_BUFFER, TERM_BUFFER, BASE_WINDOW = 0.15, 0.1, 0.05
#: The fewest steps of a window: shorter warm-ups are refused.
MIN_WINDOW = 10

#: A window's draws are split into this many consecutive batches (batch means give the effective sample size).
BATCHES = 16
#: A window's variance estimate with ``n_eff`` effective draws is shrunk towards the current scale as
#: ``(n_eff v + SHRINKAGE) / (n_eff + SHRINKAGE)`` (Stan shrinks by its draw count with 5, towards 10⁻³).
SHRINKAGE = 10
#: Coordinates with this many effective draws in a window are rescaled by its variance; with fewer than three
#: quarters as many they keep their scale (a trend across the window gives about ``BATCHES`` by batch means, whatever its
#: length), and in between the rescaling's logarithm is weighted linearly in ``n_eff`` (:func:`rescaling_weight`).
MIN_EFFECTIVE = 2 * BATCHES

#: Besides at the windows' ends, the step size is re-tuned whenever this fraction of the warm-up has passed
#: since it was last set: a smaller step lets the chain settle where the gradient noise differs, so the
#: step size and the noise it meets converge over several re-tunings.
RETUNE_FRACTION = 0.025

#: A re-tuning may raise the step size by at most this factor: the noise it tunes from was measured at the current
#: step, and a control-variate gradient's noise grows with the step (the chain strays further from the control's
#: centre), so a larger jump rests on a measurement the jump invalidates and the step oscillates between the cap
#: and a collapse. Decreases are not bounded.
RETUNE_GROWTH = 2.0

#: A window may rescale a coordinate of ``u`` by at most this factor (or its inverse): a window in which the
#: chain did not explore a direction must not collapse it.
MAX_RESCALE = 3.0

#: Eigenvalues of a Hessian are floored at this fraction of the largest (float32 resolves about 10⁻⁷).
HESSIAN_FLOOR = 1e-6

#: No coordinate of ``u`` may carry more than this many times the median coordinate's gradient noise
#: (:func:`equalize_noise`).
NOISE_SPREAD = 4.0


# --- the schedule ----------------------------------------------------------------------------------------
def minimum_warmup_steps() -> int:
    """The shortest warm-up :func:`adaptation_schedule` accepts: its first slow window must hold
    :data:`MIN_WINDOW` steps.

    **Example**::

        >>> from ppl_sgmcmc.adaptation import minimum_warmup_steps
        >>> minimum_warmup_steps()
        200
    """
    return round(MIN_WINDOW / BASE_WINDOW)


def adaptation_schedule(num_steps: int) -> list[tuple[int, int]]:
    """The adaptation windows of a warm-up of ``num_steps`` steps, as half-open ``[start, end)`` ranges.

    The list is ``[initial buffer, slow window 1, ..., slow window k, terminal buffer]``: contiguous, from
    ``0`` to ``num_steps``, ``k >= 1``. The buffers take 15 % and 10 % of the warm-up, the slow windows
    double from 5 % (the last one stretched to the terminal buffer, as Stan's
    ``windowed_adaptation::compute_next_window`` does).

    :param num_steps: the number of warm-up steps, at least :func:`minimum_warmup_steps`.
    :raises ValueError: for a warm-up too short for the windows.

    **Example**::

        >>> from ppl_sgmcmc.adaptation import adaptation_schedule
        >>> adaptation_schedule(1000)
        [(0, 150), (150, 200), (200, 300), (300, 500), (500, 900), (900, 1000)]
        >>> adaptation_schedule(100)
        Traceback (most recent call last):
            ...
        ValueError: the warm-up's adaptation needs at least 200 warm-up steps (windows of at least 10 steps), got 100; ...
    """
    minimum = minimum_warmup_steps()
    if num_steps < minimum:
        raise ValueError(
            f"the warm-up's adaptation needs at least {minimum} warm-up steps (windows of at least {MIN_WINDOW} "
            f"steps), got {num_steps}; lengthen the warm-up, or give a `step_size` and pass adapt_mass_matrix=False"
        )
    init_buffer = round(INIT_BUFFER * num_steps)
    term_start = num_steps - round(TERM_BUFFER * num_steps)
    windows = [(0, init_buffer)]
    start, size = init_buffer, round(BASE_WINDOW * num_steps)
    while start < term_start:
        if 3 * size <= term_start - start:  # the next (doubled) window still fits before the terminal buffer
            end, size = start + size, 2 * size
        else:  # the last slow window: stretched to the terminal buffer
            end = term_start
        windows.append((start, end))
        start = end
    windows.append((term_start, num_steps))
    return windows


def window_ends(schedule: list[tuple[int, int]], like: Array) -> Array:
    """The exclusive ends of the windows of ``schedule``, an ``int32`` array on the namespace and device of
    ``like``: the ``schedule_ends`` argument of :func:`adapt_step` (``[e_0, e_1, ..., e_k, e_{k+1}]``: the
    initial buffer ends at ``e_0``, slow window ``j`` is ``[e_{j-1}, e_j)``, the warm-up ends at
    ``e_{k+1}``).

    **Example**::

        >>> import torch
        >>> from ppl_sgmcmc.adaptation import adaptation_schedule, window_ends
        >>> window_ends(adaptation_schedule(200), torch.zeros(2))
        tensor([ 30,  40,  60, 100, 180, 200], dtype=torch.int32)
    """
    xp = array_namespace(like)
    return xp.asarray([end for _, end in schedule], dtype=xp.int32, device=device(like))


# --- a window's variances -------------------------------------------------------------------------------
class WindowMoments(NamedTuple):
    """The moments of the positions ``u`` seen in a window, in :data:`BATCHES` consecutive batches.

    - **counts**: the draws of each batch, ``(B,)``.
    - **sums**: their sums, ``(B, d)``, of the draws less ``centre``.
    - **squares**: the sum of the squares of all draws less ``centre``, ``(d,)``.
    - **centre**: the window's first draw, ``(d,)``: the moments are those of the draws shifted by it, so that a
      coordinate whose mean is far from 0 against its spread keeps its variance (``E[u²] - E[u]²`` of the raw draws
      would cancel catastrophically in float32, and rounding-level differences would decide the window's rescaling).

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.adaptation import window_moments
        >>> moments = window_moments(3, like=jnp.zeros(3))
        >>> moments.counts.shape, moments.sums.shape, moments.squares.shape, moments.centre.shape
        ((16,), (16, 3), (3,), (3,))
    """

    counts: Array
    sums: Array
    squares: Array
    centre: Array


def window_moments(d: int, like: Array) -> WindowMoments:
    """Empty moments of ``d``-dimensional draws, of the dtype, device and namespace of ``like``."""
    xp = array_namespace(like)
    dev = device(like)
    return WindowMoments(
        xp.zeros((BATCHES,), dtype=like.dtype, device=dev),
        xp.zeros((BATCHES, d), dtype=like.dtype, device=dev),
        xp.zeros((d,), dtype=like.dtype, device=dev),
        xp.zeros((d,), dtype=like.dtype, device=dev),
    )


def _add(moments: WindowMoments, u: Array, batch: Array) -> WindowMoments:
    """``moments`` with the draw ``u`` added to batch ``batch`` (an integer array); the window's first draw
    becomes its centre."""
    xp = array_namespace(u)
    one_hot = xp.astype(xp.arange(BATCHES, device=device(u)) == batch, u.dtype)
    centre = xp.where(xp.sum(moments.counts) == 0, u, moments.centre)
    shifted = u - centre
    squares = xp.add(moments.squares, xp.multiply(shifted, shifted))
    return WindowMoments(moments.counts + one_hot, moments.sums + one_hot[:, None] * shifted[None, :], squares, centre)


def window_variance(moments: WindowMoments) -> tuple[Array, Array]:
    """The variance of each coordinate over a window and its effective sample size by batch means:
    ``n_eff = B σ̂² / s²_m``, where ``s²_m`` is the variance of the ``B`` batch means (Geyer, "Practical Markov
    Chain Monte Carlo", Statistical Science 1992: a batch mean's variance is ``τ σ² / b`` for batches of ``b``
    draws and integrated autocorrelation time ``τ``), capped at the number of draws.

    **Example** (independent draws: ``n_eff`` near their number; a slow trend: about ``B``)::

        >>> import jax, jax.numpy as jnp
        >>> from ppl_sgmcmc import adaptation as ad
        >>> def moments_of(draws):
        ...     moments = ad.window_moments(1, like=draws)
        ...     for t in range(draws.shape[0]):
        ...         moments = ad._add(moments, draws[t], jnp.array(t * ad.BATCHES // draws.shape[0]))
        ...     return moments
        >>> var, n_eff = ad.window_variance(moments_of(jax.random.normal(jax.random.key(0), (800, 1))))
        >>> abs(float(var[0]) - 1) < 0.15, float(n_eff[0]) > 300
        (True, True)
        >>> var, n_eff = ad.window_variance(moments_of(jnp.linspace(-1, 1, 800)[:, None]))
        >>> round(float(n_eff[0]))
        15
    """
    xp = array_namespace(moments.sums)
    counts = moments.counts
    n = xp.sum(counts)
    mean = xp.sum(moments.sums, axis=0) / n
    variance = xp.maximum(moments.squares / n - mean * mean, xp.zeros_like(mean))
    filled = counts > 0
    batch_means = moments.sums / xp.where(filled, counts, xp.ones_like(counts))[:, None]
    num_batches = xp.sum(xp.astype(filled, counts.dtype))
    spread = xp.sum(xp.where(filled[:, None], (batch_means - mean[None, :]) ** 2, xp.zeros_like(batch_means)), axis=0)
    spread = spread / xp.maximum(num_batches - 1, xp.ones_like(num_batches))
    n_eff = num_batches * variance / xp.where(spread > 0, spread, xp.ones_like(spread))
    return variance, xp.where(spread > 0, xp.minimum(n_eff, n), n)


def rescaling_weight(n_eff: Array) -> Array:
    """How much of a window's rescaling a coordinate with ``n_eff`` effective draws takes, as the exponent of its
    factor: ``clip(4 n_eff / MIN_EFFECTIVE - 3, 0, 1)``, 0 up to three quarters of :data:`MIN_EFFECTIVE`, 1 from it
    on, linear in between: a continuous function of what the window measured.

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.adaptation import MIN_EFFECTIVE, rescaling_weight
        >>> rescaling_weight(jnp.array([0.0, 0.75 * MIN_EFFECTIVE, 0.875 * MIN_EFFECTIVE, MIN_EFFECTIVE, 1e4])).tolist()
        [0.0, 0.0, 0.5, 1.0, 1.0]
    """
    xp = array_namespace(n_eff)
    return xp.clip(4 * n_eff / MIN_EFFECTIVE - 3, 0.0, 1.0)


# --- the preconditioner as a change of variables -------------------------------------------------------
class Preconditioner(NamedTuple):
    """The linear change of variables ``θ = L u``, ``L Lᵀ = Σ`` (the inverse mass matrix ``M⁻¹``).

    - **scale**: ``L``: a ``(d, d)`` matrix (dense), the ``(d,)`` diagonal of ``L`` (diagonal), or a ``(2, d, r + 1)``
      packed low-rank-plus-diagonal factor (:mod:`ppl_sgmcmc.low_rank`).
    - **inverse**: ``L⁻¹``, of the same form, kept so that no step solves a linear system.

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.adaptation import Preconditioner, to_theta
        >>> to_theta(Preconditioner(scale=jnp.array([2.0, 0.5]), inverse=jnp.array([0.5, 2.0])), jnp.ones(2)).tolist()
        [2.0, 0.5]
    """

    scale: Array
    inverse: Array


def identity(d: int, dense: bool, like: Array) -> Preconditioner:
    """``L = I`` (``θ = u``): ``eye(d)`` if ``dense``, else ``ones(d)``, of the dtype and device of ``like``.

    **Example**::

        >>> import torch
        >>> from ppl_sgmcmc.adaptation import identity
        >>> identity(2, dense=True, like=torch.zeros(1)).scale
        tensor([[1., 0.],
                [0., 1.]])
    """
    xp = array_namespace(like)
    dev = device(like)
    one = xp.eye(d, dtype=like.dtype, device=dev) if dense else xp.ones((d,), dtype=like.dtype, device=dev)
    return Preconditioner(one, one)


def _cholesky(xp: Any, A: Array) -> Array:
    """Lower Cholesky factor of ``A``; NaN (never an exception) where ``A`` is not positive definite."""
    if is_torch_namespace(xp):
        import torch

        L, info = torch.linalg.cholesky_ex(A)
        return xp.where(info == 0, L, xp.full_like(L, float("nan")))
    return xp.linalg.cholesky(A)  # jax.numpy: NaN where not positive definite


def _inverse_lower(xp: Any, L: Any) -> Any:
    """``L⁻¹`` of a lower triangular ``L``."""
    eye = xp.eye(L.shape[0], dtype=L.dtype, device=device(L))
    if is_torch_namespace(xp):
        return xp.linalg.solve_triangular(L, eye, upper=False)
    if is_jax_namespace(xp):
        from jax.scipy.linalg import solve_triangular

        return solve_triangular(L, eye, lower=True)
    if is_numpy_namespace(xp):
        from scipy.linalg import solve_triangular as scipy_solve_triangular

        return scipy_solve_triangular(L, eye, lower=True)
    return xp.linalg.solve(L, eye)  # any other array-API namespace


def from_covariance(cov: Array) -> Preconditioner:
    """The preconditioner of a covariance ``Σ``: ``L = cholesky(Σ)`` for a ``(d, d)`` matrix, ``L =
    sqrt(σ²)`` for a ``(d,)`` vector of variances. A ``Σ`` that is not positive definite gives NaN entries
    (on ``torch`` as on ``jax``; no exception).

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.adaptation import from_covariance
        >>> pre = from_covariance(jnp.array([[4.0, 2.0], [2.0, 2.0]]))
        >>> pre.scale.tolist(), pre.inverse.tolist()
        ([[2.0, 0.0], [1.0, 1.0]], [[0.5, 0.0], [-0.5, 1.0]])
        >>> from_covariance(jnp.array([4.0, 0.25])).scale.tolist()
        [2.0, 0.5]
    """
    xp = array_namespace(cov)
    if cov.ndim == 1:
        scale = xp.sqrt(cov)
        return Preconditioner(scale, 1 / scale)
    L = _cholesky(xp, cov)
    return Preconditioner(L, _inverse_lower(xp, L))


def _eigh(xp: Any, A: Array) -> tuple[Array, Array]:
    """``eigh(A)`` with each eigenvector's sign fixed: the sum of the cubes of its entries is made non-negative.

    LAPACK and cuSOLVER (and two LAPACK builds) may return an eigenvector with either sign, and a preconditioner's
    coordinates ``u`` follow it: a flipped axis meets the injected noise with the opposite sign, a chain equal in law
    but with other draws. With the sign fixed by the vector itself, the same seed gives the same chain on every
    device (up to round-off, except where the sum of cubes is itself round-off)."""
    values, vectors = xp.linalg.eigh(A)
    sign = xp.where(xp.sum(vectors**3, axis=0) < 0, -xp.ones_like(values), xp.ones_like(values))
    return values, vectors * sign[None, :]


def from_hessian(hessian: Array, dense: bool) -> tuple[Preconditioner, Array]:
    """The Laplace preconditioner of a Hessian ``H`` of the potential (the approximate posterior precision),
    and the curvature left in the coordinates ``u``: the largest eigenvalue of ``Lᵀ H L``.

    * ``dense``: ``H`` is first equilibrated by its diagonal, ``H̃ = D^(-1/2) H D^(-1/2)`` with ``D = diag|H_kk|``
      (1 where ``H_kk`` is 0), so that coordinates of very different scales (a coefficient of an outcome in
      dollars next to a log scale) do not decide the eigenvalues float32 resolves; with ``H̃ = Q diag(λ) Qᵀ``,
      ``L = D^(-1/2) Q diag(λ')^(-1/2)`` and ``L⁻¹ = diag(λ')^(1/2) Qᵀ D^(1/2)``, where
      ``λ' = max(|λ|, floor)``: negative curvature (a saddle, a point short of the mode) is taken by its
      magnitude and tiny eigenvalues are floored at :data:`HESSIAN_FLOOR` of the largest. ``u`` then has
      unit curvature in every direction.
    * diagonal: ``L = diag(h')^(-1/2)`` with ``h' = max(|H_kk|, floor)`` (Jacobi's scaling: the diagonal of
      ``Lᵀ H L`` is 1). ``hessian`` may be the ``(d, d)`` matrix or only its ``(d,)`` diagonal, in which case
      the curvature is returned as NaN (unknown; see the backends' power iteration).

    **Example** (a diagonal preconditioner of a correlated Gaussian: the curvature left is ``1 + |ρ|``)::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.adaptation import from_hessian
        >>> pre, curvature = from_hessian(jnp.array([[4.0, 1.8], [1.8, 1.0]]), dense=False)
        >>> pre.scale.tolist(), round(float(curvature), 3)
        ([0.5, 1.0], 1.9)
    """
    xp = array_namespace(hessian)
    if hessian.ndim == 2:
        hessian = xp.add(hessian, hessian.T) / 2
    if dense:
        if hessian.ndim != 2:
            raise ValueError(f"from_hessian: a dense preconditioner needs the (d, d) Hessian, got shape {hessian.shape}.")
        diagonal = xp.abs(xp.linalg.diagonal(hessian))
        root = xp.sqrt(xp.where(diagonal > 0, diagonal, xp.ones_like(diagonal)))  # D^(1/2)
        eigenvalues, Q = _eigh(xp, hessian / (root[:, None] * root[None, :]))
        magnitude = xp.abs(eigenvalues)
        floored = xp.maximum(magnitude, HESSIAN_FLOOR * xp.max(magnitude))
        pre = Preconditioner(Q * (floored**-0.5)[None, :] / root[:, None], (floored**0.5)[:, None] * Q.T * root[None, :])
        return pre, xp.max(magnitude / floored)
    diagonal = xp.linalg.diagonal(hessian) if hessian.ndim == 2 else hessian
    magnitude = xp.abs(diagonal)
    floored = xp.maximum(magnitude, HESSIAN_FLOOR * xp.max(magnitude))
    scale = floored**-0.5
    pre = Preconditioner(scale, floored**0.5)
    if hessian.ndim == 1:
        return pre, xp.asarray(float("nan"), dtype=hessian.dtype, device=device(hessian))
    return pre, xp.max(xp.abs(xp.linalg.eigvalsh(scale[:, None] * hessian * scale[None, :])))


# --- the chain's start (the backends' warmup modules) ----------------------------------------------------
#: Adam's learning rate at the start of the backends' ``find_mode``.
FIND_MODE_RATE = 0.1
#: Adam's learning rate at the end of ``find_mode``, as a fraction of :data:`FIND_MODE_RATE`.
FIND_MODE_FINAL_RATE = 0.01
#: The decay of Adam's second-moment average in ``find_mode``: a short memory (optax's default is 0.999), since the
#: gradient's scale falls by orders of magnitude on the way from a start far from the mode (a scale parameter
#: started too small), and Adam's steps would shrink with it while the average remembers the start.
FIND_MODE_B2 = 0.9
#: The most data rows (of the largest subsampled plate) the Hessian averages over.
HESSIAN_ROWS = 2**16
#: The largest ``rows × d`` of a Hessian: fewer rows for many latents.
HESSIAN_ENTRIES = 2**24
#: The minibatch gradients of the noise probe (more where a dense metric is aligned with the noise's axes:
#: :func:`align_noise`).
PROBE_BATCHES = 64
#: With more latent coordinates than this, a diagonal preconditioner is built from an estimate of the Hessian's
#: diagonal (the backends' ``hessian_diagonal``) rather than from the whole Hessian (``d`` products per minibatch).
EXACT_HESSIAN_MAX = 1000
#: The power iterations of the backends' ``largest_curvature``.
POWER_ITERATIONS = 20

def hessian_rows(data_size: int, probes: int) -> int:
    """How many rows the Hessian averages over, when each minibatch takes ``probes`` Hessian-vector products
    (``d`` for the backends' ``hessian``, 1 for ``hessian_diagonal``): all ``data_size`` up to :data:`HESSIAN_ROWS`,
    and at most ``HESSIAN_ENTRIES / probes``.

    **Example**::

        >>> from ppl_sgmcmc.adaptation import hessian_rows
        >>> hessian_rows(32561, 123), hessian_rows(10**7, 20), hessian_rows(60000, 10**4), hessian_rows(60000, 1)
        (32561, 65536, 1677, 60000)
    """
    return max(1, min(data_size, HESSIAN_ROWS, HESSIAN_ENTRIES // probes))



#: A Newton step of :func:`newton_direction` moves at most this many times ``sqrt(d)`` posterior standard deviations.
NEWTON_RADIUS = 10.0


def newton_direction(hessian: Array, gradient: Array, radius: Any = NEWTON_RADIUS) -> Array:
    """The Newton step ``H'⁻¹ g`` with the regularised Hessian ``H'`` of :func:`from_hessian` (dense): from a
    point near a mode, ``θ - H'⁻¹ g`` is the mode of the Laplace approximation. The step is shortened to at most
    ``radius sqrt(d)`` in the whitened coordinates of ``H'`` (the typical set of a Gaussian lies at about
    ``sqrt(d)``; the backends start at :data:`NEWTON_RADIUS` and widen it while full steps succeed, a trust
    region), and is zero if it is not finite. Where the posterior is not close to a Gaussian (a
    neural network, a point far from the mode) the step can overshoot: the backends take the best of a few
    fractions of it on the Hessian's own minibatches (a line search with common random numbers).

    **Example** (a Gaussian's mode from anywhere, in one step)::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.adaptation import newton_direction
        >>> H, mode = jnp.array([[4.0, 1.8], [1.8, 1.0]]), jnp.array([1.0, -2.0])
        >>> theta = jnp.array([3.0, 0.5])
        >>> [round(v, 4) for v in (theta - newton_direction(H, H @ (theta - mode))).tolist()]
        [1.0, -2.0]
    """
    xp = array_namespace(hessian, gradient)
    pre, _ = from_hessian(hessian, dense=True)
    whitened = _pull(pre, gradient)  # Lᵀ g, the step's length in the whitened coordinates
    length = xp.sqrt(xp.sum(xp.multiply(whitened, whitened)))
    limit = radius * gradient.shape[0] ** 0.5
    shrink = xp.where(length > limit, limit / length, xp.ones_like(length))
    step = to_theta(pre, whitened) * shrink
    return xp.where(xp.all(xp.isfinite(step)), step, xp.zeros_like(step))


def magnitude(x: Array) -> Array:
    """``max(1, |x|)`` elementwise: the scale of the backends' optimiser steps in ``find_mode`` (Adam's
    normalised step times this), so that a coordinate far from 0 moves by a fixed fraction of its size per step.

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.adaptation import magnitude
        >>> magnitude(jnp.array([0.5, -4.0])).tolist()
        [1.0, 4.0]
    """
    xp = array_namespace(x)
    return xp.maximum(xp.abs(x), xp.ones_like(x))


#: The fractions of the Newton step the backends' line search tries (besides no step).
NEWTON_FRACTIONS = (1.0, 0.25, 0.0625)
#: The most Newton steps (each with its line search) from the optimiser's end: several, so that a start the
#: optimiser left far from the mode (many times :data:`NEWTON_RADIUS` ``sqrt(d)`` posterior sds) still reaches it.
NEWTON_ITERATIONS = 8
#: The factor by which the Newton steps' radius grows after a step whose full length was best (a trust region).
NEWTON_GROWTH = 4.0
#: The Newton steps stop once one moved less than this many posterior sds (its length in the Hessian's metric).
NEWTON_TOLERANCE = 0.01


def to_u(pre: Preconditioner, theta: Array) -> Array:
    """``u = L⁻¹ θ`` (``θ ⊙ L⁻¹`` for a diagonal ``L``).

    **Example**::

        >>> import torch
        >>> from ppl_sgmcmc.adaptation import from_covariance, to_u
        >>> to_u(from_covariance(torch.tensor([[4.0, 2.0], [2.0, 2.0]])), torch.tensor([2.0, 3.0]))
        tensor([1., 2.])
    """
    xp = array_namespace(theta, pre.inverse)
    if pre.inverse.ndim == 1:
        return xp.multiply(pre.inverse, theta)
    if pre.inverse.ndim == 3:  # low-rank plus diagonal (ppl_sgmcmc.low_rank)
        return low_rank.apply(pre.inverse, theta)
    return xp.matmul(pre.inverse, theta)


def to_theta(pre: Preconditioner, u: Array) -> Array:
    """``θ = L u`` (``scale ⊙ u`` for a diagonal ``L``).

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.adaptation import from_covariance, to_theta
        >>> to_theta(from_covariance(jnp.array([[4.0, 2.0], [2.0, 2.0]])), jnp.array([1.0, 2.0])).tolist()
        [2.0, 3.0]
    """
    xp = array_namespace(u, pre.scale)
    if pre.scale.ndim == 1:
        return xp.multiply(pre.scale, u)
    if pre.scale.ndim == 3:  # low-rank plus diagonal (ppl_sgmcmc.low_rank)
        return low_rank.apply(pre.scale, u)
    return xp.matmul(pre.scale, u)


def rescale(pre: Preconditioner, factor: Array) -> Preconditioner:
    """``L diag(factor)``: the coordinate ``u_k`` stretched by ``factor_k`` (``u' = u ⊘ factor``).

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.adaptation import identity, rescale
        >>> pre = rescale(identity(2, dense=True, like=jnp.zeros(1)), jnp.array([2.0, 0.5]))
        >>> pre.scale.tolist(), pre.inverse.tolist()
        ([[2.0, 0.0], [0.0, 0.5]], [[0.5, 0.0], [0.0, 2.0]])
    """
    xp = array_namespace(pre.scale, factor)
    if pre.scale.ndim == 1:
        return Preconditioner(xp.multiply(pre.scale, factor), xp.divide(pre.inverse, factor))
    if pre.scale.ndim == 3:  # low-rank plus diagonal (ppl_sgmcmc.low_rank)
        return Preconditioner(*low_rank.rescale(pre.scale, pre.inverse, factor))
    return Preconditioner(xp.multiply(pre.scale, factor[None, :]), xp.divide(pre.inverse, factor[:, None]))


def _pull(pre: Preconditioner, g: Array) -> Array:
    """``Lᵀ g`` for a vector ``g``, or each row of an ``n×d`` matrix ``g`` (``g L``)."""
    xp = array_namespace(g, pre.scale)
    if pre.scale.ndim == 1:
        return xp.multiply(g, pre.scale)
    if pre.scale.ndim == 3:  # low-rank plus diagonal (ppl_sgmcmc.low_rank)
        return low_rank.apply_transpose(pre.scale, g)
    return xp.matmul(g, pre.scale)


def pullback_grad_fn(pre: Preconditioner, grad_fn: Any) -> Any:
    """The gradient function in ``u``-coordinates: ``u -> StochasticGradient`` of ``Ũ_t(L u)``.

    With ``g = grad_fn(L u)``: ``energy`` unchanged, ``grad = Lᵀ g.grad`` (the chain rule),
    ``score = Lᵀ g.score``, each row of ``per_example`` mapped by ``Lᵀ`` (or ``None``). An update rule of
    :mod:`ppl_sgmcmc.rules` that steps ``u`` with this gradient and identity mass is the rule
    preconditioned by ``M⁻¹ = L Lᵀ`` in ``θ`` (Stan's metric, Carpenter et al. 2017).

    :param pre: the :class:`Preconditioner` ``L``.
    :param grad_fn: ``θ -> StochasticGradient``.
    :return: ``u -> StochasticGradient``.

    **Example** (``U(θ) = |θ|²/2``, ``L = diag(2, 0.5)``: at ``u = (1, 1)``, ``θ = (2, 0.5)``, ``Lᵀθ = (4, 0.25)``)::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.adaptation import from_covariance, pullback_grad_fn
        >>> from ppl_sgmcmc.rules import StochasticGradient
        >>> def grad_fn(theta):
        ...     return StochasticGradient(energy=(theta * theta).sum() / 2, grad=theta, score=-theta)
        >>> g = pullback_grad_fn(from_covariance(jnp.array([4.0, 0.25])), grad_fn)(jnp.ones(2))
        >>> float(g.energy), g.grad.tolist(), g.score.tolist(), g.per_example
        (2.125, [4.0, 0.25], [-4.0, -0.25], None)
    """  # noqa: E501

    def grad_fn_u(u: Array) -> StochasticGradient:
        g = grad_fn(to_theta(pre, u))
        score = None if g.score is None else _pull(pre, g.score)  # a backend computes only what the rule needs
        per_example = None if g.per_example is None else _pull(pre, g.per_example)
        return StochasticGradient(g.energy, _pull(pre, g.grad), score, per_example)

    return grad_fn_u


def equalize_noise(pre: Preconditioner, variance: Array, floor: Any = 0.0) -> tuple[Preconditioner, Array, Array]:
    """Shrink the coordinates of ``u`` whose gradient noise ``v_k`` (``c ⊙ diag V`` in ``u``) exceeds
    ``limit = max(NOISE_SPREAD · median, floor)``, the median over the coordinates with noise: ``u_k`` is rescaled by
    ``f_k = min(1, sqrt(limit / v_k))``, which divides its noise by ``f_k⁻²``.

    Where the Hessian is far smaller than the Fisher information, as at a saddle or in a flat direction of a
    neural network, the Laplace preconditioner makes ``u_k`` wide and its gradient noise huge; the tuned step
    size, set by the noisiest coordinate, would then stall every other coordinate. Shrunk, such a coordinate
    moves more slowly in its own scale and the others at the step size their noise allows. In a posterior the
    Laplace approximation fits, the noise is about the same in every coordinate (``N/n`` in ``u``) and nothing
    changes.

    ``floor``: at the start, the noise at which the tuned step size reaches its cap (:func:`capped_noise`). The start's
    probe measures minibatch noise alone, at one point: shrinking a coordinate to a level below the floor gains the
    others nothing (their step is capped) and only slows the shrunk one; without it, nearly noiseless coordinates (a
    network's unit switched off at a local mode: its weights' gradients vanish) set a median that collapses the
    metric of every coordinate that carries the fit. The warm-up's windows take no floor: the noise they measure
    along the chain also holds the change of the exact gradient between its steps, so that shrinking a coordinate
    noisier than the others also steadies it where its curvature grows (a wall the start did not show).

    :return: ``(preconditioner, variance, factor)`` after the rescaling.

    **Example** (one coordinate 100 times noisier than the others: its noise is brought to 4 times theirs; with a
    floor of 100, to 100)::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.adaptation import equalize_noise, identity
        >>> pre, v, f = equalize_noise(identity(3, dense=False, like=jnp.zeros(3)), jnp.array([10.0, 10.0, 1000.0]))
        >>> [round(x, 4) for x in v.tolist()], [round(x, 6) for x in f.tolist()]
        ([10.0, 10.0, 40.0], [1.0, 1.0, 0.2])
        >>> equalize_noise(identity(3, dense=False, like=jnp.zeros(3)), jnp.array([10.0, 10.0, 1000.0]), 100.0)[1].tolist()
        [10.0, 10.0, 100.0]
    """
    xp = array_namespace(variance)
    noisy = variance > 0
    count = xp.sum(xp.astype(noisy, xp.int32))
    ordered = xp.sort(xp.where(noisy, variance, xp.full_like(variance, float("inf"))))
    median = xp.take(ordered, xp.reshape(xp.maximum(count - 1, xp.zeros_like(count)) // 2, (1,)))[0]
    limit = xp.maximum(NOISE_SPREAD * median, xp.asarray(floor, dtype=variance.dtype, device=device(variance)))
    factor = xp.where(noisy & (variance > limit), xp.sqrt(limit / xp.where(noisy, variance, xp.ones_like(variance))),
                      xp.ones_like(variance))  # fmt: skip
    return rescale(pre, factor), xp.multiply(variance, xp.multiply(factor, factor)), factor


def capped_noise(target: Any, temperature: Any, max_step_size: Any) -> Any:
    """The noise variance ``2 τ target / h_max`` at which :func:`tuned_step_size` reaches its cap ``h_max``.

    **Example**::

        >>> from ppl_sgmcmc.adaptation import capped_noise
        >>> capped_noise(0.1, 1.0, 0.2)
        1.0
    """
    return 2 * temperature * target / max_step_size


#: The noise's principal axes (:func:`align_noise`) are estimated from the start's probe only when it holds at
#: least this many minibatch gradients per coordinate (a covariance from fewer is too rough to align by).
ALIGN_PROBES_PER_COORDINATE = 2
#: :func:`align_noise` breaks ties between equal noise variances with ``diag(1, 2, ..., d)`` times this fraction
#: of the mean noise variance.
ALIGN_TIE_BREAK = 1e-3


def align_noise(pre: Preconditioner, gradients: Array) -> Preconditioner:
    """The dense preconditioner ``L Q`` whose coordinates are the principal axes of the gradient noise:
    ``V̂ = Q diag(λ) Qᵀ`` is the sample covariance of minibatch gradients at one point (the rows of
    ``gradients``, in the coordinates ``u`` of ``pre``).

    ``u' = Qᵀ u`` keeps the metric (``(L Q)(L Q)ᵀ = L Lᵀ = Σ``), so the posterior keeps its unit scale in ``u'``,
    and the noise's covariance there is diagonal, ``Qᵀ V̂ Q = diag(λ)``. A rule that absorbs the gradient noise
    coordinate by coordinate, the multivariate thermostat of mSGNHT (Li, Chen, Fan & Carin, "High-Order
    Stochastic Gradient Thermostats for Bayesian Learning of Deep Models", AAAI 2016), then absorbs all of it:
    its friction matches the noise's variances but not its covariances, and in coordinates where the noise is
    correlated the unabsorbed part heats some directions and cools others. A hierarchical model's
    hyperparameters, which no datum's score moves, are mixed by a dense metric with the noisy group effects,
    and come out too narrow.

    Equal noise variances (directions without noise, such as those hyperparameters) leave the axes undecided,
    and rounding would decide them: a tie-break ``diag(1, ..., d)`` times :data:`ALIGN_TIE_BREAK` of the mean
    variance is added to ``V̂`` first, so that the axes are a continuous function of the gradients.

    :param pre: a dense :class:`Preconditioner`.
    :param gradients: ``(m, d)`` minibatch gradients at one point, in ``u``.

    **Example** (noise along ``(1, 1)/√2`` only: the axes turn by 45°, and the metric is unchanged)::

        >>> import jax, jax.numpy as jnp
        >>> from ppl_sgmcmc.adaptation import align_noise, identity
        >>> g = jax.random.normal(jax.random.key(0), (64, 1)) * jnp.array([[1.0, 1.0]])
        >>> pre = align_noise(identity(2, dense=True, like=jnp.zeros(2)), g)
        >>> [[round(abs(v), 3) for v in row] for row in pre.scale.tolist()]
        [[0.707, 0.707], [0.707, 0.707]]
        >>> [[round(abs(v), 3) for v in row] for row in (pre.scale @ pre.scale.T).tolist()]
        [[1.0, 0.0], [0.0, 1.0]]
    """
    xp = array_namespace(gradients, pre.scale)
    if pre.scale.ndim != 2:
        raise ValueError("align_noise: the noise's axes need a dense preconditioner.")
    m, d = gradients.shape
    centred = gradients - xp.mean(gradients, axis=0)[None, :]
    covariance = xp.matmul(centred.T, centred) / max(m - 1, 1)
    level = xp.sum(xp.linalg.diagonal(covariance)) / d
    ranks = xp.arange(1, d + 1, dtype=covariance.dtype, device=device(covariance))
    tie_break = xp.eye(d, dtype=covariance.dtype, device=device(covariance)) * ranks[None, :] * (ALIGN_TIE_BREAK * level)
    _, Q = _eigh(xp, covariance + tie_break)
    return Preconditioner(xp.matmul(pre.scale, Q), xp.matmul(Q.T, pre.inverse))


# --- the step size -----------------------------------------------------------------------------------------
def tuned_step_size(noise_variance: Array, target: Any, temperature: Any, max_step_size: Any,
                    noise_growth: Any = 0.0) -> Array:  # fmt: skip
    """The step size whose noise ratio (:func:`ppl_sgmcmc.noise.ratio`) is ``target``, capped at
    ``max_step_size``: ``h = min(2 τ target / max_k v_k, h_max)`` for the measured ``v = c ⊙ diag V``
    (``h_max`` where no noise was measured).

    With ``noise_growth = q > 0``, the noise is that of an estimator whose variance grows with the step size as
    ``V ∝ h^q`` (SVRG's: the variance of the difference of two minibatch gradients, at the chain and at a centre it
    leaves at a speed set by ``h``), given per ``h^q`` (``v = c ⊙ diag V / h^q``): its noise ratio is
    ``h^(1+q) max_k v_k / (2τ)``, and ``h = min((2 τ target / max_k v_k)^(1/(1+q)), h_max)``. Solving with ``q = 0``
    instead would overshoot and undershoot in turn from one re-tuning to the next (for ``q = 1``, ``h' = 2τ
    target / (h v)``: a cycle of two values that never meets the target).

    **Example** (``max v = 400``: ``h = 2 · 0.1 / 400``; without noise, the cap; with ``q = 2``, the cube root)::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.adaptation import tuned_step_size
        >>> round(float(tuned_step_size(jnp.array([100.0, 400.0]), 0.1, 1.0, 0.2)), 6)
        0.0005
        >>> round(float(tuned_step_size(jnp.zeros(2), 0.1, 1.0, 0.2)), 6)
        0.2
        >>> round(float(tuned_step_size(jnp.array([100.0, 400.0]), 0.1, 1.0, 0.2, noise_growth=2.0)), 6)
        0.07937
    """
    xp = array_namespace(noise_variance)
    largest = xp.max(noise_variance)
    h = 2 * temperature * target / xp.where(largest > 0, largest, xp.ones_like(largest))
    if noise_growth:
        h = h ** (1 / (1 + noise_growth))
    return xp.where((largest > 0) & (h < max_step_size), h, xp.full_like(largest, max_step_size))


# --- whether the warm-up settled -------------------------------------------------------------------------
#: The chance that a warm-up whose preconditioner fits its last slow window is taken for one that does not
#: (a family-wise level over the coordinates, :func:`settle_bound`).
SETTLE_LEVEL = 0.01


def settle_bound(d: int) -> float:
    """The largest deviation of a coordinate's log-variance from 0, in units of its Monte Carlo error
    ``sqrt(2 / n_eff)``, that :func:`settled` accepts for ``d`` coordinates: the two-sided normal quantile at the
    Bonferroni level ``SETTLE_LEVEL / d``.

    **Example**::

        >>> from ppl_sgmcmc.adaptation import settle_bound
        >>> round(settle_bound(1), 2), round(settle_bound(100), 2)
        (2.58, 3.89)
    """
    return statistics.NormalDist().inv_cdf(1 - SETTLE_LEVEL / (2 * d))


def settled(state: AdaptState | NoAdaptation) -> Array | bool:
    """Whether a warm-up that ended at ``state`` settled: its last slow window found the variance of each coordinate
    of ``u`` that it explored enough to rescale consistent with 1 within its Monte Carlo error (``misfit <= 1``, see
    :func:`settle_bound`): the preconditioner fits the posterior the chain explored, the windows' rescalings had
    converged. Also ``True`` for a warm-up that adapts no preconditioner (there is nothing to judge).

    Only explored coordinates are judged: a window too short to rescale a coordinate (too few effective draws)
    cannot tell whether the preconditioner fits it, and running the same windows again would not either;
    ``explored`` below 1 is reported instead (:class:`ppl_sgmcmc.verdict.Verdict`). With a kernel's ``max_warmup``,
    ``ppl_sgmcmc.numpyro.MCMC`` and the Pyro kernels run the warm-up again from where it ended while it has not
    settled.

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.adaptation import adapt_init, identity, settled
        >>> state = adapt_init(identity(2, dense=False, like=jnp.zeros(2)), 0.1, 1.0, jnp.zeros(2), 0.0)
        >>> bool(settled(state)), bool(settled(state._replace(misfit=jnp.array(1.5), explored=jnp.array(2.0))))
        (True, False)
    """
    if not isinstance(state, AdaptState):
        return True
    result: Array = state.misfit <= 1
    return result


# --- one warm-up step ------------------------------------------------------------------------------------
class NoAdaptation(NamedTuple):
    """The adaptation state of a chain whose warm-up adapts nothing (its step size was given, and
    ``adapt_mass_matrix=False``): no fields. Asking it for one, as NumPyro's ``extra_fields`` does for
    ``"adapt_state.step_size"``, says why there is none.

    **Example**::

        >>> from ppl_sgmcmc.adaptation import NoAdaptation
        >>> NoAdaptation()["step_size"]
        Traceback (most recent call last):
        ...
        KeyError: "adapt_state has no field 'step_size': the warm-up adapts nothing when `step_size` is given ..."
    """

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):  # NumPyro's `extra_fields` falls back to `state[name]` for a name it cannot get
            raise KeyError(
                f"adapt_state has no field {key!r}: the warm-up adapts nothing when `step_size` is given (and "
                "`adapt_mass_matrix=False`). Leave `step_size` unset for the warm-up to tune it and the "
                "preconditioner, whose fields are then collectable (adapt_state.step_size, "
                "adapt_state.preconditioner.scale)."
            )
        return tuple.__getitem__(self, key)


class AdaptState(NamedTuple):
    """The warm-up adaptation state carried by a chain.

    - **preconditioner**: the :class:`Preconditioner` in force (frozen after the warm-up).
    - **step_size**: the tuned step size ``h`` in force (frozen after the warm-up; unused when the step size
      was given).
    - **curvature**: the largest curvature of the potential in the coordinates ``u`` at the chain's start (about
      1 after a dense Laplace preconditioner), which caps the step size.
    - **moments**: the :class:`WindowMoments` of ``u`` over the current slow window.
    - **noise_sum**, **noise_count**: the sum of :func:`ppl_sgmcmc.noise.update`'s terms since the step size
      was last set, and their number.
    - **noise_peak**: the largest ``max_k v_k`` of the noise measured between two settings of the step size,
      since the current slow window began (in the current coordinates): the step size is set from it.
    - **window_index**: the number of windows closed so far (``int32`` scalar).
    - **restore**: where a chain that ran off during the warm-up returns (``θ`` at the start, then at each
      window's end); **energy_level**: the warm-up's typical minibatch energy, an exponential average over
      about :data:`~ppl_sgmcmc.noise.HORIZON` steps that did not run off; **restarts**: how many times the
      chain returned (see :func:`ran_off`).
    - **misfit**, **explored**: what the last slow window found of the preconditioner it closed with (see
      :func:`settled`): the largest deviation of a coordinate's variance in ``u`` from 1 in units of its Monte Carlo
      error, over the level :func:`settle_bound`, among the coordinates it explored enough to rescale
      (:func:`rescaling_weight` above 0), and the fewest effective draws of a coordinate over :data:`MIN_EFFECTIVE`
      (``0`` and ``inf`` until a window closes, and without ``adapt_mass``).
    - **rounds**: how many times the warm-up was run again because it had not settled (see :func:`settled`).
    - **history**: with a low-rank-plus-diagonal preconditioner, the slow windows' draws and gradients
      (:class:`ppl_sgmcmc.low_rank.History`, :data:`~ppl_sgmcmc.low_rank.SLOTS` slots over all the slow windows);
      with any other, one of no slots.

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.adaptation import adapt_init, identity
        >>> state = adapt_init(identity(2, dense=False, like=jnp.zeros(2)), 0.1, 1.0, jnp.zeros(2), 5.0)
        >>> state.preconditioner.scale.tolist(), round(float(state.step_size), 6), int(state.window_index)
        ([1.0, 1.0], 0.1, 0)
    """

    preconditioner: Preconditioner
    step_size: Array
    curvature: Array
    moments: WindowMoments
    noise_sum: Array
    noise_count: Array
    noise_peak: Array
    window_index: Array
    restore: Array
    energy_level: Array
    restarts: Array
    misfit: Array
    explored: Array
    rounds: Array
    history: low_rank.History


def adapt_init(preconditioner: Preconditioner, step_size: Any, curvature: Any, position: Array,
               energy: Any) -> AdaptState:  # fmt: skip
    """The state at the start of the warm-up: the preconditioner, step size and curvature of the chain's
    start ``position`` (``θ``, where it returns if it runs off) with minibatch energy ``energy``, an empty
    estimator and noise sum, no window closed.

    **Example**::

        >>> import torch
        >>> from ppl_sgmcmc.adaptation import adapt_init, identity
        >>> state = adapt_init(identity(2, dense=True, like=torch.zeros(1)), 0.1, 1.0, torch.zeros(2), 5.0)
        >>> state.moments.squares.shape, float(state.energy_level)
        (torch.Size([2]), 5.0)
    """
    like = preconditioner.inverse
    xp = array_namespace(like)
    d, dev = position.shape[0], device(like)
    return AdaptState(
        preconditioner,
        xp.asarray(step_size, dtype=like.dtype, device=dev),
        xp.asarray(curvature, dtype=like.dtype, device=dev),
        window_moments(d, like),
        xp.zeros((d,), dtype=like.dtype, device=dev),
        xp.zeros((), dtype=xp.int32, device=dev),
        xp.zeros((), dtype=like.dtype, device=dev),
        xp.zeros((), dtype=xp.int32, device=dev),
        position,
        xp.asarray(energy, dtype=like.dtype, device=dev),
        xp.zeros((), dtype=xp.int32, device=dev),
        xp.zeros((), dtype=like.dtype, device=dev),
        xp.full((), float("inf"), dtype=like.dtype, device=dev),
        xp.zeros((), dtype=xp.int32, device=dev),
        low_rank.history(d, like, low_rank.SLOTS if preconditioner.scale.ndim == 3 else 0),
    )


#: A warm-up step whose minibatch energy exceeds the warm-up's typical energy ``Ū`` by this many times
#: ``1 + |Ū|`` ran off (:func:`ran_off`).
RUNAWAY_FACTOR = 10.0
#: A chain that ran off during the warm-up continues from its restore point with its step size divided by this.
RESTART_SHRINK = 4.0


def ran_off(state: AdaptState, energy: Any) -> Array:
    """Whether a warm-up step with minibatch energy ``energy`` ran off: above the warm-up's typical energy
    ``Ū`` (``energy_level``) by more than :data:`RUNAWAY_FACTOR` ``(1 + |Ū|)``, or not finite.

    Without a Metropolis test nothing stops an SG-MCMC chain whose step size is too large for the curvature
    it meets (a saddle of a neural network's posterior, a region its start did not show): it runs off by
    orders of magnitude in a few steps. During the warm-up the kernels then return the chain to its restore
    point with a fresh rule state and the step size divided by :data:`RESTART_SHRINK`; the minibatch
    energy's own fluctuations (of order ``sqrt(d)`` plus the minibatch noise) stay far below the threshold.

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.adaptation import adapt_init, identity, ran_off
        >>> state = adapt_init(identity(1, dense=False, like=jnp.zeros(1)), 0.1, 1.0, jnp.zeros(1), 600.0)
        >>> [bool(ran_off(state, u)) for u in (800.0, 7000.0, float("nan"))]
        [False, True, True]
    """
    xp = array_namespace(state.energy_level)
    level = state.energy_level
    return ~(energy <= level + RUNAWAY_FACTOR * (1 + xp.abs(level)))


def _select(condition: Array, new: Any, old: Any) -> Any:
    """Field by field ``where(condition, new, old)`` of two NamedTuples of arrays."""
    xp = array_namespace(condition)
    return type(old)(*(xp.where(condition, a, b) for a, b in zip(new, old)))


def adapt_step(
    state: AdaptState,
    u: Array,
    theta: Array,
    energy: Any,
    noise_term: Array,
    noise_valid: Any,
    step_index: Any,
    schedule_ends: Array,
    *,
    adapt_mass: bool,
    tune_step_size: bool,
    target: Any,
    temperature: Any,
    max_step_size: Any,
    gradient: Array | None = None,
    branch: Any = None,
    widen: bool = True,
    noise_growth: float = 0.0,
) -> tuple[AdaptState, Array]:
    """Feed the warm-up step ``step_index`` (0-based) to the adaptation: the position ``u`` it reached (in
    the current coordinates) and its noise term (:func:`ppl_sgmcmc.noise.update`).

    With ``schedule_ends = [e_0, ..., e_k, e_{k+1}]`` (:func:`window_ends` of :func:`adaptation_schedule`):

    * inside a slow window (``e_0 <= step_index < e_k``), ``u`` is added to the window's moments (batch ``b``
      of :data:`BATCHES` equal parts of the window); while ``step_index < e_{k+1}`` a valid noise term is
      added to the noise sum;
    * at the last step of slow window ``j`` (``step_index + 1 == e_j``, ``1 <= j <= k``) with ``adapt_mass``,
      each coordinate is rescaled by the square root of its variance in the window shrunk towards 1,
      ``(n_eff v + 10)/(n_eff + 10)`` (clipped to ``[1/3, 3]``), raised to :func:`rescaling_weight` of its
      effective draws (1 from :data:`MIN_EFFECTIVE` on, 0 below three quarters of it; the preconditioner becomes
      :func:`rescale` of it), then the noisiest coordinates are shrunk
      (:func:`equalize_noise` of the noise measured since the step size was last set), and the moments
      restart;
    * at the end of every window and buffer (``step_index + 1 == e_j``, ``0 <= j <= k + 1``), and whenever
      :data:`RETUNE_FRACTION` of the warm-up has passed since, with ``tune_step_size``, the step size becomes
      :func:`tuned_step_size` of the noisiest such period since the current slow window began (``noise_peak``;
      the noise is measured in the new coordinates), capped at ``max_step_size`` divided by the curvature (that of the
      Laplace approximation: a rescaling brings a coordinate's spread to 1, where a Gaussian's curvature is 1)
      and at most :data:`RETUNE_GROWTH` times the step size it replaces, and the noise sum restarts;
    * after the warm-up (``step_index >= e_{k+1}``) the state is returned unchanged.

    With a low-rank-plus-diagonal preconditioner (:mod:`ppl_sgmcmc.low_rank`) and the step's ``gradient``, each
    slow-window step adds ``θ`` and ``L⁻ᵀ gradient`` to the history (:func:`ppl_sgmcmc.low_rank.record`, a slot of
    :data:`~ppl_sgmcmc.low_rank.SLOTS` over all the slow windows), and at the end of each slow window with
    ``adapt_mass`` the preconditioner is *replaced* by the estimate from the whole history
    (:func:`ppl_sgmcmc.low_rank.estimate`) instead of being rescaled and equalised: the step size is then not
    re-tuned at that step (the noise it measured is of the old coordinates), but at the next re-tuning, from the
    noise in the new ones. A kernel restarts its rule's state in the new coordinates (a new ``scale``).

    Array selects only (``xp.where``), so it traces under ``jax.jit``, ``jax.vmap`` and ``lax.scan`` and
    runs unchanged on ``torch``; each call costs ``O(d)`` (``O(d²)`` at a rescaling of a dense ``L``).

    :param state: the :class:`AdaptState`.
    :param u: the chain's position in the current coordinates ``u = L⁻¹ θ``, ``(d,)``.
    :param theta: that position ``θ``, the restore point when a window ends; ``energy``: the step's minibatch
        energy, averaged into ``energy_level`` unless it ran off (see :func:`ran_off`).
    :param noise_term: this step's term of :func:`ppl_sgmcmc.noise.update` (``(d,)``).
    :param noise_valid: whether that term measured the noise (a previous gradient existed, the step was
        accepted).
    :param step_index: the 0-based warm-up step (a Python int or an integer scalar array).
    :param schedule_ends: the ``int`` array of :func:`window_ends`.
    :param adapt_mass: whether the preconditioner adapts; ``tune_step_size``: whether the step size does.
    :param target: the noise ratio the step size aims at; ``temperature``: ``τ``.
    :param max_step_size: the step size's cap at curvature 1.
    :param gradient: the step's minibatch gradient in ``u`` (used by a low-rank-plus-diagonal preconditioner).
    :param branch: ``branch(pred, fn, operand)``: ``fn(operand)`` if ``pred``, else ``operand``, as the backend
        branches (NumPyro's ``warmup.when``); by default both are evaluated and selected. The low-rank estimate
        (``O(SLOTS² d)``) runs through it at the end of each slow window only.
    :param widen: whether a window may widen a coordinate (default ``True``); ``False``: only the coordinates whose
        spread is below their scale are judged and rescaled (for a chain that jumps between modes, such as replica
        exchange's cold chain, whose spread over the modes is no local scale, while a narrower spread still is).
    :param noise_growth: ``q`` where the gradient estimator's noise grows with the step size as ``V ∝ h^q``
        (default 0: the noise is set by where the chain is); the periods' noise is compared per ``h^q`` (the noise
        of each period divided by the ``h^q`` it ran with) and the step size tuned with :func:`tuned_step_size`'s
        ``noise_growth``.
    :return: ``(new state, factor)``: ``factor`` is the rescaling of ``u``'s coordinates this step applied
        (ones unless a window closed with ``adapt_mass``); a kernel re-expresses what it keeps in ``u``
        (the noise estimate, a momentum) when it is not all ones.

    **Example** (independent draws with variances 4 and 1/4: at the end of the first slow window, 50 steps,
    the scales become about 2 and 1/2, shrunk a little towards 1)::

        >>> import jax, jax.numpy as jnp
        >>> from ppl_sgmcmc import adaptation as ad
        >>> ends = ad.window_ends(ad.adaptation_schedule(1000), jnp.zeros(2))
        >>> state = ad.adapt_init(ad.identity(2, dense=False, like=jnp.zeros(2)), 0.1, 1.0, jnp.zeros(2), 0.0)
        >>> draws = jax.random.normal(jax.random.key(0), (200, 2)) * jnp.array([2.0, 0.5])
        >>> step = jax.jit(ad.adapt_step, static_argnames=("adapt_mass", "tune_step_size"))
        >>> for t in range(200):  # the initial buffer and the first slow window (steps 150 to 199)
        ...     u = ad.to_u(state.preconditioner, draws[t])
        ...     state, factor = step(state, u, draws[t], 0.0, jnp.zeros(2), False, t, ends, adapt_mass=True,
        ...                          tune_step_size=False, target=0.1, temperature=1.0, max_step_size=0.2)
        >>> [round(v, 1) for v in state.preconditioner.scale.tolist()], int(state.window_index)
        ([1.6, 0.7], 2)
    """  # noqa: E501
    xp = array_namespace(u, schedule_ends)
    dtype = u.dtype
    low = state.preconditioner.scale.ndim == 3  # low-rank plus diagonal: re-estimated, not rescaled
    in_warmup = step_index < schedule_ends[-1]
    inside = (step_index >= schedule_ends[0]) & (step_index < schedule_ends[-2])
    # the slow window holding the step, and the batch of it
    window = xp.sum(xp.astype(schedule_ends[:-1] <= step_index, xp.int32))
    last = schedule_ends.shape[0] - 1
    start = xp.take(schedule_ends, xp.clip(window - 1, 0, last))
    length = xp.take(schedule_ends, xp.clip(window, 0, last)) - start
    batch = xp.clip((step_index - start) * BATCHES // xp.maximum(length, xp.ones_like(length)), 0, BATCHES - 1)
    moments = _select(inside, _add(state.moments, u, batch), state.moments)
    valid = in_warmup & noise_valid
    noise_sum = xp.where(valid, xp.add(state.noise_sum, noise_term), state.noise_sum)
    noise_count = state.noise_count + xp.astype(valid, state.noise_count.dtype)
    closes_slow = xp.any(schedule_ends[1:-1] == step_index + 1)
    closes_window = in_warmup & xp.any(schedule_ends == step_index + 1)
    warmup_steps = xp.astype(schedule_ends[-1], dtype)
    retune_every = xp.maximum(warmup_steps * RETUNE_FRACTION, xp.full_like(warmup_steps, MIN_WINDOW))
    closes = in_warmup & (xp.any(schedule_ends == step_index + 1) | (xp.astype(noise_count, dtype) >= retune_every))
    one = xp.ones_like(u)
    factor = one
    preconditioner, curvature = state.preconditioner, state.curvature
    misfit, explored = state.misfit, state.explored
    if adapt_mass:
        variance, n_eff = window_variance(moments)
        weight = rescaling_weight(n_eff)
        # only the coordinates the window explored enough to rescale are judged
        judged = xp.logical_and(weight > 0, variance > 0)
        if not widen:
            judged = xp.logical_and(judged, variance < 1)
        deviation = xp.abs(xp.log(xp.where(judged, variance, one))) * xp.sqrt(n_eff / 2)
        misfit = xp.where(closes_slow, xp.max(deviation) / settle_bound(u.shape[0]), misfit)
        explored = xp.where(closes_slow, xp.min(n_eff) / MIN_EFFECTIVE, explored)
        shrunk = (xp.multiply(n_eff, variance) + SHRINKAGE) / (n_eff + SHRINKAGE)
        proposed = xp.clip(xp.sqrt(shrunk), 1 / MAX_RESCALE, MAX_RESCALE if widen else 1.0)
        use = closes_slow & (weight > 0) & xp.isfinite(proposed) & (not low)  # a low-rank metric is re-estimated
        factor = xp.where(use, proposed ** xp.where(use, weight, xp.zeros_like(weight)), one)
        preconditioner = _select(xp.any(use), rescale(preconditioner, factor), preconditioner)
        moments = _select(closes_slow, window_moments(u.shape[0], u), moments)
    history, replaced = state.history, xp.zeros((), dtype=xp.bool, device=device(u))
    if low and gradient is not None:  # the draw and its gradient in θ (L⁻ᵀ g) join the history
        span = xp.maximum(xp.subtract(schedule_ends[-2], schedule_ends[0]), xp.ones_like(schedule_ends[0]))
        slots = history.counts.shape[0]
        slot = xp.clip((step_index - schedule_ends[0]) * slots // span, 0, slots - 1)
        inverse_transpose = _pull(Preconditioner(state.preconditioner.inverse, state.preconditioner.scale), gradient)
        history = low_rank.record(history, slot, theta, inverse_transpose, inside & valid)
        if adapt_mass:
            estimated = (branch or _evaluate)(closes_slow, _low_rank_metric, (preconditioner, history))[0]
            replaced = closes_slow & xp.any(estimated.scale != preconditioner.scale)
            preconditioner = estimated
    measured = noise_sum / xp.astype(xp.maximum(noise_count, xp.ones_like(noise_count)), dtype) * factor**2
    if adapt_mass and not low:  # no coordinate noisier than NOISE_SPREAD times the median (equalize_noise)
        equalized, measured_eq, shrink = equalize_noise(preconditioner, measured)
        use = closes_slow & (noise_count > 0)
        preconditioner = _select(use, equalized, preconditioner)
        measured = xp.where(use, measured_eq, measured)
        factor = xp.where(use, factor * shrink, factor)
    # the noise of this period; the step size follows the noisiest period since the slow window began, since
    # the noise may change with where the chain is (as in a neural network's posterior)
    measured_any = closes & (noise_count > 0) & ~replaced  # the noise of replaced coordinates is measured anew
    period = xp.max(measured) / state.step_size**noise_growth if noise_growth else xp.max(measured)
    noise_peak = xp.where(measured_any, xp.where(closes_slow, period, xp.maximum(state.noise_peak * xp.max(factor) ** 2,
                                                                                  period)), state.noise_peak)
    noise_peak = xp.where(replaced, xp.zeros_like(noise_peak), noise_peak)
    step_size = state.step_size
    if tune_step_size:
        tuned = tuned_step_size(xp.reshape(noise_peak, (1,)), target, temperature, max_step_size / curvature,
                                noise_growth)  # fmt: skip
        step_size = xp.where(measured_any, xp.minimum(tuned, RETUNE_GROWTH * step_size), step_size)
    noise_sum = xp.where(closes, xp.zeros_like(noise_sum), noise_sum)
    noise_count = xp.where(closes, xp.zeros_like(noise_count), noise_count)
    window_index = state.window_index + xp.astype(closes_window, state.window_index.dtype)
    ordinary = in_warmup & ~ran_off(state, energy)
    level = state.energy_level + (xp.asarray(energy, dtype=dtype, device=device(u)) - state.energy_level) / HORIZON
    energy_level = xp.where(ordinary, level, state.energy_level)
    restore = xp.where(closes_window, theta, state.restore)
    new = AdaptState(preconditioner, step_size, curvature, moments, noise_sum, noise_count, noise_peak, window_index,
                     restore, energy_level, state.restarts, misfit, explored, state.rounds, history)  # fmt: skip
    return new, factor


def _low_rank_metric(operand: tuple[Preconditioner, low_rank.History]) -> tuple[Preconditioner, low_rank.History]:
    """The low-rank-plus-diagonal preconditioner estimated from the history
    (:func:`ppl_sgmcmc.low_rank.estimate`), or the given one where the history gives no estimate."""
    pre, history = operand
    sigma, U, lam, usable = low_rank.estimate(history)
    return _select(usable, Preconditioner(*low_rank.factors(sigma, U, lam)), pre), history


def _evaluate(pred: Array, fn: Any, operand: tuple[Any, ...]) -> tuple[Any, ...]:
    """``fn(operand)`` where ``pred``, else ``operand``, by array selects (``fn`` is evaluated either way)."""
    return tuple(_select(pred, new, old) for new, old in zip(fn(operand), operand))
