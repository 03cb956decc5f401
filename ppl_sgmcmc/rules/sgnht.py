"""Stochastic gradient Nosé-Hoover thermostats: SGNHT (Ding et al., NeurIPS 2014) and the
multivariate mSGNHT with the Euler (mSGNHT-E) and symmetric-splitting (mSGNHT-S) integrators of
Li, Chen, Fan & Carin, *High-Order Stochastic Gradient Thermostats* (AAAI 2016).

State ``(θ, p, ξ)`` with diffusion ``D``; ``ξ`` starts at ``D``. The thermostat measures the
kinetic energy by ``k(p) = p ⊙ p`` (multivariate, ``ξ ∈ R^d``) or ``k(p) = pᵀp / d`` (scalar).

Euler (mSGNHT-E)::

    θ_{t+1} = θ_t + h p_t
    p_{t+1} = p_t - h ∇Ũ_t(θ_{t+1}) - h ξ_t ⊙ p_t + sqrt(2 D h τ) ζ
    ξ_{t+1} = ξ_t + h (k(p_{t+1}) - τ)

Symmetric splitting (mSGNHT-S)::

    A: θ_{t+½} = θ_t + (h/2) p_t               ξ_{t+½} = ξ_t + (h/2)(k(p_t) - τ)
    B: p ← exp(-ξ_{t+½} h/2) ⊙ p_t
    O: p ← p - h ∇Ũ_t(θ_{t+½}) + sqrt(2 D h τ) ζ
    B: p_{t+1} = exp(-ξ_{t+½} h/2) ⊙ p
    A: θ_{t+1} = θ_{t+½} + (h/2) p_{t+1}        ξ_{t+1} = ξ_{t+½} + (h/2)(k(p_{t+1}) - τ)

The ``(θ, p)`` moves are those of :mod:`ppl_sgmcmc.rules.sghmc` with the thermostat as friction.
"""

from typing import NamedTuple

from array_api_compat import array_namespace, device

from ppl_sgmcmc.rules import sghmc
from ppl_sgmcmc.rules._types import Array

NEEDS = "gradient"  # what the rule reads from the gradient (see ppl_sgmcmc.rules)


class SGNHTState(NamedTuple):
    """The momentum ``p`` and the thermostat ``ξ`` (a vector, or a scalar for SGNHT).

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.rules import sgnht
        >>> state = sgnht.SGNHTState(momentum=jnp.zeros(2), thermostat=jnp.ones(2))
        >>> state.thermostat.tolist()
        [1.0, 1.0]
    """

    momentum: Array
    thermostat: Array


def kinetic(momentum, multivariate):
    """The thermostat's measure of kinetic energy: ``p ⊙ p`` (``multivariate``) or ``pᵀp / d``.

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.rules import sgnht
        >>> p = jnp.array([1.0, 2.0])
        >>> sgnht.kinetic(p, multivariate=True).tolist(), float(sgnht.kinetic(p, multivariate=False))
        ([1.0, 4.0], 2.5)
    """
    xp = array_namespace(momentum)
    squared = momentum * momentum
    return squared if multivariate else xp.mean(squared)


def init(position, noise, diffusion, multivariate=True, temperature=1.0):
    """Momentum ``p ~ N(0, τ I)`` (``p = sqrt(τ) ζ``) and thermostat ``ξ = D``.

    :param position: the chain's start ``θ_0``; ``ξ`` takes its dtype (and its shape if ``multivariate``).
    :param noise: ``ζ``, a standard normal draw of the shape of ``position``.
    :param diffusion: ``D``, the injected noise's diffusion and the thermostat's start.
    :param multivariate: ``ξ ∈ R^d`` (mSGNHT, default) or a scalar (SGNHT).
    :param temperature: ``τ`` (default 1).
    :return: :class:`SGNHTState`.

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.rules import sgnht
        >>> x, noise = jnp.zeros(3), jnp.array([0.5, -1.0, 0.0])
        >>> sgnht.init(x, noise, diffusion=2.0).thermostat.tolist()
        [2.0, 2.0, 2.0]
        >>> sgnht.init(x, noise, diffusion=2.0, multivariate=False).thermostat.shape
        ()
    """
    xp = array_namespace(position)
    shape = position.shape if multivariate else ()
    thermostat = xp.full(shape, diffusion, dtype=position.dtype, device=device(position))
    return SGNHTState(temperature**0.5 * noise, thermostat)


def step(
    position, state, grad_fn, noise, step_size, diffusion, multivariate=True, integrator="splitting", temperature=1.0
):
    """One (m)SGNHT step with the Euler or the symmetric-splitting integrator (see the module docstring).

    :param position: ``θ``, a flat array (``jax.numpy`` or ``torch``).
    :param state: the :class:`SGNHTState` ``(p, ξ)``.
    :param grad_fn: ``θ -> StochasticGradient``; called once.
    :param noise: ``ζ``, a standard normal draw of the shape of ``position``.
    :param step_size: ``h``.
    :param diffusion: ``D > 0``.
    :param multivariate: a thermostat per coordinate (default) or one scalar thermostat.
    :param integrator: ``"splitting"`` (mSGNHT-S, default) or ``"euler"`` (mSGNHT-E).
    :param temperature: ``τ`` (default 1).
    :return: ``(new position, new state, gradient)``.

    **Example** (one step on ``U(x) = |x|²/2``, with ``jax.numpy`` and with ``torch`` arrays)::

        >>> import jax.numpy as jnp, torch
        >>> from ppl_sgmcmc.rules import StochasticGradient, sgnht
        >>> def grad_fn(x):  # U(x) = |x|²/2: ∇U = x; no data, so the score is -∇U
        ...     return StochasticGradient(energy=(x * x).sum() / 2, grad=x, score=-x)
        >>> x, noise = jnp.array([1.0, -2.0]), jnp.array([0.5, -0.5])
        >>> state = sgnht.init(x, noise, diffusion=1.0)
        >>> x, state, _ = sgnht.step(x, state, grad_fn, noise, step_size=0.1, diffusion=1.0)
        >>> [round(v, 4) for v in x.tolist()], [round(v, 4) for v in state.thermostat.tolist()]
        ([1.0535, -2.0487], [0.9287, 0.9237])
        >>> t, z = torch.tensor([1.0, -2.0]), torch.tensor([0.5, -0.5])
        >>> sgnht.step(t, sgnht.init(t, z, diffusion=1.0), grad_fn, z, step_size=0.1, diffusion=1.0)[0]
        tensor([ 1.0535, -2.0487])
    """
    momentum, thermostat = state
    if integrator == "euler":
        position, momentum, gradient = sghmc.euler(
            position, momentum, grad_fn, noise, step_size, thermostat, diffusion, temperature
        )
        thermostat = thermostat + step_size * (kinetic(momentum, multivariate) - temperature)
    else:
        half = step_size / 2
        thermostat = thermostat + half * (kinetic(momentum, multivariate) - temperature)
        position, momentum, gradient = sghmc.splitting(
            position, momentum, grad_fn, noise, step_size, thermostat, diffusion, temperature
        )
        thermostat = thermostat + half * (kinetic(momentum, multivariate) - temperature)
    return position, SGNHTState(momentum, thermostat), gradient
