import math

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from ppl_sgmcmc import schedules


def test_constant():
    assert float(schedules.constant(0.1)(1000)) == pytest.approx(0.1)


def test_polynomial_matches_formula():
    schedule = schedules.polynomial(0.5, 10.0, 0.55)
    t = jnp.arange(5)
    np.testing.assert_allclose(schedule(t), 0.5 * (10.0 + np.arange(5)) ** -0.55, rtol=1e-6)


def test_cyclical_restarts_each_cycle():
    schedule = schedules.cyclical(0.2, num_steps=100, num_cycles=4)
    assert float(schedule(0)) == pytest.approx(0.2)
    assert float(schedule(25)) == pytest.approx(0.2)  # restart
    assert float(schedule(12.5)) == pytest.approx(0.1, rel=1e-5)  # half-way down
    assert float(schedule(24)) == pytest.approx(0.1 * (math.cos(math.pi * 24 / 25) + 1), rel=1e-5)


def test_optax_schedules_are_accepted():
    from ppl_sgmcmc.numpyro import SGLD

    kernel = SGLD(lambda: None, step_size=optax.exponential_decay(1e-2, 100, 0.5))
    assert float(kernel.step_size_at(100)) == pytest.approx(5e-3)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: schedules.polynomial(0.1, 0.0, 0.55), "`b` must be positive"),
        (lambda: schedules.polynomial(0.1, 1.0, -1.0), "`gamma` must be non-negative"),
        (lambda: schedules.cyclical(0.1, 10, 0), "0 < num_cycles <= num_steps"),
    ],
)
def test_bad_schedule_arguments(make, message):
    with pytest.raises(ValueError, match=message):
        make()
