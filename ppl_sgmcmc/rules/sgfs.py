"""Stochastic gradient Fisher scoring, SGFS (Ahn, Korattikara & Welling, ICML 2012), Algorithm 1.

With the minibatch's per-datum scores ``g_i = ∇ log p(x_i | θ)`` (``i ∈ S_t``, ``n`` of them), their
mean ``ḡ``, the data size ``N``, ``γ = (n + N)/n``, the step size ``ε`` (``step_size``) and a
symmetric positive-definite ``B``::

    V_t = (1/(n-1)) Σ_i (g_i - ḡ)(g_i - ḡ)ᵀ                 empirical Fisher of the minibatch
    Î_t = (1 - κ_t) Î_{t-1} + κ_t V_t,   κ_t = 1/t           online average
    η ~ N(0, 4B/ε)
    θ ← θ + 2 (γ N Î_t + 4B/ε)⁻¹ (∇ log p(θ) + N ḡ + η)

``∇ log p(θ) + N ḡ`` is ``-∇Ũ_t(θ)``, the negated stochastic gradient of the model's potential
(prior, log-Jacobian and likelihood as the model declares them). The paper reports
``α = 2/sqrt(ε)`` instead of ``ε``: ``α = 0`` is ``ε = ∞`` (pass ``float("inf")``), the minibatch
noise alone; larger ``α`` injects more noise and takes smaller steps.

* ``fisher="full"`` (SGFS-f) keeps the ``d×d`` average and solves with a Cholesky factor, O(d³) per
  step; ``fisher="diagonal"`` (SGFS-d) keeps only ``diag Î_t``, O(d).
* ``B="fisher"`` is the paper's choice ``B = γ N Î_t`` (its experiments' ``B = γ I_N``); then the
  preconditioner is ``γ N (1 + 4/ε) Î_t`` and one Cholesky factor of ``Î_t`` serves both the solve
  and the noise. ``B="identity"``, a positive scalar, a vector of ``d`` positive diagonal entries,
  or (full form only) a ``d×d`` symmetric positive-definite matrix give a fixed ``B``.
* As ``ε → 0`` the step is SGLD preconditioned by ``B⁻¹`` with step size ``ε``:
  ``θ ← θ + (ε/2) B⁻¹ (∇ log p + N ḡ) + N(0, ε B⁻¹)``. At large ``ε`` and large ``N`` it samples the
  Bernstein–von Mises Gaussian ``N(θ₀, I_N⁻¹)``.

Two additions to Algorithm 1, both off by default in the rule:

* ``ridge``: the preconditioner uses ``Î_t + ridge · Diag(Î_t)`` (a ridge relative to each parameter's
  own Fisher, so invariant to rescaling a parameter), which keeps the Cholesky factorisation defined
  while ``Î_t`` is singular (``n ≤ d`` in the first steps) as long as every parameter enters the
  likelihood.
* ``fisher_window = m`` with ``num_warmup = W``: during the first ``W`` steps the average forgets
  (``κ_t = 1/min(t, m)``, a moving average of the last ~``m`` minibatches), so that the inflated scores
  of a start far from the mode do not freeze the chain (scores far from the mode are much larger);
  after warm-up the paper's ``1/t`` averaging resumes, counting the warm-up estimate as ``min(W, m)``
  minibatches. With ``W = 0`` or ``m = None`` the schedule is exactly ``κ_t = 1/t``.

The rule reads the ``n×d`` matrix ``StochasticGradient.per_example`` of per-datum log-likelihood
gradients; :data:`NEEDS` tells a backend to compute it.
"""

import math
from typing import NamedTuple

from array_api_compat import array_namespace, device, is_jax_namespace, is_numpy_namespace, is_torch_namespace

from ppl_sgmcmc.rules._types import Array

#: This rule needs ``StochasticGradient.per_example`` (the ``n×d`` per-datum scores of the minibatch).
NEEDS = "per_example"

FISHER_FORMS = ("full", "diagonal")

#: Largest number of parameters for ``fisher="full"`` unless ``max_full_dim`` says otherwise: a step
#: costs O(d³) (Cholesky) + O(n d²) (the empirical Fisher) and the state holds d² floats.
MAX_FULL_DIM = 2000


