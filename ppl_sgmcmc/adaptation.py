"""Warm-up adaptation of a mass matrix (preconditioner), the backend-neutral pieces.

Stan's windowed adaptation (Carpenter et al., "Stan: A Probabilistic Programming Language", Journal of
Statistical Software 76(1), 2017; the Stan Reference Manual, "HMC algorithm parameters", section
"Automatic parameter tuning"), as NumPyro's ``numpyro/infer/hmc_util.py`` implements it
(``build_adaptation_schedule``, ``welford_covariance``):

* **the schedule** (:func:`adaptation_schedule`): the warm-up is cut into a fast initial buffer
  (``init_buffer`` steps, the chain travels to the typical set; nothing is estimated), slow windows of
  ``base_window``, ``2·base_window``, ``4·base_window``, ... steps (the last one stretched to the terminal
  buffer), and a fast terminal buffer (``term_buffer`` steps). The chain's positions in each slow window
  feed a Welford estimate of the posterior covariance ``Σ``; at the window's last step the preconditioner
  becomes that estimate and the estimator restarts, so each window adapts under the previous window's
  (better) preconditioner.
* **the estimator** (:func:`welford_init`, :func:`welford_update`, :func:`welford_covariance`): Welford's
  online mean and (co)variance, with Stan's shrinkage towards ``10⁻³ I``.
* **the preconditioner** (:class:`Preconditioner`) as a linear change of variables ``θ = L u`` with
  ``Σ = L Lᵀ``: any update rule of :mod:`ppl_sgmcmc.rules` run on ``u`` with the gradient
  :func:`pullback_grad_fn` (``Lᵀ ∇_θ U``) and identity mass is the rule preconditioned by ``M⁻¹ = Σ`` in
  ``θ``. For SGLD: ``u' = u - h Lᵀ∇U(θ) + sqrt(2h) ζ`` is ``θ' = θ - h Σ ∇U(θ) + sqrt(2h) L ζ``.
* **one warm-up step** (:func:`adapt_step`): a pure function of an :class:`AdaptState`, with array
  selects only, so that it runs inside ``jax.jit``, ``jax.vmap`` and ``lax.scan`` as well as on ``torch``
  tensors.

Everything is written once on the array-API subset shared by ``jax.numpy`` and ``torch`` (the namespace
of the inputs, :func:`array_api_compat.array_namespace`), like the update rules.

**Example** (a dense preconditioner estimated, inside ``jax.jit`` and ``lax.scan``, from 1000 draws of
``N(0, Σ)``; the last slow window, 500 draws, sets it)::

    >>> import jax, jax.numpy as jnp
    >>> from ppl_sgmcmc import adaptation as ad
    >>> schedule = ad.adaptation_schedule(1000)
    >>> schedule[1:-1]  # the slow windows
    [(75, 100), (100, 150), (150, 250), (250, 450), (450, 950)]
    >>> Sigma = jnp.array([[4.0, 1.8], [1.8, 1.0]])
    >>> draws = jax.random.normal(jax.random.key(0), (1000, 2)) @ jnp.linalg.cholesky(Sigma).T
    >>> ends = ad.window_ends(schedule, draws)
    >>> def body(state, t):
    ...     return ad.adapt_step(state, draws[t], t, ends, dense=True), None
    >>> state, _ = jax.jit(lambda s: jax.lax.scan(body, s, jnp.arange(1000)))(ad.adapt_init(2, True, draws))
    >>> L = state.preconditioner.scale
    >>> [[round(v, 1) for v in row] for row in (L @ L.T).tolist()], int(state.window_index)
    ([[4.2, 1.9], [1.9, 1.1]], 5)
"""

from __future__ import annotations

from typing import Any, NamedTuple

from array_api_compat import array_namespace, device, is_jax_namespace, is_numpy_namespace, is_torch_namespace

from ppl_sgmcmc.rules import StochasticGradient
from ppl_sgmcmc.rules._types import Array

__all__ = [
    "AdaptState",
    "Preconditioner",
    "WelfordState",
    "adapt_init",
    "adapt_step",
    "adaptation_schedule",
    "from_covariance",
    "identity",
    "minimum_warmup_steps",
    "pullback_grad_fn",
    "to_theta",
    "to_u",
    "welford_covariance",
    "welford_init",
    "welford_update",
    "window_ends",
]

