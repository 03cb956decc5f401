"""Replica-exchange SGLD and SGHMC (Deng, Feng, Gao, Liang & Lin, ICML 2020) as Pyro kernels.

1. The two-mode target ``0.3 N(-4, 1) + 0.7 N(4, 1)``, one chain started in the right mode, the ladder (1, 10): the
   chain crosses between the modes and the left mode's mass matches the exact ``0.3 Φ(4) + 0.7 Φ(-4)`` within its
   Monte Carlo error (``K_SIGMA`` MCSE, ESS by NumPyro's estimator).
2. Swap statistics in ``sample_stats``; same seed, same samples.
3. Variance-reduced energies (``anchor_every``): the anchors hold the full-data potential at their points.
"""

import math

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import scipy.stats
import torch
from pyro.infer import MCMC

from ppl_sgmcmc import adaptation
from ppl_sgmcmc.pyro import ReSGHMC, ReSGLD, sample_stats, to_inference_data
from tests.helpers import K_SIGMA, mean_and_mcse

LEFT = 0.3 * scipy.stats.norm.cdf(4) + 0.7 * scipy.stats.norm.cdf(-4)  # exact P(x < 0)
# the chains run eagerly: the replica-exchange kernels' steps are not compiled, and with `compile_potential` a chain
# would compile its gradient and its noise summary for seconds of Inductor compiling, which no test here is about
# (`test_compile.py` checks the compiled graphs against the eager ones)
EAGER = dict(compile_potential=False)


def mixture(z):
    x = z["x"]
    return -torch.logaddexp(math.log(0.3) - (x + 4) ** 2 / 2, math.log(0.7) - (x - 4) ** 2 / 2)


def run(kernel, warmup_steps, num_samples, seed=0):
    pyro.set_rng_seed(seed)
    mcmc = MCMC(kernel, warmup_steps=warmup_steps, num_samples=num_samples, initial_params={"x": torch.tensor(4.0)},
                disable_progbar=True)  # fmt: skip
    mcmc.run()
    return mcmc


@pytest.mark.parametrize("kernel", [ReSGLD, pytest.param(ReSGHMC, marks=pytest.mark.slow)])
def test_one_chain_crosses_and_weighs_the_modes(kernel):
    mcmc = run(kernel(potential_fn=mixture, step_size=0.2, temperatures=(1.0, 10.0), steps_per_sample=2, **EAGER),
               100, 1500)  # fmt: skip
    x = mcmc.get_samples()["x"].numpy()
    left, mcse = mean_and_mcse((x < 0).astype(float)[None])
    assert int(np.sum(np.diff(np.sign(x)) != 0)) > 20
    assert mcse < 0.07, mcse
    assert abs(left - LEFT) < K_SIGMA * mcse, (left, mcse)


def test_swap_statistics_and_same_seed_same_samples():
    kernel = ReSGLD(potential_fn=mixture, step_size=0.1, temperatures=(1.0, 4.0, 16.0), **EAGER)
    first, second = (run(kernel, 20, 100, seed=3) for _ in range(2))
    torch.testing.assert_close(first.get_samples()["x"], second.get_samples()["x"], rtol=0, atol=0)
    stats = sample_stats(first)
    assert {"swap_probability", "num_swaps", "cold_replica"} <= set(stats)
    assert stats["cold_replica"].shape == (1, 100) and set(np.unique(stats["cold_replica"])) <= {0, 1, 2}
    assert np.all(np.diff(stats["num_swaps"][0]) >= 0)
    idata = to_inference_data(first)
    assert idata.sample_stats["swap_probability"].shape == (1, 100)


N, BATCH, PRIOR_SD = 1000, 20, 10.0


def normal_mean(y):
    mu = pyro.sample("mu", dist.Normal(0.0, PRIOR_SD))
    with pyro.plate("data", y.shape[0], subsample_size=BATCH):
        pyro.sample("y", dist.Normal(mu, 1.0), obs=pyro.subsample(y, event_dim=0))


def test_anchors_hold_the_full_data_energy_at_their_points():
    """As the NumPyro test: after a run, every replica's anchor energy is the full-data potential at the anchor (in
    the preconditioned coordinates), and ``ŝ²`` along the offsets from the anchors is below the plain estimate's."""
    y = torch.as_tensor(np.random.default_rng(0).normal(1.5, 1.0, N), dtype=torch.float32)
    pyro.set_rng_seed(2)
    kernel = ReSGLD(normal_mean, temperatures=(1.0, 50.0), anchor_every=N // BATCH, **EAGER)
    mcmc = MCMC(kernel, warmup_steps=200, num_samples=100, disable_progbar=True)
    mcmc.run(y)
    state = kernel.last_state.state
    rule, pre = state.rule_state, state.adapt_state.preconditioner
    assert bool(rule.anchored)
    y64 = y.double().numpy()
    for anchor, energy in zip(rule.anchors, rule.anchor_energies):
        mu = float(adaptation.to_theta(pre, anchor)[0])
        exact = -scipy.stats.norm.logpdf(mu, 0.0, PRIOR_SD) - scipy.stats.norm.logpdf(y64, mu, 1.0).sum()
        assert float(energy) == pytest.approx(exact, rel=1e-5)
    offsets = rule.points - rule.anchors
    plain = float(torch.sum(rule.gradient_noise * (rule.points[0] - rule.points[1]) ** 2))
    assert float(torch.sum(rule.gradient_noise * (offsets[0] - offsets[1]) ** 2)) < plain


def test_tuned_options_carry_the_adapted_ladder():
    """``tuned_options`` returns the ladder the warm-up adapted as ``temperatures``: a kernel built with them runs
    without a warm-up at the run's temperatures."""
    kernel = ReSGLD(potential_fn=mixture, num_replicas=3, **EAGER)
    run(kernel, 300, 20)
    options = kernel.tuned_options(kernel.last_state)
    ladder = kernel.last_state.state.rule_state.ladder.tolist()
    assert options["temperatures"] == pytest.approx(ladder) and options["temperatures"][0] == 1.0
    again = ReSGLD(potential_fn=mixture, **options, **EAGER)
    run(again, 0, 20)
    assert again.last_state.state.rule_state.ladder.tolist() == pytest.approx(ladder)
