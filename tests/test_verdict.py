"""The end-of-run verdict (ppl_sgmcmc.verdict) on arrays with known answers, and on runs of both backends."""

import dataclasses
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pyro
import pyro.distributions as pyro_dist
import pytest
import torch
from numpyro.infer import MCMC as NumPyroMCMC
from pyro.infer import MCMC as PyroMCMC
from scipy import stats

from ppl_sgmcmc import checkpoint, verdict
from ppl_sgmcmc.algorithms import MAX_DENSE_DIM
from ppl_sgmcmc.diagnostics import _row_log_likelihoods, fixed_rows
from ppl_sgmcmc.diagnostics import verdict as run_verdict
from ppl_sgmcmc.numpyro import MCMC, SGLD, SGNHT
from ppl_sgmcmc.numpyro import kernel as numpyro_kernel
from ppl_sgmcmc.numpyro.scores import RunView
from ppl_sgmcmc.pyro import SGLD as PyroSGLD
from ppl_sgmcmc.pyro.scores import RunView as PyroRunView
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


def test_chains_each_constant_and_apart_are_unmixed_and_said_so():
    """A quantity constant within each chain and different between them (a prediction of chains frozen in different
    places): ArviZ's R-hat is infinite (a within-chain variance of zero; about 1e15 where rounding leaves one), which
    must count as chains that disagree, not as a constant with nothing to compare, and the message says what it means
    rather than print the number. A quantity constant in every chain is left out (R-hat NaN: nothing to compare)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 1000, 3)).astype(np.float32)
    x[..., 1] = np.float32(0.1) * np.arange(4, dtype=np.float32)[:, None]
    x[..., 2] = 1.0
    result = verdict.assess(x, judge="predictions", predictions=x)
    assert result.unmixed and result.rhat == np.inf and result.rhat_of == "prediction[1]", result
    message = result.message("SGNHT")
    assert "R-hat unbounded on prediction[1]: each chain nearly constant there, the chains apart" in message, message
    assert "inf" not in message and "e+" not in message, message
    assert verdict.assess(x[..., [0, 2]], judge="predictions", predictions=x[..., [0, 2]]).ok


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


def test_the_fixes_offered_are_those_the_run_can_take():
    """A dense metric is offered only where the draws' dimension allows one, and leaving the step size unset only
    where nothing adapted (a tuned step size is unset already)."""
    drifting = verdict.Verdict(4, 1000, 1.3, "theta[2]", 40.0, 90.0, 9.0, "the radius")
    assert "dense_mass=True" in drifting.message("SGLD") and "leave it unset" in drifting.message("SGLD")
    network = dataclasses.replace(drifting, dimension=MAX_DENSE_DIM + 1, warmup=(0.5, 1.0, 0))
    assert "dense_mass=True" not in network.message("SGLD") and "leave it unset" not in network.message("SGLD")
    assert "run longer" in network.message("SGLD")
    assert verdict.assess(np.random.default_rng(0).normal(size=(2, 100, 7))).dimension == 7


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


# --- models with symmetries: the predictions ----------------------------------------------------------------------
def mirrored(rng, draws=1000, rows=8):
    """Four chains of ``(a, b)`` around ``(±1, 0.5)`` (two in each mirror image) and their predictions ``a² + b x_j``
    at ``rows`` inputs, which the sign of ``a`` does not change."""
    ab = np.stack([1.0 + 0.05 * rng.normal(size=(4, draws)), 0.5 + 0.05 * rng.normal(size=(4, draws))], axis=-1)
    ab[2:, :, 0] *= -1.0
    x = np.linspace(-1.0, 1.0, rows)
    return ab, ab[..., :1] ** 2 + ab[..., 1:] * x


def test_mirror_image_chains_agree_on_the_predictions():
    ab, f = mirrored(np.random.default_rng(0))
    result = verdict.assess(ab, predictions=f)
    assert result.symmetric and not result.unmixed and not result.severe and not result.ok
    assert result.parameters_rhat[0] > 1.5 and result.parameters_rhat[1] == "theta[0]"
    assert result.judged == "predictions" and result.rhat <= verdict.RHAT_LIMIT and not result.too_few
    text = result.message("SGLD")
    assert text.startswith(f"SGLD: {verdict.SYMMETRIC}: ") and 'verdict="predictions"' in text
    assert 'judge="predictions"' in text and "if it has none (a regression's weights), the chains have not met" in text
    # running longer joins no copies: the advice is for a model without symmetries, whose chains have not met
    assert text.count("run longer") == 1 and "or for a model without symmetries, run longer" in text
    judged = verdict.assess(ab, predictions=f, judge="predictions")
    assert judged.ok and judged.judged == "predictions" and judged.parameters_rhat is None
    assert verdict.assess(ab).severe  # without predictions: chains that never met


def test_predictions_that_disagree_are_judged_as_such():
    ab, f = mirrored(np.random.default_rng(0))
    f[2:] += 1.0  # the second pair of chains predicts otherwise: not a copy of the first pair's posterior
    result = verdict.assess(ab, predictions=f)
    assert not result.symmetric and result.severe and result.judged == "parameters"
    assert result.message("SGLD").startswith(f"SGLD: {verdict.SEVERE}")
    judged = verdict.assess(ab, predictions=f, judge="predictions")
    assert judged.unmixed and judged.severe and judged.rhat_of.startswith("prediction[")


def test_predictions_at_fewer_draws_are_read():
    ab, f = mirrored(np.random.default_rng(0), draws=3 * verdict.MAX_DRAWS, rows=2)
    thinned = f[:, np.arange(verdict.MAX_DRAWS) * f.shape[1] // verdict.MAX_DRAWS]
    assert verdict.assess(ab, predictions=thinned) == verdict.assess(ab, predictions=f)
    few = f[:, np.arange(500) * f.shape[1] // 500]
    energy = np.random.default_rng(1).normal(size=f.shape[:2])  # thinned with them
    judged = verdict.assess(ab, predictions=few, energy=energy, judge="predictions")
    assert judged.ok and verdict.assess(ab, predictions=few, energy=energy).symmetric


@pytest.mark.parametrize(
    ("options", "match"),
    [({"judge": "functions"}, "`judge` must be one of"), ({"judge": "predictions"}, "needs `predictions`"),
     ({"predictions": np.zeros((3, 100, 2))}, "with the draws' 4 chains"),
     ({"predictions": np.zeros((4, 101, 2))}, "at most their 100 draws"),
     ({"predictions": np.zeros((4, 10, 2))}, "at least 20")],
)  # fmt: skip
def test_bad_predictions_and_judges_are_refused(options, match):
    with pytest.raises(ValueError, match=match):
        verdict.assess(np.zeros((4, 100, 2)), **options)


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
    mcmc = NumPyroMCMC(SGNHT(logistic_model, step_size=1e-3), num_warmup=0, num_samples=100, num_chains=2,
                       chain_method="vectorized", progress_bar=False)  # fmt: skip
    # a given start (scale = 1) and no warm-up: no search for initial values, no warm-up loop to compile
    start = {"w": jnp.zeros((2, 2)), "scale": jnp.zeros(2)}
    mcmc.run(jax.random.PRNGKey(0), jnp.asarray(X), jnp.asarray(y), init_params=start)
    result = run_verdict(mcmc, warn=False)
    assert result.num_chains == 2 and result.num_draws == 100
    draws, noise_ratio, energy = RunView(mcmc, "test").kept()
    assert draws.shape == (2, 100, 3)  # w and scale: the deterministic site scaled_w is not a latent
    assert noise_ratio.shape == (2, 100) and energy is None  # potential_energy was not collected
    assert result.noise_limit == SGNHT.noise_ratio_limit  # the noise ratios were read


def pyro_run(step_size, num_samples, seed=0):
    torch.manual_seed(seed)
    # eager steps: the compiled noise estimate's graphs (TorchInductor) took two thirds of the test's time, and give
    # the same draws and noise ratios (tests/pyro/test_compile.py)
    kernel = PyroSGLD(potential_fn=lambda z: 0.5 * (z["x"] ** 2).sum(), step_size=step_size, compile_potential=False)
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
    kernel = PyroSGLD(potential_fn=lambda z: 0.5 * (z["x"] ** 2).sum(), step_size=lambda t: 0.005 - 1e-4 * t,
                      compile_potential=False)  # eager steps, as in `pyro_run`
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
                       checkpoint_every=200)  # fmt: skip
    assert verdicts(caught) == [] and mcmc.verdict is True
    draws = np.asarray(mcmc.get_samples(group_by_chain=True)["x"])
    assert not any(verdict.assess(draws[:, k : k + 200]).ok for k in range(0, 2000, 200))  # each chunk alone fails
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

    advisory = lambda kernel, flags, values, *options: {kind: f"{kernel}: {kind} (advisory)"}  # noqa: E731
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


# --- models with symmetries: the runs' predictions, on both backends ------------------------------------------------
MIRROR_N, MIRROR_BATCH = 1000, 200


def mirror_data():
    """``y = 1 + x/2 + N(0, 1/4)``: the models below fit ``y ~ N(a² + b x, 1/2)``, whose posterior has two mirror
    images, ``a ≈ 1`` and ``a ≈ -1``, that predict alike."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=MIRROR_N)
    return x, 1.0 + 0.5 * x + 0.5 * rng.normal(size=MIRROR_N)


