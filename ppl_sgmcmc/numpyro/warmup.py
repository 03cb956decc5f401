"""A chain's start on the NumPyro backend: the approximate mode, the Hessian there and the noise probe.

The warm-up's backend-neutral part is :mod:`ppl_sgmcmc.adaptation`; this module computes what it needs
from a target (:mod:`~ppl_sgmcmc.numpyro.potential`), in the start's compiled stages (the kernel's
``_start_stages``: one program for the mode and the curvature there, one for the noise probe, each kept for the
next kernel started on the same model, arguments and options):

* :func:`find_mode`: Adam (``optax``) with a cosine-decaying learning rate on the same minibatch
  potential the chain samples, from the init strategy's point; a step whose gradient is not finite
  returns to the last point whose gradient was (a step into a region where the model is undefined is
  undone).
* :func:`hessian`: the Hessian of the potential at a point and its gradient, the means over up to
  :data:`~ppl_sgmcmc.adaptation.HESSIAN_ROWS` rows of the data drawn without replacement (all of them for smaller data sets),
  each by forward-over-reverse differentiation of the minibatch gradient.
* :func:`hessian_diagonal` and :func:`largest_curvature`: with a diagonal preconditioner and more than
  :data:`~ppl_sgmcmc.adaptation.EXACT_HESSIAN_MAX` latent coordinates, Hutchinson's estimate of the Hessian's diagonal and the
  largest curvature it leaves, by power iteration: one Hessian-vector product per minibatch instead of ``d``.
* :func:`newton`: Newton steps from the optimiser's end point (:func:`ppl_sgmcmc.adaptation.newton_direction`),
  each the best of a few fractions of the step on the Hessian's minibatches.
* :func:`probe`: :data:`~ppl_sgmcmc.adaptation.PROBE_BATCHES` minibatch gradients at one point, whose spread is the gradient
  noise that sets the first step size.
* :func:`when`: ``fn(operand)`` if a predicate holds: a branch, kept a branch under ``jax.vmap`` (the
  warm-up's adaptation is skipped after the warm-up by all chains at once).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax import custom_batching, lax, random, vmap

from ppl_sgmcmc.adaptation import (
    FIND_MODE_B2,
    FIND_MODE_FINAL_RATE,
    FIND_MODE_RATE,
    NEWTON_FRACTIONS,
    NEWTON_GROWTH,
    NEWTON_ITERATIONS,
    NEWTON_RADIUS,
    NEWTON_TOLERANCE,
    POWER_ITERATIONS,
    magnitude,
    newton_direction,
)

__all__ = ["find_mode", "hessian", "hessian_diagonal", "largest_curvature", "newton", "probe", "scale_by_magnitude", "when"]

GradientFn = Callable[[jax.Array, Any], Any]  # (flat position, batch) -> StochasticGradient


def batch_count(batches: Any) -> int:
    """The number of minibatches stacked in ``batches`` (a target's ``epoch``): the leading axis of its arrays, or
    1 for a model without subsampled plates, whose epoch is one full-data batch with no indices to stack."""
    leaves = jax.tree.leaves(batches)
    return leaves[0].shape[0] if leaves else 1


def _all_finite(x: jax.Array) -> jax.Array:
    return jnp.isfinite(jnp.sum(x))


def find_mode(gradient: GradientFn, draw: Callable[[jax.Array, Any], tuple[Any, Any]], batch_state: Any,
              flat: jax.Array, rng_key: jax.Array, steps: int) -> jax.Array:  # fmt: skip
    """``steps`` steps of Adam on the minibatch potential from ``flat``: an approximate mode.

    The learning rate decays from :data:`~ppl_sgmcmc.adaptation.FIND_MODE_RATE` to ``FIND_MODE_RATE × FIND_MODE_FINAL_RATE`` along
    a cosine (``optax.cosine_decay_schedule``); Adam's steps are about that long in every coordinate,
    whatever the gradient's scale, times the coordinate's magnitude where it exceeds 1
    (:func:`scale_by_magnitude`): a mode at 10⁴ (an outcome in dollars) or a start at 10⁴ is reached
    geometrically, in tens of steps, where a step of fixed length would need 10⁵. A step whose gradient is not
    finite moves back to the last point whose gradient was finite and leaves Adam's moments unchanged.

    :param gradient: ``(flat, batch) -> StochasticGradient`` of the minibatch potential.
    :param draw: ``(rng_key, batch_state) -> (batch, batch_state)``, the target's minibatch draw.
    :param batch_state: the minibatch sampler's state to start from.
    :param flat: the start, a flat position.
    :param rng_key: a PRNG key.
    :param steps: the number of optimiser steps.
    :return: the end point.

    **Example** (the mode of ``U(x) = |x - 3|²/2``)::

        >>> import jax, jax.numpy as jnp
        >>> from ppl_sgmcmc.numpyro.warmup import find_mode
        >>> from ppl_sgmcmc.rules import StochasticGradient
        >>> def gradient(x, batch):
        ...     return StochasticGradient(jnp.sum((x - 3) ** 2) / 2, x - 3, None)
        >>> x = find_mode(gradient, lambda key, s: (key, s), (), jnp.zeros(2), jax.random.PRNGKey(0), 1000)
        >>> [round(v, 2) for v in x.tolist()]
        [3.0, 3.0]
    """
    optimizer = optax.chain(optax.scale_by_adam(b2=FIND_MODE_B2), scale_by_magnitude(),
                            optax.scale_by_learning_rate(optax.cosine_decay_schedule(FIND_MODE_RATE, steps,
                                                                                     alpha=FIND_MODE_FINAL_RATE)))

    def body(carry, key):
        x, last_good, opt_state, batch_state = carry
        batch, batch_state = draw(key, batch_state)
        g = gradient(x, batch).grad
        finite = _all_finite(g)
        updates, new_opt_state = optimizer.update(jnp.where(finite, g, 0.0), opt_state, x)
        opt_state = jax.tree.map(lambda new, old: jnp.where(finite, new, old), new_opt_state, opt_state)
        x, last_good = jnp.where(finite, optax.apply_updates(x, updates), last_good), jnp.where(finite, x, last_good)
        return (x, last_good, opt_state, batch_state), None

    (x, _, _, _), _ = lax.scan(body, (flat, flat, optimizer.init(flat), batch_state), random.split(rng_key, steps))
    return x


def scale_by_magnitude() -> optax.GradientTransformation:
    """An ``optax`` transformation that multiplies each coordinate's update by ``max(1, |x|)`` for the current
    parameters ``x`` (:func:`ppl_sgmcmc.adaptation.magnitude`): after Adam's normalisation, steps relative to the
    coordinate's size where it is large, of absolute size where it is small.

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.numpyro.warmup import scale_by_magnitude
        >>> t = scale_by_magnitude()
        >>> updates, _ = t.update(jnp.ones(3), t.init(None), jnp.array([0.5, -4.0, 100.0]))
        >>> updates.tolist()
        [1.0, 4.0, 100.0]
    """

    def update(updates: Any, state: optax.EmptyState, params: Any = None) -> tuple[Any, optax.EmptyState]:
        return jax.tree.map(lambda u, x: u * magnitude(x), updates, params), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def hessian(gradient: GradientFn, batches: Any, flat: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The means over ``batches`` (a pytree of stacked minibatches) of the Hessian of the minibatch potential at
    ``flat``, ``(d, d)``, and of its gradient: the Jacobian of the gradient by forward-mode differentiation
    (``jax.jacfwd``), one minibatch at a time.

    **Example** (``U(x) = x₀² + 3 x₀ x₁ + 2 x₁²``, the same on every batch)::

        >>> import jax, jax.numpy as jnp
        >>> from ppl_sgmcmc.numpyro.warmup import hessian
        >>> from ppl_sgmcmc.rules import StochasticGradient
        >>> def energy(x):
        ...     return x[0] ** 2 + 3 * x[0] * x[1] + 2 * x[1] ** 2
        >>> def gradient(x, batch):
        ...     return StochasticGradient(energy(x), jax.grad(energy)(x), None)
        >>> H, g = hessian(gradient, jnp.arange(4), jnp.array([1.0, 0.0]))
        >>> H.tolist(), g.tolist()
        ([[2.0, 3.0], [3.0, 4.0]], [2.0, 3.0])
    """
    count = batch_count(batches)
    d = flat.shape[0]

    def body(totals, batch):
        grad_fn = lambda x: gradient(x, batch).grad  # noqa: E731
        grad, hvp = jax.linearize(grad_fn, flat)
        return (totals[0] + jax.vmap(hvp)(jnp.eye(d, dtype=flat.dtype)), totals[1] + grad), None

    (H, g), _ = lax.scan(body, (jnp.zeros((d, d), flat.dtype), jnp.zeros(d, flat.dtype)), batches, length=count)
    return H / count, g / count


def newton(gradient: GradientFn, batches: Any, flat: jax.Array, hessian_batches: Any = None) -> tuple[jax.Array, jax.Array]:
    """Up to :data:`~ppl_sgmcmc.adaptation.NEWTON_ITERATIONS` Newton steps from ``flat``
    (:func:`ppl_sgmcmc.adaptation.newton_direction`), each from the Hessian at its start point, on ``hessian_batches``
    (``batches`` when ``None``; fewer rows than ``batches`` on a large data set), and the mean gradient over
    ``batches``, and each the best of ``x - t step`` for ``t`` in :data:`~ppl_sgmcmc.adaptation.NEWTON_FRACTIONS`
    and ``t = 0``: the lowest mean minibatch energy over ``batches`` (the same minibatches for every candidate, a
    line search with common random numbers; their sums compensated, :func:`_compensated_add`). The Hessian is taken
    again at every step: far from the mode, where a model's curvature differs from the mode's (a logistic
    regression's saturated rows), steps with the first point's Hessian stall. The step's radius starts at
    :data:`~ppl_sgmcmc.adaptation.NEWTON_RADIUS` and grows by :data:`~ppl_sgmcmc.adaptation.NEWTON_GROWTH` after each
    step whose full length was best (a trust region); the steps stop once one moved less than
    :data:`~ppl_sgmcmc.adaptation.NEWTON_TOLERANCE` posterior sds. Returns the end point and the Hessian at the last
    step's start (one Hessian a step, traced once: the last step moved less than the tolerance, unless the steps ran
    out).

    **Example** (``U(x) = x²``: the full step from 1 lands at 0, where the next step stays)::

        >>> import jax, jax.numpy as jnp
        >>> from ppl_sgmcmc.numpyro.warmup import newton
        >>> from ppl_sgmcmc.rules import StochasticGradient
        >>> def gradient(x, batch):
        ...     return StochasticGradient(jnp.sum(x**2), 2 * x, None)
        >>> x, H = newton(gradient, jnp.arange(2), jnp.array([1.0]))
        >>> [round(v, 6) for v in x.tolist()], H.tolist()
        ([0.0], [[2.0]])
    """
    count = batch_count(batches)
    fractions = jnp.asarray((0.0, *NEWTON_FRACTIONS), flat.dtype)
    hessian_batches = batches if hessian_batches is None else hessian_batches

    def mean_gradient(x):
        def body(totals, batch):
            return _compensated_add(totals, gradient(x, batch).grad), None

        return lax.scan(body, (jnp.zeros_like(x), jnp.zeros_like(x)), batches, length=count)[0][0] / count

    def iteration(carry):
        k, x, g, radius, _, _ = carry
        H = hessian(gradient, hessian_batches, x)[0]
        step = newton_direction(H, g, radius)
        candidates = x - fractions[:, None] * step

        def body(totals, batch):
            out = vmap(lambda c: gradient(c, batch))(candidates)
            # each candidate's energy less the current point's, on the same minibatch: small terms, where the
            # whole energies (N/n times a minibatch's) would lose the candidates' differences to rounding
            reference = jnp.where(jnp.isfinite(out.energy[0]), out.energy[0], 0)
            return _compensated_add(totals, (out.energy - reference, out.grad)), None

        zeros = (jnp.zeros(fractions.shape, flat.dtype), jnp.zeros_like(candidates))
        (energies, grads), _ = lax.scan(body, (zeros, zeros), batches, length=count)[0]
        best = jnp.argmin(jnp.where(jnp.isfinite(energies), energies, jnp.inf))
        moved = fractions[best] * jnp.sqrt(jnp.abs(step @ H @ step))  # in posterior sds
        radius = jnp.where(best == 1, NEWTON_GROWTH * radius, radius)
        return k + 1, candidates[best], grads[best] / count, radius, moved, H

    def more(carry):
        k, _, _, _, moved, _ = carry
        return (k < NEWTON_ITERATIONS) & (moved >= NEWTON_TOLERANCE)

    d = flat.shape[0]
    start = (0, flat, mean_gradient(flat), jnp.asarray(NEWTON_RADIUS, flat.dtype), jnp.asarray(jnp.inf, flat.dtype),
             jnp.zeros((d, d), flat.dtype))  # fmt: skip
    _, x, _, _, _, H = lax.while_loop(more, iteration, start)
    return x, H


def _compensated_add(totals: tuple[Any, Any], terms: Any) -> tuple[Any, Any]:
    """Kahan's compensated summation, one term at a time: ``(sums, compensations)`` after adding ``terms`` (pytrees
    alike). The rounding error stays of the order of one term's, not of the number of terms times it, as for the
    Newton steps' sums over every row of a large data set (ten thousand minibatches of a million rows)."""
    sums, compensations = totals
    corrected = jax.tree.map(jnp.subtract, terms, compensations)
    new = jax.tree.map(jnp.add, sums, corrected)
    compensations = jax.tree.map(lambda n, s, c: (n - s) - c, new, sums, corrected)
    return new, compensations


def hessian_diagonal(gradient: GradientFn, batches: Any, flat: jax.Array, rng_key: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Hutchinson's estimate of the diagonal of the Hessian at ``flat``, ``E[z ⊙ (H z)]`` for Rademacher ``z``
    (Hutchinson, "A stochastic estimator of the trace of the influence matrix for Laplacian smoothing splines",
    Communications in Statistics 1990; Bekas, Kokiopoulou & Saad, "An estimator for the diagonal of a matrix",
    Applied Numerical Mathematics 2007), one probe per minibatch of ``batches``, and the mean gradient: ``d``
    times cheaper than :func:`hessian`. A diagonal Hessian is recovered exactly.

    **Example**::

        >>> import jax, jax.numpy as jnp
        >>> from ppl_sgmcmc.numpyro.warmup import hessian_diagonal
        >>> from ppl_sgmcmc.rules import StochasticGradient
        >>> def gradient(x, batch):  # U(x) = x₀² + 2 x₁²
        ...     return StochasticGradient(x[0] ** 2 + 2 * x[1] ** 2, jnp.array([2 * x[0], 4 * x[1]]), None)
        >>> diagonal, g = hessian_diagonal(gradient, jnp.arange(3), jnp.ones(2), jax.random.PRNGKey(0))
        >>> diagonal.tolist(), g.tolist()
        ([2.0, 4.0], [2.0, 4.0])
    """
    count = batch_count(batches)

    def body(totals, batch_and_key):
        batch, key = batch_and_key
        grad, hvp = jax.linearize(lambda x: gradient(x, batch).grad, flat)
        z = random.rademacher(key, flat.shape, flat.dtype)
        return (totals[0] + z * hvp(z), totals[1] + grad), None

    zeros = jnp.zeros_like(flat)
    (diagonal, g), _ = lax.scan(body, (zeros, zeros), (batches, random.split(rng_key, count)))
    return diagonal / count, g / count


def largest_curvature(gradient: GradientFn, batches: Any, flat: jax.Array, scale: jax.Array,
                      rng_key: jax.Array) -> jax.Array:  # fmt: skip
    """The largest curvature of the potential in the coordinates ``u = θ ⊘ scale``: the largest eigenvalue of
    ``diag(scale) H diag(scale)`` at ``flat``, by :data:`~ppl_sgmcmc.adaptation.POWER_ITERATIONS` power iterations with one
    Hessian-vector product each, on the minibatches of ``batches`` in turn. What caps the step size when only
    the Hessian's diagonal is known (:func:`hessian_diagonal`).

    **Example** (``H = [[2, 1], [1, 2]]``: eigenvalues 3 and 1)::

        >>> import jax, jax.numpy as jnp
        >>> from ppl_sgmcmc.numpyro.warmup import largest_curvature
        >>> from ppl_sgmcmc.rules import StochasticGradient
        >>> H = jnp.array([[2.0, 1.0], [1.0, 2.0]])
        >>> def gradient(x, batch):
        ...     return StochasticGradient(x @ H @ x / 2, H @ x, None)
        >>> round(float(largest_curvature(gradient, jnp.arange(4), jnp.zeros(2), jnp.ones(2), jax.random.PRNGKey(0))), 3)
        3.0
    """
    count = batch_count(batches)

    def body(v, index):
        batch = jax.tree.map(lambda b: b[index % count], batches)
        _, hvp = jax.linearize(lambda x: gradient(x, batch).grad, flat)
        w = scale * hvp(scale * v)
        return w / jnp.linalg.norm(w), jnp.vdot(v, w)

    v0 = random.normal(rng_key, flat.shape, flat.dtype)
    _, rayleigh = lax.scan(body, v0 / jnp.linalg.norm(v0), jnp.arange(POWER_ITERATIONS))
    return jnp.abs(rayleigh[-1])


def probe(gradient: GradientFn, batches: Any, flat: jax.Array) -> Any:
    """The stochastic gradients of ``batches`` (stacked minibatches) at ``flat``, stacked
    (a :class:`~ppl_sgmcmc.rules.StochasticGradient` of rows)."""
    return vmap(lambda batch: gradient(flat, batch), axis_size=batch_count(batches))(batches)


def when(pred: jax.Array, fn: Callable[[Any, Any], Any], operand: Any, args: Any = ()) -> Any:
    """``fn(operand, args)`` if ``pred``, else ``operand``, as a branch (``lax.cond``); ``fn`` must return a
    pytree like ``operand`` and take every traced value it uses through ``operand`` or ``args`` (not by
    closure). Under ``jax.vmap`` it stays a branch: ``fn`` runs (for every member, the result kept where
    ``pred``) only when some member's ``pred`` holds, instead of ``lax.cond``'s batching rule, which evaluates
    both sides for every member.

    **Example**::

        >>> import jax, jax.numpy as jnp
        >>> from ppl_sgmcmc.numpyro.warmup import when
        >>> def add(x, y):
        ...     return x + y
        >>> jax.vmap(lambda p, x: when(p, add, x, 1.0))(jnp.array([True, False]), jnp.zeros(2)).tolist()
        [1.0, 0.0]
    """

    @custom_batching.custom_vmap
    def branch(pred, operand, args):
        return lax.cond(pred, fn, lambda x, _: x, operand, args)

    @branch.def_vmap
    def branch_batched(
        axis_size: int, in_batched: Sequence[Any], pred: jax.Array, operand: Any, args: Any
    ) -> tuple[Any, Any]:
        pred_batched, operand_batched, args_batched = in_batched
        pred = pred if pred_batched else jnp.broadcast_to(pred, (axis_size,))
        # the operand is returned batched; the arguments' unbatched leaves (a model's data) stay unbatched: a
        # broadcast copy of them, made at every call whatever the branch, would cost more than the branch
        operand = jax.tree.map(
            lambda x, b: x if b else jnp.broadcast_to(x, (axis_size,) + jnp.shape(x)), operand, operand_batched
        )

        def some():
            new = vmap(fn, in_axes=(0, jax.tree.map(lambda b: 0 if b else None, args_batched)))(operand, args)
            return jax.tree.map(
                lambda a, b: jnp.where(jnp.reshape(pred, (axis_size,) + (1,) * (jnp.ndim(a) - 1)), a, b), new, operand
            )

        out = lax.cond(jnp.any(pred), some, lambda: operand)
        return out, jax.tree.map(lambda _: True, out)

    return branch(pred, operand, args)
