"""Cyclical SG-MCMC on NumPyro (``cycle_length``): the exploration stage is the rule without noise, only the
sampling stages' draws are kept (``ppl_sgmcmc.numpyro.MCMC``, ``to_inference_data``), a plain
``numpyro.infer.MCMC`` run says that its draws mix the stages, and cyclical SGLD with its defaults (the tuned
step size as the cycles' peak) reproduces a conjugate posterior's moments within Monte Carlo error."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import MCMC as NumPyroMCMC

from ppl_sgmcmc.numpyro import MCMC, SGHMC, SGLD, to_inference_data
from tests.cyclical_prediction import predicted_cov
from tests.helpers import assert_mc_close, assert_small_bias, cov_and_mcse, mean_and_mcse


def half_square(z):
    return 0.5 * jnp.sum(z["x"] ** 2)


def test_exploration_is_gradient_descent_and_sampling_adds_noise():
    # U = |x|²/2: an exploring SGLD step is x ← (1 - h_i) x exactly; a sampling step adds sqrt(2 h_i) ζ
    kernel = SGLD(potential_fn=half_square, step_size=0.1, cycle_length=10, exploration_fraction=0.4)
    mcmc = NumPyroMCMC(kernel, num_warmup=5, num_samples=30, progress_bar=False)
    with pytest.warns(UserWarning, match="exploration stage"):
        mcmc.run(jax.random.PRNGKey(0), init_params={"x": jnp.ones(3)}, extra_fields=("step_size",))
    x = np.asarray(mcmc.get_samples()["x"], np.float64)
    fields = mcmc.get_extra_fields()
    counts, h = np.asarray(fields["i"]), np.asarray(fields["step_size"], np.float64)
    np.testing.assert_array_equal(counts, np.arange(6, 36))
    exploring = ~kernel.sampling_stage(counts)
    assert exploring.tolist() == ([True] * 4 + [False] * 6) * 3
    np.testing.assert_allclose(h, [0.1 * kernel.cycles.factor(int(i) - 1, 5, 1) for i in counts], rtol=1e-5)
    previous, residual = x[:-1], x[1:] - (1 - h[1:, None]) * x[:-1]
    assert np.abs(residual[exploring[1:]]).max() < 1e-6 * np.abs(previous).max()
    noise = residual[~exploring[1:]] / np.sqrt(2 * h[1:][~exploring[1:], None])  # the sampling steps' ζ
    assert noise.std() == pytest.approx(1.0, abs=0.35)


def test_momentum_exploration_draws_no_noise():
    # SGHMC's exploration is gradient descent with momentum: two chains from one start and momentum (the
    # same key for the momentum, another for the noise) cannot differ until their first sampling stage
    def run(seed):
        kernel = SGHMC(potential_fn=half_square, step_size=0.1, cycle_length=8, exploration_fraction=0.5)
        mcmc = MCMC(kernel, num_warmup=0, num_samples=16, progress_bar=False, verdict=False)
        with pytest.warns(UserWarning, match="exploration stage"):  # a state started outside `MCMC.run`
            state = kernel.init(jax.random.PRNGKey(0), 0, init_params={"x": jnp.ones(2)})
        mcmc.post_warmup_state = state._replace(rng_key=jax.random.PRNGKey(seed))
        mcmc.run(mcmc.post_warmup_state.rng_key)
        return np.asarray(NumPyroMCMC.get_samples(mcmc)["x"]), kernel

    first, kernel = run(1)
    second, _ = run(2)
    exploring = ~kernel.sampling_stage(np.arange(1, 17))
    assert exploring.tolist() == ([True] * 4 + [False] * 4) * 2
    np.testing.assert_array_equal(first[:4], second[:4])  # the first exploration stage: no noise drawn
    assert not np.allclose(first[4:8], second[4:8])


def normal_mean(y):
    x = numpyro.sample("x", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", y.shape[0], subsample_size=5):
        numpyro.sample("y", dist.Normal(x, 1.0), obs=numpyro.subsample(y, event_dim=0))


@pytest.mark.slow
def test_mcmc_and_arviz_keep_only_the_sampling_stages_draws():
    kernel = SGLD(normal_mean, step_size=0.01, cycle_length=10, exploration_fraction=0.3)
    y = jnp.zeros(10)
    mcmc = MCMC(kernel, num_warmup=20, num_samples=40, num_chains=2, chain_method="vectorized", progress_bar=False,
                verdict=False)  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # this driver leaves the exploration draws out: nothing to say
        mcmc.run(jax.random.PRNGKey(0), y)
    kept = [i for i in range(21, 61) if (i - 21) % 10 >= 3]
    assert mcmc.get_samples()["x"].shape == (2 * 28,)
    assert mcmc.get_samples(group_by_chain=True)["x"].shape == (2, 28)
    np.testing.assert_array_equal(mcmc.get_extra_fields(group_by_chain=True)["i"][1], kept)
    idata = to_inference_data(mcmc)
    assert idata.posterior["x"].shape == (2, 28) and idata.log_likelihood["y"].shape == (2, 28, 10)
    # numpyro.infer.MCMC's draws hold both stages; to_inference_data leaves the exploration out
    plain = NumPyroMCMC(kernel, num_warmup=20, num_samples=40, progress_bar=False)
    with pytest.warns(UserWarning, match="ppl_sgmcmc.numpyro.MCMC"):
        plain.run(jax.random.PRNGKey(0), y)
    assert plain.get_samples()["x"].shape == (40,)
    idata = to_inference_data(plain)
    np.testing.assert_array_equal(idata.sample_stats["i"].values[0], kept)
    np.testing.assert_array_equal(idata.posterior["x"].values[0], np.asarray(plain.get_samples()["x"])[np.array(kept) - 21])


# --- a conjugate posterior --------------------------------------------------------------------------------------
rng = np.random.default_rng(0)
X = rng.normal(size=(20, 2))
Y = X @ np.array([1.0, -0.5]) + rng.normal(size=20)
PRECISION = X.T @ X + np.eye(2)  # prior N(0, I), unit noise
POST_COV = np.linalg.inv(PRECISION)
POST_MEAN = POST_COV @ X.T @ Y


def regression(X, y):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Normal(X @ w, 1.0), obs=y)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:SGLD. the model has no plate")
def test_conjugate_posterior_with_defaults():
    # the tuned step size (0.2, the cap: the full-data gradient has no noise) is each chain's cycle peak, with the
    # default exploration fraction; 8 chains of 2000 kept draws give variance MCSEs of about 5-6% of the posterior's,
    # so a shift of about 35% is caught: the exploration draws kept (half the draws at the mode: 50% too narrow), or
    # a stage that never spreads from its mode (the sampling stages' step sizes wrong)
    kernel = SGLD(regression, cycle_length=200)
    num_warmup, num_samples = 500, 4000
    mcmc = MCMC(kernel, num_warmup=num_warmup, num_samples=num_samples, num_chains=8, chain_method="vectorized",
                progress_bar=False, verdict=False)  # fmt: skip
    mcmc.run(jax.random.PRNGKey(0), X, Y)
    draws = np.asarray(mcmc.get_samples(group_by_chain=True)["w"], np.float64)
    assert draws.shape == (8, num_samples // 2, 2)
    mean, mean_mcse = mean_and_mcse(draws)
    assert_mc_close("mean", mean, POST_MEAN, mean_mcse)
    cov, cov_mcse = cov_and_mcse(draws)
    adapt = mcmc.last_state.adapt_state
    predicted = predicted_cov(kernel, adapt.step_size, adapt.preconditioner.scale, PRECISION, num_warmup, num_samples)
    assert_small_bias("covariance", predicted - POST_COV, np.sqrt(np.outer(np.diag(POST_COV), np.diag(POST_COV))), 0.1)
    assert_mc_close("covariance", cov, POST_COV, cov_mcse, allowance=predicted - POST_COV)


def test_exploration_settling_at_the_mode_is_not_a_frozen_chain(monkeypatch):
    # an exact gradient: every exploration stage descends to the mode (x ← 0.5 x) and stays there; the frozen-chain
    # check compares positions at steps 256 and 512, both exploring, and must not take the descent for a frozen chain
    def run():
        kernel = SGLD(potential_fn=half_square, step_size=0.5, cycle_length=1000, exploration_fraction=0.9)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            MCMC(kernel, num_warmup=0, num_samples=1000, progress_bar=False, verdict=False).run(
                jax.random.PRNGKey(0), init_params={"x": jnp.ones(2)})
        return [str(w.message) for w in caught if "has not moved" in str(w.message)]

    assert run() == []
    monkeypatch.setattr(SGLD, "_exploring", lambda self, i: False)  # the check on every step: it fires
    assert run()
