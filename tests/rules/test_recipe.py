"""The complete-recipe rule (:mod:`ppl_sgmcmc.rules.recipe`) on ``jax.numpy`` and ``torch``.

1. Its instances: ``D = 1`` is SGLD and, with momenta, ``D = A``, ``Q = [[0, -I], [I, 0]]`` is SGHMC with the
   Euler integrator: the same trajectories as :mod:`ppl_sgmcmc.rules.sgld` and :mod:`ppl_sgmcmc.rules.sghmc`
   for the same noise (``D`` as a scalar, a diagonal or a matrix).
2. State-dependent ``D(z)`` and ``Q(z)``: the rule against a NumPy restatement of its module docstring whose
   ``Γ`` comes from central finite differences (so the autodiff ``Γ`` is checked independently), and the
   same trajectory on both array libraries.
3. ``Γ`` itself for matrix, diagonal and scalar ``D`` and for ``Q``; the shape checks.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.func
from array_api_compat import array_namespace

from ppl_sgmcmc.rules import recipe, sghmc, sgld
from tests.rules.test_rules import X0, as_np, gradient_np, make_grad_fn, noise_sequence

JACOBIANS = {"jax": (jnp.asarray, jax.jacfwd), "torch": (torch.from_numpy, torch.func.jacfwd)}
D_DIM = X0.size
SGHMC_Q = np.block([[np.zeros((3, 3)), -np.eye(3)], [np.eye(3), np.zeros((3, 3))]])


def trajectory(rule, state, hyper, to_array, num_steps=20):
    """Positions and rule states after each of ``num_steps`` steps with a fixed noise sequence."""
    noises = noise_sequence(num_steps, seed=11).astype(np.float32)
    x, out = to_array(X0.astype(np.float32)), []
    grad_fn = make_grad_fn(x)

    def step(x, state, zeta):
        return rule.step(x, state, grad_fn, zeta, 0.1, **hyper)

    step = jax.jit(step) if isinstance(x, jax.Array) else step  # JAX: compiled once, not dispatched op by op
    for zeta in noises:
        x, state, _ = step(x, state, to_array(zeta))
        out.append((as_np(x), *(as_np(leaf) for leaf in state if leaf is not None)))
    return out


def assert_same(traj_a, traj_b, atol=2e-6):
    for step, (row_a, row_b) in enumerate(zip(traj_a, traj_b)):
        assert len(row_a) == len(row_b)
        for a, b in zip(row_a, row_b):
            np.testing.assert_allclose(a, b, rtol=2e-5, atol=atol, err_msg=f"step {step}")


# --- 1. the instances ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("library", list(JACOBIANS))
def test_sgld_is_the_recipe_with_identity_diffusion(library):
    to_array, jacobian = JACOBIANS[library]
    for D in (1.0, np.ones(D_DIM), np.eye(D_DIM)):  # a scalar, a diagonal, a matrix (its root by eigh)
        got = trajectory(recipe, recipe.RecipeState(None), dict(D=D, jacobian=jacobian, temperature=0.5), to_array)
        assert_same(got, trajectory(sgld, sgld.SGLDState(), dict(temperature=0.5), to_array))


@pytest.mark.parametrize("library", list(JACOBIANS))
def test_sghmc_euler_is_the_recipe_with_momenta(library):
    to_array, jacobian = JACOBIANS[library]
    p0 = to_array(noise_sequence(1, seed=12)[0].astype(np.float32))
    expected = trajectory(sghmc, sghmc.SGHMCState(p0), dict(friction=1.5, integrator="euler", temperature=2.0), to_array)
    for D in (1.5, np.full(D_DIM, 1.5), 1.5 * np.eye(D_DIM)):
        hyper = dict(D=D, Q=SGHMC_Q, momentum=True, jacobian=jacobian, temperature=2.0)
        assert_same(trajectory(recipe, recipe.RecipeState(p0), hyper, to_array), expected)


# --- 2. state-dependent D(z) and Q(z) (written once, for NumPy, jax.numpy and torch) ------------------------------
def metric_D(z):
    """A diagonal diffusion on θ that grows away from 0: ``1 + θ⊙θ/2`` (``Γ = θ``)."""
    return 1 + z * z / 2


def theta_Q(z):
    """A curl on θ that depends on ``θ_0``: ``θ_0 (E₊ - E₋)`` (``E±`` the unit upper and lower off-diagonals)."""
    xp = array_namespace(z)
    return z[0] * (xp.eye(D_DIM, k=1, dtype=z.dtype) - xp.eye(D_DIM, k=-1, dtype=z.dtype))


def riemann_D(z):
    """A dense momentum block that depends on θ and r: ``(1 + |θ|²/10) I + u uᵀ`` with ``u = θ/2 + flip(r)/10``."""
    xp = array_namespace(z)
    theta, r = z[:D_DIM], z[D_DIM:]
    u = theta / 2 + xp.flip(r) / 10
    return xp.eye(D_DIM, dtype=z.dtype) * (1 + xp.sum(theta * theta) / 10) + u[:, None] * u[None, :]


def riemann_Q(z):
    """``[[0, -G^{-1/2}], [G^{-1/2}, θ_0 (E₊ - E₋)]]`` with ``G^{-1/2} = diag(1 + θ⊙θ)^{-1/2}``: SGRHMC's coupling of
    Ma, Chen & Fox (their Riemannian HMC), and a rotation among the momenta."""
    xp = array_namespace(z)
    theta = z[:D_DIM]
    root = xp.eye(D_DIM, dtype=z.dtype) / xp.sqrt(1 + theta * theta)[:, None]
    zero = xp.zeros((D_DIM, D_DIM), dtype=z.dtype)
    return xp.concat([xp.concat([zero, -root], axis=1), xp.concat([root, theta_Q(theta)], axis=1)], axis=0)


def joint_matrix(D, Q, z, momentum):
    """``D + Q`` over the joint state (``D`` in its block), in NumPy."""
    d = D_DIM
    value = np.asarray(D(z) if callable(D) else D, np.float64)
    M = np.zeros((z.size, z.size))
    M[z.size - d:, z.size - d:] = value if value.ndim == 2 else np.eye(d) * value
    return M + (np.asarray(Q(z) if callable(Q) else Q, np.float64) if Q is not None else 0)


def fd_divergence(D, Q, z, momentum, eps=1e-6):
    """``Γ_i = Σ_j ∂_j (D + Q)_ij`` by central differences (float64)."""
    gamma = np.zeros(z.size)
    for j in range(z.size):
        step = np.zeros(z.size)
        step[j] = eps
        gamma += (joint_matrix(D, Q, z + step, momentum) - joint_matrix(D, Q, z - step, momentum))[:, j] / (2 * eps)
    return gamma


def ref_recipe(x, r, zeta, h, D, Q, tau):
    """One step of the module docstring's splitting, in NumPy (float64), ``Γ`` by finite differences."""
    d, momentum = x.size, r is not None
    z = np.concatenate([x, r]) if momentum else x
    part = np.concatenate([np.zeros(d), r]) if momentum else np.zeros(d)
    z = z + h * (-joint_matrix(D, Q, z, momentum) @ part + tau * fd_divergence(D, Q, z, momentum))  # A
    grad = np.concatenate([gradient_np(z[:d]), np.zeros(d)]) if momentum else gradient_np(z[:d])
    block = joint_matrix(D, None, z, momentum)[z.size - d:, z.size - d:]
    w, V = np.linalg.eigh(block)
    noise = np.sqrt(2 * h * tau) * (V @ np.diag(np.sqrt(np.maximum(w, 0))) @ V.T) @ zeta
    z = z - h * joint_matrix(D, Q, z, momentum) @ grad + (np.concatenate([np.zeros(d), noise]) if momentum else noise)
    return z[:d], (z[d:] if momentum else None)  # B