def numpyro_mirror(x, y):
    a = numpyro.sample("a", dist.Normal(0.0, 2.0))
    b = numpyro.sample("b", dist.Normal(0.0, 2.0))
    with numpyro.plate("data", x.shape[0], subsample_size=MIRROR_BATCH):
        xb = numpyro.subsample(x, event_dim=0)
        numpyro.sample("y", dist.Normal(a * a + b * xb, 0.5), obs=numpyro.subsample(y, event_dim=0))


def pyro_mirror(x, y):
    a = pyro.sample("a", pyro_dist.Normal(0.0, 2.0))
    b = pyro.sample("b", pyro_dist.Normal(0.0, 2.0))
    with pyro.plate("data", x.shape[0], subsample_size=MIRROR_BATCH):
        xb = pyro.subsample(x, event_dim=0)
        pyro.sample("y", pyro_dist.Normal(a * a + b * xb, 0.5), obs=pyro.subsample(y, event_dim=0))


def exact_rows(samples):
    """The log-likelihoods of the fixed rows at each draw of ``samples`` ``{site: (chains, draws)}``."""
    x, y = mirror_data()
    rows = fixed_rows(MIRROR_N, MIRROR_BATCH)
    a, b = (np.asarray(samples[name], np.float64)[..., None] for name in ("a", "b"))
    return stats.norm.logpdf(y[rows], a * a + b * x[rows], 0.5)


