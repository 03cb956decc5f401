"""The complete recipe for SG-MCMC (Ma, Chen & Fox, "A Complete Recipe for Stochastic Gradient MCMC",
NeurIPS 2015): a sampler built from a positive semidefinite diffusion matrix ``D(z)`` and a
skew-symmetric curl matrix ``Q(z)`` over the joint state ``z``.

The state is ``z = θ``, or ``z = (θ, r)`` with momenta ``r``; the Hamiltonian is ``H(z) = U(θ)`` or
``U(θ) + r·r/2``, and the target ``exp(-H/τ)``. Every such diffusion::

    dz = [-(D(z) + Q(z)) ∇H(z) + τ Γ(z)] dt + sqrt(2 τ D(z)) dW,     Γ_i(z) = Σ_j ∂_j (D_ij(z) + Q_ij(z))

leaves ``exp(-H/τ)`` invariant (Γ's sign is the one the Fokker-Planck equation requires; the paper's
discretised update, as printed, puts it inside the bracket of ``-ε[...]``). With momenta the noise enters
the momenta only: the joint diffusion is ``diag(0, D(z))`` and ``D(z)`` gives its momentum block (the
kernels draw one normal per parameter and step). ``D(z)`` is a scalar (``D(z) I``), the ``d`` entries of a diagonal, or a ``d×d``
matrix; ``Q(z)`` is an ``n×n`` matrix (``n = d``, or ``2d`` with momenta). Either may be a constant.

One step (``h`` the step size, ``ζ ~ N(0, I_d)``, ``∇Ũ_t`` in place of ``∇U``), the part of the drift
without the gradient first, then the gradient and the noise at the point it reached::

    A:  z ← z + h [-(D(z) + Q(z)) (0, r) + τ Γ(z)]
    B:  z ← z - h (D(z) + Q(z)) (∇Ũ_t(θ), 0) + sqrt(2 h τ) D(z)^{1/2} ζ

where ``(0, r)`` and ``(∇Ũ_t(θ), 0)`` are the two parts of ``∇H(z)`` (without momenta: ``0`` and
``∇Ũ_t(θ)``), the joint ``D`` acts on its block and ``D^{1/2}`` is the symmetric square root. A is
skipped when it is zero (no momenta, constant ``D`` and ``Q``). This Lie-Trotter splitting of Euler's
scheme is first order like it, takes one gradient per step, and orders the moves as SGHMC's Euler
integrator does: ``D = I`` is SGLD and, with momenta, ``D = A``, ``Q = [[0, -I], [I, 0]]`` is SGHMC
(:mod:`ppl_sgmcmc.rules.sghmc`, ``integrator="euler"``), step for step. The paper's correction of the
noise by an estimate ``B̂`` of the gradient noise is not applied.

``Γ`` needs the derivatives of ``D`` and ``Q``: the kernel passes its backend's Jacobian operator as
``jacobian`` (``jax.jacfwd`` or ``torch.func.jacfwd``); a constant contributes nothing. Costs per step:
two evaluations of ``D`` and ``Q``, ``n`` more in the Jacobian of each one that varies, a matrix product
with a dense ``Q`` or ``D``, and an ``eigh`` of a dense ``D``.
"""

from typing import NamedTuple

from array_api_compat import array_namespace, device

from ppl_sgmcmc.rules._types import Array

NEEDS = "gradient"  # what the rule reads from the gradient (see ppl_sgmcmc.rules)


class RecipeState(NamedTuple):
    """The momenta ``r`` (the shape of ``θ``), or ``None`` when ``z = θ``.

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.rules import recipe
        >>> recipe.RecipeState(momentum=None).momentum is None
        True
    """

    momentum: Array | None


