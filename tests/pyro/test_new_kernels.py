"""CSGLD, CSGHMC, SGFS and SGRLD in the Pyro backend: the NumPyro backend's trajectories (same gradients,
same noise, same minibatches), per-datum scores, cheap statistical checks, ArviZ fields, errors.

The trajectory tests follow ``test_cross_backend.py``: NumPyro's ``jax.random.normal`` and the Pyro
kernel's noise source hand out the same sequence; for SGFS both targets' minibatch draws are replaced
by the same index sequence as well.
"""

import math
import warnings

import arviz as az
import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as ndist
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC

from ppl_sgmcmc import numpyro as np_backend
from ppl_sgmcmc import pyro as pyro_backend
from ppl_sgmcmc.importance import resample
from ppl_sgmcmc.pyro import CSGHMC, CSGLD, SGFS, SGLD, SGRLD, sample_stats, to_inference_data
from ppl_sgmcmc.schedules import polynomial
from tests.pyro.test_cross_backend import X0, energy_jax, energy_torch, jitted_numpyro_steps, numpyro_states

NUM_DRAWS = 25


def _compare(case, pyro_kernel, np_states, params, rtol=2e-5, atol=2e-6):
    for step, np_state in enumerate(np_states):
        params = pyro_kernel.sample(params)
        state = pyro_kernel.state
        assert state.i == int(np_state.i)
        for name in params:
            np.testing.assert_allclose(params[name].numpy(), np.asarray(np_state.z[name]), rtol=rtol, atol=atol,
                                       err_msg=f"{case}: {name} at draw {step}")  # fmt: skip
        for leaf_torch, leaf_jax in zip(state.rule_state, np_state.rule_state):
            if leaf_jax is None:
                assert leaf_torch is None
                continue
            np.testing.assert_allclose(np.asarray(leaf_torch), np.asarray(leaf_jax), rtol=rtol, atol=atol,
                                       err_msg=f"{case}: rule state at draw {step}")  # fmt: skip
        np.testing.assert_allclose(float(state.potential_energy), float(np_state.potential_energy), rtol=rtol)
    return params


# --- CSGLD / CSGHMC / SGRLD trajectories (potential_fn) ------------------------------------------------------
X0_POS = np.array([0.7, 1.2, 0.4], np.float32)


def gamma_energy_jax(z):  # independent Gamma(2.5, 1.5)-like energies on x > 0
    x = z["x"]
    return jnp.sum(1.5 * x - 1.5 * jnp.log(x) + 0.1 * x**2)


def gamma_energy_torch(z):
    x = z["x"]
    return (1.5 * x - 1.5 * torch.log(x) + 0.1 * x**2).sum()