#: Stan's defaults (``adapt init_buffer``, ``adapt term_buffer``, ``adapt window``), also NumPyro's.
INIT_BUFFER, TERM_BUFFER, BASE_WINDOW = 75, 50, 25

#: Stan's regularisation of the estimated covariance: ``(n/(n+5)) Σ̂ + 10⁻³ (5/(n+5)) I``.
SHRINKAGE_TARGET, SHRINKAGE_COUNT = 1e-3, 5


# --- the schedule ----------------------------------------------------------------------------------------
def minimum_warmup_steps(init_buffer: int = INIT_BUFFER, term_buffer: int = TERM_BUFFER,
                         base_window: int = BASE_WINDOW) -> int:  # fmt: skip
    """The smallest warm-up with one slow window: ``init_buffer + base_window + term_buffer``.

    Stan (Reference Manual, "HMC algorithm parameters") and NumPyro's ``build_adaptation_schedule`` shrink
    the buffers of a shorter warm-up to 15 % / 10 % of it; :func:`adaptation_schedule` refuses it instead.

    **Example**::

        >>> from ppl_sgmcmc.adaptation import minimum_warmup_steps
        >>> minimum_warmup_steps(), minimum_warmup_steps(init_buffer=10, term_buffer=5, base_window=5)
        (150, 20)
    """
    return init_buffer + base_window + term_buffer