def check_shape(name, shape, dim, momentum):
    """Raise a ``ValueError`` unless ``shape`` fits ``D`` (``name="D"``: ``()``, ``(d,)`` or ``(d, d)``) or ``Q``
    (``(n, n)``) for ``d = dim`` parameters, ``n = 2d`` with ``momentum`` else ``d``.

    **Example**::

        >>> from ppl_sgmcmc.rules import recipe
        >>> recipe.check_shape("Q", (4, 4), dim=2, momentum=True)  # fits: no error
        >>> recipe.check_shape("D", (4, 4), dim=2, momentum=True)
        Traceback (most recent call last):
        ...
        ValueError: `D` has shape (4, 4); with momenta it is the momentum block of the diffusion: give a scalar, ...
    """
    shape = tuple(shape)
    if name == "D":
        if shape in ((), (dim,), (dim, dim)):
            return
        block = "it is the momentum block of the diffusion" if momentum else "it acts on the parameters"
        joint = " (the joint diffusion is diag(0, D))" if momentum else ""
        raise ValueError(
            f"`D` has shape {shape}; with{'' if momentum else 'out'} momenta {block}: give a scalar, {dim} diagonal "
            f"entries or a {dim}×{dim} matrix{joint}."
        )
    n = 2 * dim if momentum else dim
    if shape != (n, n):
        raise ValueError(
            f"`Q` has shape {shape}; it acts on the joint state z of {n} coordinates "
            f"({'the parameters, then the momenta' if momentum else 'the parameters'}): give a {n}×{n} matrix."
        )


def _value(name, spec, z, dim, momentum):
    """``spec`` at ``z``: a callable's value (its shape checked), or the constant in the namespace of ``z``."""
    if callable(spec):
        value = spec(z)
        check_shape(name, getattr(value, "shape", ()), dim, momentum)
        return value
    if isinstance(spec, float):
        return spec
    return array_namespace(z).asarray(spec, dtype=z.dtype, device=device(z))


def _times(matrix, vector):
    """``matrix`` (a scalar, a diagonal or a matrix) applied to ``vector``."""
    return matrix @ vector if getattr(matrix, "ndim", 0) == 2 else matrix * vector


def _root_times(matrix, noise):
    """``D^{1/2} ζ``: the symmetric square root of the positive semidefinite ``D`` (a scalar, a diagonal or a
    matrix, by ``eigh``; negative round-off eigenvalues count as 0) applied to ``ζ``."""
    if getattr(matrix, "ndim", 0) < 2:
        return (matrix**0.5) * noise
    xp = array_namespace(noise)
    values, vectors = xp.linalg.eigh(matrix)
    return vectors @ (xp.sqrt((xp.abs(values) + values) / 2) * (vectors.T @ noise))


def divergence(D, Q, z, dim, momentum, jacobian):
    """``Γ_i(z) = Σ_j ∂_j (D_ij(z) + Q_ij(z))`` over the joint state (``D`` in its block), by ``jacobian`` of
    the callables among ``D`` and ``Q``; ``None`` when both are constants.

    **Example** (``z = θ``, ``D(θ) = 1 + θ⊙θ``: ``Γ = 2θ``)::

        >>> import jax, jax.numpy as jnp
        >>> from ppl_sgmcmc.rules import recipe
        >>> z = jnp.array([1.0, -0.5])
        >>> recipe.divergence(lambda z: 1 + z * z, None, z, dim=2, momentum=False, jacobian=jax.jacfwd).tolist()
        [2.0, -1.0]
    """
    xp = array_namespace(z)
    total = None
    if callable(D):
        J = jacobian(D)(z)  # D's axes, then z's
        check_shape("D", J.shape[:-1], dim, momentum)
        offset = dim if momentum else 0  # where D's block starts in z
        if J.ndim == 3:  # a matrix: Σ_j ∂D_ij/∂z_(offset+j)
            part = xp.sum(xp.linalg.diagonal(J[:, :, offset:]), axis=-1)
        else:  # a diagonal, ∂D_i/∂z_(offset+i), or a scalar c(z) I, ∂c/∂z_(offset+i)
            part = xp.linalg.diagonal(J[:, offset:]) if J.ndim == 2 else J[offset:]
        total = xp.concat([xp.zeros_like(part), part]) if momentum else part
    if callable(Q):
        J = jacobian(Q)(z)
        check_shape("Q", J.shape[:-1], dim, momentum)
        part = xp.sum(xp.linalg.diagonal(J), axis=-1)
        total = part if total is None else total + part
    return total


