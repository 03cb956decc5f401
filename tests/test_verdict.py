"""The end-of-run verdict (ppl_sgmcmc.verdict) on arrays with known answers, and on runs of both backends."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from numpyro.infer import MCMC as NumPyroMCMC
from pyro.infer import MCMC as PyroMCMC

from ppl_sgmcmc import checkpoint, verdict
from ppl_sgmcmc.diagnostics import verdict as run_verdict
from ppl_sgmcmc.numpyro import MCMC, SGLD, SGNHT
from ppl_sgmcmc.numpyro import kernel as numpyro_kernel
from ppl_sgmcmc.numpyro.scores import RunView
from ppl_sgmcmc.pyro import SGLD as PyroSGLD
from tests.numpyro.conftest import logistic_model

VERDICT = "(ppl_sgmcmc.verdict;"


def ar1(rng, chains, draws, d, rho):
    """Stationary AR(1) chains of unit variance and autocorrelation ``rho``."""
    x = np.empty((chains, draws, d))
    x[:, 0] = rng.normal(size=(chains, d))
    for t in range(1, draws):
        x[:, t] = rho * x[:, t - 1] + np.sqrt(1 - rho**2) * rng.normal(size=(chains, d))
    return x


def verdicts(caught):
    return [str(w.message) for w in caught if VERDICT in str(w.message)]


# --- the statistics, on arrays --------------------------------------------------------------------------------------
@pytest.mark.parametrize("chains", [1, 4])
def test_independent_draws_pass(chains):
    for seed in range(5):  # a fixed set of seeds: no false alarm on any
        result = verdict.assess(np.random.default_rng(seed).normal(size=(chains, 1000, 5)))
        assert result.ok, result
        assert result.ess_bulk > 0.5 * chains * 1000  # the smallest of the quantities' estimates, near the count


def test_chains_stuck_apart_are_unmixed():
    rng = np.random.default_rng(0)
    centres = np.array([0.0, 0.0, 3.0, 3.0])[:, None, None]
    result = verdict.assess(rng.normal(size=(4, 1000, 3)) + centres)
    assert result.unmixed and not result.ok and result.rhat > 1.5


def test_one_chain_that_moved_between_its_halves_is_unmixed():
    x = np.random.default_rng(0).normal(size=(1, 2000, 2))
    x[0, 1000:, 1] += 3.0
    result = verdict.assess(x)
    assert result.unmixed and result.num_chains == 1


def test_slow_chains_have_too_few_effective_draws():
    result = verdict.assess(ar1(np.random.default_rng(0), 4, 2000, 3, rho=0.995))  # tau ~ 400: ESS ~ 20
    assert result.too_few and not result.ok
    assert result.ess_bulk < verdict.ESS_PER_CHAIN * 4


def test_burn_in_left_in_the_draws_drifts():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 4000, 3))
    x[:, :400] += np.linspace(4.0, 0.0, 400)[None, :, None]  # the first 10 %: still on its way in
    result = verdict.assess(x)
    assert result.drifting and result.drift > verdict.DRIFT_Z


def test_stationary_correlated_chains_do_not_drift():
    for seed in range(5):
        result = verdict.assess(ar1(np.random.default_rng(seed), 4, 4000, 3, rho=0.9))
        assert not result.drifting, result


def test_noise_ratio_quantile_against_the_limit():
    x = np.random.default_rng(0).normal(size=(2, 500, 2))
    ratios = np.full((2, 500), 0.1)
    assert verdict.assess(x, noise_ratio=ratios, noise_limit=0.5).ok
    ratios[:, :100] = 2.0  # 20 % of the draws: the 90 % quantile is above the limit
    result = verdict.assess(x, noise_ratio=ratios, noise_limit=0.5)
    assert result.noisy and result.noise_ratio == pytest.approx(2.0)
    assert "noise ratio" in result.message("SGLD") and "larger subsample_size" in result.message("SGLD")


def test_energy_is_watched():
    rng = np.random.default_rng(0)
    energy = rng.normal(size=(4, 1000)) + np.array([0.0, 0.0, 0.0, 5.0])[:, None]
    result = verdict.assess(rng.normal(size=(4, 1000, 2)), energy=energy)
    assert result.unmixed and result.rhat_of == "the potential energy"


def test_constant_and_non_finite_coordinates_are_skipped():
    x = np.random.default_rng(0).normal(size=(4, 500, 3))
    x[..., 1] = 2.0
    x[0, 3, 2] = np.nan
    assert verdict.assess(x).ok


def test_message_names_the_failures_and_the_fixes():
    text = verdict.Verdict(4, 1000, 1.3, "theta[2]", 40.0, 90.0, 9.0, "the radius").message("SGNHT")
    assert text.startswith(f"SGNHT: {verdict.SEVERE}: ") and "R-hat 1.300 on theta[2]" in text
    assert "40 effective draws" in text and "burn-in" in text and "run longer" in text and "dense_mass=True" in text
    short = verdict.Verdict(4, 1000, 1.02, "theta[0]", 300.0, 900.0, 1.0, "the radius")
    assert not short.severe and short.message("SGLD").startswith(f"SGLD: {verdict.SHORT}: ")


def test_the_algorithms_advice_comes_first_and_only_for_a_failed_run():
    rng = np.random.default_rng(0)
    advice = ("anchor_every='epoch': the ladder collapsed",)
    failed = verdict.assess(rng.normal(size=(4, 1000, 3)) * 0.1 + np.arange(4.0)[:, None, None], advice=advice)
    assert not failed.ok and failed.message("ReSGLD").split("Try: ")[1].startswith(advice[0])
    assert verdict.assess(rng.normal(size=(4, 1000, 3)), advice=advice).ok


def test_draws_without_a_finite_coordinate_fail():
    x = np.random.default_rng(0).normal(size=(2, 100, 2))
    x[0, 5] = np.nan
    assert not verdict.assess(x).ok


@pytest.mark.parametrize("bad", [np.zeros((10, 3)), np.zeros((2, 5, 3))])
def test_bad_shapes_are_refused(bad):
    with pytest.raises(ValueError, match="verdict"):
        verdict.assess(bad)


def test_kept_draws_stay_evenly_spaced_and_bounded():
    kept = verdict.KeptDraws()
    for t in range(5 * verdict.MAX_DRAWS + 3):
        kept.add(np.array([float(t), -float(t)]))
    draws = kept.draws()[0, :, 0]
    assert verdict.MAX_DRAWS <= draws.shape[0] < 2 * verdict.MAX_DRAWS
    assert len(set(np.diff(draws))) == 1  # evenly spaced


# --- the runs -----------------------------------------------------------------------------------------------------------
def gaussian(z):
    return 0.5 * jnp.sum(z["x"] ** 2)


def run_numpyro(mcmc, chains=2):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mcmc.run(jax.random.PRNGKey(0), init_params={"x": jnp.zeros((chains, 2))})
    return verdicts(caught)


def test_numpyro_mcmc_judges_its_runs():
    short = MCMC(SGLD(potential_fn=gaussian, step_size=0.005), num_warmup=10, num_samples=200, num_chains=2,
                 chain_method="vectorized", progress_bar=False)  # fmt: skip
    messages = run_numpyro(short)
    assert len(messages) == 1 and "effective draws" in messages[0]
    assert short.last_verdict is not None and short.last_verdict.too_few
    mixed = MCMC(SGLD(potential_fn=gaussian, step_size=0.5), num_warmup=50, num_samples=2000, num_chains=2,
                 chain_method="vectorized", progress_bar=False)  # fmt: skip
    assert run_numpyro(mixed) == [] and mixed.last_verdict.ok
    off = MCMC(SGLD(potential_fn=gaussian, step_size=0.005), num_warmup=10, num_samples=200, num_chains=2,
               chain_method="vectorized", progress_bar=False, verdict=False)  # fmt: skip
    assert run_numpyro(off) == [] and off.last_verdict is None


def test_numpyro_warmup_draws_are_not_judged():
    mcmc = MCMC(SGLD(potential_fn=gaussian, step_size=0.005), num_warmup=200, num_samples=200, progress_bar=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mcmc.warmup(jax.random.PRNGKey(0), init_params={"x": jnp.zeros(2)}, collect_warmup=True)
    assert verdicts(caught) == [] and mcmc.last_verdict is None


def test_plain_numpyro_mcmc_is_told_once_how_to_get_a_verdict(monkeypatch):
    monkeypatch.setattr(numpyro_kernel, "_VERDICT_NOTED", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            mcmc = NumPyroMCMC(SGLD(potential_fn=gaussian, step_size=0.005), num_warmup=10, num_samples=200,
                               progress_bar=False)  # fmt: skip
            mcmc.run(jax.random.PRNGKey(0), init_params={"x": jnp.zeros(2)})
    notes = [str(w.message) for w in caught if "no end-of-run verdict" in str(w.message)]
    assert len(notes) == 1 and "ppl_sgmcmc.numpyro.MCMC" in notes[0] and verdicts(caught) == []
    assert not run_verdict(mcmc, warn=False).ok  # judged on request


def test_numpyro_verdict_reads_the_latent_sites():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 2)).astype(np.float32)
    y = (X @ np.array([1.0, -0.5]) + rng.logistic(size=200) > 0).astype(np.float32)
    mcmc = NumPyroMCMC(SGNHT(logistic_model, step_size=1e-3), num_warmup=10, num_samples=100, num_chains=2,
                       chain_method="vectorized", progress_bar=False)  # fmt: skip
    mcmc.run(jax.random.PRNGKey(0), jnp.asarray(X), jnp.asarray(y))
    result = run_verdict(mcmc, warn=False)
    assert result.num_chains == 2 and result.num_draws == 100
    draws, noise_ratio, energy = RunView(mcmc, "test").kept()
    assert draws.shape == (2, 100, 3)  # w and scale: the deterministic site scaled_w is not a latent
    assert noise_ratio.shape == (2, 100) and energy is None  # potential_energy was not collected
    assert result.noise_limit == SGNHT.noise_ratio_limit  # the noise ratios were read


def pyro_run(step_size, num_samples, seed=0):
    torch.manual_seed(seed)
    kernel = PyroSGLD(potential_fn=lambda z: 0.5 * (z["x"] ** 2).sum(), step_size=step_size)
    mcmc = PyroMCMC(kernel, warmup_steps=10, num_samples=num_samples, initial_params={"x": torch.zeros(2)},
                    disable_progbar=True)  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mcmc.run()
    return mcmc, verdicts(caught)


def test_pyro_chains_are_judged_at_their_end():
    mcmc, messages = pyro_run(0.005, 200)
    assert len(messages) == 1 and "halves of the chain" in messages[0]
    assert not run_verdict(mcmc, warn=False).ok
    mcmc, messages = pyro_run(0.5, 2000)
    assert messages == [] and run_verdict(mcmc, warn=False).ok


def test_a_health_warning_stands_for_the_verdict():
    kernel = PyroSGLD(potential_fn=lambda z: 0.5 * (z["x"] ** 2).sum(), step_size=lambda t: 0.005 - 1e-4 * t)
    mcmc = PyroMCMC(kernel, warmup_steps=0, num_samples=200, initial_params={"x": torch.zeros(2)},
                    disable_progbar=True)  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mcmc.run()
    assert any("step_size" in str(w.message) for w in caught) and verdicts(caught) == []


def test_checkpointed_runs_are_judged_once_at_the_end(tmp_path):
    mcmc = MCMC(SGLD(potential_fn=gaussian, step_size=0.5), num_warmup=50, num_samples=2000, progress_bar=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        checkpoint.run(mcmc, jax.random.PRNGKey(0), init_params={"x": jnp.zeros(2)}, checkpoint=tmp_path / "a",
                       checkpoint_every=100)  # fmt: skip
    assert verdicts(caught) == [] and mcmc.verdict is True  # each 100-draw chunk alone would fail
    short = MCMC(SGLD(potential_fn=gaussian, step_size=0.005), num_warmup=10, num_samples=200, progress_bar=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        checkpoint.run(short, jax.random.PRNGKey(0), init_params={"x": jnp.zeros(2)}, checkpoint=tmp_path / "b",
                       checkpoint_every=100)  # fmt: skip
    assert len(verdicts(caught)) == 1


def test_an_optimiser_is_not_judged():
    from ppl_sgmcmc.numpyro import Santa

    mcmc = MCMC(Santa(potential_fn=gaussian, step_size=1e-3), num_warmup=10, num_samples=200, progress_bar=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mcmc.run(jax.random.PRNGKey(0), init_params={"x": jnp.ones(2)})
    assert verdicts(caught) == [] and mcmc.last_verdict is None



@pytest.mark.parametrize("kind", ["restarts", "noise"])
def test_an_advisory_health_warning_leaves_the_verdict_to_judge(monkeypatch, kind):
    """A warm-up that ran off and recovered (``restarts``) says to check the chains' agreement, and a noise ratio above
    the limit says nothing of it (:data:`ppl_sgmcmc.health.ADVISORY`): the verdict still judges the run and warns when
    it fails (a run too short for the posterior). Any other kind's warning stands for the verdict."""
    from ppl_sgmcmc import health

    advisory = lambda kernel, flags, values, tuned=False, reducible=False: {kind: f"{kernel}: {kind} (advisory)"}  # noqa: E731
    monkeypatch.setattr(health, "failures", advisory)
    short = MCMC(SGLD(potential_fn=gaussian, step_size=0.005), num_warmup=10, num_samples=200, progress_bar=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        short.run(jax.random.PRNGKey(0), init_params={"x": jnp.zeros(2)})
    assert any(f"{kind} (advisory)" in str(w.message) for w in caught) and len(verdicts(caught)) == 1
    reporter = health.Reporter("SGLD")
    reporter.reported = {kind}
    assert not reporter.named_failure
    reporter.reported.add("rejections")
    assert reporter.named_failure
