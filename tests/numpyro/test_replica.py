"""Replica-exchange SGLD and SGHMC (Deng, Feng, Gao, Liang & Lin, ICML 2020) as NumPyro kernels.

1. The two-mode target ``0.3 N(-5, 1) + 0.7 N(5, 1)`` (barrier 12.5 above the heavier mode), one chain started in the
   right mode, the kernels' defaults (tuned step size, ladder adapted in the warm-up): the chain crosses between
   the modes and the left mode's mass matches the exact ``0.3 Φ(4) + 0.7 Φ(-4)`` within its Monte Carlo error,
   where SGLD with the same gradient budget stays in its mode.
2. A conjugate Gaussian posterior (mean of N = 1000 normal observations, minibatches of 20), the ladder (1, 2):
   the mean and the variance match the exact posterior; the energies are noisy, so the swaps run with the
   estimated correction.
3. Plumbing: swap statistics in ArviZ's ``sample_stats``, same seed same samples, errors.

Tolerances: ``K_SIGMA`` Monte Carlo standard errors (``tests/helpers.py``, ESS by NumPyro's estimator); the
variance also allows the discretisation bias the helpers predict for SGLD on a Gaussian.
"""

import math

import arviz as az
import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
import scipy.stats

from ppl_sgmcmc import adaptation
from ppl_sgmcmc.numpyro import MCMC, SGLD, ReSGHMC, ReSGLD
from ppl_sgmcmc.rules import replica
from tests.helpers import K_SIGMA, mean_and_mcse

LEFT = 0.3 * scipy.stats.norm.cdf(5) + 0.7 * scipy.stats.norm.cdf(-5)  # exact P(x < 0)


def mixture(z):
    x = z["x"]
    return -jnp.logaddexp(jnp.log(0.3) - (x + 5) ** 2 / 2, jnp.log(0.7) - (x - 5) ** 2 / 2)


def run(kernel, num_warmup, num_samples, seed=0, start=5.0, **kwargs):
    mcmc = MCMC(kernel, num_warmup=num_warmup, num_samples=num_samples, progress_bar=False, **kwargs)
    mcmc.run(jax.random.PRNGKey(seed), init_params={"x": jnp.asarray(start)})
    return mcmc


@pytest.mark.parametrize("kernel", [ReSGLD, pytest.param(ReSGHMC, marks=pytest.mark.slow)])
def test_one_chain_crosses_and_weighs_the_modes(kernel):
    mcmc = run(kernel(potential_fn=mixture, steps_per_sample=10), 500, 6000)
    x = np.asarray(mcmc.get_samples()["x"])
    left, mcse = mean_and_mcse((x < 0).astype(float)[None])
    crossings = int(np.sum(np.diff(np.sign(x)) != 0))
    assert crossings > 100, crossings
    assert mcse < 0.03, mcse
    assert abs(left - LEFT) < K_SIGMA * mcse, (left, mcse)
    stats = mcmc.get_extra_fields()
    assert 0.1 < float(np.mean(stats["swap_probability"])) < 0.6  # the adapted ladder's target is 0.3
    assert set(np.unique(stats["cold_replica"]).tolist()) == {0, 1}


@pytest.mark.slow
def test_sgld_with_the_same_gradients_stays_in_its_mode():
    mcmc = run(SGLD(potential_fn=mixture, steps_per_sample=20), 500, 6000)
    assert float(np.mean(np.asarray(mcmc.get_samples()["x"]) < 0)) < 0.01


N, BATCH, PRIOR_SD = 1000, 20, 10.0


def normal_mean(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, PRIOR_SD))
    with numpyro.plate("data", y.shape[0], subsample_size=BATCH):
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=numpyro.subsample(y, event_dim=0))


