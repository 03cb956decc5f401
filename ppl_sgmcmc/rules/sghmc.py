"""Stochastic gradient Hamiltonian Monte Carlo (Chen, Fox & Guestrin, ICML 2014) with identity
mass, and its symmetric-splitting integrator (Chen, Ding & Carin, NeurIPS 2015; Li et al., AAAI 2016).

The momentum integrators below take a general ``friction`` (a scalar, a vector the size of ``θ``,
or a symmetric ``d × d`` matrix ``Ξ``, whose ``Ξ p`` and ``exp(-Ξ h/2) p`` replace the products below) and
``diffusion`` ``D``; SGHMC is the case ``D = friction = A``, and the thermostat rules of
:mod:`ppl_sgmcmc.rules.sgnht` call them with the thermostat ``ξ`` as friction.

Euler (first order)::

    θ ← θ + h p
    p ← p - h ∇Ũ_t(θ) - h A ⊙ p + sqrt(2 D h τ) ζ

Symmetric splitting A-B-O-B-A (second order, one gradient per step)::

    A: θ ← θ + (h/2) p
    B: p ← exp(-A h/2) ⊙ p
    O: p ← p - h ∇Ũ_t(θ) + sqrt(2 D h τ) ζ
    B: p ← exp(-A h/2) ⊙ p
    A: θ ← θ + (h/2) p
"""

from typing import NamedTuple

from array_api_compat import array_namespace, device

from ppl_sgmcmc.rules._types import Array

NEEDS = "gradient"  # what the rule reads from the gradient (see ppl_sgmcmc.rules)


class SGHMCState(NamedTuple):
    """The momentum ``p`` (identity mass), an array of the shape of ``θ``.

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.rules import sghmc
        >>> sghmc.SGHMCState(momentum=jnp.zeros(2)).momentum.shape
        (2,)
    """

    momentum: Array


def init(position, noise, temperature=1.0):
    """Draw the initial momentum ``p ~ N(0, τ I)`` from the standard normal ``noise``: ``p = sqrt(τ) ζ``.

    :param position: the chain's start ``θ_0`` (unused).
    :param noise: ``ζ``, a standard normal draw of the shape of ``position``.
    :param temperature: ``τ`` (default 1).
    :return: :class:`SGHMCState`.

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.rules import sghmc
        >>> sghmc.init(jnp.zeros(2), jnp.array([0.5, -1.0]), temperature=4.0).momentum.tolist()
        [1.0, -2.0]
    """
    del position
    return SGHMCState(temperature**0.5 * noise)


def damping(friction, time, like):
    """``exp(-friction t)``: coordinate by coordinate for a scalar or vector friction; for a symmetric matrix
    ``Ξ``, its matrix exponential through the eigendecomposition ``Ξ = Q diag(λ) Qᵀ``: ``Q diag(exp(-λ t)) Qᵀ``.
    ``like``: an array of the backend and device to use. Apply it with :func:`times`.

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.rules import sghmc
        >>> p = jnp.array([1.0, 1.0])
        >>> [round(v, 4) for v in sghmc.times(sghmc.damping(jnp.array([2.0, 0.0]), 0.5, p), p).tolist()]
        [0.3679, 1.0]
        >>> [round(v, 4) for v in sghmc.times(sghmc.damping(jnp.ones((2, 2)), 0.5, p), p).tolist()]
        [0.3679, 0.3679]
    """
    xp = array_namespace(like)
    friction = xp.asarray(friction, device=device(like))
    if friction.ndim == 2:
        values, vectors = xp.linalg.eigh(friction)
        return (vectors * xp.exp(-values * time)) @ vectors.T
    return xp.exp(-friction * time)


def times(operator, momentum):
    """``operator p``: the matrix-vector product for a ``d × d`` operator, else coordinate by coordinate."""
    return operator @ momentum if getattr(operator, "ndim", 0) == 2 else operator * momentum


def euler(position, momentum, grad_fn, noise, step_size, friction, diffusion, temperature):
    """First-order Euler move of ``(θ, p)``; returns ``(θ, p, gradient)``::

        θ ← θ + h p
        p ← p - h ∇Ũ_t(θ) - h friction ⊙ p + sqrt(2 D h τ) ζ

    The gradient is taken at the new ``θ``. ``friction``: a scalar, an array of the shape of ``θ``
    or a symmetric ``d × d`` matrix (:func:`damping`);
    ``diffusion``: ``D``.

    **Example** (no friction and no noise: a symplectic Euler step on ``U(x) = x²/2``)::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.rules import StochasticGradient, sghmc
        >>> def grad_fn(x):  # U(x) = |x|²/2: ∇U = x; no data, so the score is -∇U
        ...     return StochasticGradient(energy=(x * x).sum() / 2, grad=x, score=-x)
        >>> x, p, _ = sghmc.euler(jnp.array([1.0]), jnp.array([0.0]), grad_fn, jnp.array([0.0]), 0.5,
        ...                       friction=0.0, diffusion=0.0, temperature=1.0)
        >>> x.tolist(), p.tolist()  # θ = 1 + 0.5·0, p = 0 - 0.5·θ
        ([1.0], [-0.5])
    """
    position = position + step_size * momentum
    gradient = grad_fn(position)
    momentum = (
        momentum
        - step_size * gradient.grad
        - times(step_size * friction, momentum)
        + (2 * diffusion * step_size * temperature) ** 0.5 * noise
    )
    return position, momentum, gradient