CASES = {
    "metric-on-theta": (metric_D, None, False),
    "metric-and-curl-on-theta": (metric_D, theta_Q, False),
    "riemannian-momenta": (riemann_D, riemann_Q, True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_state_dependent_recipe_matches_reference(case):
    D, Q, momentum = CASES[case]
    p0 = noise_sequence(1, seed=12)[0].astype(np.float32)
    hyper = dict(D=D, Q=Q, momentum=momentum, jacobian=jax.jacfwd, temperature=0.8)
    got = trajectory(recipe, recipe.RecipeState(jnp.asarray(p0) if momentum else None), hyper, jnp.asarray)
    x, r = X0, (p0.astype(np.float64) if momentum else None)
    for zeta, row in zip(noise_sequence(20, seed=11).astype(np.float32).astype(np.float64), got):
        x, r = ref_recipe(x, r, zeta, 0.1, D, Q, 0.8)
        np.testing.assert_allclose(row[0], x, rtol=1e-4, atol=1e-5)
        if momentum:
            np.testing.assert_allclose(row[1], r, rtol=1e-4, atol=1e-5)
    assert np.abs(x - X0).max() > 0.1


def test_state_dependent_recipe_same_on_jax_and_torch():
    """The Riemannian case, ``Γ`` by ``jax.jacfwd`` and by ``torch.func.jacfwd``: the same trajectory."""
    p0 = noise_sequence(1, seed=12)[0].astype(np.float32)
    runs = [
        trajectory(recipe, recipe.RecipeState(to_array(p0.copy())),
                   dict(D=riemann_D, Q=riemann_Q, momentum=True, jacobian=jacobian, temperature=0.8), to_array)
        for to_array, jacobian in JACOBIANS.values()
    ]  # fmt: skip
    assert_same(*runs, atol=5e-6)


# --- 3. Γ and the shapes --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "D, Q, momentum",
    [
        (riemann_D, None, True),  # a dense D on the momenta
        (lambda z: 1 + z[:3] * z[3:], None, True),  # a diagonal
        (lambda z: 2 + (z * z).sum(), None, True),  # a scalar c(z) I
        (metric_D, theta_Q, False),
        (1.0, riemann_Q, True),  # only Q varies
    ],
    ids=["matrix", "diagonal", "scalar", "theta", "curl"],
)
def test_divergence_against_finite_differences(D, Q, momentum):
    z = np.array([0.3, -0.8, 1.1, 0.5, 0.2, -0.4])[: 6 if momentum else 3]
    got = np.asarray(recipe.divergence(D, Q, jnp.asarray(z), 3, momentum, jax.jacfwd), np.float64)
    np.testing.assert_allclose(got, fd_divergence(D, Q, z, momentum), rtol=1e-4, atol=1e-5)


def test_constants_have_no_divergence():
    assert recipe.divergence(1.0, SGHMC_Q, jnp.zeros(6), 3, True, jax.jacfwd) is None


def test_shapes():
    recipe.check_shape("D", (), 3, False)
    recipe.check_shape("D", (3,), 3, True)
    recipe.check_shape("Q", (6, 6), 3, True)
    with pytest.raises(ValueError, match=r"`D` has shape \(6, 6\); with momenta it is the momentum block"):
        recipe.check_shape("D", (6, 6), 3, True)
    with pytest.raises(ValueError, match=r"`Q` has shape \(3, 3\); it acts on the joint state z of 6 coordinates"):
        recipe.check_shape("Q", (3, 3), 3, True)
    x = jnp.asarray(X0, jnp.float32)
    with pytest.raises(ValueError, match=r"`D` has shape \(2,\); without momenta it acts on the parameters"):
        recipe.step(x, recipe.RecipeState(None), make_grad_fn(x), x, 0.1, D=lambda z: z[:2], jacobian=jax.jacfwd)


def test_one_gradient_per_step_where_sgld_and_sghmc_take_it():
    """SGLD's instance takes its gradient at the position itself (so a rejected step returns as SGLD's does);
    SGHMC's at ``θ + h r``, as its Euler integrator."""
    x, r = jnp.asarray(X0, jnp.float32), jnp.asarray(noise_sequence(1, seed=12)[0], jnp.float32)
    calls = []
    recipe.step(x, recipe.RecipeState(None), make_grad_fn(x, calls), r, 0.2, D=1.0)
    assert len(calls) == 1 and calls[0] is x
    calls.clear()
    recipe.step(x, recipe.RecipeState(r), make_grad_fn(x, calls), r, 0.2, D=1.0, Q=SGHMC_Q, momentum=True)
    assert len(calls) == 1
    np.testing.assert_allclose(np.asarray(calls[0]), X0 + 0.2 * np.asarray(r), rtol=1e-6)