def test_numpyro_chains_in_mirror_images_are_told_apart_from_chains_that_never_met():
    """Two chains started in the two mirror images: judging the predictions (``verdict="predictions"``), the run
    passes; judging the parameters, it fails as a symmetric one (not as chains that never met) and names the other
    judge. The predictions are the exact log-likelihoods of the fixed rows.

    The step size and preconditioner are given, those the tuned default settles on (0.5 in the coordinates of the
    posterior's sds, about 0.008 for ``a`` and 0.016 for ``b``: ``1/sqrt(4N/σ²)`` and ``1/sqrt(Σx²/σ²)``), with the
    minibatch gradient (noise ratio about 1.7, below SGNHT's limit of 5) and no warm-up (the chains start near the
    modes): the tuning is not what is tested, and its mode search, Hessian, noise probe, SVRG and warm-up took half
    the test's time."""
    x, y = (jnp.asarray(v, jnp.float32) for v in mirror_data())
    init = {"a": jnp.array([1.0, -1.0]), "b": jnp.array([0.5, 0.5])}
    kernel = SGNHT(numpyro_mirror, step_size=0.5, inverse_mass_matrix=np.array([0.008, 0.016]) ** 2,
                   steps_per_sample=10)  # fmt: skip
    mcmc = MCMC(kernel, num_warmup=0, num_samples=1000, num_chains=2, chain_method="vectorized", progress_bar=False,
                verdict="predictions")  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mcmc.run(jax.random.PRNGKey(0), x, y, init_params=init)
        quiet = verdicts(caught)
        parameters = run_verdict(mcmc)  # warns
    assert quiet == [] and mcmc.last_verdict.ok and mcmc.last_verdict.judged == "predictions"
    messages = verdicts(caught)
    assert len(messages) == 1 and messages[0].startswith(f"SGNHT: {verdict.SYMMETRIC}: ")
    assert 'verdict="predictions"' in messages[0] and parameters.symmetric and parameters.parameters_rhat[0] > 1.5
    samples = mcmc.get_samples(group_by_chain=True)
    np.testing.assert_allclose(_row_log_likelihoods(RunView(mcmc, "test"), "test"), exact_rows(samples), rtol=1e-4,
                               atol=1e-4)  # fmt: skip
    f = np.asarray(samples["a"] ** 2)[..., None] + np.asarray(samples["b"])[..., None] * np.linspace(-5, 5, 4)
    assert run_verdict(mcmc, warn=False, judge="predictions", predictions=f).ok  # predictions given: far out too
    assert run_verdict(mcmc, warn=False, predictions=f).symmetric
    f[1] += 0.1  # the second chain's predictions off by 1.2-3 posterior sds: no copy of the first's
    assert run_verdict(mcmc, warn=False, judge="predictions", predictions=f).severe