@pytest.mark.slow
@pytest.mark.parametrize(("kernel", "anchor_every"), [(ReSGLD, None), (ReSGHMC, None), (ReSGLD, "epoch")])
def test_gaussian_posterior_with_minibatch_energies(kernel, anchor_every):
    y = jnp.asarray(np.random.default_rng(0).normal(1.5, 1.0, N), jnp.float32)
    precision = N + 1 / PRIOR_SD**2
    mean, var = float(y.sum()) / precision, 1 / precision
    # a fixed ladder: with minibatch energies the corrected swap rate falls with a² ŝ², and an adapted ladder
    # shrinks towards τ_1 = τ to keep its target rate (see the algorithm page)
    kernel = kernel(normal_mean, steps_per_sample=5, temperatures=(1.0, 2.0), anchor_every=anchor_every)
    # the anchored swaps are frequent: one chain's ESS then counts the fast switching between the two walkers and
    # misses their slow drift (over 8 seeds, single-chain z-scores of the mean had sd 2.1), so 4 chains, whose spread
    # the multi-chain ESS reads
    chains = 1 if anchor_every is None else 4
    mcmc = MCMC(kernel, num_warmup=500, num_samples=4000 // chains, num_chains=chains, chain_method="vectorized",
                progress_bar=False)  # fmt: skip
    mcmc.run(jax.random.PRNGKey(1), y)
    mu = np.asarray(mcmc.get_samples(group_by_chain=True)["mu"], np.float64)
    state = jax.tree.map(lambda a: a[0] if chains > 1 else a, mcmc.last_state)
    estimate, mcse = mean_and_mcse(mu)
    assert abs(estimate - mean) < K_SIGMA * mcse
    centred = (mu - mean) ** 2
    variance, variance_mcse = mean_and_mcse(centred)
    # SGLD's stationary variance on a Gaussian in unit coordinates: 1/(1 - h/2), times 1 + r for the gradient noise
    h, ratio = float(state.step_size), float(np.nanmean(np.asarray(mcmc.get_extra_fields()["noise_ratio"])))
    allowance = var * ((1 + ratio) / (1 - h / 2) - 1) if kernel is ReSGLD else var * ratio
    assert -K_SIGMA * variance_mcse < variance - var < allowance + K_SIGMA * variance_mcse, (variance, var, allowance)
    assert float(state.energy_variance[0]) > 0  # the minibatch energies are noisy: the swaps are corrected
    assert int(state.swaps[0]) > 100


def test_swap_statistics_in_inference_data_and_same_seed_same_samples():
    kernel = ReSGLD(potential_fn=mixture, step_size=0.1, temperatures=(1.0, 4.0, 16.0))
    first, second = (run(kernel, 50, 200, seed=3) for _ in range(2))
    np.testing.assert_array_equal(first.get_samples()["x"], second.get_samples()["x"])
    idata = az.from_numpyro(first)
    for name in ("swap_probability", "num_swaps", "cold_replica"):
        assert idata.sample_stats[name].shape == (1, 200)
    assert set(np.unique(idata.sample_stats["cold_replica"]).tolist()) <= {0, 1, 2}
    state = first.last_state
    assert state.ladder.tolist() == [1.0, 4.0, 16.0]  # a given ladder is not adapted
    assert state.swaps.shape == (2,) and float(state.energy_variance.sum()) >= 0


