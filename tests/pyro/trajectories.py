"""The cross-backend trajectory check of ``tests/pyro/test_cross_backend.py`` for kernels built by the caller:
a NumPyro and a Pyro kernel on the same energy, fed the same noise sequence, must follow the same trajectory
(positions, rule states, energies, step sizes). The NumPyro step is jitted once, as NumPyro's ``MCMC`` runs it: run
eagerly, each of its hundreds of small operations would be compiled on its own (seconds a case)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from ppl_sgmcmc.numpyro import kernel as np_kernel_module

X0 = np.array([0.7, -1.2, 0.4], np.float32)


def assert_same_trajectory(monkeypatch, np_kernel, pyro_kernel, num_warmup=0, num_draws=25, x0=X0, atol=2e-6):
    """Run both kernels ``num_draws`` draws from ``x0`` with the same standard normal draws (NumPyro's
    ``jax.random.normal`` and Pyro's ``_normal`` hand out one sequence) and compare every state."""
    max_draws = 4  # of a step
    noises = np.random.default_rng(4).normal(size=(max_draws * (num_warmup + num_draws + 1) + 1, x0.size))
    noises = noises.astype(np.float32)
    queue = iter(noises)
    monkeypatch.setattr(jax.random, "normal", lambda key, shape, dtype=None: jnp.asarray(next(queue)))
    monkeypatch.setattr(np_kernel_module, "_refresh_noise", lambda key, like: jnp.zeros_like(like))
    state = np_kernel.init(jax.random.PRNGKey(0), num_warmup, init_params={"x": jnp.asarray(x0)})
    position = len(noises) - len(list(queue))  # the draws of `init`
    traces = []  # the shapes of each trace's calls of jax.random.normal

    def step(state, block):  # traced once: the step's k-th call of jax.random.normal gets block[k]
        calls = []
        traces.append(calls)

        def normal(key, shape, dtype=None):
            calls.append(tuple(shape))
            return block[len(calls) - 1]

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(jax.random, "normal", normal)
            return np_kernel.sample(state, (), {})

    step = jax.jit(step)
    np_states = []
    for _ in range(num_warmup + num_draws):
        state = step(state, jnp.asarray(noises[position : position + max_draws]))
        np_states.append(state)
        position += len(traces[-1])
    monkeypatch.undo()
    assert 0 < len(traces[-1]) <= max_draws and all(calls == [x0.shape] * len(traces[-1]) for calls in traces)

    queue = iter(noises)
    pyro_kernel.initial_params = {"x": torch.from_numpy(x0)}
    pyro_kernel.setup(num_warmup)
    pyro_kernel._normal = lambda like, shape=None, generator=None: torch.from_numpy(next(queue))
    params = pyro_kernel.initial_params
    for draw, np_state in enumerate(np_states):
        params = pyro_kernel.sample(params)
        state = pyro_kernel.state
        assert state.i == int(np_state.i)
        np.testing.assert_allclose(params["x"].numpy(), np.asarray(np_state.z["x"]), rtol=2e-5, atol=atol,
                                   err_msg=f"position at draw {draw}")  # fmt: skip
        for leaf_torch, leaf_jax in zip(state.rule_state, np_state.rule_state):
            assert (leaf_torch is None) == (leaf_jax is None)
            if leaf_torch is not None:
                np.testing.assert_allclose(leaf_torch.numpy(), np.asarray(leaf_jax), rtol=2e-5, atol=atol,
                                           err_msg=f"rule state at draw {draw}")  # fmt: skip
        np.testing.assert_allclose(float(state.potential_energy), float(np_state.potential_energy), rtol=2e-5)
        assert state.step_size == pytest.approx(float(np_state.step_size), rel=1e-6)
        assert state.diverging == bool(np_state.diverging)
    assert np.abs(params["x"].numpy() - x0).max() > 0.1  # the chain moved
