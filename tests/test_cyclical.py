"""Cyclical SG-MCMC's stages (:class:`ppl_sgmcmc.algorithms.Cycles`), backend-neutral: which steps explore, the
cosine step size, which recorded draws are kept, and the checks of the kernel option."""

import math

import numpy as np
import pytest

from ppl_sgmcmc.algorithms import EXPLORATION_FRACTION, Cycles
from ppl_sgmcmc.numpyro import SGHMC, SGLD, Santa


def test_stages_of_each_step():
    # cycles of 5 draws of 2 steps after a warm-up of 6 steps; 2 draws (4 steps) of each cycle explore
    cycles = Cycles.of(5, 0.4, None, True, "SGLD")
    assert cycles == Cycles(length=5, exploration=2)
    noisy = [cycles.sampling(i, 6, 2) for i in range(6 + 2 * 10)]
    warmup, first, second = noisy[:6], noisy[6:16], noisy[16:]
    assert warmup == [True] * 6
    assert first == second == [False] * 4 + [True] * 6


def test_step_size_is_the_cosine_cycle_from_the_peak():
    cycles = Cycles.of(4, 0.5, None, True, "SGLD")
    steps = 4 * 3  # 4 draws of 3 steps
    for i in range(10 + 2 * steps):
        r = ((i - 10) % steps) / steps
        expected = 1.0 if i < 10 else (math.cos(math.pi * r) + 1) / 2
        assert cycles.factor(i, 10, 3) == pytest.approx(expected, abs=1e-12)
    # the array form (a traced step count) agrees, and stays positive in float32 at a long cycle's last step
    i = np.arange(10 + 2 * steps)
    np.testing.assert_allclose(cycles.factor(i, 10, 3), [cycles.factor(int(k), 10, 3) for k in i], atol=1e-12)
    np.testing.assert_array_equal(cycles.sampling(i, 10, 3), [cycles.sampling(int(k), 10, 3) for k in i])
    long = Cycles.of(20_000, 0.5, None, True, "SGLD")
    assert long.factor(np.int32(19_999), 0, 1).astype(np.float32) > 0


def test_exploration_is_rounded_to_whole_draws():
    assert Cycles.of(10, None, None, True, "SGLD").exploration == round(EXPLORATION_FRACTION * 10)
    assert Cycles.of(7, 0.3, None, True, "SGLD").exploration == 2
    assert Cycles.of(7, 0.0, None, True, "SGLD").exploration == 0
    assert Cycles.of(None, None, None, True, "SGLD") is None


def test_kept_draws_are_those_of_the_sampling_stages():
    # one step per draw, 3 warm-up draws, cycles of 4 draws whose first one explores; a draw's recorded step
    # count is the state's after it: the warm-up's last draw has i = 3
    kernel = SGHMC(potential_fn=lambda z: 0.0, step_size=0.1, cycle_length=4, exploration_fraction=0.25)
    kernel._set_warmup(3)
    counts = np.arange(4, 4 + 8)
    assert kernel.sampling_stage(counts).tolist() == [False, True, True, True] * 2
    assert kernel.sampling_stage(np.array([[3]])).tolist() == [[True]]  # a warm-up draw
    assert SGLD(potential_fn=lambda z: 0.0, step_size=0.1).sampling_stage(counts).all()


def test_a_cyclical_kernel_records_the_step_count_and_is_not_compiled_once():
    kernel = SGLD(potential_fn=lambda z: 0.0, step_size=0.1, cycle_length=10)
    assert kernel.sample_stats_fields == ("i",)
    assert not kernel._same_step_after_warmup()  # the step size and the noise change along the chain


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"step_size": 0.1, "exploration_fraction": 0.5}, "give `cycle_length`"),
        ({"step_size": lambda t: 0.1, "cycle_length": 10}, "not a schedule"),
        ({"step_size": 0.1, "cycle_length": 0}, "cycle_length"),
        ({"step_size": 0.1, "cycle_length": 10, "exploration_fraction": 1.0}, r"in \[0, 1\)"),
        ({"step_size": 0.1, "cycle_length": 10, "exploration_fraction": "half"}, "exploration_fraction"),
        ({"step_size": 0.1, "cycle_length": 2, "exploration_fraction": 0.9}, "no sampling draw"),
    ],
)
def test_bad_cycle_options_are_refused_by_name(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SGLD(potential_fn=lambda z: 0.0, **kwargs)


def test_an_optimiser_has_no_sampling_stage():
    with pytest.raises(ValueError, match="optimiser"):
        Santa(potential_fn=lambda z: 0.0, step_size=0.1, cycle_length=10)
