"""Stochastic gradient Nosé-Hoover thermostats: SGNHT (Ding et al., NeurIPS 2014) and the
multivariate mSGNHT with the Euler (mSGNHT-E) and symmetric-splitting (mSGNHT-S) integrators of
Li, Chen, Fan & Carin, *High-Order Stochastic Gradient Thermostats* (AAAI 2016).

State ``(θ, p, ξ)`` with diffusion ``D``; ``ξ`` starts at ``D``. The thermostat measures the
kinetic energy by ``k(p) = p ⊙ p`` (multivariate, ``ξ ∈ R^d``) or ``k(p) = pᵀp / d`` (scalar); ``τ``
below is ``τ I`` for the matrix thermostat.

The matrix thermostat ``Ξ ∈ R^{d×d}`` (``k(p) = p pᵀ``, starting at ``D I``) is the Nosé-Hoover thermostat
of the full kinetic-energy tensor: the friction ``Ξ p`` and the B-step's ``exp(-Ξ h/2) p``
(:func:`ppl_sgmcmc.rules.sghmc.damping`) replace the products with ``ξ``. At equilibrium the multivariate
thermostat settles at ``ξ_k ≈ D + h V_kk / 2`` for a gradient noise of covariance ``V`` and absorbs its
variances only; the matrix one settles at ``Ξ ≈ D I + h V / 2`` and absorbs its covariances too, at
``O(d²)`` memory and an ``O(d³)`` eigendecomposition a step (a generalisation of the thermostats of Ding et
al. and Li et al., measured in the library's benchmarks).

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
    """The momentum ``p`` and the thermostat ``ξ`` (a vector, a scalar for SGNHT, or a ``d × d`` matrix).

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.rules import sgnht
        >>> state = sgnht.SGNHTState(momentum=jnp.zeros(2), thermostat=jnp.ones(2))
        >>> state.thermostat.tolist()
        [1.0, 1.0]
    """

    momentum: Array
    thermostat: Array


THERMOSTATS = ("multivariate", "scalar", "matrix")


def excess(momentum, thermostat="multivariate", temperature=1.0):
    """The thermostat's force ``k(p) - τ``: ``k(p) = p ⊙ p`` (``"multivariate"``), ``pᵀp / d`` (``"scalar"``)
    or ``p pᵀ`` (``"matrix"``, less ``τ I``).

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.rules import sgnht
        >>> p = jnp.array([1.0, 2.0])
        >>> sgnht.excess(p).tolist(), float(sgnht.excess(p, "scalar")), sgnht.excess(p, "matrix").tolist()
        ([0.0, 3.0], 1.5, [[0.0, 2.0], [2.0, 3.0]])
    """
    xp = array_namespace(momentum)
    if thermostat == "matrix":
        eye = xp.eye(momentum.shape[0], dtype=momentum.dtype, device=device(momentum))
        return momentum[:, None] * momentum[None, :] - temperature * eye
    squared = momentum * momentum
    return (squared if thermostat == "multivariate" else xp.mean(squared)) - temperature


def init(position, noise, diffusion, thermostat="multivariate", temperature=1.0):
    """Momentum ``p ~ N(0, τ I)`` (``p = sqrt(τ) ζ``) and thermostat ``ξ = D`` (``D I`` for the matrix one).

    :param position: the chain's start ``θ_0``; ``ξ`` takes its dtype and device.
    :param noise: ``ζ``, a standard normal draw of the shape of ``position``.
    :param diffusion: ``D``, the injected noise's diffusion and the thermostat's start.
    :param thermostat: ``"multivariate"`` (``ξ ∈ R^d``, mSGNHT, default), ``"scalar"`` (SGNHT) or ``"matrix"``
        (``Ξ ∈ R^{d×d}``).
    :param temperature: ``τ`` (default 1).
    :return: :class:`SGNHTState`.

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.rules import sgnht
        >>> x, noise = jnp.zeros(3), jnp.array([0.5, -1.0, 0.0])
        >>> sgnht.init(x, noise, diffusion=2.0).thermostat.tolist()
        [2.0, 2.0, 2.0]
        >>> sgnht.init(x, noise, diffusion=2.0, thermostat="scalar").thermostat.shape
        ()
        >>> sgnht.init(x, noise, diffusion=2.0, thermostat="matrix").thermostat.shape
        (3, 3)
    """
    return SGNHTState(temperature**0.5 * noise, start(position, diffusion, thermostat))


def start(position, diffusion, thermostat="multivariate"):
    """The thermostat's start: ``D`` (a vector of the shape of ``position``, or a scalar) or ``D I``.

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.rules import sgnht
        >>> sgnht.start(jnp.zeros(2), 3.0, "matrix").tolist()
        [[3.0, 0.0], [0.0, 3.0]]
    """
    xp = array_namespace(position)
    dtype, dev = position.dtype, device(position)
    if thermostat == "matrix":
        return diffusion * xp.eye(position.shape[0], dtype=dtype, device=dev)
    return xp.full(position.shape if thermostat == "multivariate" else (), diffusion, dtype=dtype, device=dev)


def step(
    position,
    state,
    grad_fn,
    noise,
    step_size,
    diffusion,
    thermostat="multivariate",
    integrator="splitting",
    temperature=1.0,
):
    """One (m)SGNHT step with the Euler or the symmetric-splitting integrator (see the module docstring).

    :param position: ``θ``, a flat array (``jax.numpy`` or ``torch``).
    :param state: the :class:`SGNHTState` ``(p, ξ)``.
    :param grad_fn: ``θ -> StochasticGradient``; called once.
    :param noise: ``ζ``, a standard normal draw of the shape of ``position``.
    :param step_size: ``h``.
    :param diffusion: ``D > 0``.
    :param thermostat: a thermostat per coordinate (``"multivariate"``, default), one (``"scalar"``), or a
        ``d × d`` matrix (``"matrix"``); the state's ``ξ`` must have its shape (:func:`init`).
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
    momentum, xi = state
    if integrator == "euler":
        position, momentum, gradient = sghmc.euler(
            position, momentum, grad_fn, noise, step_size, xi, diffusion, temperature
        )
        xi = xi + step_size * excess(momentum, thermostat, temperature)
    else:
        half = step_size / 2
        xi = xi + half * excess(momentum, thermostat, temperature)
        position, momentum, gradient = sghmc.splitting(
            position, momentum, grad_fn, noise, step_size, xi, diffusion, temperature
        )
        xi = xi + half * excess(momentum, thermostat, temperature)
    return position, SGNHTState(momentum, xi), gradient