class SGFSConfigError(ValueError):
    """Hyper-parameters that do not fit the model's dimension (raised when the state is built).

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.rules import sgfs
        >>> try:
        ...     sgfs.init(jnp.zeros(3), None, B=jnp.ones(2))
        ... except sgfs.SGFSConfigError as error:
        ...     print(error)
        B of shape (2,) does not fit the 3 parameters: give a scalar, a vector of 3 diagonal entries or a 3×3 matrix.
    """


class SGFSState(NamedTuple):
    """The running Fisher estimate.

    - **fisher**: ``Î_{1,t}``, the online average of the per-datum empirical Fisher, ``(d, d)``
      (``fisher="full"``) or its diagonal ``(d,)``. ``γ N Î`` estimates the posterior precision.
    - **count**: ``1/κ_t`` of the last update: the number of minibatches the average weighs equally
      (equal to ``t`` under the paper's ``κ_t = 1/t``).
    - **t**: the number of steps (Fisher updates) taken.

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.rules import sgfs
        >>> state = sgfs.init(jnp.zeros(3), None, fisher="diagonal")
        >>> state.fisher.shape, int(state.count), int(state.t)
        ((3,), 0, 0)
    """

    fisher: Array
    count: Array  # type: ignore[assignment]  # (shadows tuple.count)
    t: Array


def check(d, fisher, B, max_full_dim):
    """Raise :class:`SGFSConfigError` if ``fisher``, ``B`` or ``max_full_dim`` do not fit ``d`` parameters.

    **Example**::

        >>> from ppl_sgmcmc.rules import sgfs
        >>> sgfs.check(3, "full", "fisher", max_full_dim=2)
        Traceback (most recent call last):
            ...
        ppl_sgmcmc.rules.sgfs.SGFSConfigError: a full Fisher for d = 3 parameters (3×3 matrix, an O(d³) Cholesky ...
    """
    if fisher not in FISHER_FORMS:
        raise SGFSConfigError(f"unknown fisher {fisher!r}; choose one of {', '.join(map(repr, FISHER_FORMS))}.")
    if fisher == "full" and d > max_full_dim:
        raise SGFSConfigError(
            f"a full Fisher for d = {d} parameters ({d}×{d} matrix, an O(d³) Cholesky solve per step) exceeds "
            f"max_full_dim = {max_full_dim}. Use fisher='diagonal' (SGFS-d, O(d) per step), or raise "
            "max_full_dim if the cost is acceptable."
        )
    if isinstance(B, str):
        if B not in ("fisher", "identity"):
            raise SGFSConfigError(f"unknown B {B!r}; give 'fisher', 'identity' or an array.")
        return
    shape = tuple(B.shape)
    if fisher == "diagonal" and len(shape) == 2:
        raise SGFSConfigError(
            f"fisher='diagonal' needs a diagonal B: a scalar or a vector of {d} entries, got shape {shape}."
        )
    if shape not in ((), (d,), (d, d)):
        raise SGFSConfigError(
            f"B of shape {shape} does not fit the {d} parameters: give a scalar, a vector of {d} diagonal entries "
            f"or a {d}×{d} matrix."
        )


def init(position, noise, fisher="full", B="fisher", max_full_dim=MAX_FULL_DIM):
    """``Î_0 = 0`` (the first update has ``κ_1 = 1``, so ``Î_1 = V_1``), ``count = t = 0``.

    Raises :class:`SGFSConfigError` for a full Fisher of more than ``max_full_dim`` parameters or a ``B``
    whose shape does not fit, before anything of size ``d²`` is allocated.

    :param position: the chain's start ``θ_0``, a flat array of ``d`` entries; the state takes its dtype
        and device.
    :param fisher: ``"full"`` (a ``d×d`` average, default) or ``"diagonal"``.
    :param B: ``"fisher"`` (default), ``"identity"``, a positive scalar, a vector of ``d`` entries or
        (full form only) a ``d×d`` matrix; checked against ``d`` here.
    :param max_full_dim: the largest ``d`` for ``fisher="full"`` (default :data:`MAX_FULL_DIM`).
    :return: :class:`SGFSState`.

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.rules import sgfs
        >>> sgfs.init(jnp.zeros(3), None).fisher.shape, sgfs.init(jnp.zeros(3), None, fisher="diagonal").fisher.shape
        ((3, 3), (3,))
    """
    del noise
    d = position.shape[0]
    check(d, fisher, B, max_full_dim)
    xp = array_namespace(position)
    dev = device(position)
    shape = (d, d) if fisher == "full" else (d,)
    zero = xp.zeros((), dtype=xp.int32, device=dev)
    return SGFSState(xp.zeros(shape, dtype=position.dtype, device=dev), zero, zero)


