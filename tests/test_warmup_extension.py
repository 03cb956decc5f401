"""Whether the warm-up settled (:func:`ppl_sgmcmc.adaptation.settled`) and what a failed verdict then advises."""

import jax
import jax.numpy as jnp
import pytest

from ppl_sgmcmc import adaptation as ad
from ppl_sgmcmc.verdict import Verdict


def _close_first_window(draws):
    """The adaptation state after the initial buffer and the first slow window of a 4000-step warm-up saw ``draws``."""
    d = draws.shape[1]
    ends = ad.window_ends(ad.adaptation_schedule(4000), jnp.zeros(d))
    state = ad.adapt_init(ad.identity(d, dense=False, like=jnp.zeros(d)), 0.1, 1.0, jnp.zeros(d), 0.0)
    step = jax.jit(ad.adapt_step, static_argnames=("adapt_mass", "tune_step_size"))
    for t in range(int(ends[1])):
        u = ad.to_u(state.preconditioner, draws[t])
        state, _ = step(state, u, draws[t], 0.0, jnp.zeros(d), False, t, ends, adapt_mass=True, tune_step_size=False,
                        target=0.1, temperature=1.0, max_step_size=0.2)
    return state


@pytest.mark.parametrize("seed", range(3))
def test_a_window_of_the_metric_s_own_variances_settles(seed):
    # 200 independent draws of unit variance: every coordinate explored, no variance beyond chance
    draws = jax.random.normal(jax.random.key(seed), (800, 5))
    state = _close_first_window(draws)
    assert float(state.explored) > 2 and bool(ad.settled(state))


def test_a_window_of_twice_the_variance_does_not_settle():
    draws = jax.random.normal(jax.random.key(0), (800, 5)) * jnp.array([1.0, 1.0, 1.0, 1.0, 2.0 ** 0.5])
    state = _close_first_window(draws)
    # 200 draws: the log-variance's error is 0.1, log 2 is 7 of them, above the bound of 3.5 for 5 coordinates
    assert float(state.misfit) > 1.5 and not bool(ad.settled(state))


def test_a_window_that_explored_nothing_is_not_judged():
    # a slow trend: about BATCHES effective draws, too few to rescale, so neither settled nor unsettled by its variance
    draws = jnp.linspace(-20.0, 20.0, 800)[:, None] * jnp.ones((1, 3))
    state = _close_first_window(draws)
    assert float(state.explored) < 0.75 and float(state.misfit) == 0 and bool(ad.settled(state))


def test_settle_bound_is_the_bonferroni_quantile():
    # P(|Z| > bound) = level / d for each of d coordinates
    from statistics import NormalDist

    for d in (1, 10, 1000):
        assert 2 * (1 - NormalDist().cdf(ad.settle_bound(d))) == pytest.approx(ad.SETTLE_LEVEL / d)


def _failed(warmup):
    return Verdict(4, 1000, 1.3, "theta[0]", 30.0, 60.0, 1.0, "radius", warmup=warmup)


def test_a_failed_run_whose_windows_explored_too_little_is_told_how_much_longer():
    message = _failed((0.0, 0.3, 0)).message("SGLD")
    assert "about 10 effective draws" in message and "a warm-up about 4x as long" in message


def test_a_failed_run_whose_warm_up_had_not_settled_is_told_so():
    message = _failed((2.5, 1.5, 2)).message("SGLD")
    assert "had not settled after running 2 more time(s)" in message and "max_warmup" in message


def test_a_settled_warm_up_adds_nothing():
    assert _failed((0.5, 1.5, 0)).message("SGLD") == _failed(None).message("SGLD")