def splitting(position, momentum, grad_fn, noise, step_size, friction, diffusion, temperature):
    """Second-order symmetric-splitting move (A-B-O-B-A) of ``(θ, p)``; returns ``(θ, p, gradient)``::

        A: θ ← θ + (h/2) p;  B: p ← exp(-friction h/2) ⊙ p;  O: p ← p - h ∇Ũ_t(θ) + sqrt(2 D h τ) ζ
        B: p ← exp(-friction h/2) ⊙ p;  A: θ ← θ + (h/2) p

    The gradient is taken at the midpoint ``θ + (h/2) p``. ``friction``: a scalar, an array of the
    shape of ``θ`` or a symmetric ``d × d`` matrix (:func:`damping`); ``diffusion``: ``D``. With no friction
    and no noise it is the leapfrog integrator.

    **Example** (leapfrog on ``U(x) = x²/2``: the energy ``U + p²/2`` is nearly conserved)::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.rules import StochasticGradient, sghmc
        >>> def grad_fn(x):  # U(x) = |x|²/2: ∇U = x; no data, so the score is -∇U
        ...     return StochasticGradient(energy=(x * x).sum() / 2, grad=x, score=-x)
        >>> x, p = jnp.array([1.0]), jnp.array([0.0])
        >>> for _ in range(100):
        ...     x, p, _ = sghmc.splitting(x, p, grad_fn, jnp.zeros(1), 0.1, friction=0.0, diffusion=0.0, temperature=1.0)
        >>> round(float(x[0] ** 2 / 2 + p[0] ** 2 / 2), 2)
        0.5
    """
    half = step_size / 2
    damped = damping(friction, half, position)
    position = position + half * momentum
    momentum = times(damped, momentum)
    gradient = grad_fn(position)
    momentum = momentum - step_size * gradient.grad + (2 * diffusion * step_size * temperature) ** 0.5 * noise
    momentum = times(damped, momentum)
    position = position + half * momentum
    return position, momentum, gradient


INTEGRATORS = {"euler": euler, "splitting": splitting}


def step(position, state, grad_fn, noise, step_size, friction, integrator="splitting", temperature=1.0,
         gradient_noise=0.0):
    """One SGHMC step with friction ``C = A + B̂`` and injected noise ``2 A h τ``, by :func:`splitting`
    (default) or :func:`euler`.

    ``B̂`` (``gradient_noise``) is Chen, Fox & Guestrin's estimate of the stochastic gradient's own diffusion,
    ``h V/(2τ)`` for a gradient noise of covariance ``V``: their SGHMC injects ``2(C - B̂)hτ`` with a friction
    ``C``, so that the injected and the gradient's noise together match the friction and the chain keeps the
    posterior. Here the injected noise stays ``2Ahτ`` and the friction grows to ``C = A + B̂``, which any ``B̂ ≥ 0``
    allows. With ``B̂ = 0`` (the default) it is the algorithm as most of its users run it (the diffusion equals
    the friction ``A``).

    :param position: ``θ``, a flat array (``jax.numpy`` or ``torch``).
    :param state: the :class:`SGHMCState` (the momentum ``p``).
    :param grad_fn: ``θ -> StochasticGradient``; called once.
    :param noise: ``ζ``, a standard normal draw of the shape of ``position``.
    :param step_size: ``h``.
    :param friction: ``A > 0``, a scalar or an array of the shape of ``θ``.
    :param integrator: ``"splitting"`` (default) or ``"euler"``.
    :param temperature: ``τ`` (default 1).
    :param gradient_noise: ``B̂ ≥ 0``, a scalar or an array of the shape of ``θ`` (default 0).
    :return: ``(new position, new state, gradient)``; the gradient is taken at the integrator's point
        (the midpoint for splitting, the new position for Euler).

    **Example** (one step on ``U(x) = |x|²/2``, with ``jax.numpy`` and with ``torch`` arrays; a ``B̂`` adds to the
    friction alone)::

        >>> import jax.numpy as jnp, torch
        >>> from ppl_sgmcmc.rules import StochasticGradient, sghmc
        >>> def grad_fn(x):  # U(x) = |x|²/2: ∇U = x; no data, so the score is -∇U
        ...     return StochasticGradient(energy=(x * x).sum() / 2, grad=x, score=-x)
        >>> x, noise = jnp.array([1.0, -2.0]), jnp.array([0.5, -0.5])
        >>> state = sghmc.init(x, noise)
        >>> x, state, _ = sghmc.step(x, state, grad_fn, noise, step_size=0.1, friction=1.0)
        >>> [round(v, 4) for v in x.tolist()], [round(v, 4) for v in state.momentum.tolist()]
        ([1.0534, -2.0486], [0.5676, -0.4725])
        >>> t = torch.tensor([1.0, -2.0])
        >>> z = torch.tensor([0.5, -0.5])
        >>> sghmc.step(t, sghmc.init(t, z), grad_fn, z, step_size=0.1, friction=1.0)[0]
        tensor([ 1.0534, -2.0486])
        >>> x, noise = jnp.array([1.0, -2.0]), jnp.array([0.5, -0.5])
        >>> _, damped, _ = sghmc.step(x, sghmc.init(x, noise), grad_fn, noise, 0.1, friction=1.0, gradient_noise=1.0)
        >>> [round(v, 4) for v in damped.momentum.tolist()]
        [0.5189, -0.4285]
    """
    position, momentum, gradient = INTEGRATORS[integrator](
        position, state.momentum, grad_fn, noise, step_size, friction + gradient_noise, friction, temperature
    )
    return position, SGHMCState(momentum), gradient
