"""The stochastic gradient's noise, measured while a chain runs, and the noise ratio.

A minibatch gradient is ``∇Ũ_t(θ) = ∇U(θ) + e_t`` with noise ``e_t`` of covariance ``V(θ)``, about
``(N²/n)`` times the per-datum scores' covariance. One step of SGLD adds ``h e_t`` (variance ``h² V``) to
the noise it injects on purpose (variance ``2hτ``), so the chain samples a distribution wider than the
posterior; to first order in ``h``, on a Gaussian posterior in coordinates where it has unit covariance,
the variance along coordinate ``k`` grows by the factor ``1 + r_k`` with the **noise ratio**

    r_k = h c_k V_kk / (2 τ)

(Welling & Teh, "Bayesian Learning via Stochastic Gradient Langevin Dynamics", ICML 2011, §4, compare
the two noises the same way). ``c_k`` is the rule's own scale of the gradient in its step (1 for SGLD;
``1/A`` for SGHMC with friction ``A``, whose injected noise is ``2Ahτ``; ``1/D`` for SGNHT, whose thermostat
absorbs most of it; pSGLD's preconditioner ``G_k``; CSGLD's squared multiplier), given by each algorithm
(:meth:`ppl_sgmcmc.algorithms.Algorithm.noise_scale`). The chain reports ``r = max_k r_k``.

**The estimate costs no extra gradient.** Consecutive steps take their gradients at nearby points, with
independent minibatches: ``g_t - g_{t-1} = e_t - e_{t-1} + (∇U(θ_t) - ∇U(θ_{t-1}))``, so
``(g_t - g_{t-1})²/2`` estimates ``diag V`` plus half the squared change of the exact gradient between the
two points, which is small where a step moves the chain little compared with the posterior's scale (and
makes the estimate err on the large side, towards smaller steps, where it does not). :func:`update` keeps
a running mean of it (an exponential average once :data:`HORIZON` steps are in), in the rule's coordinates
(those of the adapted preconditioner, :mod:`ppl_sgmcmc.adaptation`).

Written once on the array-API subset shared by ``jax.numpy`` and ``torch``, like the update rules.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from array_api_compat import array_namespace

from ppl_sgmcmc.rules._types import Array

__all__ = ["HORIZON", "NoiseState", "init", "ratio", "rescale", "trace", "update"]

#: The running estimate averages about this many steps (an exponential average with weight 1/HORIZON,
#: after a plain mean of the first HORIZON steps).
HORIZON = 256


class NoiseState(NamedTuple):
    """The running estimate of the gradient noise of a chain.

    - **previous**: the last accepted step's gradient, in the rule's coordinates.
    - **variance**: the running estimate of ``c ⊙ diag V`` (see the module docstring), ``(d,)``.
    - **count**: the number of differences averaged so far (``int32``), and ``-1`` while ``previous`` is not
      a gradient of the current coordinates (at the start, and after the preconditioner changed).

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc import noise
        >>> state = noise.init(jnp.zeros(3))
        >>> state.variance.tolist(), int(state.count)
        ([0.0, 0.0, 0.0], -1)
    """

    previous: Array
    variance: Array
    count: Array  # type: ignore[assignment]  # (shadows tuple.count)


def init(like: Array) -> NoiseState:
    """No gradient seen: zero estimate, ``count = -1``, of the dtype, shape and namespace of ``like``."""
    xp = array_namespace(like)
    zeros = xp.zeros_like(like)
    return NoiseState(zeros, zeros, xp.full((), -1, dtype=xp.int32, device=getattr(like, "device", None)))


def update(state: NoiseState, gradient: Array, scale: Any, accepted: Any) -> tuple[NoiseState, Array]:
    """Add the gradient of an accepted step: ``((g - previous)²/2) ⊙ scale`` joins the running estimate.

    :param state: the :class:`NoiseState`.
    :param gradient: the step's stochastic gradient ``g_t`` in the rule's coordinates, ``(d,)``.
    :param scale: ``c``, the rule's scale of the gradient (a number or a ``(d,)`` array).
    :param accepted: whether the step was accepted (a rejected step's gradient is not used).
    :return: ``(new state, this step's term)``; the term is 0 where there was no previous gradient or the
        step was rejected (the warm-up's step-size tuning sums it over a window).

    **Example** (gradients 1, 3, 5: differences 2 and 2, so the estimate is 2²/2 = 2)::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc import noise
        >>> state = noise.init(jnp.zeros(1))
        >>> for g in (1.0, 3.0, 5.0):
        ...     state, term = noise.update(state, jnp.array([g]), 1.0, True)
        >>> state.variance.tolist(), int(state.count), term.tolist()
        ([2.0], 2, [2.0])
    """
    xp = array_namespace(gradient)
    accepted = xp.asarray(accepted, device=getattr(gradient, "device", None))
    valid = (state.count >= 0) & accepted
    diff = xp.subtract(gradient, state.previous)
    term = xp.where(valid, scale * diff * diff / 2, xp.zeros_like(diff))
    count = xp.where(valid, state.count + 1, state.count)
    weight = 1 / xp.astype(xp.clip(count, 1, HORIZON), gradient.dtype)  # a mean, then an exponential average
    variance = xp.where(valid, state.variance + weight * (term - state.variance), state.variance)
    previous = xp.where(accepted, gradient, state.previous)
    count = xp.where(accepted & (state.count < 0), xp.zeros_like(count), count)
    return NoiseState(previous, variance, count), term


def rescale(state: NoiseState, factor: Array) -> NoiseState:
    """The estimate in coordinates rescaled by ``factor`` (``u' = u / factor``, gradients ``factor ⊙ g``):
    the variance is multiplied by ``factor²`` and, unless ``factor`` is all ones, the previous gradient is
    forgotten (``count = -1``).

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc import noise
        >>> state = noise.NoiseState(jnp.ones(2), jnp.array([4.0, 1.0]), jnp.array(10))
        >>> new = noise.rescale(state, jnp.array([0.5, 2.0]))
        >>> new.variance.tolist(), int(new.count)
        ([1.0, 4.0], -1)
    """
    xp = array_namespace(state.variance)
    count = xp.where(xp.any(factor != 1), xp.full_like(state.count, -1), state.count)
    return NoiseState(state.previous, xp.multiply(state.variance, xp.multiply(factor, factor)), count)


def ratio(state: NoiseState, step_size: Any, temperature: Any) -> Array:
    """The noise ratio ``r = h max_k (c ⊙ diag V)_k / (2τ)`` of a step of size ``h`` at temperature ``τ``, from
    the running estimate of ``state``; NaN before the first difference was measured.

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc import noise
        >>> state = noise.NoiseState(jnp.zeros(2), jnp.array([100.0, 400.0]), jnp.array(300))
        >>> round(float(noise.ratio(state, 1e-3, 1.0)), 6), float(noise.ratio(noise.init(jnp.zeros(2)), 1e-3, 1.0))
        (0.2, nan)
    """
    xp = array_namespace(state.variance)
    value = step_size * xp.max(state.variance) / (2 * temperature)
    return xp.where(state.count > 0, value, xp.full_like(value, float("nan")))


def trace(state: NoiseState) -> Array:
    """The trace of the running estimate, ``Σ_k (c ⊙ diag V)_k``: the gradient-noise variance the chain
    measures, summed over the coordinates of the rule (those of the adapted preconditioner), each weighted by
    the rule's scale ``c`` (1 for SGLD); NaN before the first difference was measured. Over a leading axis
    of chains (NumPyro's vectorised chains), one value per chain. It is what a variance-reduced gradient
    (:mod:`ppl_sgmcmc.gradients`) reduces, at any step size: kernels report it as ``noise_variance``.

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc import noise
        >>> state = noise.NoiseState(jnp.zeros(2), jnp.array([100.0, 400.0]), jnp.array(300))
        >>> float(noise.trace(state)), float(noise.trace(noise.init(jnp.zeros(2))))
        (500.0, nan)
    """
    xp = array_namespace(state.variance)
    value = xp.sum(state.variance, axis=-1)
    return xp.where(state.count > 0, value, xp.full_like(value, float("nan")))