def test_pyro_predictions_are_the_log_likelihoods_of_fixed_rows():
    x, y = (torch.tensor(v, dtype=torch.float32) for v in mirror_data())
    pyro.set_rng_seed(0)
    mcmc = PyroMCMC(PyroSGLD(pyro_mirror, step_size=1e-4, compile_potential=False), warmup_steps=0, num_samples=30,
                    initial_params={"a": torch.tensor(-1.0), "b": torch.tensor(0.5)}, disable_progbar=True)  # fmt: skip
    with warnings.catch_warnings():  # the chain's own verdict: 30 draws are too few
        warnings.simplefilter("ignore", RuntimeWarning)
        mcmc.run(x, y)
    expected = exact_rows({k: v.numpy() for k, v in mcmc.get_samples(group_by_chain=True).items()})
    np.testing.assert_allclose(_row_log_likelihoods(PyroRunView(mcmc, "test"), "test"), expected, rtol=1e-4, atol=1e-4)
    judged = run_verdict(mcmc, warn=False, judge="predictions")
    assert judged.judged == "predictions" and "prediction" in judged.rhat_of  # a Pyro run keeps no energy


def test_judging_predictions_needs_a_model_and_a_known_judge(tmp_path):
    mcmc = MCMC(SGLD(potential_fn=gaussian, step_size=0.5), num_warmup=10, num_samples=100, num_chains=2,
                chain_method="vectorized", progress_bar=False, verdict=False)  # fmt: skip
    run_numpyro(mcmc)
    with pytest.raises(ValueError, match="built from `potential_fn`"):
        run_verdict(mcmc, judge="predictions")
    with pytest.raises(ValueError, match="`judge` must be one of"):
        run_verdict(mcmc, judge="function space")
    with pytest.raises(ValueError, match="`verdict` must be True, False or one of"):
        MCMC(SGLD(potential_fn=gaussian, step_size=0.5), num_warmup=10, num_samples=100, verdict="yes")
    judged = MCMC(SGLD(potential_fn=gaussian, step_size=0.5), num_warmup=10, num_samples=100, verdict="predictions")
    with pytest.raises(ValueError, match="MCMC: judging the predictions.*potential_fn"):  # before the run
        judged.run(jax.random.PRNGKey(0), init_params={"x": jnp.zeros(2)})
    assert judged.last_state is None
    with pytest.raises(ValueError, match="checkpoint.run: judging the predictions"):
        checkpoint.run(judged, jax.random.PRNGKey(0), init_params={"x": jnp.zeros(2)}, checkpoint=tmp_path / "c",
                       checkpoint_every=50)  # fmt: skip
    assert not (tmp_path / "c").exists() or not any((tmp_path / "c").iterdir())