def adaptation_schedule(num_steps: int, init_buffer: int = INIT_BUFFER, term_buffer: int = TERM_BUFFER,
                        base_window: int = BASE_WINDOW) -> list[tuple[int, int]]:  # fmt: skip
    """Stan's adaptation windows of a warm-up of ``num_steps`` steps, as half-open ``[start, end)`` ranges.

    The list is ``[initial buffer, slow window 1, ..., slow window k, terminal buffer]``: contiguous,
    from ``0`` to ``num_steps``, ``k >= 1``. The slow windows have ``base_window``, ``2·base_window``, ...
    steps; a window is stretched to the terminal buffer when the next, doubled, one would not fit before it
    (Stan's ``windowed_adaptation::compute_next_window``). A buffer of size 0 appears as an empty range
    ``(s, s)``, so that ``schedule[1:-1]`` are always the slow windows. The windows are those of NumPyro's
    ``build_adaptation_schedule`` (``numpyro.infer.hmc_util``), whose ``AdaptWindow(start, end)`` is
    inclusive: its ``(start, end)`` is this ``(start, end + 1)``.

    :param num_steps: the number of warm-up steps, at least :func:`minimum_warmup_steps`.
    :param init_buffer: the fast initial buffer (Stan's ``init_buffer``, default 75).
    :param term_buffer: the fast terminal buffer (Stan's ``term_buffer``, default 50).
    :param base_window: the first slow window (Stan's ``window``, default 25).
    :raises ValueError: for a warm-up too short for one slow window.

    **Example**::

        >>> from ppl_sgmcmc.adaptation import adaptation_schedule
        >>> adaptation_schedule(1000)
        [(0, 75), (75, 100), (100, 150), (150, 250), (250, 450), (450, 950), (950, 1000)]
        >>> adaptation_schedule(100)
        Traceback (most recent call last):
            ...
        ValueError: mass-matrix adaptation needs at least 150 warm-up steps (a 75-step initial buffer, ...
    """
    for name, value in (("init_buffer", init_buffer), ("term_buffer", term_buffer), ("base_window", base_window)):
        if int(value) != value or value < (1 if name == "base_window" else 0):
            kind = "a positive" if name == "base_window" else "a non-negative"
            raise ValueError(f"adaptation_schedule: {name} must be {kind} integer, got {value!r}.")
    minimum = minimum_warmup_steps(init_buffer, term_buffer, base_window)
    if num_steps < minimum:
        raise ValueError(
            f"mass-matrix adaptation needs at least {minimum} warm-up steps (a {init_buffer}-step initial buffer, "
            f"one {base_window}-step slow window and a {term_buffer}-step terminal buffer), got {num_steps}; "
            "lengthen the warm-up or pass adapt_mass=False"
        )
    windows = [(0, init_buffer)]
    term_start = num_steps - term_buffer
    start, size = init_buffer, base_window
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
        tensor([ 75, 100, 150, 200], dtype=torch.int32)
    """
    xp = array_namespace(like)
    return xp.asarray([end for _, end in schedule], dtype=xp.int32, device=device(like))


# --- Welford's estimator ---------------------------------------------------------------------------------
class WelfordState(NamedTuple):
    """Welford's running moments of the samples seen so far.

    - **count**: ``n``, an ``int32`` scalar.
    - **mean**: the running mean, ``(d,)``.
    - **m2**: the sum of squared deviations from the running mean, ``Σ_i (x_i - x̄)²`` (``(d,)``,
      diagonal) or ``Σ_i (x_i - x̄)(x_i - x̄)ᵀ`` (``(d, d)``, dense).

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.adaptation import welford_init
        >>> state = welford_init(3, dense=True, like=jnp.zeros(3))
        >>> int(state.count), state.mean.shape, state.m2.shape
        (0, (3,), (3, 3))
    """

    count: Array  # type: ignore[assignment]  # (shadows tuple.count)
    mean: Array
    m2: Array


def welford_init(d: int, dense: bool, like: Array) -> WelfordState:
    """The empty estimator for ``d``-dimensional samples: ``n = 0``, zero mean and ``m2`` (``(d, d)`` if
    ``dense``, else ``(d,)``), of the dtype, device and namespace of ``like``.

    **Example**::

        >>> import torch
        >>> from ppl_sgmcmc.adaptation import welford_init
        >>> welford_init(2, dense=False, like=torch.zeros(1, dtype=torch.float64))
        WelfordState(count=tensor(0, dtype=torch.int32), mean=tensor([0., 0.], dtype=torch.float64), m2=tensor([0., 0.], dtype=torch.float64))
    """  # noqa: E501
    xp = array_namespace(like)
    dev = device(like)
    return WelfordState(
        count=xp.zeros((), dtype=xp.int32, device=dev),
        mean=xp.zeros((d,), dtype=like.dtype, device=dev),
        m2=xp.zeros((d, d) if dense else (d,), dtype=like.dtype, device=dev),
    )


def welford_update(state: WelfordState, x: Array) -> WelfordState:
    """Add the sample ``x`` (``(d,)``): ``n ← n + 1``, ``δ = x - x̄``, ``x̄ ← x̄ + δ/n``,
    ``m2 ← m2 + (x - x̄) ⊙ δ`` (dense: ``+ (x - x̄) δᵀ``). Welford's method (Knuth, TAOCP vol. 2), as in
    NumPyro's ``welford_covariance``.

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.adaptation import welford_init, welford_update
        >>> state = welford_init(2, dense=False, like=jnp.zeros(2))
        >>> for x in ([1.0, 2.0], [3.0, 6.0]):
        ...     state = welford_update(state, jnp.array(x))
        >>> int(state.count), state.mean.tolist(), state.m2.tolist()
        (2, [2.0, 4.0], [2.0, 8.0])
    """
    xp = array_namespace(x, state.mean)
    count = state.count + 1
    delta = xp.subtract(x, state.mean)
    mean = state.mean + delta / xp.astype(count, state.mean.dtype)
    after = x - mean
    m2 = state.m2 + (after * delta if state.m2.ndim == 1 else after[:, None] * delta[None, :])
    return WelfordState(count, mean, m2)


def welford_covariance(state: WelfordState, regularize: bool = True) -> Array:
    """The sample (co)variance ``Σ̂ = m2 / (n - 1)`` of the samples added, shrunk as Stan does when
    ``regularize``: ``(n/(n+5)) Σ̂ + 10⁻³ (5/(n+5)) I`` (diagonal estimate: the same, entrywise).

    Stan's ``diag_e_adaptation`` / ``dense_e_adaptation`` (Carpenter et al. 2017), NumPyro's
    ``welford_covariance(...)[2](state, regularize=True)``. With ``n <= 1`` samples ``Σ̂`` is taken as 0
    (not ``0/0``), so the regularised estimate is ``10⁻³ (5/(n+5)) I``: a positive-definite matrix at every
    step, which :func:`adapt_step` relies on.

    **Example** (the samples ``[1, 2]`` and ``[3, 6]``: variances 2 and 8)::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.adaptation import welford_covariance, welford_init, welford_update
        >>> state = welford_init(2, dense=True, like=jnp.zeros(2))
        >>> for x in ([1.0, 2.0], [3.0, 6.0]):
        ...     state = welford_update(state, jnp.array(x))
        >>> welford_covariance(state, regularize=False).tolist()
        [[2.0, 4.0], [4.0, 8.0]]
        >>> [[round(v, 4) for v in row] for row in welford_covariance(state).tolist()]  # (2/7) Σ̂ + 10⁻³ (5/7) I
        [[0.5721, 1.1429], [1.1429, 2.2864]]
    """
    xp = array_namespace(state.mean)
    n = xp.astype(state.count, state.mean.dtype)
    cov = state.m2 / xp.maximum(n - 1, xp.ones_like(n))
    if not regularize:
        return cov
    shrunk = (n / (n + SHRINKAGE_COUNT)) * cov
    shrinkage = SHRINKAGE_TARGET * SHRINKAGE_COUNT / (n + SHRINKAGE_COUNT)
    if cov.ndim == 1:
        return shrunk + shrinkage
    d = cov.shape[0]
    return shrunk + shrinkage * xp.eye(d, dtype=cov.dtype, device=device(cov))


# --- the preconditioner as a change of variables -------------------------------------------------------
class Preconditioner(NamedTuple):
    """The linear change of variables ``θ = L u``, ``L Lᵀ = Σ`` (the inverse mass matrix ``M⁻¹``).

    - **scale**: ``L``: the ``(d, d)`` lower Cholesky factor of ``Σ`` (dense) or the ``(d,)`` standard
      deviations ``sqrt(diag Σ)`` (diagonal, ``L = diag(scale)``).

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.adaptation import Preconditioner, to_theta
        >>> to_theta(Preconditioner(scale=jnp.array([2.0, 0.5])), jnp.array([1.0, 1.0])).tolist()
        [2.0, 0.5]
    """

    scale: Array


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
    if dense:
        return Preconditioner(xp.eye(d, dtype=like.dtype, device=dev))
    return Preconditioner(xp.ones((d,), dtype=like.dtype, device=dev))


def _cholesky(xp: Any, A: Array) -> Array:
    """Lower Cholesky factor of ``A``; NaN (never an exception) where ``A`` is not positive definite."""
    if is_torch_namespace(xp):
        import torch

        L, info = torch.linalg.cholesky_ex(A)
        return xp.where(info == 0, L, xp.full_like(L, float("nan")))
    return xp.linalg.cholesky(A)  # jax.numpy: NaN where not positive definite


def _solve_lower(xp: Any, L: Any, b: Any) -> Any:
    """``x`` with ``L x = b``, ``L`` lower triangular, ``b`` a vector."""
    if is_torch_namespace(xp):
        return xp.linalg.solve_triangular(L, b[:, None], upper=False)[:, 0]
    if is_jax_namespace(xp):
        from jax.scipy.linalg import solve_triangular

        return solve_triangular(L, b, lower=True)
    if is_numpy_namespace(xp):
        from scipy.linalg import solve_triangular as scipy_solve_triangular

        return scipy_solve_triangular(L, b, lower=True)
    return xp.linalg.solve(L, b)  # any other array-API namespace


def from_covariance(cov: Array) -> Preconditioner:
    """The preconditioner of a covariance ``Σ``: ``L = cholesky(Σ)`` for a ``(d, d)`` matrix, ``L =
    sqrt(σ²)`` for a ``(d,)`` vector of variances. A ``Σ`` that is not positive definite gives NaN entries
    (on ``torch`` as on ``jax``; no exception).

    NumPyro's ``welford_covariance`` final function returns the same factor of ``Σ`` (as ``tril_inv``, for
    its momentum ``p ~ N(0, M)``); here it is the map from ``u`` to ``θ``.

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.adaptation import from_covariance
        >>> from_covariance(jnp.array([[4.0, 2.0], [2.0, 2.0]])).scale.tolist()
        [[2.0, 0.0], [1.0, 1.0]]
        >>> from_covariance(jnp.array([4.0, 0.25])).scale.tolist()
        [2.0, 0.5]
    """
    xp = array_namespace(cov)
    return Preconditioner(_cholesky(xp, cov) if cov.ndim == 2 else xp.sqrt(cov))


def to_u(pre: Preconditioner, theta: Array) -> Array:
    """``u = L⁻¹ θ`` (a triangular solve for a dense ``L``, ``θ / scale`` for a diagonal one).

    **Example**::

        >>> import torch
        >>> from ppl_sgmcmc.adaptation import Preconditioner, to_u
        >>> to_u(Preconditioner(torch.tensor([[2.0, 0.0], [1.0, 1.0]])), torch.tensor([2.0, 3.0]))
        tensor([1., 2.])
    """
    xp = array_namespace(theta, pre.scale)
    if pre.scale.ndim == 1:
        return xp.divide(theta, pre.scale)
    return _solve_lower(xp, pre.scale, theta)


def to_theta(pre: Preconditioner, u: Array) -> Array:
    """``θ = L u`` (``scale ⊙ u`` for a diagonal ``L``).

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.adaptation import Preconditioner, to_theta
        >>> to_theta(Preconditioner(jnp.array([[2.0, 0.0], [1.0, 1.0]])), jnp.array([1.0, 2.0])).tolist()
        [2.0, 3.0]
    """
    xp = array_namespace(u, pre.scale)
    if pre.scale.ndim == 1:
        return xp.multiply(pre.scale, u)
    return xp.matmul(pre.scale, u)


def _pull(pre: Preconditioner, g: Array) -> Array:
    """``Lᵀ g`` for a vector ``g``, or each row of an ``n×d`` matrix ``g`` (``g L``)."""
    xp = array_namespace(g, pre.scale)
    if pre.scale.ndim == 1:
        return xp.multiply(g, pre.scale)
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
        >>> from ppl_sgmcmc.adaptation import Preconditioner, pullback_grad_fn
        >>> from ppl_sgmcmc.rules import StochasticGradient
        >>> def grad_fn(theta):
        ...     return StochasticGradient(energy=(theta * theta).sum() / 2, grad=theta, score=-theta)
        >>> g = pullback_grad_fn(Preconditioner(jnp.array([2.0, 0.5])), grad_fn)(jnp.ones(2))
        >>> float(g.energy), g.grad.tolist(), g.score.tolist(), g.per_example
        (2.125, [4.0, 0.25], [-4.0, -0.25], None)
    """  # noqa: E501

    def grad_fn_u(u: Array) -> StochasticGradient:
        g = grad_fn(to_theta(pre, u))
        score = None if g.score is None else _pull(pre, g.score)  # a backend computes only what the rule needs
        per_example = None if g.per_example is None else _pull(pre, g.per_example)
        return StochasticGradient(g.energy, _pull(pre, g.grad), score, per_example)

    return grad_fn_u