def _solve_triangular(xp, L, b, transpose):
    """``x`` with ``L x = b`` (or ``Lᵀ x = b``), ``L`` lower triangular, ``b`` a vector."""
    if is_torch_namespace(xp):
        A = L.mT if transpose else L
        return xp.linalg.solve_triangular(A, b[:, None], upper=transpose)[:, 0]
    if is_jax_namespace(xp):
        from jax.scipy.linalg import solve_triangular

        return solve_triangular(L, b, trans=1 if transpose else 0, lower=True)
    if is_numpy_namespace(xp):
        from scipy.linalg import solve_triangular

        return solve_triangular(L, b, trans=1 if transpose else 0, lower=True)
    return xp.linalg.solve(L.mT if transpose else L, b)  # any other array-API namespace


def _cholesky_solve(xp, L, b):
    """``(L Lᵀ)⁻¹ b``."""
    return _solve_triangular(xp, L, _solve_triangular(xp, L, b, False), True)


def step(
    position,
    state,
    grad_fn,
    noise,
    step_size,
    data_size=1,
    fisher="full",
    B="fisher",
    ridge=0.0,
    num_warmup=0,
    fisher_window=None,
):
    """One SGFS step (Algorithm 1, lines 4-9): update ``Î`` with this minibatch, then move.

    ``data_size`` is ``N``; ``step_size`` is ``ε`` (``float("inf")`` for the paper's ``α = 0``).

    :param position: ``θ``, a flat array of ``d`` entries (``jax.numpy`` or ``torch``).
    :param state: the :class:`SGFSState`.
    :param grad_fn: ``θ -> StochasticGradient`` with the ``n×d`` per-datum scores in ``per_example``
        (``n >= 2``); called once.
    :param noise: ``ζ``, a standard normal draw of the shape of ``position``.
    :param step_size: ``ε``.
    :param data_size: ``N``, the data set's size.
    :param fisher: ``"full"`` (default) or ``"diagonal"``.
    :param B: ``"fisher"`` (default: ``B = γ N Î_t``), ``"identity"``, a scalar, a vector or a matrix.
    :param ridge: the relative ridge of the preconditioner (default 0).
    :param num_warmup: ``W``; with ``fisher_window`` ``m``, the average forgets during the first ``W`` steps.
    :param fisher_window: ``m`` (default ``None``: the paper's ``κ_t = 1/t`` throughout).
    :return: ``(new position, new state, gradient)``.

    **Example** (``y_i ~ N(θ, I)`` with the prior ``N(0, I)``, ``N = 100``; one step on a minibatch of 4,
    with ``jax.numpy`` and with ``torch`` arrays: the same numbers)::

        >>> import jax.numpy as jnp, torch
        >>> from ppl_sgmcmc.rules import StochasticGradient, sgfs
        >>> def grad_fn(x):  # per-datum scores ∇ log N(y_i | x, I) = y_i - x
        ...     scores = y - x
        ...     energy = (x * x).sum() / 2 + 100 * (scores * scores).sum(1).mean() / 2
        ...     return StochasticGradient(energy, x - 100 * scores.mean(0), scores.mean(0), per_example=scores)
        >>> y = jnp.array([[0.5, 1.0], [1.5, -1.0], [1.0, 0.5], [1.0, -0.5]])
        >>> x, noise = jnp.zeros(2), jnp.array([0.5, -0.5])
        >>> x, state, _ = sgfs.step(x, sgfs.init(x, noise), grad_fn, noise, step_size=1.0, data_size=100)
        >>> [round(v, 4) for v in x.tolist()], [[round(v, 4) for v in row] for row in state.fisher.tolist()]
        ([0.4423, 0.1654], [[0.1667, -0.3333], [-0.3333, 0.8333]])
        >>> y = torch.tensor(y.tolist())
        >>> t, z = torch.zeros(2), torch.tensor([0.5, -0.5])
        >>> sgfs.step(t, sgfs.init(t, z), grad_fn, z, step_size=1.0, data_size=100)[0]
        tensor([0.4423, 0.1654])
    """
    xp = array_namespace(position)
    dtype, dev = position.dtype, device(position)
    gradient = grad_fn(position)
    scores = gradient.per_example
    if scores is None:
        raise ValueError("sgfs: grad_fn must return the per-datum scores in StochasticGradient.per_example (n×d).")
    n, d = scores.shape[0], position.shape[0]
    full = fisher == "full"

    # lines 5-7: mean score, empirical Fisher, online average
    centred = scores - xp.mean(scores, axis=0)
    V = (centred.mT @ centred if full else xp.sum(centred * centred, axis=0)) / (n - 1)
    t = state.t + 1
    count = state.count + 1
    if fisher_window is not None and num_warmup > 0:
        count = xp.where((t <= num_warmup) & (count > fisher_window), fisher_window, count)
    kappa = 1 / xp.astype(count, dtype)
    fisher_avg = (1 - kappa) * state.fisher + kappa * V

    # lines 8-9: θ ← θ + 2 (γ N Î + 4B/ε)⁻¹ (∇ log p(θ) + N ḡ + η),  η ~ N(0, 4B/ε)
    gamma_n = (n + data_size) / n * data_size  # γ N
    inv_eps = 4 / step_size  # 4/ε; 0 for ε = ∞ (α = 0)
    force = -gradient.grad  # ∇ log p(θ) + N ḡ
    F = fisher_avg
    if ridge:  # Î + ridge · Diag(Î)
        F = F + ridge * xp.eye(d, dtype=dtype, device=dev) * xp.linalg.diagonal(F) if full else (1 + ridge) * F
    if isinstance(B, str) and B == "fisher":
        # B = γ N F:  P = γ N (1 + 4/ε) F,  η = sqrt(4 γ N/ε) F^{1/2} ζ
        scale = 2 / (gamma_n * (1 + inv_eps))
        noise_scale = (gamma_n * inv_eps) ** 0.5
        if full:
            L = xp.linalg.cholesky(F)
            delta = scale * _solve_triangular(xp, L, _solve_triangular(xp, L, force, False) + noise_scale * noise, True)
        else:
            delta = scale * (force / F + noise_scale * noise / xp.sqrt(F))
        return position + delta, SGFSState(fisher_avg, count, t), gradient

    # a fixed B: "identity", a scalar, a vector (diagonal) or a matrix
    b = xp.ones((), dtype=dtype, device=dev) if isinstance(B, str) else xp.asarray(B, dtype=dtype, device=dev)
    if b.ndim == 2:
        eta = inv_eps**0.5 * (xp.linalg.cholesky(b) @ noise)
        P = gamma_n * F + inv_eps * b
    else:
        eta = xp.sqrt(inv_eps * b) * noise
        P = gamma_n * F + inv_eps * (xp.eye(d, dtype=dtype, device=dev) * b if full else b)
    if full:
        delta = 2 * _cholesky_solve(xp, xp.linalg.cholesky(P), force + eta)
    else:
        delta = 2 * (force + eta) / P
    return position + delta, SGFSState(fisher_avg, count, t), gradient


def alpha_to_step_size(alpha):
    """``ε = 4/α²`` for the paper's ``α = 2/sqrt(ε)`` (``α = 0`` gives ``ε = ∞``).

    **Example**::

        >>> from ppl_sgmcmc.rules import sgfs
        >>> sgfs.alpha_to_step_size(2.0), sgfs.alpha_to_step_size(0)
        (1.0, inf)
    """
    return math.inf if alpha == 0 else 4.0 / alpha**2
