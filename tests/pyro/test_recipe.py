"""The complete-recipe kernel on Pyro: SGLD and SGHMC (Euler) as instances, with the same generator seed the
same draws as the dedicated kernels on a minibatched model (run eagerly: the compiled gradient and step, which
``test_compile.py`` checks against the eager ones, would cost seconds of Inductor compiling, more than the 80
eager steps); and a state-dependent recipe with momenta (its
``Γ`` by ``torch.func.jacfwd``) on the same trajectory as on NumPyro (``Γ`` by ``jax.jacfwd``)."""

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC

from ppl_sgmcmc import numpyro as np_backend
from ppl_sgmcmc import pyro as pyro_backend
from tests.pyro.test_cross_backend import energy_jax, energy_torch
from tests.pyro.trajectories import assert_same_trajectory
from tests.rules.test_recipe import SGHMC_Q, metric_D, riemann_D, riemann_Q, theta_Q

rng = np.random.default_rng(0)
X = torch.as_tensor(rng.normal(size=(200, 3)), dtype=torch.float32)
Y = X @ torch.tensor([1.0, -0.5, 0.3]) + 2 * torch.as_tensor(rng.normal(size=200), dtype=torch.float32)


def regression(X, y):
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with pyro.plate("data", X.shape[0], subsample_size=20):
        x = pyro.subsample(X, event_dim=1)
        pyro.sample("y", dist.Normal(x @ w, 2.0), obs=pyro.subsample(y, event_dim=0))


EAGER = dict(compile_potential=False)


def draws(kernel):
    pyro.set_rng_seed(3)
    mcmc = MCMC(kernel, warmup_steps=20, num_samples=60, initial_params={"w": torch.zeros(3)}, disable_progbar=True)
    mcmc.run(X, Y)
    return mcmc.get_samples()["w"].numpy()


def test_sgld_is_an_instance():
    sgld = draws(pyro_backend.SGLD(regression, step_size=1e-3, temperature=0.5, **EAGER))
    recipe = draws(pyro_backend.Recipe(regression, step_size=1e-3, D=1.0, temperature=0.5, **EAGER))
    np.testing.assert_allclose(recipe, sgld, rtol=1e-5, atol=1e-6)
    assert np.abs(sgld[-1]).max() > 0.1


def test_sghmc_euler_is_an_instance():
    sghmc = draws(pyro_backend.SGHMC(regression, step_size=0.02, friction=2.0, integrator="euler", **EAGER))
    recipe = draws(pyro_backend.Recipe(regression, step_size=0.02, D=2.0, Q=SGHMC_Q, momentum=True, **EAGER))
    np.testing.assert_allclose(recipe, sghmc, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "hyper",
    [pytest.param(dict(D=riemann_D, Q=riemann_Q, momentum=True), marks=pytest.mark.slow), dict(D=metric_D, Q=theta_Q)],
    ids=["dense-momentum-block-and-curl", "metric-and-curl-on-theta"],
)
def test_state_dependent_recipe_same_trajectory_as_numpyro(hyper, monkeypatch):
    """``D`` and ``Q`` written once with ``array_namespace``, varying with the state."""
    np_kernel = np_backend.Recipe(potential_fn=energy_jax, step_size=0.05, temperature=0.8, **hyper)
    pyro_kernel = pyro_backend.Recipe(potential_fn=energy_torch, step_size=0.05, temperature=0.8, **hyper)
    assert_same_trajectory(monkeypatch, np_kernel, pyro_kernel, num_draws=12, atol=5e-6)
