"""Santa, the stochastic annealing thermostat with adaptive momentum (Chen, Carlson, Gan, Li & Carin,
"Bridging the Gap between Stochastic Gradient MCMC and Stochastic Optimization", AISTATS 2016), with the
Euler scheme of the paper's Algorithm 1.

Santa is mSGNHT (:mod:`ppl_sgmcmc.rules.sgnht`) preconditioned by RMSprop and run at the inverse
temperature ``β_t``, which grows to infinity: it starts as a sampler of ``exp(-β U)`` and ends as an
optimiser that finds the global mode. State ``(θ, p, ξ, V)``: momentum ``p``, a thermostat ``ξ`` per
coordinate, the RMSprop average ``V`` (:mod:`ppl_sgmcmc.rules.rms`). With ``N`` the data size (1 for a
``potential_fn``), decay ``σ``, regulariser ``λ``, step size ``h`` and ``T_t = 1/β_t`` while the chain
explores (step ``t < num_exploration``), ``T_t = 0`` once it refines, one step::

    f = ∇Ũ_t(θ)
    V' = f⊙f / N² where V = 0 (a coordinate's first gradient), else V
    V ← σ V' + (1 - σ) f⊙f / N²
    g' = 1 ⊘ sqrt(λ + sqrt(V'));   g = 1 ⊘ sqrt(λ + sqrt(V))
    ξ ← ξ + h (p⊙p - T_t)
    p ← (1 - h ξ)⊙p - h g⊙f + sqrt(2 h T_t g') ⊙ ζ   [+ T_t (1 - g'⊘g) ⊘ p_old with curvature_term]
    θ ← θ + h g⊙p

This is Algorithm 1 in the sampler's variables: the paper's learning rate is ``η = h²``, its momentum
``u = h p`` and its thermostat ``α = h ξ`` (its ``α_0 = sqrt(η) C``, read for the per-datum gradient, is
``ξ_0 = C sqrt(N)``: see :func:`init`). Three differences from the listing as printed:

- The noise is ``sqrt(2 h T g')`` in ``p``, i.e. ``sqrt(2 η^{3/2} g'/β)`` in ``u``: the discretisation of the
  paper's SDE (with ``G₂ = g``, and its drift term ``G₁(Ξ - G₂)∇G₂`` dropped, as the paper's algorithm does), and what
  the authors' implementations use. The listing has ``η`` for ``η^{3/2}`` there.
- ``T_t (1 - g'⊘g) ⊘ p_old``, the listing's finite-difference estimate of the drift ``T ∇_θ G₁(θ)`` that the
  θ-dependent preconditioner needs, divides by the momentum and can throw the chain far (see
  :class:`ppl_sgmcmc.algorithms.Santa`): it is added only with ``curvature_term=True``. The authors'
  implementation leaves it out.
- In refinement the listing freezes ``ξ``; here the thermostat runs on at ``T = 0`` (``ξ`` only grows, by
  ``h p⊙p``), as the authors' refinement-stage implementation does. ``ξ`` fluctuates by about ``sqrt(T)`` around
  its mean ``≈ g`` while exploring, so it can end the exploration negative, and a frozen negative ``ξ`` makes
  the refinement diverge (``|1 - h ξ| > 1``): 4% of 200 double-well runs did, none with the thermostat on.

The first step seeds ``V`` with its own gradient (``V' = f⊙f/N²``, as the authors' implementation does), so
that ``g' = g`` then: ``V = 0`` would make ``g' = λ^{-1/2}``.

With ``β_t = 1`` and no refinement the chain samples ``exp(-U)`` (up to the discretisation and the noise
of the preconditioner, like pSGLD); the thermostat absorbs the gradient noise as mSGNHT's does. The
refinement is deterministic: momentum SGD with the RMSprop preconditioner and a per-coordinate momentum
decay ``1 - h ξ`` that starts where the exploration left it.
"""

from collections.abc import Callable
from typing import Any, NamedTuple

from array_api_compat import array_namespace, device

from ppl_sgmcmc.rules import rms
from ppl_sgmcmc.rules._types import Array

