"""``max_warmup``: the warm-up runs again under :class:`ppl_sgmcmc.numpyro.MCMC` while it has not settled."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ppl_sgmcmc import adaptation
from ppl_sgmcmc.numpyro import MCMC, SGLD


def _potential(z):
    return 0.5 * jnp.sum(z["x"] ** 2 / jnp.array([1.0, 4.0]))


def _run(max_warmup, progress_bar=False, num_chains=2, **kwargs):
    kernel = SGLD(potential_fn=_potential, max_warmup=max_warmup)
    mcmc = MCMC(kernel, num_warmup=200, num_samples=300, num_chains=num_chains, chain_method="vectorized",
                progress_bar=progress_bar, verdict=False, **kwargs)
    mcmc.run(jax.random.PRNGKey(0), init_params={"x": jnp.ones((num_chains, 2))}, extra_fields=("i",))
    return mcmc


@pytest.fixture
def never_settled(monkeypatch):
    monkeypatch.setattr(adaptation, "settled", lambda state: jnp.zeros(jnp.shape(state.misfit), bool))


def test_an_unsettled_warm_up_runs_again_up_to_max_warmup(never_settled):
    mcmc = _run(max_warmup=700)  # 700 // 200 - 1 = 2 more warm-ups
    state = mcmc.last_state
    assert np.asarray(state.adapt_state.rounds).tolist() == [2, 2]
    assert np.asarray(state.i).tolist() == [500, 500]  # the step count restarted with each warm-up
    # the draws are the sampling draws only, the step counts of the draws after the last warm-up
    assert mcmc.get_samples(group_by_chain=True)["x"].shape == (2, 300, 2)
    assert np.asarray(mcmc.get_extra_fields(group_by_chain=True)["i"][0]).tolist() == list(range(201, 501))


def test_the_bar_draws_the_same_chain(never_settled):
    quiet, shown = _run(max_warmup=700), _run(max_warmup=700, progress_bar=True)
    np.testing.assert_array_equal(quiet.get_samples()["x"], shown.get_samples()["x"])


def test_replays_change_the_chain(never_settled):
    again, once = _run(max_warmup=700), _run(max_warmup=None)
    assert int(np.max(once.last_state.adapt_state.rounds)) == 0
    assert not np.array_equal(again.get_samples()["x"], once.get_samples()["x"])


def test_a_settled_warm_up_is_the_run_without_max_warmup():
    longer, plain = _run(max_warmup=1000), _run(max_warmup=None)
    assert int(np.max(longer.last_state.adapt_state.rounds)) == 0
    np.testing.assert_array_equal(longer.get_samples()["x"], plain.get_samples()["x"])


def test_numpyro_s_mcmc_runs_no_replay(never_settled):
    import numpyro.infer

    kernel = SGLD(potential_fn=_potential, max_warmup=700)
    mcmc = numpyro.infer.MCMC(kernel, num_warmup=200, num_samples=300, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), init_params={"x": jnp.ones(2)})
    assert int(mcmc.last_state.adapt_state.rounds) == 0 and int(mcmc.last_state.i) == 500


def test_max_warmup_is_checked():
    with pytest.raises(ValueError, match="max_warmup"):
        SGLD(potential_fn=_potential, max_warmup=0)
