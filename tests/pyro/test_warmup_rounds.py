"""``max_warmup`` on Pyro: the warm-up runs again within its last draw while it has not settled."""

import pytest
import torch
from pyro.infer import MCMC

from ppl_sgmcmc import adaptation
from ppl_sgmcmc.pyro import SGLD

pytestmark = pytest.mark.filterwarnings("ignore:SGLD. the run is too short:RuntimeWarning")


def _potential(z):
    return 0.5 * (z["x"] ** 2 / torch.tensor([1.0, 4.0])).sum()


def _run(max_warmup):
    # the potential runs eagerly: with `compile_potential` the kernel compiles its noise estimate's update and summary
    # (seconds of Inductor compiling), which the warm-up's rounds are not about; the eager step draws the same values
    # (`test_compile.py` checks the compiled graphs against the eager ones)
    kernel = SGLD(potential_fn=_potential, max_warmup=max_warmup, compile_potential=False)
    mcmc = MCMC(kernel, num_samples=300, warmup_steps=200, initial_params={"x": torch.ones(2)},
                disable_progbar=True)
    mcmc.run()
    return mcmc, kernel


@pytest.fixture
def never_settled(monkeypatch):
    monkeypatch.setattr(adaptation, "settled", lambda state: torch.tensor(False))


def test_an_unsettled_warm_up_runs_again_up_to_max_warmup(never_settled):
    mcmc, kernel = _run(max_warmup=700)  # 700 // 200 - 1 = 2 more warm-ups
    assert int(kernel.last_state.state.adapt_state.rounds) == 2
    assert kernel.last_state.state.i == 500  # the step count restarted with each warm-up
    assert mcmc.get_samples()["x"].shape == (300, 2)


def test_without_max_warmup_nothing_runs_again(never_settled):
    _, kernel = _run(max_warmup=None)
    assert int(kernel.last_state.state.adapt_state.rounds) == 0 and kernel.last_state.state.i == 500


def test_a_settled_warm_up_is_the_run_without_max_warmup():
    longer, _ = _run(max_warmup=1000)
    torch.manual_seed(0)
    plain, _ = _run(max_warmup=None)
    assert torch.equal(longer.get_samples()["x"], plain.get_samples()["x"])