NEEDS = "gradient"  # what the rule reads from the gradient (see ppl_sgmcmc.rules)

#: The annealing exponent of the authors' implementations: ``β_t = t^0.5`` (1-based ``t``).
ANNEALING_RATE = 0.5


class SantaState(NamedTuple):
    """The momentum ``p``, the thermostat ``ξ`` and the RMSprop average ``V``, each of the shape of ``θ``.

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.rules import santa
        >>> state = santa.SantaState(momentum=jnp.zeros(2), thermostat=jnp.ones(2), square_avg=jnp.zeros(2))
        >>> state.thermostat.tolist()
        [1.0, 1.0]
    """

    momentum: Array
    thermostat: Array
    square_avg: Array


def annealing(rate: float = ANNEALING_RATE, scale: float = 1.0) -> Callable[[Any], Any]:
    """The inverse-temperature schedule ``β_t = (1 + t/scale)^rate`` of the 0-based step index ``t``: with
    ``scale = 1`` the paper's ``t^rate`` of its 1-based ``t``. ``β_0 = 1``, growing without bound; a larger
    ``scale`` anneals more slowly, for a smaller step size (the temperature falls per step, not per unit of
    the dynamics' time ``h t``).

    :param rate: the exponent, positive (default :data:`ANNEALING_RATE`, 0.5).
    :param scale: the steps over which ``β`` first doubles its base, positive (default 1).
    :return: the schedule ``t -> β_t``.

    **Example**::

        >>> from ppl_sgmcmc.rules import santa
        >>> beta = santa.annealing()
        >>> beta(0), beta(3), beta(99), santa.annealing(scale=100.0)(300)
        (1.0, 2.0, 10.0, 2.0)
    """
    if not rate > 0:
        raise ValueError(f"annealing: the exponent `rate` must be positive (β_t grows to infinity), got {rate!r}.")
    if not scale > 0:
        raise ValueError(f"annealing: `scale` must be positive, got {scale!r}.")
    return lambda t: (1 + t / scale) ** rate


def preconditioner(square_avg, eps):
    """Santa's RMSprop preconditioner ``g = 1 ⊘ sqrt(λ + sqrt(V))``.

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.rules import santa
        >>> santa.preconditioner(jnp.array([0.0, 16.0]), eps=1.0).tolist()
        [1.0, 0.4472135901451111]
    """
    xp = array_namespace(square_avg)
    return 1 / xp.sqrt(eps + xp.sqrt(square_avg))


def init(position, noise, initial_thermostat=5.0, inverse_temperature=1.0, data_size=1):
    """Momentum ``p ~ N(0, T_0 I)`` (``p = sqrt(T_0) ζ``, ``T_0 = 1/β_0``), thermostat ``ξ_0 = C sqrt(N)``,
    ``V = 0``.

    ``C`` is the paper's constant in ``α_0 = sqrt(η) C``, read for the learning rate ``η_1`` of the per-datum
    (minibatch-mean) gradient ``f/N``, as deep-learning implementations of Santa differentiate it (a Keras port
    of the authors' Theano code takes the mean loss and has no ``1/N²`` in ``V``): ``η_1 = N h²`` and
    ``α = h ξ``, so ``ξ_0 = C sqrt(N)``. The start is then the same for every ``N`` (the exploration's first steps do not
    depend on how the loss is scaled), and ``ξ_0 = C`` for a ``potential_fn`` (``N = 1``).

    :param position: the chain's start ``θ_0``; the state takes its shape and dtype.
    :param noise: ``ζ``, a standard normal draw of the shape of ``position``.
    :param initial_thermostat: ``C`` (default 5).
    :param inverse_temperature: ``β_0`` (default 1).
    :param data_size: ``N`` (default 1).
    :return: :class:`SantaState`.

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.rules import santa
        >>> state = santa.init(jnp.zeros(2), jnp.array([1.0, -2.0]), initial_thermostat=3.0, inverse_temperature=4.0)
        >>> state.momentum.tolist(), state.thermostat.tolist(), state.square_avg.tolist()
        ([0.5, -1.0], [3.0, 3.0], [0.0, 0.0])
        >>> santa.init(jnp.zeros(2), jnp.zeros(2), initial_thermostat=3.0, data_size=100).thermostat.tolist()
        [30.0, 30.0]
    """
    xp = array_namespace(position)
    thermostat = xp.full(position.shape, initial_thermostat * data_size**0.5, dtype=position.dtype, device=device(position))
    return SantaState((1 / inverse_temperature) ** 0.5 * noise, thermostat, rms.init(position))