# --- one warm-up step ------------------------------------------------------------------------------------
class AdaptState(NamedTuple):
    """The warm-up adaptation state carried by a chain.

    - **welford**: the :class:`WelfordState` of the current slow window.
    - **preconditioner**: the :class:`Preconditioner` in force (identity until the first slow window ends).
    - **window_index**: the number of slow windows completed so far (``int32`` scalar): it changes exactly
      when the preconditioner is replaced, so a kernel can tell when to re-express its position ``u``.

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.adaptation import adapt_init
        >>> state = adapt_init(2, dense=False, like=jnp.zeros(2))
        >>> state.preconditioner.scale.tolist(), int(state.window_index)
        ([1.0, 1.0], 0)
    """

    welford: WelfordState
    preconditioner: Preconditioner
    window_index: Array


def adapt_init(d: int, dense: bool, like: Array) -> AdaptState:
    """The state before warm-up: an empty estimator, the identity preconditioner, no window completed.

    **Example**::

        >>> import torch
        >>> from ppl_sgmcmc.adaptation import adapt_init
        >>> adapt_init(2, dense=True, like=torch.zeros(1)).welford.m2.shape
        torch.Size([2, 2])
    """
    xp = array_namespace(like)
    return AdaptState(
        welford_init(d, dense, like), identity(d, dense, like), xp.zeros((), dtype=xp.int32, device=device(like))
    )


