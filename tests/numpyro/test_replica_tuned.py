"""A replica-exchange run's tuned options carry its adapted ladder; its chain resumes."""

import jax
import jax.numpy as jnp
import numpy as np

from ppl_sgmcmc.numpyro import MCMC, ReSGLD


def _potential(z):
    return 0.5 * jnp.sum(z["x"] ** 2)


def _run(kernel, num_warmup, key=0):
    mcmc = MCMC(kernel, num_warmup=num_warmup, num_samples=100, progress_bar=False, verdict=False)
    mcmc.run(jax.random.PRNGKey(key), init_params={"x": jnp.ones(2)})
    return mcmc


def test_tuned_options_give_the_adapted_ladder():
    kernel = ReSGLD(potential_fn=_potential)
    mcmc = _run(kernel, 300)
    ladder = np.asarray(mcmc.last_state.rule_state.ladder)
    options = kernel.tuned_options(mcmc.last_state)
    np.testing.assert_allclose(options["temperatures"], ladder)
    again = ReSGLD(potential_fn=_potential, **options)
    assert again.hyperparameters()["ladder"] == options["temperatures"]
    rerun = _run(again, 0, key=1)
    np.testing.assert_allclose(np.asarray(rerun.last_state.rule_state.ladder), ladder, rtol=1e-6)


def test_a_resumed_chain_keeps_its_ladder_and_continues():
    kernel = ReSGLD(potential_fn=_potential)
    mcmc = _run(kernel, 300)
    ladder, steps = np.asarray(mcmc.last_state.rule_state.ladder), int(mcmc.last_state.i)
    mcmc.post_warmup_state = mcmc.last_state
    mcmc.run(mcmc.last_state.rng_key, init_params={"x": jnp.ones(2)})
    assert int(mcmc.last_state.i) == steps + 100
    np.testing.assert_array_equal(np.asarray(mcmc.last_state.rule_state.ladder), ladder)