def step(
    position, state, grad_fn, noise, step_size, inverse_temperature=1.0, num_exploration=0, step_index=0,
    decay=0.999, eps=1e-8, data_size=1, curvature_term=False,
):  # fmt: skip
    """One Santa step (Euler scheme; see the module docstring): exploration at ``T = 1/β`` while ``step_index <
    num_exploration``, refinement at ``T = 0`` afterwards.

    :param position: ``θ``, a flat array (``jax.numpy`` or ``torch``).
    :param state: the :class:`SantaState` ``(p, ξ, V)``.
    :param grad_fn: ``θ -> StochasticGradient``; called once, at ``θ``.
    :param noise: ``ζ``, a standard normal draw of the shape of ``position``.
    :param step_size: ``h`` (the paper's learning rate is ``η = h²``).
    :param inverse_temperature: ``β_t`` at this step (default 1).
    :param num_exploration: the number of exploration steps (default 0: refinement only).
    :param step_index: the chain's 0-based step count ``t``.
    :param decay: the RMSprop decay ``σ`` (default 0.999).
    :param eps: the regulariser ``λ`` (default 1e-8).
    :param data_size: ``N``, which scales the gradients in ``V`` (default 1).
    :param curvature_term: add ``T_t (1 - g' ⊘ g) ⊘ p`` in exploration (default ``False``).
    :return: ``(new position, new state, gradient at the old position)``.

    **Example** (two steps on ``U(x) = |x|²/2`` with ``jax.numpy`` and ``torch``: the first explores, the
    second refines)::

        >>> import jax.numpy as jnp, torch
        >>> from ppl_sgmcmc.rules import StochasticGradient, santa
        >>> def grad_fn(x):  # U(x) = |x|²/2: ∇U = x
        ...     return StochasticGradient(energy=(x * x).sum() / 2, grad=x, score=None)
        >>> for x, noise in ((jnp.array([1.0, -2.0]), jnp.array([0.5, -0.5])),
        ...                  (torch.tensor([1.0, -2.0]), torch.tensor([0.5, -0.5]))):
        ...     state = santa.init(x, noise)
        ...     for t in range(2):
        ...         x, state, _ = santa.step(x, state, grad_fn, noise, 0.1, num_exploration=1, step_index=t)
        ...     print([round(v, 4) for v in x.tolist()], [round(v, 4) for v in state.thermostat.tolist()])
        [1.0465, -2.0219] [4.9392, 4.934]
        [1.0465, -2.0219] [4.9392, 4.934]
    """
    xp = array_namespace(position)
    momentum, thermostat, square_avg = state
    gradient = grad_fn(position)
    scaled = gradient.grad / data_size
    previous = xp.where(square_avg == 0, scaled * scaled, square_avg)
    square_avg = rms.update(previous, scaled, decay)
    g_previous, g = preconditioner(previous, eps), preconditioner(square_avg, eps)
    exploring = xp.asarray(step_index < num_exploration, device=device(position))
    temperature = xp.astype(exploring, position.dtype) / inverse_temperature  # T_t; 0 in refinement
    thermostat = thermostat + step_size * (momentum * momentum - temperature)
    momentum = (
        (1 - step_size * thermostat) * momentum
        - step_size * g * gradient.grad
        + xp.sqrt(2 * step_size * temperature * g_previous) * noise
    )
    if curvature_term:
        momentum = momentum + xp.where(exploring, temperature * (1 - g_previous / g) / state.momentum, 0.0)
    return position + step_size * g * momentum, SantaState(momentum, thermostat, square_avg), gradient