def _select(condition: Array, new: Any, old: Any) -> Any:
    """Field by field ``where(condition, new, old)`` of two NamedTuples of arrays."""
    xp = array_namespace(condition)
    return type(old)(*(xp.where(condition, a, b) for a, b in zip(new, old)))


def adapt_step(state: AdaptState, theta: Array, step_index: Any, schedule_ends: Array, dense: bool) -> AdaptState:
    """Feed the warm-up position ``θ`` of step ``step_index`` (0-based) to Stan's windowed adaptation.

    With ``schedule_ends = [e_0, ..., e_k, e_{k+1}]`` (:func:`window_ends` of :func:`adaptation_schedule`):

    * inside a slow window (``e_0 <= step_index < e_k``), ``θ`` is added to the Welford estimate;
    * at the last step of slow window ``j`` (``step_index + 1 == e_j``, ``1 <= j <= k``) the preconditioner
      becomes :func:`from_covariance` of the regularised :func:`welford_covariance` (if its factor is
      finite; otherwise the previous one is kept), the estimator restarts empty, ``window_index`` grows by 1;
    * in the buffers and after warm-up (``step_index >= e_{k+1}``) the state is returned unchanged.

    Stan (Carpenter et al. 2017; Reference Manual, "HMC algorithm parameters") and NumPyro's
    ``warmup_adapter`` (``numpyro.infer.hmc_util``) do the same with Python or ``lax.cond`` branches; this
    function uses array selects only (``xp.where``), so it traces under ``jax.jit``, ``jax.vmap`` and
    ``lax.scan`` and runs unchanged on ``torch``. Its price: the covariance and its Cholesky factor are
    computed at every call and discarded except at window ends.

    :param state: the :class:`AdaptState`.
    :param theta: the chain's position ``θ`` (``(d,)``; not ``u``).
    :param step_index: the 0-based warm-up step (a Python int or an integer scalar array).
    :param schedule_ends: the ``int`` array of :func:`window_ends`.
    :param dense: whether the state is dense (``(d, d)``) or diagonal (``(d,)``); must match ``state``.
    :return: the new :class:`AdaptState`. A kernel that steps ``u = L⁻¹ θ`` must re-express its position
        (``u ← to_u(new, to_theta(old, u))``) when ``window_index`` changes.

    **Example** (a warm-up of 150 steps: one slow window, steps 75 to 99)::

        >>> import jax, jax.numpy as jnp
        >>> from ppl_sgmcmc.adaptation import adapt_init, adapt_step, adaptation_schedule, window_ends
        >>> draws = jnp.stack([jnp.arange(150.0), jnp.ones(150)], axis=1)  # θ_t = (t, 1)
        >>> ends = window_ends(adaptation_schedule(150), draws)
        >>> step = jax.jit(adapt_step, static_argnames="dense")
        >>> state = adapt_init(2, dense=False, like=draws)
        >>> for t in range(150):
        ...     state = step(state, draws[t], t, ends, dense=False)
        >>> # sqrt((25/30) var(75, ..., 99) + 10⁻³/6) with var = 1300/24 (ddof=1), and sqrt(10⁻³/6)
        >>> [round(v, 4) for v in state.preconditioner.scale.tolist()], int(state.window_index)
        ([6.7186, 0.0129], 1)
    """  # noqa: E501
    if (state.welford.m2.ndim == 2) != dense:
        shape = tuple(state.welford.m2.shape)
        raise ValueError(f"adapt_step: dense={dense} does not match the state's m2 of shape {shape}.")
    xp = array_namespace(theta, schedule_ends)
    inside = (step_index >= schedule_ends[0]) & (step_index < schedule_ends[-2])
    closes = xp.any(schedule_ends[1:-1] == step_index + 1)
    welford = _select(inside, welford_update(state.welford, theta), state.welford)
    new = from_covariance(welford_covariance(welford, regularize=True))
    replace = closes & xp.all(xp.isfinite(new.scale))
    preconditioner = _select(replace, new, state.preconditioner)
    empty = welford_init(theta.shape[0], dense, theta)
    welford = _select(closes, empty, welford)
    window_index = state.window_index + xp.astype(closes, state.window_index.dtype)
    return AdaptState(welford, preconditioner, window_index)
