"""The complete-recipe kernel on NumPyro (Ma, Chen & Fox, NeurIPS 2015).

1. **Instances.** On a minibatched regression model, with the same key, ``Recipe(D=1.0)`` gives SGLD's draws and
   ``Recipe(D=A, Q=[[0, -I], [I, 0]], momentum=True)`` gives SGHMC's with the Euler integrator.
2. **A state-dependent diffusion samples the target**: on a 2-d standard normal, Langevin dynamics with the
   diffusion ``D(θ) = 1 + θ⊙θ/2`` (a Riemannian metric on θ, ``Γ = θ``) and the Riemannian HMC of the paper
   (``D = diag(0, G(θ)⁻¹)``, ``Q = [[0, -G^{-1/2}], [G^{-1/2}, 0]]``) match the target's variance and fourth
   moment within Monte Carlo error. Without ``Γ`` the first would sample ``∝ e^{-U}/D``, whose variance is
   about 30% smaller: the same test rejects it.
3. Its arguments.
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import MCMC

from ppl_sgmcmc.numpyro import SGHMC, SGLD, Recipe
from tests.helpers import assert_mc_close, linear_regression_data, mean_and_mcse

X, Y, _ = linear_regression_data(200, 3, 2.0, seed=0)
SGHMC_Q = np.block([[np.zeros((3, 3)), -np.eye(3)], [np.eye(3), np.zeros((3, 3))]])


def regression(X, y):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=20):
        x = numpyro.subsample(X, event_dim=1)
        numpyro.sample("y", dist.Normal(x @ w, 2.0), obs=numpyro.subsample(y, event_dim=0))


def draws(kernel, **run):
    mcmc = MCMC(kernel, num_warmup=50, num_samples=100, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(3), X, Y, init_params={"w": jnp.zeros(3)}, **run)
    return np.asarray(mcmc.get_samples()["w"])


# --- 1. instances -------------------------------------------------------------------------------------------
def test_sgld_is_an_instance():
    sgld = draws(SGLD(regression, step_size=1e-3, temperature=0.5))
    np.testing.assert_allclose(draws(Recipe(regression, step_size=1e-3, D=1.0, temperature=0.5)), sgld, rtol=1e-5, atol=1e-6)
    assert np.abs(sgld[-1]).max() > 0.1  # the chain moved


@pytest.mark.slow
def test_sghmc_euler_is_an_instance():
    sghmc = draws(SGHMC(regression, step_size=0.02, friction=2.0, integrator="euler"))
    recipe = draws(Recipe(regression, step_size=0.02, D=2.0, Q=SGHMC_Q, momentum=True))
    np.testing.assert_allclose(recipe, sghmc, rtol=1e-4, atol=1e-5)
    assert np.abs(sghmc[-1]).max() > 0.1


# --- 2. state-dependent diffusions ----------------------------------------------------------------------------
NUM_CHAINS = 8


def metric(z):
    return 1 + z * z / 2


def riemann_D(z):
    return 1 + z[:2] * z[:2] / 2  # G(θ)⁻¹, diagonal, on the momenta


def riemann_Q(z):
    root = jnp.sqrt(metric(z[:2]))  # G^{-1/2} = (G⁻¹)^{1/2}
    zero = jnp.zeros((2, 2))
    return jnp.block([[zero, -jnp.diag(root)], [jnp.diag(root), zero]])


def sample_normal(kernel, num_samples=2000):
    mcmc = MCMC(kernel, num_warmup=200, num_samples=num_samples, num_chains=NUM_CHAINS, chain_method="vectorized",
                progress_bar=False)  # fmt: skip
    mcmc.run(jax.random.PRNGKey(0), init_params={"x": jnp.zeros((NUM_CHAINS, 2))})
    assert int(mcmc.last_state.num_diverging.sum()) == 0
    return np.asarray(mcmc.get_samples(group_by_chain=True)["x"])


def assert_standard_normal(name, x, variance_bias):
    """Mean 0, variance 1 and fourth moment 3 of each coordinate, within ``K_SIGMA`` MCSEs; the variance and
    fourth moment may be biased by the step size by ``variance_bias`` (relative, first order: ``(1 + b)`` and
    ``(1 + b)²``)."""
    mean, mean_se = mean_and_mcse(x)
    assert_mc_close(f"{name} mean", mean, np.zeros(2), mean_se)
    var, var_se = mean_and_mcse(x * x)
    assert_mc_close(f"{name} variance", var, np.ones(2), var_se, allowance=variance_bias)
    fourth, fourth_se = mean_and_mcse(x**4)
    assert_mc_close(f"{name} fourth moment", fourth, np.full(2, 3.0), fourth_se, allowance=3 * ((1 + variance_bias) ** 2 - 1))


@pytest.mark.slow
def test_riemannian_langevin_samples_the_target():
    """``D(θ) = 1 + θ⊙θ/2`` (``E[D] = 1.5``), ``h = 0.02``: Euler's first-order variance excess is about
    ``h E[D]/2 = 1.5%``, a tenth of the tolerance."""
    h = 0.02
    x = sample_normal(Recipe(potential_fn=lambda z: 0.5 * jnp.sum(z["x"] ** 2), step_size=h, D=metric,
                             steps_per_sample=5))  # fmt: skip
    assert_standard_normal("riemannian langevin", x, h * 1.5 / 2)
    # without Γ the chain samples ∝ e^{-U}/D: variance ≈ 0.7. The same test fails it
    no_gamma = Recipe(potential_fn=lambda z: 0.5 * jnp.sum(z["x"] ** 2), step_size=h, D=metric, steps_per_sample=5)
    no_gamma._options["jacobian"] = lambda fn: lambda z: jnp.zeros(z.shape * 2)
    with pytest.raises(AssertionError, match="variance: outside the Monte Carlo tolerance"):
        assert_standard_normal("without Γ", sample_normal(no_gamma, num_samples=1000), h * 1.5 / 2)


@pytest.mark.slow
def test_riemannian_hmc_samples_the_target():
    """Ma, Chen & Fox's SGRHMC with ``G(θ)⁻¹ = diag(1 + θ⊙θ/2)``: ``z = (θ, r)``, ``D = diag(0, G⁻¹)``,
    ``Q = [[0, -G^{-1/2}], [G^{-1/2}, 0]]``; ``Γ_r = ∂_θ G^{-1/2}`` (the momenta's ``D`` does not depend on ``r``).
    At ``h = 0.05`` the first-order bias is a few per cent at most."""
    x = sample_normal(Recipe(potential_fn=lambda z: 0.5 * jnp.sum(z["x"] ** 2), step_size=0.05, D=riemann_D,
                             Q=riemann_Q, momentum=True, steps_per_sample=5))  # fmt: skip
    assert_standard_normal("riemannian hmc", x, 0.0)


# --- 3. arguments -----------------------------------------------------------------------------------------------
def test_arguments():
    potential = lambda z: jnp.sum(z["x"] ** 2)  # noqa: E731
    with pytest.raises(ValueError, match=r"give a `step_size`: .* \(its D\(z\) and Q\(z\) are given in the model's"):
        Recipe(potential_fn=potential, D=1.0)
    with pytest.raises(ValueError, match="with momentum=True the curl `Q` couples θ and the momenta"):
        Recipe(potential_fn=potential, step_size=0.1, D=1.0, momentum=True)
    with pytest.raises(ValueError, match="`Q` must be skew-symmetric"):
        Recipe(potential_fn=potential, step_size=0.1, D=1.0, Q=np.eye(2))
    with pytest.raises(ValueError, match="`D` must be positive semidefinite"):
        Recipe(potential_fn=potential, step_size=0.1, D=np.array([[1.0, 2.0], [2.0, 1.0]]))
    with pytest.raises(ValueError, match="`D` must be non-negative"):
        Recipe(potential_fn=potential, step_size=0.1, D=-1.0)
    with pytest.raises(ValueError, match="`D` must be a callable z -> D\\(z\\) or a non-negative number"):
        Recipe(potential_fn=potential, step_size=0.1, D="identity")
    kernel = Recipe(potential_fn=potential, step_size=0.1, D=np.ones(3))
    with pytest.raises(ValueError, match=r"`D` has shape \(3,\); .* The model has d = 2 latent coordinates"):
        kernel.init(jax.random.PRNGKey(0), 0, init_params={"x": jnp.ones(2)})
    hyper = Recipe(potential_fn=potential, step_size=0.1, D=metric, Q=SGHMC_Q, momentum=True).hyperparameters()
    assert sorted(hyper) == ["D", "Q", "jacobian", "momentum", "temperature"] and hyper["D"] is metric
