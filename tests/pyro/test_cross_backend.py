"""The Pyro backend computes what the NumPyro backend computes, exactly (to float32 round-off).

1. **The stochastic potential**: the same model declared in NumPyro and in Pyro, at the same
   unconstrained point and on the same minibatch indices, has the same ``Ũ_t`` (with the ``N/n`` plate
   scale and the log-Jacobian of a constrained latent), the same gradient and the same mean per-datum
   score. The NumPyro side is NumPyro's own ``potential_energy``, not this library's code. The Pyro side runs
   the model eagerly: ``test_compile.py`` checks the compiled graph of the same gradient and score
   (``regression``, this model with another prior scale) against the eager model.
2. **The kernels**: both backends' kernels, fed the same gradient (a ``potential_fn``) and the same
   noise sequence, follow the same trajectory, for every algorithm and integrator, with a step-size
   schedule. ``tests/rules/test_rules.py`` already runs the pure rules on ``jax.numpy`` and ``torch``
   arrays; this checks everything around them: initial rule state, which noise goes where, the
   schedule's indexing, hyper-parameter plumbing (e.g. ``thermostat="scalar"``), divergence handling.
   The NumPyro step is jitted once, as NumPyro's ``MCMC`` runs it (:func:`jitted_numpyro_steps`); the Pyro
   kernels run eagerly (``compile_potential=False``): with a ``potential_fn`` only the noise estimate would be
   compiled, which the trajectory does not read, and the compiled step is checked against the eager one in
   ``test_compile.py``.

Together these make the two backends' chains equal in distribution, so that the NumPyro backend's statistical
tests hold for the Pyro kernels too; ``test_posterior.py`` checks the Pyro kernels' posteriors against exact ones
as well.
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as ndist
import pyro
import pyro.distributions as dist
import pytest
import torch
from numpyro.handlers import block, substitute
from numpyro.infer.util import potential_energy

from ppl_sgmcmc import numpyro as np_backend
from ppl_sgmcmc import pyro as pyro_backend
from ppl_sgmcmc.numpyro import kernel as np_kernel_module
from ppl_sgmcmc.schedules import polynomial

N, BATCH = 40, 8


def numpyro_model(X, y):
    w = numpyro.sample("w", ndist.Normal(0.0, 2.0).expand([X.shape[1]]).to_event(1))
    sigma = numpyro.sample("sigma", ndist.HalfNormal(1.0))
    with numpyro.plate("data", X.shape[0], subsample_size=BATCH):
        x = numpyro.subsample(X, event_dim=1)
        numpyro.sample("y", ndist.Normal(x @ w, sigma), obs=numpyro.subsample(y, event_dim=0))


def pyro_model(X, y):
    w = pyro.sample("w", dist.Normal(0.0, 2.0).expand([X.shape[1]]).to_event(1))
    sigma = pyro.sample("sigma", dist.HalfNormal(1.0))
    with pyro.plate("data", X.shape[0], subsample_size=BATCH):
        x = pyro.subsample(X, event_dim=1)
        pyro.sample("y", dist.Normal(x @ w, sigma), obs=pyro.subsample(y, event_dim=0))


def test_same_stochastic_potential_gradient_and_score():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(N, 3)).astype(np.float32)
    y = (X @ np.array([1.0, -2.0, 0.5]) + rng.normal(size=N)).astype(np.float32)
    pyro.set_rng_seed(0)
    kernel = pyro_backend.PSGLD(pyro_model, step_size=1e-3, compile_potential=False)
    kernel.setup(0, torch.from_numpy(X), torch.from_numpy(y))
    target = kernel._target
    assert target.layout.names == ["sigma", "w"]  # the flat order of jax.flatten_util.ravel_pytree
    # NumPyro: its own potential_energy (unconstrained, with the log-Jacobian of sigma)
    def energy(x, idx, model=numpyro_model):
        conditioned = substitute(model, data={"data": idx})
        return potential_energy(conditioned, (jnp.asarray(X), jnp.asarray(y)), {}, {"sigma": x[0], "w": x[1:]})

    value_and_grad = jax.jit(jax.value_and_grad(energy))
    prior_grad = jax.jit(jax.grad(lambda x, idx: energy(x, idx, block(numpyro_model, hide=["y"]))))
    for _ in range(3):
        sigma_u, w = rng.normal(size=()).astype(np.float32), rng.normal(size=3).astype(np.float32)
        idx = rng.integers(0, N, size=BATCH)
        flat = np.concatenate([[sigma_u], w]).astype(np.float32)
        value, grad = value_and_grad(jnp.asarray(flat), jnp.asarray(idx))
        score = -(grad - prior_grad(jnp.asarray(flat), jnp.asarray(idx))) / N

        got = target.gradient(torch.from_numpy(flat), {"data": torch.from_numpy(idx)}, with_score=True)
        np.testing.assert_allclose(got.energy.numpy(), value, rtol=1e-5)
        np.testing.assert_allclose(got.grad.numpy(), grad, rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(got.score.numpy(), score, rtol=1e-5, atol=1e-6)


# --- the kernels: same gradient, same noise, same trajectory --------------------------------------
A_COEF = np.array([1.5, 0.5, 2.0], np.float32)
C_COEF = np.array([0.3, -0.2, 0.1], np.float32)
X0 = np.array([0.7, -1.2, 0.4], np.float32)


def energy_jax(z):
    x = z["x"]
    return jnp.sum(A_COEF * x * x / 2 + x**4 / 16 + C_COEF * x)


def energy_torch(z):
    x = z["x"]
    return (torch.from_numpy(A_COEF) * x * x / 2 + x**4 / 16 + torch.from_numpy(C_COEF) * x).sum()


CASES = {
    "sgld": ("SGLD", dict(step_size=0.05)),
    "sgld-schedule-tempered": ("SGLD", dict(step_size=polynomial(0.1, 1.0, 0.55), temperature=0.5)),
    "sghmc-splitting": ("SGHMC", dict(step_size=0.1, friction=1.5)),
    "sghmc-euler": ("SGHMC", dict(step_size=0.1, friction=1.5, integrator="euler", temperature=2.0)),
    # the friction absorbs the noise each backend measures from the gradients' differences (B̂)
    "sghmc-absorb-noise": ("SGHMC", dict(step_size=0.1, friction=1.5, absorb_noise=True, temperature=2.0)),
    "sgnht-splitting": ("SGNHT", dict(step_size=0.1, diffusion=1.0)),
    "sgnht-euler": ("SGNHT", dict(step_size=0.1, diffusion=1.0, integrator="euler")),
    "sgnht-scalar-splitting": ("SGNHT", dict(step_size=polynomial(0.2, 1.0, 0.3), diffusion=0.5, thermostat="scalar")),
    "sgnht-scalar-euler": ("SGNHT", dict(step_size=0.1, diffusion=0.5, thermostat="scalar", integrator="euler")),
    "sgnht-matrix-splitting": ("SGNHT", dict(step_size=0.1, diffusion=0.5, thermostat="matrix")),
    "psgld": ("PSGLD", dict(step_size=0.01, alpha=0.9, eps=1e-3)),
}
NUM_DRAWS = 25


def jitted_numpyro_steps(np_kernel, state, model_args, noises, indices=None):
    """NumPyro's states after each of ``len(noises)`` steps, step ``k`` drawing the noise ``noises[k]`` (and the
    minibatch ``indices[k]``). The step is jitted, as NumPyro's ``MCMC`` runs it, with the noise (and the
    indices) as its arguments: ``jax.random.normal`` (and the target's ``draw``) are replaced while it is traced,
    once. (Run eagerly, each of the step's hundreds of small operations would be compiled on its own.)"""
    draws = []

    def step(state, noise, idx):
        def normal(key, shape, dtype=None):
            draws.append(tuple(shape))
            return noise

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(jax.random, "normal", normal)
            # the momentum redraw of a rejected step (a `lax.cond` branch, not taken here) draws no queued noise
            patch.setattr(np_kernel_module, "_refresh_noise", lambda key, like: jnp.zeros_like(like))
            if idx is not None:
                patch.setattr(np_kernel._target, "draw", lambda key, batch_state: ({"data": idx}, batch_state))
            return np_kernel.sample(state, model_args, {})

    step = jax.jit(step)
    states = []
    for k, noise in enumerate(noises):
        state = step(state, jnp.asarray(noise), None if indices is None else jnp.asarray(indices[k]))
        states.append(state)
    assert draws == [noises.shape[1:]]  # traced once; one noise draw of the parameters' shape per step
    return states


def numpyro_states(np_kernel, noises, num_warmup=0, x0=X0):
    """The NumPyro kernel on a ``potential_fn`` from ``x0``: ``init`` draws ``noises[0]`` (its one call of
    ``jax.random.normal``), step ``k`` draws ``noises[k + 1]`` (:func:`jitted_numpyro_steps`)."""
    queue = iter(noises[:1])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(jax.random, "normal", lambda key, shape, dtype=None: jnp.asarray(next(queue)))
        state = np_kernel.init(jax.random.PRNGKey(0), num_warmup, init_params={"x": jnp.asarray(x0)})
    return jitted_numpyro_steps(np_kernel, state, (), noises[1:])


@pytest.mark.parametrize(  # each jits a NumPyro step: SGLD in the quick tier, all in the slow
    "case", [case if case == "sgld" else pytest.param(case, marks=pytest.mark.slow) for case in CASES]
)
def test_same_gradient_and_noise_same_trajectory(case):
    name, hyper = CASES[case]
    noises = np.random.default_rng(4).normal(size=(NUM_DRAWS + 1, 3)).astype(np.float32)

    # NumPyro: jax.random.normal, which the kernel calls once in `init` and once per step, hands out `noises`
    np_states = numpyro_states(getattr(np_backend, name)(potential_fn=energy_jax, **hyper), noises)

    # Pyro: the kernel's noise source hands out the same `noises`
    queue = iter(noises)
    pyro_kernel = getattr(pyro_backend, name)(potential_fn=energy_torch, compile_potential=False, **hyper)
    pyro_kernel.initial_params = {"x": torch.from_numpy(X0)}
    pyro_kernel.setup(0)
    pyro_kernel._normal = lambda like, shape=None, generator=None: torch.from_numpy(next(queue))
    params = pyro_kernel.initial_params
    for step, np_state in enumerate(np_states):
        params = pyro_kernel.sample(params)
        state = pyro_kernel.state
        assert state.i == int(np_state.i)
        np.testing.assert_allclose(params["x"].numpy(), np.asarray(np_state.z["x"]), rtol=2e-5, atol=2e-6,
                                   err_msg=f"{case}: position at draw {step}")  # fmt: skip
        for leaf_torch, leaf_jax in zip(state.rule_state, np_state.rule_state):
            np.testing.assert_allclose(leaf_torch.numpy(), np.asarray(leaf_jax), rtol=2e-5, atol=2e-6,
                                       err_msg=f"{case}: rule state at draw {step}")  # fmt: skip
        np.testing.assert_allclose(float(state.potential_energy), float(np_state.potential_energy), rtol=2e-5)
        assert state.step_size == pytest.approx(float(np_state.step_size), rel=1e-6)
    assert np.abs(params["x"].numpy() - X0).max() > 0.1  # the chain moved


def test_same_rejection_of_non_finite_steps():
    """An energy that overflows on part of the space: both kernels reject the same steps and keep
    the same last finite state."""

    def energy_jax(z):
        return jnp.sum(jnp.exp(4 * z["x"]) + z["x"] ** 2)

    def energy_torch(z):
        return (torch.exp(4 * z["x"]) + z["x"] ** 2).sum()

    noises = np.random.default_rng(1).normal(size=(41, 3)).astype(np.float32) * 3
    np_states = numpyro_states(np_backend.SGLD(potential_fn=energy_jax, step_size=2.0), noises)

    queue = iter(noises)
    kernel = pyro_backend.SGLD(potential_fn=energy_torch, step_size=2.0, compile_potential=False)
    kernel.initial_params = {"x": torch.from_numpy(X0)}
    kernel.setup(0)
    kernel._normal = lambda like, shape=None, generator=None: torch.from_numpy(next(queue))
    params = kernel.initial_params
    diverging = []
    for np_state in np_states:
        params = kernel.sample(params)
        diverging.append(kernel.state.diverging)
        assert kernel.state.diverging == bool(np_state.diverging)
        np.testing.assert_allclose(params["x"].numpy(), np.asarray(np_state.z["x"]), rtol=2e-5, atol=2e-6)
    assert any(diverging) and not all(diverging)
    assert kernel.diagnostics()["num_diverging"] == int(np_states[-1].num_diverging)
