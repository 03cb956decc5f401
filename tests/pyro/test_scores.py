"""The full-data score of a Pyro kernel's target (:mod:`ppl_sgmcmc.pyro.scores`), against autograd of the
full-data log density written out by hand, and :func:`~ppl_sgmcmc.diagnostics.ksd`,
:func:`~ppl_sgmcmc.diagnostics.step_halving_check` and :func:`~ppl_sgmcmc.diagnostics.energy_noise` on Pyro runs
(one chain per ``MCMC``: the kernel keeps the final state of the chain it ran)."""

import warnings

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import scipy.stats
import torch
from pyro.infer import MCMC, NUTS

from ppl_sgmcmc.diagnostics import energy_noise, imq_ksd, ksd, step_halving_check
from ppl_sgmcmc.pyro import CSGHMC, CSGLD, SGLD, full_data_score
from tests.pyro.models import logistic_data, logistic_model


def regression_model(X, y):
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    scale = pyro.sample("scale", dist.HalfNormal(1.0))
    with pyro.plate("data", X.shape[0], subsample_size=8):
        X_batch = pyro.subsample(X, event_dim=1)
        pyro.sample("y", dist.Normal(X_batch @ w, scale), obs=pyro.subsample(y, event_dim=0))


def test_full_data_score_is_the_gradient_of_the_full_data_log_density():
    """40 rows in minibatches of 8 (an epoch holds every row); coordinates ``(log scale, w)``, Jacobian included.
    Pyro's global random state is left as it was."""
    generator = torch.Generator().manual_seed(0)
    X = torch.randn(40, 2, generator=generator)
    y = X @ torch.tensor([1.0, -0.5]) + 0.7 * torch.randn(40, generator=generator)
    log_scale, w = torch.randn(5, generator=generator), torch.randn(5, 2, generator=generator)
    before = torch.get_rng_state()
    score = full_data_score(SGLD(regression_model, step_size=1e-3, compile_potential=False),
                            {"w": w, "scale": log_scale}, (X, y))  # fmt: skip
    assert torch.equal(torch.get_rng_state(), before)
    log_scale, w = log_scale.clone().requires_grad_(), w.clone().requires_grad_()
    scale = log_scale.exp()
    log_density = (
        dist.Normal(0.0, 1.0).log_prob(w).sum()
        + dist.HalfNormal(1.0).log_prob(scale).sum()
        + log_scale.sum()
        + dist.Normal(w @ X.T, scale[:, None]).log_prob(y).sum()
    )
    want_scale, want_w = torch.autograd.grad(log_density, (log_scale, w))
    assert score.shape == (5, 3)  # sites in sorted order: scale, w
    torch.testing.assert_close(score[:, 0], want_scale, rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(score[:, 1:], want_w, rtol=1e-4, atol=1e-3)


def test_potential_fn_scores_and_bad_input():
    precision = torch.tensor([[2.0, 0.3], [0.3, 1.0]])
    x = torch.tensor([[1.0, -1.0], [0.5, 2.0], [0.0, 0.0]])
    kernel = SGLD(potential_fn=lambda z: 0.5 * z["x"] @ precision @ z["x"], step_size=0.1)
    torch.testing.assert_close(full_data_score(kernel, {"x": x}), -x @ precision)
    with pytest.raises(TypeError, match="the run's kernel is NUTS, not a ppl_sgmcmc kernel"):
        full_data_score(NUTS(regression_model), {"w": torch.zeros(1, 2)})
    X, y = torch.zeros(16, 2), torch.zeros(16)
    with pytest.raises(ValueError, match=r"latent sites with shapes \{'scale': \(\), 'w': \(2,\)\}"):
        full_data_score(SGLD(regression_model, step_size=1e-3, compile_potential=False), {"w": torch.zeros(1, 2)}, (X, y))


# --- runs of a 2-d Gaussian ---------------------------------------------------------------------------
PRECISION = torch.tensor([[1.0, 0.5], [0.5, 2.0]])


def gaussian_potential(z):
    return 0.5 * z["x"] @ PRECISION @ z["x"]


def diagonal_potential(z):
    """``U(x) = Σ_k λ_k x_k² / 2`` with ``λ = (1, 1/4)``."""
    return 0.5 * (torch.tensor([1.0, 0.25]) * z["x"] ** 2).sum()


def run(kernel, num_samples, warmup_steps=100):
    mcmc = MCMC(kernel, warmup_steps=warmup_steps, num_samples=num_samples, initial_params={"x": torch.zeros(2)},
                disable_progbar=True)  # fmt: skip
    mcmc.run()
    return mcmc


def test_ksd_of_a_run_is_imq_ksd_of_its_thinned_draws():
    mcmc = run(SGLD(potential_fn=gaussian_potential, step_size=0.1, steps_per_sample=5), 400)
    draws = mcmc.get_samples()["x"].numpy()
    rows = draws[np.arange(300) * 400 // 300]
    result = ksd(mcmc, num_draws=300)
    assert result.num_draws == 300 and result.preconditioner is None  # nothing adapted
    assert result.ksd == pytest.approx(imq_ksd(rows, -rows @ PRECISION.numpy()), rel=1e-4)
    shifted = ksd(mcmc, num_draws=300, samples={"x": mcmc.get_samples(group_by_chain=True)["x"] + 1.0})
    assert 3 * result.ksd < shifted.ksd


def test_a_tuned_run_gives_its_preconditioner_and_its_step_size_to_halve():
    """A warm-up longer than the sampling phase: the continuation (steps 620 to 1020) must not reopen the
    adaptation, as it would if the warm-up were counted in draws of doubled steps (2 · 2 · 250 steps, whose
    windows close at steps 900 and 1000 and would tune the step size back)."""
    kernel = SGLD(potential_fn=gaussian_potential, find_mode=False, dense_mass=True, steps_per_sample=2)
    mcmc = run(kernel, 60, warmup_steps=250)
    adapted = kernel.last_state.state.adapt_state
    scale = adapted.preconditioner.scale.double().numpy()
    result = ksd(mcmc, num_draws=50)
    np.testing.assert_allclose(result.preconditioner, scale @ scale.T, rtol=1e-12)
    last = kernel.last_state
    halving = step_halving_check(mcmc, num_samples=100, burn_in=0)
    np.testing.assert_allclose(halving.halved_step_size, [float(adapted.step_size) / 2], rtol=1e-6)
    assert kernel.last_state is last and kernel.resume_from is None and kernel._steps_per_sample == 2


def test_step_halving_flags_a_far_too_large_step_size_and_restores_the_kernel():
    """SGLD at ``h = 1``: sd 1.41 instead of 1 for ``λ = 1``, 1.15 at ``h = 1/2``."""
    kernel = SGLD(potential_fn=diagonal_potential, step_size=1.0)
    mcmc = run(kernel, 2000)
    last = kernel.last_state
    with pytest.warns(RuntimeWarning, match=r"moved beyond their Monte Carlo error .*sd of x\[0\]"):
        result = step_halving_check(mcmc)
    print(result.table.to_string())
    assert "sd of x[0]" in result.flagged and not any(name.startswith("mean") for name in result.flagged)
    np.testing.assert_array_equal(result.step_size, [1.0])
    np.testing.assert_array_equal(result.halved_step_size, [0.5])
    assert kernel.last_state is last and kernel.resume_from is None
    assert kernel._step_size == 1.0 and kernel._steps_per_sample == 1


def test_step_halving_is_silent_on_a_healthy_run():
    """``h = 0.05``: the sds differ from the posterior's by at most 1.3 % at ``h`` and 0.6 % at ``h/2``."""
    mcmc = run(SGLD(potential_fn=diagonal_potential, step_size=0.05, steps_per_sample=10), 600)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = step_halving_check(mcmc, num_samples=300)
    print(result.table.to_string())
    assert result.flagged == []
    # the check's own warning only: a resumed Pyro chain's health check reports it "frozen" (a kernel issue)
    assert not [w for w in caught if "when the step size was halved" in str(w.message)]


def test_step_halving_needs_the_kernels_state_of_this_run():
    kernel = SGLD(potential_fn=gaussian_potential, step_size=0.1)
    first = run(kernel, 20)
    run(kernel, 20)  # the kernel now holds the second run's final state
    with pytest.raises(ValueError, match="the kernel's `last_state` is not the final state of this run"):
        step_halving_check(first)
    assert ksd(first).preconditioner is None


# --- a model run ----------------------------------------------------------------------------------------
def test_ksd_and_step_halving_of_a_model_run():
    """The logistic regression of ``tests/pyro/models.py``: its deterministic site is left out, ``scale`` is
    compared constrained and scored unconstrained."""
    X, y = logistic_data()
    kernel = SGLD(logistic_model, step_size=2e-3, steps_per_sample=2, compile_potential=False)
    mcmc = MCMC(kernel, warmup_steps=100, num_samples=200, disable_progbar=True)
    mcmc.run(X, y)
    result = ksd(mcmc, num_draws=50)
    assert result.num_draws == 50 and np.isfinite(result.ksd)
    with warnings.catch_warnings():  # 200 draws: the comparison itself is not the point here
        warnings.simplefilter("ignore", RuntimeWarning)
        halving = step_halving_check(mcmc, num_samples=20)
    assert list(halving.table.index) == ["scale", "w[0]", "w[1]"]
    assert (halving.table[["sd", "sd_halved"]] > 0).all(axis=None)


# --- the minibatch-energy noise of CSGLD / CSGHMC -----------------------------------------------------------------
def two_mode_model(y, n):
    """``θ ~ N(0.8, 1)``, ``y_i ~ N(θ², 1)``, ``N = 20``: two modes near ``θ = ±1.05`` (as in
    ``tests/test_diagnostics.py``)."""
    theta = pyro.sample("theta", dist.Normal(0.8, 1.0))
    with pyro.plate("data", y.shape[0], subsample_size=n):
        pyro.sample("y", dist.Normal(theta**2, 1.0), obs=pyro.subsample(y, event_dim=0))


def two_mode_run(kernel, n):
    e = np.random.default_rng(0).normal(size=20)
    y = torch.tensor(1.1 + (e - e.mean()) / e.std(), dtype=torch.float32)
    mcmc = MCMC(kernel, warmup_steps=200, num_samples=100, disable_progbar=True)
    with warnings.catch_warnings():  # the run's own (noise ratio; no subsampled plate when n = N)
        warnings.simplefilter("ignore")
        mcmc.run(y, n)
    return mcmc, y.double().numpy()


def test_energy_noise_of_csgld_runs():
    """Minibatches of 5 of 20 without replacement: ``σ² = (N²/n) Var_i[log p(y_i | θ)] (N - n)/(N - 1)``, computed by
    hand at the 40 evenly spaced draws, far above Δu/2 and 0.3 τ: a warning. CSGHMC with n = N: no noise, silent."""
    mcmc, y = two_mode_run(CSGLD(two_mode_model, step_size=1e-3, replace=False, compile_potential=False), 5)
    with pytest.warns(RuntimeWarning, match=r"CSGLD: the minibatch energies are too noisy .*chain 0: σ/Δu = "):
        result = energy_noise(mcmc, num_draws=40)
    print(result)
    theta = mcmc.get_samples()["theta"].double().numpy()[np.arange(40) * 100 // 40]
    log_lik = scipy.stats.norm.logpdf(y, theta[:, None] ** 2, 1.0)
    want = 20 / np.sqrt(5) * log_lik.std(axis=1) * np.sqrt(15 / 19)
    np.testing.assert_allclose(result.sigma, want[None], rtol=1e-4)
    assert result.plates == {"data": (20, 5)} and not result.replace and result.table["biased"].all()
    assert result.table.loc[0, "energy_gap"] == pytest.approx(mcmc.diagnostics()["energy_gap"]["chain 0"])
    assert "without replacement" in str(result)

    full, _ = two_mode_run(CSGHMC(two_mode_model, step_size=1e-2, replace=False, compile_potential=False), 20)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet = energy_noise(full, num_draws=10)
    assert not caught, [str(w.message) for w in caught]
    assert quiet.plates == {} and quiet.flagged == []
    np.testing.assert_array_equal(quiet.sigma, np.zeros((1, 10)))


def test_energy_noise_refuses_other_kernels_and_potential_fn():
    with pytest.raises(TypeError, match="the run's kernel is SGLD, not CSGLD or CSGHMC"):
        energy_noise(run(SGLD(potential_fn=gaussian_potential, step_size=0.1), 10, warmup_steps=0))
    kernel = CSGLD(potential_fn=gaussian_potential, step_size=0.1, energy_min=0.0, energy_gap=1.0)
    with pytest.raises(ValueError, match=r"built from a `potential_fn`, which has no per-datum log-likelihoods"):
        energy_noise(run(kernel, 10, warmup_steps=0))
    idle = MCMC(CSGLD(two_mode_model, step_size=1e-3), warmup_steps=10, num_samples=10, disable_progbar=True)
    with pytest.raises(ValueError, match="holds no draws"):
        energy_noise(idle)

