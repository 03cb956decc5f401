"""Step-size schedules: plain callables of the step index ``t`` (0-based, warm-up included).

Any callable ``t -> h_t`` works as a kernel's ``step_size``, so optax's schedules
(``optax.exponential_decay``, ``optax.cosine_decay_schedule``, ...) can be passed unchanged;
the three below are the ones the SG-MCMC literature uses. Choosing a step size: the *Step sizes* page of
the user guide (``docs/src/user-guide/step-sizes.md``).

References:

* M. Welling and Y. W. Teh. *Bayesian Learning via Stochastic Gradient Langevin Dynamics.* ICML 2011.
* C. Chen, N. Ding and L. Carin. *On the Convergence of Stochastic Gradient MCMC Algorithms with
  High-Order Integrators.* NeurIPS 2015.
* R. Zhang, C. Li, J. Zhang, C. Chen and A. G. Wilson. *Cyclical Stochastic Gradient MCMC for Bayesian
  Deep Learning.* ICLR 2020.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # JAX and optax are imported when a schedule needs them (the Pyro backend needs neither)
    import optax

__all__ = ["constant", "cosine_cycle", "cyclical", "polynomial"]


def constant(step_size: float) -> optax.Schedule:
    """``h_t = h`` (optax's :func:`optax.constant_schedule`).

    :param step_size: ``h``.
    :return: the schedule ``t -> h``.

    **Example**::

        >>> float(constant(1e-3)(10_000))
        0.001
    """
    import optax

    return optax.constant_schedule(step_size)


def polynomial(a: float, b: float, gamma: float) -> optax.Schedule:
    """``h_t = a (b + t)^(-γ)`` (Welling & Teh, ICML 2011), with ``γ ∈ (0.5, 1]`` for consistency of SGLD;
    the optimal decay is ``t^(-1/(K+1))`` for a ``K``-th order integrator (Chen, Ding & Carin, NeurIPS 2015).

    :param a: the scale ``a > 0``.
    :param b: the offset ``b > 0`` (``h_0 = a b^(-γ)``).
    :param gamma: the decay exponent ``γ >= 0``.
    :return: the schedule ``t -> h_t``.

    **Example** (``SGLD(model, step_size=polynomial(1e-2, 10.0, 0.55))``)::

        >>> h = polynomial(a=1.0, b=1.0, gamma=1.0)
        >>> h(0), h(1), h(9)
        (1.0, 0.5, 0.1)
    """
    if not b > 0:
        raise ValueError(f"polynomial schedule: `b` must be positive so that h_0 is finite, got {b}.")
    if not gamma >= 0:
        raise ValueError(f"polynomial schedule: the decay exponent `gamma` must be non-negative, got {gamma}.")
    return lambda t: a * (b + t) ** (-gamma)


def cyclical(step_size: float, num_steps: int, num_cycles: int) -> optax.Schedule:
    """Cosine cyclical schedule of Zhang, Li, Zhang, Chen & Wilson (ICLR 2020), restarting ``num_cycles``
    times in ``num_steps``: ``h_t = h/2 · (cos(π mod(t, L) / L) + 1)`` with ``L = ceil(num_steps / num_cycles)``.

    :param step_size: ``h``, the step size at the start of each cycle.
    :param num_steps: the number of steps the cycles cover (warm-up included).
    :param num_cycles: the number of cycles, ``0 < num_cycles <= num_steps``.
    :return: the schedule ``t -> h_t``.

    **Example** (two cycles of 50 steps)::

        >>> h = cyclical(1e-2, num_steps=100, num_cycles=2)
        >>> [round(float(h(t)), 4) for t in (0, 25, 49, 50)]
        [0.01, 0.005, 0.0, 0.01]
    """
    if not (isinstance(num_cycles, int) and 0 < num_cycles <= num_steps):
        raise ValueError(f"cyclical schedule: need 0 < num_cycles <= num_steps, got {num_cycles} and {num_steps}.")
    import jax.numpy as jnp

    cycle_length = math.ceil(num_steps / num_cycles)
    return lambda t: step_size * cosine_cycle((t % cycle_length) / cycle_length, jnp)


def cosine_cycle(r: Any, xp: Any = math) -> Any:
    """The cosine cycle's factor at the position ``r ∈ [0, 1)`` in the cycle: ``(cos(π r) + 1)/2``, computed as
    ``cos²(π r / 2)``, which stays positive in single precision up to the cycle's last step (``cos(π r) + 1``
    rounds to 0 there in ``float32`` for cycles of some thousand steps: a step size of 0).

    :param r: the position, a number or an array.
    :param xp: the array namespace of ``r`` (default :mod:`math`, for a number).

    **Example**::

        >>> [round(cosine_cycle(r), 4) for r in (0.0, 0.25, 0.5, 0.75)]
        [1.0, 0.8536, 0.5, 0.1464]
        >>> import numpy as np
        >>> bool(cosine_cycle(np.float32(1 - 1e-4), np) > 0)
        True
    """
    return xp.cos(math.pi / 2 * r) ** 2
