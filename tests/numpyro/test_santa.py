"""Santa on NumPyro: the optimiser that starts as a sampler.

1. **The double-well of the SG-MCMC tutorial** (Chen, *Large-Scale Bayesian Learning with Stochastic Gradient
   MCMC*; Chen, Carlson, Gan, Li & Carin, AISTATS 2016), ``U(x) = (x+4)(x+1)(x-1)(x-3)/14 + 0.5``: a local mode
   near 2.22 (``U ≈ -0.87``), the global one near -2.94 (``U ≈ -2.94``), the barrier near -0.04 (``U ≈ 1.36``).
   From the local mode, RMSprop (``optax.rmsprop``) stays there; Santa, annealed slowly enough for its step
   size, reaches the global mode in most runs (20 chains from 20 starts; measured: 19 of 20).
2. **With β = 1 and no refinement Santa samples the posterior**: the conjugate regression of
   ``tests/numpyro/test_posterior.py``, within Monte Carlo error of the exact posterior, allowing the
   predicted bias of the step size (a linear chain, as there).
3. Its arguments, on NumPyro (Pyro: ``tests/pyro/test_santa.py``, which also checks that both backends step
   alike).
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
import scipy.linalg
import scipy.optimize
from numpyro.infer import MCMC

from ppl_sgmcmc import algorithms
from ppl_sgmcmc import numpyro as np_backend
from ppl_sgmcmc import pyro as pyro_backend
from ppl_sgmcmc.numpyro import Santa
from ppl_sgmcmc.optim import santa
from ppl_sgmcmc.rules import StochasticGradient
from ppl_sgmcmc.rules import santa as santa_rule
from ppl_sgmcmc.rules.santa import annealing
from tests.helpers import (
    assert_mc_close,
    assert_small_bias,
    conjugate_posterior,
    cov_and_mcse,
    linear_regression_data,
    mahalanobis,
    mean_and_mcse,
    minibatch_gradient_cov,
)

# --- 1. the double-well -------------------------------------------------------------------------------
SEEDS = 20
LOCAL_MODE, GLOBAL_MODE = 2.2237, -2.9354
# h = 0.1 covers 0.1 units of the dynamics' time per step, so β_t = (1 + t/1000)^0.5 (T from 1 to 0.38 over the
# exploration) gives the chain time to cross the barrier while it is hot; the paper's t^0.5 would freeze it
# in the local well within ~20 steps
STEP, EXPLORATION, REFINEMENT, SCALE = 0.1, 6000, 2000, 1000.0


def double_well(x):
    return (x + 4) * (x + 1) * (x - 1) * (x - 3) / 14 + 0.5


def starts():
    """Near the local mode: one start per seed."""
    return LOCAL_MODE + 0.1 * np.random.default_rng(0).normal(size=(SEEDS, 1)).astype(np.float32)


def minimise(optimiser, x):
    """``EXPLORATION + REFINEMENT`` steps of an optax optimiser on the double-well from ``x``."""

    def step(carry, _):
        x, state = carry
        updates, state = optimiser.update(jax.grad(lambda x: jnp.sum(double_well(x)))(x), state, x)
        return (optax.apply_updates(x, updates), state), None

    return jax.lax.scan(step, (x, optimiser.init(x)), length=EXPLORATION + REFINEMENT)[0][0]


@pytest.mark.slow
def test_double_well_santa_finds_the_global_mode_rmsprop_stays():
    kernel = Santa(potential_fn=lambda z: jnp.sum(double_well(z["x"])), step_size=STEP,
                   inverse_temperature=annealing(scale=SCALE))  # fmt: skip
    mcmc = MCMC(kernel, num_warmup=EXPLORATION, num_samples=REFINEMENT, num_chains=SEEDS, chain_method="vectorized",
                progress_bar=False)  # fmt: skip
    mcmc.run(jax.random.PRNGKey(0), init_params={"x": jnp.asarray(starts())})
    final = np.asarray(mcmc.get_samples(group_by_chain=True)["x"])[:, -1, 0]  # the last draw: the mode found
    rmsprop = np.asarray(jax.vmap(lambda x0: minimise(optax.rmsprop(0.01), x0))(jnp.asarray(starts())))[:, 0]
    fractions = {name: float(np.mean(np.abs(x - GLOBAL_MODE) < 0.01)) for name, x in (("Santa", final), ("RMSprop", rmsprop))}
    print(f"global mode reached from the local one, over {SEEDS} seeds: {fractions}")
    # the runs that did not find the global mode refined to the local one: nothing diverged
    assert np.all((np.abs(final - GLOBAL_MODE) < 0.01) | (np.abs(final - LOCAL_MODE) < 0.01)), final
    assert int(mcmc.last_state.num_diverging.sum()) == 0
    assert fractions["Santa"] >= 0.7
    assert fractions["RMSprop"] == 0.0 and np.all(np.abs(rmsprop - LOCAL_MODE) < 0.01)


@pytest.mark.slow
def test_optax_santa_is_the_rule():
    """:func:`ppl_sgmcmc.optim.santa` steps the rule with the gradient it is handed and the noise of its key: the
    same trajectory as the rule called directly, on a pytree of parameters (its doctest runs the double-well)."""
    beta = annealing(scale=10.0)
    optimiser = santa(0.05, num_exploration=15, inverse_temperature=beta, decay=0.9, initial_thermostat=1.5, data_size=4,
                      seed=3)  # fmt: skip
    params = {"a": jnp.array([0.5, -1.0]), "b": jnp.array(2.0)}
    state = optimiser.init(params)
    flat = jnp.array([0.5, -1.0, 2.0])
    key, key_init = jax.random.split(jax.random.PRNGKey(3))
    rule_state = santa_rule.init(flat, jax.random.normal(key_init, (3,)), 1.5, beta(0), data_size=4)  # ξ_0 = 3
    for t in range(25):
        grad = jax.grad(lambda p: jnp.sum(double_well(p["a"])) + double_well(p["b"]))(params)
        updates, state = optimiser.update(grad, state, params)
        params = optax.apply_updates(params, updates)
        key, key_noise = jax.random.split(key)
        flat, rule_state, _ = santa_rule.step(
            flat, rule_state, lambda x: StochasticGradient(None, jax.grad(lambda x: jnp.sum(double_well(x)))(x), None),
            jax.random.normal(key_noise, (3,)), 0.05, inverse_temperature=beta(t), num_exploration=15, step_index=t,
            decay=0.9, data_size=4,
        )  # fmt: skip
        np.testing.assert_allclose(np.concatenate([params["a"], params["b"][None]]), flat, rtol=1e-5, atol=1e-6)
    assert int(state.steps) == 25
    with pytest.raises(ValueError, match="`update` needs `params`"):
        optimiser.update(grad, state)
    with pytest.raises(ValueError, match="`num_exploration` must be an integer >= 0 or math.inf"):
        santa(0.1, num_exploration=-1)


# --- 2. β = 1: a sampler ------------------------------------------------------------------------------------
NUM_DATA, NUM_FEATURES, BATCH = 1000, 3, 250
NOISE, PRIOR = 16.0, 1.0
X, Y, _ = linear_regression_data(NUM_DATA, NUM_FEATURES, NOISE, seed=0)
POST_MEAN, POST_COV = conjugate_posterior(X, Y, NOISE, PRIOR)
PRECISION = np.linalg.inv(POST_COV)
GRAD_COV = minibatch_gradient_cov(X, Y, POST_MEAN, NOISE, BATCH)
SAMPLER_STEP = 1.5e-3


def regression(X, y):
    w = numpyro.sample("w", dist.Normal(0.0, PRIOR).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=BATCH):
        x = numpyro.subsample(X, event_dim=1)
        numpyro.sample("y", dist.Normal(x @ w, NOISE), obs=numpyro.subsample(y, event_dim=0))


def predicted_santa(h, eps=1e-8):
    """Santa at β = 1 on the Gaussian posterior with the gradient noise ``GRAD_COV``, as a linear chain: the
    preconditioner frozen at ``g = (λ + sqrt(E[f⊙f])/N)^{-1/2}`` (``E[f⊙f]`` over the posterior and the
    minibatches) and the thermostat at the ``ξ`` where ``E[p⊙p] = 1``::

        p' = (1 - h ξ) p - h g (Λ θ + ε) + sqrt(2 h g) ζ;   θ' = θ + h g p'

    Returns ``(g, ξ, Cov(θ))``. The covariance departs from the posterior's by the discretisation and the
    off-diagonal gradient noise, which the thermostat does not absorb."""
    square = (np.diag(PRECISION @ POST_COV @ PRECISION) + np.diag(GRAD_COV)) / NUM_DATA**2
    g = 1 / np.sqrt(eps + np.sqrt(square))
    d, G, Id = len(g), np.diag(g), np.eye(len(g))

    def chain_cov(xi):
        A = np.diag(1 - h * xi)
        M = np.block([[Id - h * h * G @ G @ PRECISION, h * G @ A], [-h * G @ PRECISION, A]])
        into = np.vstack([h * G, Id])  # the momentum's noise, and what it moves θ by
        return scipy.linalg.solve_discrete_lyapunov(M, into @ (h * h * G @ GRAD_COV @ G + 2 * h * G) @ into.T)

    xi = scipy.optimize.fsolve(lambda xi: np.diag(chain_cov(xi))[d:] - 1, g + h * g * g * np.diag(GRAD_COV) / 2)
    return g, xi, chain_cov(xi)[:d, :d]


@pytest.mark.slow
def test_beta_one_samples_the_posterior():
    """β = 1, ``num_exploration=math.inf``. The thermostat starts near its equilibrium (``ξ_0 = C sqrt(N) = 18``,
    the predicted ``ξ`` rounded): started elsewhere it moves at rate ``h`` and needs more steps than the warm-up to
    get there."""
    g, xi, predicted_cov = predicted_santa(SAMPLER_STEP)
    assert np.all(np.abs(xi - 18) < 1), xi
    scale = np.sqrt(np.outer(np.diag(POST_COV), np.diag(POST_COV)))
    assert_small_bias("santa", predicted_cov - POST_COV, scale, 0.05)
    kernel = Santa(regression, step_size=SAMPLER_STEP, inverse_temperature=1.0, num_exploration=math.inf,
                   initial_thermostat=18.0 / np.sqrt(NUM_DATA), steps_per_sample=10)  # fmt: skip
    mcmc = MCMC(kernel, num_warmup=200, num_samples=1000, num_chains=4, chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(1), X, Y)
    draws = np.asarray(mcmc.get_samples(group_by_chain=True)["w"])
    mean, mean_se = mean_and_mcse(draws)
    assert_mc_close("santa mean", mean, POST_MEAN, mean_se)
    cov, cov_se = cov_and_mcse(draws)
    assert_mc_close("santa cov", cov, POST_COV, cov_se, allowance=predicted_cov - POST_COV)
    md, md_se = mean_and_mcse(mahalanobis(draws, POST_MEAN, POST_COV)[..., None])
    expected = np.trace(PRECISION @ predicted_cov)
    assert_mc_close("santa Mahalanobis", md, NUM_FEATURES, md_se, allowance=expected - NUM_FEATURES)
    square_avg = np.asarray(mcmc.last_state.rule_state.square_avg)
    np.testing.assert_allclose(1 / np.sqrt(1e-8 + np.sqrt(square_avg.mean(0))), g, rtol=0.05)  # g as predicted


# --- 3. arguments -------------------------------------------------------------------------------------------
def test_arguments():
    potential = lambda z: jnp.sum(z["x"] ** 2)  # noqa: E731
    with pytest.raises(ValueError, match=r"give a `step_size`: .* \(Santa preconditions by its own RMSprop average"):
        Santa(potential_fn=potential)
    with pytest.raises(ValueError, match="`adapt_mass_matrix`/`dense_mass` are not available"):
        Santa(potential_fn=potential, step_size=0.1, adapt_mass_matrix=True)
    with pytest.raises(ValueError, match="`temperature` must be 1: Santa's temperature is 1/β_t"):
        Santa(potential_fn=potential, step_size=0.1, temperature=0.5)
    with pytest.raises(ValueError, match="`num_exploration` must be an integer >= 0"):
        Santa(potential_fn=potential, step_size=0.1, num_exploration=-1)
    with pytest.raises(ValueError, match="`decay` must lie strictly between 0 and 1"):
        Santa(potential_fn=potential, step_size=0.1, decay=1.0)
    with pytest.raises(ValueError, match="`inverse_temperature` must be a finite positive number"):
        Santa(potential_fn=potential, step_size=0.1, inverse_temperature=0.0)
    kernel = Santa(potential_fn=potential, step_size=0.1)
    with pytest.warns(UserWarning, match="num_warmup=0 leaves none: the chain only refines"):
        kernel.init(jax.random.PRNGKey(0), 0, init_params={"x": jnp.ones(2)})
    hyper = Santa(regression, step_size=0.1).hyperparameters()
    assert hyper["data_size"] == 1 and callable(hyper["inverse_temperature"])  # N is read from the model at init
    kernel = Santa(regression, step_size=1e-3, num_exploration=5)
    state = kernel.init(jax.random.PRNGKey(0), 10, model_args=(X, Y))
    assert kernel.hyperparameters()["data_size"] == NUM_DATA and kernel.hyperparameters()["num_exploration"] == 5
    # the thermostat starts at C sqrt(N) (default C = 5): the paper's α_0 = sqrt(η) C for the per-datum gradient
    np.testing.assert_allclose(state.rule_state.thermostat, 5 * np.sqrt(NUM_DATA), rtol=1e-6)
    assert kernel.temperature_at(3) == pytest.approx(0.5) and kernel.temperature_at(5) == 0.0
    assert math.isnan(float(jax.jit(kernel.sample)(state, (X, Y), {}).noise_ratio))


def test_one_definition():
    for algorithm in (algorithms.Santa, algorithms.Recipe):
        for backend in (np_backend, pyro_backend):
            kernel = getattr(backend, algorithm.__name__)
            assert issubclass(kernel, algorithm) and issubclass(kernel, backend.SGMCMCKernel)
            own = {k for k in vars(kernel) if not k.startswith("__")} - {"state_type", "_abc_impl"}
            assert not own, f"{backend.__name__}.{algorithm.__name__} defines {own}"