def init(position, noise, momentum=False, temperature=1.0):
    """The momenta ``r ~ N(0, τ I)`` (``r = sqrt(τ) ζ``) with ``momentum``, else none.

    :param position: the chain's start ``θ_0`` (unused).
    :param noise: ``ζ``, a standard normal draw of the shape of ``position``.
    :param momentum: whether ``z`` has momenta (default ``False``).
    :param temperature: ``τ`` (default 1).
    :return: :class:`RecipeState`.

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.rules import recipe
        >>> recipe.init(jnp.zeros(2), jnp.array([0.5, -1.0]), momentum=True, temperature=4.0).momentum.tolist()
        [1.0, -2.0]
    """
    del position
    return RecipeState(temperature**0.5 * noise if momentum else None)


def step(position, state, grad_fn, noise, step_size, D, Q=None, momentum=False, jacobian=None, temperature=1.0):
    """One step of the recipe's splitting A-B (see the module docstring).

    :param position: ``θ``, a flat array (``jax.numpy`` or ``torch``).
    :param state: the :class:`RecipeState` (the momenta, or ``None``).
    :param grad_fn: ``θ -> StochasticGradient``; called once, at the ``θ`` that A reached.
    :param noise: ``ζ``, a standard normal draw of the shape of ``position``.
    :param step_size: ``h``.
    :param D: the diffusion (its momentum block with ``momentum``): a float, a NumPy array, or a callable
        ``z -> D(z)`` on the backend's arrays.
    :param Q: the curl, an ``n×n`` NumPy array or a callable ``z -> Q(z)``, or ``None`` (0); with
        ``momentum`` it is needed, to couple ``θ`` and ``r``.
    :param momentum: whether ``z = (θ, r)`` (default ``False``: ``z = θ``).
    :param jacobian: ``f -> (z -> ∂f(z)/∂z)``, the backend's Jacobian operator; needed when ``D`` or ``Q``
        is a callable.
    :param temperature: ``τ`` (default 1).
    :return: ``(new position, new state, gradient)``.

    **Example** (``D = 1``: an SGLD step, with ``jax.numpy`` and with ``torch`` arrays)::

        >>> import jax.numpy as jnp, torch
        >>> from ppl_sgmcmc.rules import StochasticGradient, recipe
        >>> def grad_fn(x):  # U(x) = |x|²/2: ∇U = x
        ...     return StochasticGradient(energy=(x * x).sum() / 2, grad=x, score=None)
        >>> x, noise = jnp.array([1.0, -2.0]), jnp.array([0.5, -0.5])
        >>> [round(v, 4) for v in recipe.step(x, recipe.RecipeState(None), grad_fn, noise, 0.1, D=1.0)[0].tolist()]
        [1.1236, -2.0236]
        >>> recipe.step(torch.tensor([1.0, -2.0]), recipe.RecipeState(None), grad_fn, torch.tensor([0.5, -0.5]), 0.1,
        ...             D=1.0)[0]
        tensor([ 1.1236, -2.0236])
    """
    xp = array_namespace(position)
    dim = position.shape[0]
    z = xp.concat([position, state.momentum]) if momentum else position
    gamma = divergence(D, Q, z, dim, momentum, jacobian)
    theta = position
    if momentum or gamma is not None:  # A: the drift without the gradient
        drift = xp.zeros_like(z) if gamma is None else temperature * gamma
        if momentum:
            r = z[dim:]
            drift = drift - xp.concat([xp.zeros_like(r), _times(_value("D", D, z, dim, momentum), r)])
            if Q is not None:
                drift = drift - _value("Q", Q, z, dim, momentum)[:, dim:] @ r
        z = z + step_size * drift
        theta = z[:dim]
    gradient = grad_fn(theta)  # B: the gradient and the noise
    diffusion = _value("D", D, z, dim, momentum)
    curl = None if Q is None else _value("Q", Q, z, dim, momentum)
    shaken = (2 * step_size * temperature) ** 0.5 * _root_times(diffusion, noise)
    if momentum:  # D acts on the momenta, where this part of ∇H is 0
        move = xp.concat([xp.zeros_like(shaken), shaken]) - step_size * (curl[:, :dim] @ gradient.grad)
    else:
        move = shaken - step_size * _times(diffusion, gradient.grad)
        if curl is not None:
            move = move - step_size * (curl @ gradient.grad)
    z = z + move
    return z[:dim], RecipeState(z[dim:] if momentum else None), gradient