CASES = {
    "csgld-fixed-grid": ("CSGLD", dict(step_size=0.05, num_partitions=10, energy_min=0.0, energy_gap=0.3), 0),
    "csgld-auto-grid-bin-weight": ("CSGLD", dict(step_size=0.05, num_partitions=10, weight="bin", zeta=0.9), 10),
    "csgld-schedule-frozen": ("CSGLD", dict(step_size=polynomial(0.1, 1.0, 0.55), num_partitions=8, temperature=0.7,
                                            sa_step_size=0.05, adapt_theta="warmup", calibration_steps=4), 8),
    "ksgld-theta-fixed": ("CSGLD", dict(step_size=0.05, num_partitions=4, energy_min=0.0, energy_gap=0.3,
                                        initial_theta=[0.1, 0.2, 0.3, 0.4], adapt_theta="never"), 0),
    "csghmc-splitting": ("CSGHMC", dict(step_size=0.1, friction=1.5, num_partitions=10, energy_min=0.0,
                                        energy_gap=0.3), 0),
    "csghmc-euler-auto": ("CSGHMC", dict(step_size=0.1, friction=1.5, integrator="euler", num_partitions=10), 6),
    "sgrld": ("SGRLD", dict(step_size=0.02), 0),
    "sgrld-tempered": ("SGRLD", dict(step_size=polynomial(0.05, 1.0, 0.55), temperature=0.5), 0),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_same_gradient_and_noise_same_trajectory(case):
    name, hyper, num_warmup = CASES[case]
    positive = name == "SGRLD"
    x0 = X0_POS if positive else X0
    e_jax, e_torch = (gamma_energy_jax, gamma_energy_torch) if positive else (energy_jax, energy_torch)
    noises = np.random.default_rng(4).normal(size=(NUM_DRAWS + 1, 3)).astype(np.float32)
    np_states = numpyro_states(getattr(np_backend, name)(potential_fn=e_jax, **hyper), noises, num_warmup, x0)
    state = np_states[-1]

    queue = iter(noises)
    pyro_kernel = getattr(pyro_backend, name)(potential_fn=e_torch, compile_potential=False, **hyper)
    pyro_kernel.initial_params = {"x": torch.from_numpy(x0)}
    pyro_kernel.setup(num_warmup)
    pyro_kernel._normal = lambda like, shape=None, generator=None: torch.from_numpy(next(queue))
    params = _compare(case, pyro_kernel, np_states, pyro_kernel.initial_params)
    assert np.abs(params["x"].numpy() - x0).max() > 0.1  # the chain moved
    if name != "SGRLD":
        rule = pyro_kernel.state
        assert (float(rule.log_weight), int(rule.partition)) == (float(state.log_weight), int(state.partition))
        kept = pyro_kernel.diagnostics()["log_weight"]
        assert len(kept) == NUM_DRAWS - num_warmup
        assert kept[-1] == pytest.approx(float(state.log_weight), rel=2e-5, abs=1e-6)


# --- SGFS: the same model in both backends, same minibatches and noise ----------------------------------------
N_SGFS, BATCH_SGFS = 60, 10


def np_logistic(X, y):
    w = numpyro.sample("w", ndist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    sigma = numpyro.sample("sigma", ndist.HalfNormal(1.0))
    with numpyro.plate("data", X.shape[0], subsample_size=BATCH_SGFS):
        x = numpyro.subsample(X, event_dim=1)
        numpyro.sample("y", ndist.Normal(x @ w, sigma), obs=numpyro.subsample(y, event_dim=0))


def pyro_logistic(X, y):
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    sigma = pyro.sample("sigma", dist.HalfNormal(1.0))
    with pyro.plate("data", X.shape[0], subsample_size=BATCH_SGFS):
        x = pyro.subsample(X, event_dim=1)
        pyro.sample("y", dist.Normal(x @ w, sigma), obs=pyro.subsample(y, event_dim=0))


SGFS_CASES = {
    "full-alpha": dict(alpha=1.0, fisher_window=5, ridge=1e-2),
    "full-inf-identity": dict(step_size=math.inf, B="identity", ridge=1e-2),
    "diagonal-vector-B": dict(step_size=2.0, fisher="diagonal", B=np.array([1.0, 2.0, 0.5])),
}


@pytest.mark.parametrize("case", list(SGFS_CASES))
def test_sgfs_same_minibatches_and_noise_same_trajectory(case):
    """The Pyro SGFS kernel's draws, rule state and energies are NumPyro's, step by step. The Pyro kernel runs
    eagerly: ``test_compile.py`` checks its compiled per-datum score graph and its compiled step against the eager
    kernel (its ``SGFS`` rows), so the compiled kernel follows NumPyro's too; the three cases differ in the rule's
    arithmetic (full or diagonal Fisher, ``α`` or an infinite step, ``B``), which is what the comparison with NumPyro
    checks, not in what is compiled around it (an Inductor compile of the two graphs costs about 20 s here)."""
    hyper = SGFS_CASES[case]
    rng = np.random.default_rng(0)
    X = rng.normal(size=(N_SGFS, 2)).astype(np.float32)
    y = (X @ np.array([1.0, -0.5]) + 0.5 * rng.normal(size=N_SGFS)).astype(np.float32)
    noises = rng.normal(size=(NUM_DRAWS + 1, 3)).astype(np.float32)
    indices = rng.integers(0, N_SGFS, size=(NUM_DRAWS, BATCH_SGFS))
    init = {"sigma": np.float32(-0.7), "w": np.array([0.9, -0.4], np.float32)}  # unconstrained; flat order sigma, w

    np_kernel = np_backend.SGFS(np_logistic, **hyper)
    state = np_kernel.init(jax.random.PRNGKey(0), 5, init_params={k: jnp.asarray(v) for k, v in init.items()},
                           model_args=(jnp.asarray(X), jnp.asarray(y)))  # fmt: skip
    np_states = jitted_numpyro_steps(np_kernel, state, (jnp.asarray(X), jnp.asarray(y)), noises[1:], indices)

    queue, batches = iter(noises), iter(indices)
    kernel = SGFS(pyro_logistic, compile_potential=False, **hyper)
    kernel.initial_params = {k: torch.as_tensor(v) for k, v in init.items()}
    kernel.setup(5, torch.from_numpy(X), torch.from_numpy(y))
    kernel._normal = lambda like, shape=None, generator=None: torch.from_numpy(next(queue))
    kernel._target.draw = lambda generator, bs: ({"data": torch.from_numpy(next(batches))}, bs)
    params = _compare(case, kernel, np_states, kernel.initial_params, rtol=1e-4, atol=1e-5)
    assert abs(float(params["w"][0]) - 0.9) > 1e-3  # the chain moved


def two_site_model(X, y, c):
    """Two observed sites in the subsampled plate (one with an event dimension), a constrained latent."""
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    sigma = pyro.sample("sigma", dist.HalfNormal(1.0))
    with pyro.plate("data", X.shape[0], subsample_size=7):
        x = pyro.subsample(X, event_dim=1)
        pyro.sample("y", dist.StudentT(4.0, x @ w, sigma), obs=pyro.subsample(y, event_dim=0))
        logits = x[:, :2] * w[0]
        pyro.sample("c", dist.Bernoulli(logits=logits).to_event(1), obs=pyro.subsample(c, event_dim=1))


def test_per_example_scores_are_per_datum_gradients():
    """The eager kernel's per-datum scores are the per-datum gradients (``torch.func.grad`` of each datum's
    log-likelihood) and average to the score. The compiled graph's equal the eager kernel's on this model
    (``test_compile.py``, ``two_site_model``): together, the compiled ones are the per-datum gradients too."""
    g = torch.Generator().manual_seed(0)
    Xs, ys = torch.randn(50, 3, generator=g), torch.randn(50, generator=g)
    cs = (torch.rand(50, 2, generator=g) < 0.5).float()
    kernel = SGFS(two_site_model, alpha=1.0, compile_potential=False)
    kernel.setup(0, Xs, ys, cs)
    target = kernel._target
    flat = torch.tensor([-0.4, 0.3, -0.2, 0.5])  # sigma (unconstrained), w
    batch = {"data": torch.tensor([3, 10, 10, 0, 49, 21, 7])}
    result = target.gradient(flat, batch, "per_example")

    def datum_loglik(f, i):
        sigma, w = torch.exp(f[0]), f[1:]
        loglik = dist.StudentT(4.0, Xs[i] @ w, sigma).log_prob(ys[i])
        return loglik + dist.Bernoulli(logits=Xs[i, :2] * w[0]).log_prob(cs[i]).sum()

    brute = torch.stack([torch.func.grad(datum_loglik)(flat, i) for i in batch["data"]])
    assert result.per_example.shape == (7, 4)
    np.testing.assert_allclose(result.per_example.numpy(), brute.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(result.per_example.mean(0).numpy(), result.score.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_sgfs_full_matches_the_exact_gaussian_posterior():
    """Conjugate linear regression (known noise): SGFS-f at α = 0 samples ``N(θ̂, I_N⁻¹)`` ≈ the exact
    posterior; mean within 5 MC standard errors, covariance within 25%. From the approximate mode
    (``find_mode``), as the defaults start: from ``init_to_uniform``'s point, 200 warm-up draws leave the chain
    20-40 posterior sd from the mode for some seeds, and the kept draws then hold its approach."""
    g = torch.Generator().manual_seed(3)
    N, noise = 1000, 0.5
    X = torch.randn(N, 2, generator=g)
    y = X @ torch.tensor([0.8, -0.4]) + noise * torch.randn(N, generator=g)

    def model(X, y):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        with pyro.plate("data", N, subsample_size=100):
            pyro.sample("y", dist.Normal(pyro.subsample(X, event_dim=1) @ w, noise), obs=pyro.subsample(y, event_dim=0))

    mcmc = MCMC(SGFS(model, alpha=0.0, find_mode=True), warmup_steps=200, num_samples=3000, disable_progbar=True)
    mcmc.run(X, y)
    w = mcmc.get_samples()["w"].double().numpy()
    X64, y64 = X.double().numpy(), y.double().numpy()
    precision = np.eye(2) + X64.T @ X64 / noise**2
    cov = np.linalg.inv(precision)
    mean = cov @ X64.T @ y64 / noise**2
    ess = az.ess(w[None, :, 0]), az.ess(w[None, :, 1])
    mcse = np.sqrt(np.diag(cov) / np.array(ess))
    assert np.all(np.abs(w.mean(0) - mean) < 5 * mcse), (w.mean(0), mean, mcse)
    np.testing.assert_allclose(np.cov(w.T), cov, rtol=0.25, atol=0.25 * np.abs(cov).max())


# --- CSGLD: ζ = 0 is SGLD; weights restore π; ArviZ fields ----------------------------------------------------
def normal_mean(y):
    mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
    with pyro.plate("data", y.shape[0], subsample_size=10):
        pyro.sample("y", dist.Normal(mu, 1.0), obs=pyro.subsample(y, event_dim=0))


Y = torch.from_numpy(np.random.default_rng(0).normal(1.0, 1.0, size=100).astype(np.float32))
# short chains whose checks are not about compilation run the model eagerly: each kernel's compiled gradient and step
# (``test_compile.py`` checks them against the eager ones) would cost seconds of Inductor compiling, more than the
# eager steps
EAGER = dict(compile_potential=False)


def run_model(kernel, warmup_steps=100, num_samples=100, **kwargs):
    mcmc = MCMC(kernel, warmup_steps=warmup_steps, num_samples=num_samples, disable_progbar=True, **kwargs)
    mcmc.run(Y)
    return mcmc


def test_zeta_zero_is_sgld_exactly():
    pyro.set_rng_seed(0)
    csgld = run_model(CSGLD(normal_mean, step_size=1e-3, zeta=0.0, energy_min=0.0, energy_gap=1.0, **EAGER),
                      num_samples=50)  # fmt: skip
    pyro.set_rng_seed(0)
    sgld = run_model(SGLD(normal_mean, step_size=1e-3, **EAGER), num_samples=50)
    np.testing.assert_array_equal(csgld.get_samples()["mu"][1:].numpy(), sgld.get_samples()["mu"][:-1].numpy())
    np.testing.assert_array_equal(sample_stats(csgld)["log_weight"], 0.0)


def test_sample_stats_reach_inference_data_and_importance():
    pyro.set_rng_seed(0)
    with pytest.warns(UserWarning, match="sequentially"):
        mcmc = run_model(CSGHMC(normal_mean, step_size=1e-2, num_partitions=20, integrator="euler", **EAGER),
                         num_chains=2)  # fmt: skip
    stats = sample_stats(mcmc)
    assert stats["log_weight"].shape == stats["partition"].shape == (2, 100)
    idata = to_inference_data(mcmc)
    assert {"log_weight", "partition", "diverging"} <= set(idata.sample_stats.data_vars)
    assert idata.sample_stats["log_weight"].dims == ("chain", "draw")
    np.testing.assert_array_equal(idata.sample_stats["log_weight"].values, stats["log_weight"])
    np.testing.assert_array_equal(idata.sample_stats["partition"].values, stats["partition"])
    assert idata.log_likelihood["y"].shape == (2, 100, 100)
    assert resample(idata, seed=0).posterior["mu"].shape == (2, 100)
    diagnostics = mcmc.diagnostics()
    assert len(diagnostics["theta"]["chain 1"]) == 20 and np.isfinite(diagnostics["energy_gap"]["chain 0"])
    assert "log_weight" not in az.from_pyro(mcmc).sample_stats  # ArviZ's converter keeps only `diverging`


def test_auto_grid_from_the_first_half_of_warmup():
    kernel = CSGLD(normal_mean, step_size=1e-3, num_partitions=20, **EAGER)
    energies = []
    mcmc = MCMC(kernel, warmup_steps=200, num_samples=5, disable_progbar=True,
                hook_fn=lambda k, params, stage, i: energies.append(float(k.state.potential_energy)))  # fmt: skip
    mcmc.run(Y)
    diagnostics = mcmc.diagnostics()
    assert diagnostics["energy_min"]["chain 0"] == pytest.approx(min(energies[:100]), rel=1e-6)
    assert diagnostics["energy_gap"]["chain 0"] == pytest.approx(np.std(energies[50:100], ddof=1), rel=1e-4)


# --- errors: the NumPyro backend's messages ----------------------------------------------------------------
def np_normal_mean(y):
    mu = numpyro.sample("mu", ndist.Normal(0, 10))
    with numpyro.plate("data", y.shape[0], subsample_size=10):
        numpyro.sample("y", ndist.Normal(mu, 1), obs=numpyro.subsample(y, event_dim=0))


@pytest.mark.parametrize(
    "name, kwargs",
    [
        ("CSGLD", dict(step_size=1e-3, num_partitions=1)),
        ("CSGLD", dict(step_size=1e-3, num_partitions=10.0)),
        ("CSGLD", dict(step_size=1e-3, energy_gap=0.0)),
        ("CSGLD", dict(step_size=1e-3, energy_gap="fine")),
        ("CSGLD", dict(step_size=1e-3, energy_min=float("nan"))),
        ("CSGLD", dict(step_size=1e-3, zeta=-0.5)),
        ("CSGLD", dict(step_size=1e-3, sa_step_size=1.5)),
        ("CSGLD", dict(step_size=1e-3, weight="paper")),
        ("CSGLD", dict(step_size=1e-3, adapt_theta="never")),
        ("CSGLD", dict(step_size=1e-3, energy_min=0.0, energy_gap=1.0, initial_theta=[1.0, 2.0])),
        ("CSGLD", dict(step_size=1e-3, num_partitions=2, initial_theta=[1.0, 2.0])),
        ("CSGLD", dict(step_size=1e-3, calibration_steps=1)),
        ("CSGHMC", dict(step_size=1e-3, friction=-1.0)),
        ("CSGHMC", dict(step_size=1e-3, integrator="langevin")),
        ("SGFS", dict(alpha=0.0, fisher="block")),
        ("SGFS", dict(alpha=0.0, B="eye")),
        ("SGFS", dict(alpha=0.0, B=np.array([[1.0, 2.0], [2.0, 1.0]]))),
        ("SGFS", dict(alpha=0.0, B=np.array([1.0, -1.0]))),
        ("SGFS", dict(alpha=0.0, B=np.eye(3), fisher="diagonal")),
        ("SGFS", dict(alpha=-1.0)),
        ("SGFS", dict(alpha=1.0, step_size=0.1)),
        ("SGFS", dict(step_size=-0.1)),
        ("SGFS", dict(alpha=1.0, temperature=2.0)),
        ("SGFS", dict(alpha=1.0, ridge=-1.0)),
        ("SGFS", dict(alpha=1.0, fisher_window=0)),
        ("SGRLD", dict(step_size=0.0)),
    ],
)
def test_hyperparameter_errors_match_numpyro(name, kwargs):
    messages = []
    for backend, model in ((pyro_backend, normal_mean), (np_backend, np_normal_mean)):
        with pytest.raises(ValueError) as info:
            getattr(backend, name)(model, **kwargs)
        messages.append(str(info.value))
    assert messages[0] == messages[1]


def test_sgfs_needs_a_model():
    with pytest.raises(ValueError, match="give `model`"):
        SGFS(potential_fn=lambda z: (z["x"] ** 2).sum(), alpha=0.0)


@pytest.mark.parametrize(
    "kernel, warmup_steps, message",
    [
        (lambda: CSGLD(normal_mean, step_size=1e-3, calibration_steps=50), 20, r"`calibration_steps` \(50\) exceeds"),
        (lambda: CSGLD(normal_mean, step_size=1e-3, adapt_theta="warmup", energy_min=0.0, energy_gap=1.0), 0,
         "leaves no step for it"),
    ],
)
def test_csgld_warmup_errors(kernel, warmup_steps, message):
    with pytest.raises(ValueError, match=message):
        run_model(kernel(), warmup_steps=warmup_steps, num_samples=2)


def test_csgld_auto_grid_without_warmup_warns():
    """A new chain without warm-up cannot calibrate an "auto" grid: a warning names the fix (a chain
    continued from its state, whose grid is calibrated, needs none, so this is not an error)."""
    with pytest.warns(UserWarning, match=r"choose the energy grid during the warm-up.*energy_gap"):
        run_model(CSGLD(normal_mean, step_size=1e-3, **EAGER), warmup_steps=0, num_samples=2)


def test_csgld_parent_setup_without_warmup():
    """Pyro's ``MCMC`` calls ``kernel.setup(0, ...)`` in the parent process to read the transforms after
    worker chains ran: with an "auto" grid that must neither raise nor warn (no chain starts there)."""
    kernel = CSGLD(normal_mean, step_size=1e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kernel.setup(0, Y)
    assert "mu" in kernel.transforms


def small_logistic(X, y, batch_size=10):
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with pyro.plate("data", X.shape[0], subsample_size=batch_size):
        logits = pyro.subsample(X, event_dim=1) @ w
        pyro.sample("y", dist.Bernoulli(logits=logits), obs=pyro.subsample(y, event_dim=0))


def test_sgfs_setup_errors():
    X, y = torch.randn(100, 3), torch.zeros(100)
    with pytest.raises(ValueError, match=r"SGFS: B of shape \(4,\) does not fit the 3 parameters"):
        SGFS(small_logistic, alpha=0.0, B=np.ones(4)).setup(0, X, y)
    with pytest.raises(ValueError, match="max_full_dim = 2"):
        SGFS(small_logistic, alpha=0.0, max_full_dim=2).setup(0, X, y)
    with pytest.raises(ValueError, match="needs n >= 2"):
        SGFS(lambda X, y: small_logistic(X, y, 1), alpha=0.0).setup(0, X, y)

    def no_subsampling(X, y):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
        with pyro.plate("data", X.shape[0]):
            pyro.sample("y", dist.Bernoulli(logits=X @ w), obs=y)

    with pytest.warns(UserWarning, match="no plate with `subsample_size`"):
        with pytest.raises(ValueError, match="exactly one plate with `subsample_size`"):
            SGFS(no_subsampling, alpha=0.0).setup(0, X, y)
    with pytest.warns(UserWarning, match=r"n = 10\) is not larger than the number of parameters \(d = 12\)"):
        SGFS(small_logistic, alpha=0.0).setup(0, torch.ones(100, 12), y)


def test_sgrld_refuses_unbounded_latents_with_numpyro_message():
    with pytest.raises(ValueError) as info:
        SGRLD(normal_mean, step_size=1e-3).setup(0, Y)
    assert "latent site 'mu' has support" in str(info.value) and "SGRLD moves positive latents only" in str(info.value)


def test_sgrld_moves_positive_latents_in_their_own_space():
    """The chain's values are the latent itself (no exp transform): MCMC's samples equal the kernel's state."""
    def model(y):
        rate = pyro.sample("rate", dist.Gamma(2.0, 1.0))
        with pyro.plate("data", y.shape[0], subsample_size=20):
            pyro.sample("y", dist.Poisson(rate), obs=pyro.subsample(y, event_dim=0))

    kernel = SGRLD(model, step_size=1e-3, **EAGER)
    mcmc = MCMC(kernel, warmup_steps=50, num_samples=50, disable_progbar=True,
                hook_fn=lambda k, params, stage, i: last.update(params))  # fmt: skip
    last = {}
    mcmc.run(torch.full((200,), 3.0))
    assert kernel.transforms == {}
    assert float(mcmc.get_samples()["rate"][-1]) == float(last["rate"]) > 0


def pyro_hierarchical(y):
    """``mu`` and ``tau`` enter only through the prior of ``beta`` (the NumPyro twin is in test_sgfs.py)."""
    mu = pyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = pyro.sample("tau", dist.HalfNormal(1.0))
    beta = pyro.sample("beta", dist.Normal(mu, tau).expand([2]).to_event(1))
    with pyro.plate("data", y.shape[0], subsample_size=10):
        pyro.sample("y", dist.Normal(beta[0] + beta[1], 1.0), obs=pyro.subsample(y, event_dim=0))


def test_sgfs_refuses_latents_outside_the_likelihood():
    y = torch.randn(50, generator=torch.Generator().manual_seed(0))
    kernel = SGFS(pyro_hierarchical)
    with pytest.raises(ValueError, match="latent site\\(s\\) 'mu', 'tau' are zero in all"):
        kernel.setup(0, y)


@pytest.mark.parametrize("make", [CSGLD, CSGHMC], ids=["CSGLD", "CSGHMC"])
def test_integrator_position_follows_the_warmups_rescalings(make):
    """As on NumPyro (``tests/numpyro/test_csgld.py``): when the warm-up rescales the preconditioned coordinates
    (a Student-t target, rescalings by 0.05-0.5), the integrator's own position is rescaled with them and stays
    one move from the sample. (Where it starts, ``L⁻¹ θ_0``, is set by the same ``Algorithm._initial_adaptation`` on
    both backends and checked exactly on NumPyro.)"""
    from ppl_sgmcmc import adaptation

    def energy(z):
        return 2.0 * torch.log1p((z["x"] - 10.0) ** 2 / 3.0).sum()

    torch.manual_seed(0)
    kernel = make(potential_fn=energy)
    kernel.initial_params = {"x": torch.full((2,), 10.0)}
    kernel.setup(warmup_steps=300)
    z = kernel.sample(kernel.initial_params)
    gaps, scales = [], []
    for _ in range(400):
        z = kernel.sample(z)
        state = kernel.state
        ahead = adaptation.to_theta(state.adapt_state.preconditioner, state.rule_state.position)
        gaps.append(float((ahead - z["x"]).abs().max()))
        L = state.adapt_state.preconditioner.scale.clone().numpy()  # dense by default: a coordinate's is a column's
        scales.append(np.linalg.norm(L, axis=0) if L.ndim == 2 else np.abs(L))
    changes = np.abs(np.diff(np.log(np.array(scales)), axis=0)).max(axis=1)
    assert changes.max() > np.log(2)  # the warm-up did rescale a coordinate by more than 2x
    assert max(gaps[100:]) < 2.0