@pytest.mark.slow
def test_vectorized_chains():
    kernel = ReSGLD(potential_fn=mixture, step_size=0.1, temperatures=(1.0, 10.0), steps_per_sample=5)
    mcmc = numpyro.infer.MCMC(kernel, num_warmup=100, num_samples=300, num_chains=3, chain_method="vectorized",
                              progress_bar=False)  # fmt: skip
    mcmc.run(jax.random.PRNGKey(0), init_params={"x": jnp.full(3, 5.0)})
    stats = mcmc.get_extra_fields(group_by_chain=True)
    assert stats["cold_replica"].shape == (3, 300) and stats["num_swaps"].shape == (3, 300)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(temperatures=(2.0, 4.0)), "temperatures"),
        (dict(temperatures=(1.0, 0.5)), "temperatures"),
        (dict(temperatures=(1.0, 2.0), num_replicas=3), "num_replicas"),
        (dict(num_replicas=1), "num_replicas"),
        (dict(energy_variance=-1.0), "energy_variance"),
        (dict(correction_factor=0.0), "correction_factor"),
        (dict(target_swap_rate=1.5), "target_swap_rate"),
        (dict(cycle_length=10), "cycle_length"),
        (dict(anchor_every="often"), "anchor_every"),
        (dict(anchor_every=0), "anchor_every"),
        (dict(anchor_every=10, energy_variance=1.0), "anchor_every"),
    ],
)
def test_errors_name_the_argument(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ReSGLD(potential_fn=mixture, step_size=0.1, **kwargs)


def test_exact_energies_swap_uncorrected():
    """The kernel tells exact energies from the target when it starts a chain (its ``init``; no run needed)."""
    kernel = ReSGLD(potential_fn=mixture, step_size=0.1)
    assert kernel.hyperparameters()["energy_variance"] is None  # "auto": not yet known
    kernel.init(jax.random.PRNGKey(0), 10, {"x": jnp.asarray(5.0)})
    assert kernel.hyperparameters()["energy_variance"] == 0.0
    assert math.isfinite(kernel.hyperparameters()["correction_factor"])


def test_anchors_need_a_subsampled_plate():
    kernel = ReSGLD(potential_fn=mixture, step_size=0.1, anchor_every=10)
    with pytest.raises(ValueError, match="anchor_every"):
        kernel.init(jax.random.PRNGKey(0), 10, {"x": jnp.asarray(5.0)})


def full_energy(mu, y):
    """``U(μ)`` of :func:`normal_mean` on all of ``y``."""
    return float(-scipy.stats.norm.logpdf(mu, 0.0, PRIOR_SD) - scipy.stats.norm.logpdf(np.asarray(y, np.float64), mu,
                                                                                        1.0).sum())  # fmt: skip


def test_anchors_hold_the_full_data_energy_at_their_points():
    """``anchor_every``: after a run, every replica's anchor is a point of the
    chain (in the preconditioned coordinates) whose anchor energy is the full-data potential there, and the swaps'
    ``ŝ²`` is the noise along the offsets from the anchors: far below the plain estimate's for replicas this far
    apart."""
    y = jnp.asarray(np.random.default_rng(0).normal(1.5, 1.0, N), jnp.float32)
    kernel = ReSGLD(normal_mean, temperatures=(1.0, 50.0), anchor_every=N // BATCH)
    mcmc = MCMC(kernel, num_warmup=200, num_samples=100, progress_bar=False, verdict=False)
    mcmc.run(jax.random.PRNGKey(2), y)
    rule, pre = mcmc.last_state.rule_state, mcmc.last_state.adapt_state.preconditioner
    assert bool(rule.anchored)
    for anchor, energy in zip(rule.anchors, rule.anchor_energies):
        mu = float(adaptation.to_theta(pre, anchor)[0])
        assert float(energy) == pytest.approx(full_energy(mu, y), rel=1e-5)
    offsets = rule.points - rule.anchors
    plain = float(jnp.sum(rule.gradient_noise * (rule.points[0] - rule.points[1]) ** 2))
    assert float(jnp.sum(rule.gradient_noise * (offsets[0] - offsets[1]) ** 2)) < plain


@pytest.mark.parametrize(
    ("ladder", "noise", "fix"),
    [((1.0, 1.14), 215.0, "anchor_every="), ((1.0, 1.14), 0.0, "more replicas"), ((1.0, 1.8), 215.0, None)],
)
def test_a_collapsed_ladder_is_named_in_the_verdicts_advice(ladder, noise, fix):
    """An adapted two-replica ladder in 4 coordinates starts at (1, 2): at 1.14 it collapsed, and the advice names the
    noise correction's fix when ``a² ŝ²/2`` at the starting ratio exceeds 1, else more replicas; 1.8 did not collapse;
    a given ladder is the user's (no advice)."""
    state = jax.tree.map(lambda a: a[None], replica.init(jnp.zeros(4), jnp.zeros((2, 6)), num_replicas=2))  # a chain axis
    state = state._replace(ladder=jnp.asarray([ladder]), energy_variance=jnp.full((1, 1), noise))
    advice = ReSGLD(potential_fn=mixture).verdict_advice(state)
    assert (advice == ()) if fix is None else (len(advice) == 1 and advice[0].startswith(fix))
    assert ReSGLD(potential_fn=mixture, temperatures=ladder).verdict_advice(state) == ()
