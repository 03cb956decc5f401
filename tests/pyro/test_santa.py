"""Santa on Pyro: the same trajectory as on NumPyro (same gradient, same noise), through the exploration, the
switch to refinement and the annealing schedule; the same checks of its arguments."""

import math

import numpy as np
import pytest
import torch

from ppl_sgmcmc import numpyro as np_backend
from ppl_sgmcmc import pyro as pyro_backend
from ppl_sgmcmc.rules.santa import annealing
from tests.pyro.models import logistic_model
from tests.pyro.test_cross_backend import energy_jax, energy_torch
from tests.pyro.trajectories import assert_same_trajectory

CASES = {
    # the 10 warm-up steps explore, the 15 kept draws refine (one step per draw: NumPyro traces the noise of a
    # multi-step draw once, so the injected noise sequence could not reach every step)
    "warmup-explores": (dict(step_size=0.1, inverse_temperature=annealing(scale=4.0)), 10),
    "explicit-switch": (dict(step_size=0.05, num_exploration=17, decay=0.9, eps=1e-3, initial_thermostat=2.0), 0),
    "curvature-term": (dict(step_size=0.1, num_exploration=20, initial_thermostat=1.0, curvature_term=True), 0),
    "beta-1-sampler": (dict(step_size=0.1, inverse_temperature=1.0, num_exploration=math.inf), 0),
}


@pytest.mark.parametrize(  # one case in the quick tier, the others in the slow
    "case", [case if case == "curvature-term" else pytest.param(case, marks=pytest.mark.slow) for case in CASES]
)
def test_same_trajectory_as_numpyro(case, monkeypatch):
    hyper, num_warmup = CASES[case]
    np_kernel = np_backend.Santa(potential_fn=energy_jax, **hyper)
    pyro_kernel = pyro_backend.Santa(potential_fn=energy_torch, **hyper)
    # the curvature term divides by the momentum, which amplifies round-off
    assert_same_trajectory(monkeypatch, np_kernel, pyro_kernel, num_warmup=num_warmup, num_draws=15,
                           atol=2e-5 if hyper.get("curvature_term") else 2e-6)  # fmt: skip


def test_arguments_and_warmup():
    with pytest.raises(ValueError, match="give a `step_size`"):
        pyro_backend.Santa(potential_fn=energy_torch)
    with pytest.raises(ValueError, match="`temperature` must be 1"):
        pyro_backend.Santa(potential_fn=energy_torch, step_size=0.1, temperature=2.0)
    kernel = pyro_backend.Santa(potential_fn=energy_torch, step_size=0.1)
    kernel.initial_params = {"x": torch.zeros(3)}
    kernel.setup(warmup_steps=0)
    with pytest.warns(UserWarning, match="leaves none: the chain only refines"):
        kernel.sample(kernel.initial_params)
    assert kernel.hyperparameters()["num_exploration"] == 0 and kernel.temperature_at(0) == 0.0
    assert sorted(kernel.logging()) == ["T", "div", "h", "Ũ_t", "ξ̄"]
    np.testing.assert_array_equal(kernel.state.noise_ratio, np.nan)


def test_thermostat_starts_at_c_sqrt_n(logistic_data):
    """On a model of ``N`` data the thermostat starts at ``C sqrt(N)`` (the rule's ``init``, as on NumPyro)."""
    kernel = pyro_backend.Santa(logistic_model, step_size=1e-4, initial_thermostat=2.0, num_exploration=10)
    kernel.setup(0, *logistic_data)
    kernel._start(kernel.initial_params)
    size = kernel.hyperparameters()["data_size"]
    assert size == logistic_data[0].shape[0] > 1
    torch.testing.assert_close(kernel.state.rule_state.thermostat, torch.full_like(kernel._flat, 2.0 * size**0.5))
