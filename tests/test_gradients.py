"""The gradient estimators of :mod:`ppl_sgmcmc.gradients` on both backends: control variates and SVRG are
unbiased (the mean of many minibatch estimates at a fixed point is the full-data gradient within Monte Carlo
error), their noise vanishes at the centre and is far smaller than the minibatch estimator's near it, SVRG's
centre moves on schedule, sampling with each estimator matches the exact conjugate posterior within Monte
Carlo error, and bad input gets a clear error."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pyro
import pyro.distributions as pdist
import pytest
import torch
from jax.flatten_util import ravel_pytree
from numpyro.infer import MCMC

from ppl_sgmcmc import gradients
from ppl_sgmcmc import numpyro as np_backend
from ppl_sgmcmc import pyro as pyro_backend
from ppl_sgmcmc.numpyro.potential import ModelTarget
from tests.helpers import K_SIGMA, conjugate_posterior, linear_regression_data, mean_and_mcse, sd_and_mcse

N, D, BATCH = 2000, 3, 20
X, Y, _ = linear_regression_data(N, D, 1.0, seed=5)
MEAN, COV = conjugate_posterior(X, Y, 1.0, 1.0)


def numpyro_model(X, y):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=BATCH):
        numpyro.sample("y", dist.Normal(numpyro.subsample(X, event_dim=1) @ w, 1.0), obs=numpyro.subsample(y, 0))


def pyro_model(X, y):
    w = pyro.sample("w", pdist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with pyro.plate("data", X.shape[0], subsample_size=BATCH):
        pyro.sample("y", pdist.Normal(pyro.subsample(X, event_dim=1) @ w, 1.0), obs=pyro.subsample(y, event_dim=0))


def exact_gradient(w):
    """``∇U(w)`` of the conjugate regression (prior N(0, I), unit noise)."""
    X64, y64 = np.asarray(X, np.float64), np.asarray(Y, np.float64)
    return w + X64.T @ (X64 @ w - y64)


def estimates(estimator, at, centre, draws=400):
    """``draws`` estimates of ``∇U(at)`` with the NumPyro target's minibatches, the estimator centred at ``centre``
    (one compiled program: dispatched operation by operation under ``vmap`` they took more CPU time). The points are
    the program's arguments, not constants in it: an estimator's program at another point is the one it compiled
    (JAX's compilation cache), not a new one."""
    target = ModelTarget(numpyro_model, (jnp.asarray(X), jnp.asarray(Y)), {}, jax.random.PRNGKey(0), True, "SGLD")
    _, unravel = ravel_pytree({"w": jnp.zeros(D)})
    args = (jnp.asarray(X), jnp.asarray(Y))

    def run(at, centre, keys):
        state = estimator.init(centre, lambda x: target.full_gradient(x, unravel, args, {}))

        def one(key):
            batch, _ = target.draw(key, target.init_batch(key))
            grad_fn, _ = estimator.estimate(state, at, lambda x: target.gradient(x, unravel, batch, args, {}), 0)
            return grad_fn(at).grad

        return jax.vmap(one)(keys)

    points = (jnp.asarray(at, jnp.float32), jnp.asarray(centre, jnp.float32))
    return np.asarray(jax.jit(run)(*points, jax.random.split(jax.random.PRNGKey(1), draws)), np.float64)


@pytest.mark.parametrize("estimator", [gradients.minibatch(), gradients.control_variates()], ids=["minibatch", "cv"])
def test_estimators_are_unbiased(estimator):
    at = jnp.asarray(MEAN + 2 * np.sqrt(np.diag(COV)), jnp.float32)  # two posterior sds from the centre
    g = estimates(estimator, at, MEAN)
    mean, mcse = g.mean(0), g.std(0, ddof=1) / np.sqrt(len(g))
    exact = exact_gradient(np.asarray(at, np.float64))
    assert np.all(np.abs(mean - exact) < K_SIGMA * mcse + 1e-3 * np.abs(exact).max()), (mean, exact, mcse)


def test_control_variates_noise_vanishes_at_the_centre_and_is_small_near_it():
    cv, plain = gradients.control_variates(), gradients.minibatch()
    at_centre = estimates(cv, jnp.asarray(MEAN, jnp.float32), MEAN)  # the program of `cv` near it below
    np.testing.assert_allclose(at_centre.std(0), 0.0, atol=1e-3 * np.abs(at_centre).max())  # float32 rounding only
    near = jnp.asarray(MEAN + np.sqrt(np.diag(COV)), jnp.float32)  # one posterior sd away
    ratio = estimates(plain, near, MEAN).var(0) / estimates(cv, near, MEAN).var(0)
    assert np.all(ratio > 10), ratio  # the acceptance's "at least 10x" near the mode


def test_svrg_centre_moves_on_schedule():
    kernel = np_backend.SGLD(numpyro_model, step_size=1e-4, gradient=gradients.svrg(epoch_length=7), find_mode=False)
    mcmc = MCMC(kernel, num_warmup=0, num_samples=30, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), jnp.asarray(X), jnp.asarray(Y), init_params={"w": jnp.zeros(D)},
             extra_fields=("gradient_state.position", "i"))  # fmt: skip
    centres = np.asarray(mcmc.get_extra_fields()["gradient_state.position"])
    steps = np.asarray(mcmc.get_extra_fields()["i"])  # the step count after each draw
    draws = np.asarray(mcmc.get_samples()["w"])
    moved = [int(s) for s, a, b in zip(steps[1:], centres[:-1], centres[1:]) if not np.array_equal(a, b)]
    assert moved == [8, 15, 22, 29]  # the step starting at i = 7k recentres (counts after the step: 7k + 1)
    np.testing.assert_array_equal(centres[7], draws[6])  # draw 7 (i = 8): at the position before step 7
    assert np.array_equal(centres[0], np.zeros(D))  # the start


def test_default_epoch_is_n_over_batch_aligned_with_draws():
    """One epoch, ``N/n`` steps, or the nearest multiple or divisor of ``steps_per_sample`` (the centre moves between
    draws or between equal groups of a draw's steps, where the accelerator step moves it without a branch:
    ``tests/numpyro/test_accelerator_step.py``)."""
    epochs = []
    for steps in (1, 3, 100, 300, 240):
        kernel = np_backend.SGLD(numpyro_model, step_size=1e-4, gradient="svrg", find_mode=False,
                                 steps_per_sample=steps)  # fmt: skip
        kernel.init(jax.random.PRNGKey(0), 0, {"w": jnp.zeros(D)}, (jnp.asarray(X), jnp.asarray(Y)))
        epochs.append(kernel._epoch_steps)
    assert epochs == [100, 99, 100, 100, 120]  # N/n = 100


def assert_exact_posterior(draws, h):
    """Moments within Monte Carlo error of the exact posterior, allowing SGLD's discretisation bias at the
    tuned step (its variance ``1/(1 - h/2)`` in the preconditioned coordinates) and its residual noise."""
    mean, mcse = mean_and_mcse(draws)
    assert np.all(np.abs(mean - MEAN) < K_SIGMA * mcse), (mean - MEAN) / mcse
    sd, sd_mcse = sd_and_mcse(draws)
    exact = np.sqrt(np.diag(COV))
    allowance = np.sqrt(1 / (1 - h / 2) * 1.02) - 1  # discretisation, and a 2 % noise ratio at most
    assert np.all(np.abs(sd / exact - 1) < K_SIGMA * sd_mcse / exact + allowance), (sd / exact, sd_mcse / exact)


@pytest.mark.parametrize("gradient", ["control_variates", "svrg"])
def test_numpyro_sampling_with_variance_reduction_is_exact(gradient):
    kernel = np_backend.SGLD(numpyro_model, gradient=gradient, steps_per_sample=5)
    mcmc = MCMC(kernel, num_warmup=200, num_samples=2000, num_chains=4, chain_method="vectorized",
                progress_bar=False)  # fmt: skip
    mcmc.run(jax.random.PRNGKey(0), jnp.asarray(X), jnp.asarray(Y))
    h = float(np.max(mcmc.last_state.step_size))
    assert_exact_posterior(np.asarray(mcmc.get_samples(group_by_chain=True)["w"], np.float64), h)


@pytest.mark.parametrize("gradient", ["control_variates", "svrg"])
def test_pyro_sampling_with_variance_reduction_is_exact(gradient):
    pyro.set_rng_seed(0)
    kernel = pyro_backend.SGLD(pyro_model, gradient=gradient, steps_per_sample=5)
    # a warm-up of 500 steps (every window of the adaptation's schedule, 2.5 times its shortest), not NumPyro's
    # 1000: Pyro's warm-up steps are not the compiled step (the adaptation runs in Python at each), and the tuned
    # step sizes (0.09-0.2, seeds 0-2) and the draws' errors were those of 1000 steps
    mcmc = pyro.infer.MCMC(kernel, warmup_steps=100, num_samples=2000, disable_progbar=True)
    mcmc.run(torch.tensor(X), torch.tensor(Y))
    h = kernel.last_state.state.step_size
    assert_exact_posterior(mcmc.get_samples(group_by_chain=True)["w"].double().numpy(), h)


def noise_variance_in_sample_stats(backend, gradient):
    """The per-draw ``noise_variance`` of ArviZ's ``sample_stats``: SGLD at a fixed step from the posterior mean,
    control variates centred there."""
    if backend is np_backend:
        from ppl_sgmcmc.numpyro.inference_data import to_inference_data

        kernel = backend.SGLD(numpyro_model, step_size=1e-4, gradient=gradient, find_mode=False)
        mcmc = MCMC(kernel, num_warmup=100, num_samples=300, progress_bar=False)
        start = {"w": jnp.asarray(MEAN, jnp.float32)}
        mcmc.run(jax.random.PRNGKey(0), jnp.asarray(X), jnp.asarray(Y), init_params=start)
    else:
        from ppl_sgmcmc.pyro.inference_data import to_inference_data

        pyro.set_rng_seed(0)
        # eager steps: the same draws and noise variances as the compiled step's (tests/pyro/test_compile.py), whose
        # TorchInductor graphs took most of this run's time
        kernel = backend.SGLD(pyro_model, step_size=1e-4, gradient=gradient, find_mode=False, compile_potential=False)
        mcmc = pyro.infer.MCMC(kernel, warmup_steps=100, num_samples=300, disable_progbar=True,
                               initial_params={"w": torch.tensor(MEAN, dtype=torch.float32)})  # fmt: skip
        mcmc.run(torch.tensor(X), torch.tensor(Y))
    return np.asarray(to_inference_data(mcmc, log_likelihood=False).sample_stats["noise_variance"])


@pytest.mark.parametrize("backend", [np_backend, pyro_backend], ids=["numpyro", "pyro"])
def test_noise_variance_in_sample_stats_shows_the_reduction(backend):
    plain = noise_variance_in_sample_stats(backend, "minibatch")
    # a NumPy centre (float64) works on both backends: it becomes an array of the chain's namespace and dtype
    reduced = noise_variance_in_sample_stats(backend, gradients.control_variates(centre=np.asarray(MEAN)))
    assert plain.shape == reduced.shape == (1, 300) and np.all(np.isfinite(plain)) and np.all(np.isfinite(reduced))
    # minibatch: about (N²/n) tr Cov(g_i) ~ 1e6; control variates near the centre: the exact gradient's change
    # between steps (h tr H² ~ 1e3) and a residual of the same order
    assert np.median(plain) > 100 * np.median(reduced), (np.median(plain), np.median(reduced))


@pytest.mark.parametrize("backend", [np_backend, pyro_backend])
def test_bad_estimator_input(backend):
    model = numpyro_model if backend is np_backend else pyro_model
    with pytest.raises(ValueError, match="unknown gradient 'cv'"):
        backend.SGLD(model, gradient="cv")
    with pytest.raises(ValueError, match="a `potential_fn` does not give"):
        backend.SGLD(potential_fn=lambda z: 0.0, gradient="control_variates")
    with pytest.raises(ValueError, match="SGFS takes its diffusion from the minibatch gradient's noise"):
        backend.SGFS(model, gradient="svrg")
    with pytest.raises(ValueError, match="with local Gibbs sites"):
        backend.SGLD(model, gradient="control_variates", gibbs_sites=["z"], gibbs_fn=lambda *a: None)
    with pytest.raises(ValueError, match="`epoch_length` must be a positive number"):
        gradients.svrg(epoch_length=-3)
    kernel = backend.SGLD(model, step_size=1e-4, gradient=gradients.control_variates(centre=np.zeros(D + 1)))
    with pytest.raises(ValueError, match=f"`centre` has shape \\({D + 1},\\), but the model has {D}"):
        if backend is np_backend:
            kernel.init(jax.random.PRNGKey(0), 0, {"w": jnp.zeros(D)}, (jnp.asarray(X), jnp.asarray(Y)))
        else:
            kernel.setup(0, torch.tensor(X), torch.tensor(Y))


@pytest.mark.parametrize("backend", [np_backend, pyro_backend], ids=["numpyro", "pyro"])
def test_tuned_momentum_kernels_take_svrg_by_default(backend):
    """``gradient=None``: SVRG for SGHMC and SGNHT with a tuned step size on a model with a subsampled plate; the
    minibatch gradient for the other kernels, a given step size, local Gibbs sites and a ``potential_fn``, and for a
    model whose data has no subsampled plate (full-data steps; no error, as a given ``"svrg"`` raises) or, on
    NumPyro, is streamed from the host (a full-data gradient would read every row each epoch)."""
    model = numpyro_model if backend is np_backend else pyro_model
    name = lambda kernel: kernel.gradient_estimator.name  # noqa: E731
    assert [name(backend.SGHMC(model)), name(backend.SGNHT(model))] == ["svrg", "svrg"]
    assert name(backend.SGNHT(model, gradient="minibatch")) == "minibatch"
    for kernel in (backend.SGLD(model), backend.PSGLD(model), backend.CSGLD(model), backend.SGFS(model),
                   backend.SGNHT(model, step_size=1e-4), backend.SGHMC(potential_fn=lambda z: 0.0),
                   backend.SGNHT(model, gibbs_sites=["z"], gibbs_fn=lambda *a: None)):  # fmt: skip
        assert name(kernel) == "minibatch", kernel
    if backend is np_backend:
        from ppl_sgmcmc.numpyro.streaming import HostArray, streamed

        def full(X, y):
            w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
            numpyro.sample("y", dist.Normal(X @ w, 1.0), obs=y)

        key, args = jax.random.PRNGKey(0), (jnp.asarray(X), jnp.asarray(Y))
        host = (HostArray(np.asarray(X), dtype=np.float32, shape=(None, D)), jnp.asarray(Y))
        for model_, data, estimator in ((numpyro_model, args, "svrg"), (full, args, "minibatch"),
                                        (streamed(numpyro_model), host, "minibatch")):  # fmt: skip
            kernel = backend.SGNHT(model_)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the model without a subsampled plate is warned of
                kernel._check_target(ModelTarget(model_, data, {}, key, True, "SGNHT"))
            assert name(kernel) == estimator, model_
    else:
        from ppl_sgmcmc.pyro.potential import ModelTarget as PyroTarget

        def full(X, y):
            w = pyro.sample("w", pdist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
            pyro.sample("y", pdist.Normal(X @ w, 1.0).to_event(1), obs=y)

        for model_, estimator in ((pyro_model, "svrg"), (full, "minibatch")):
            kernel = backend.SGNHT(model_)
            target = PyroTarget(model_, (torch.tensor(X), torch.tensor(Y)), {}, True, "SGNHT",
                                pyro.infer.autoguide.init_to_sample, warn_no_plate=False)  # fmt: skip
            kernel._check_target(target)
            assert name(kernel) == estimator, model_


@pytest.mark.parametrize("backend", [np_backend, pyro_backend])
def test_variance_reduction_needs_a_subsampled_plate(backend):
    if backend is np_backend:
        def full(X, y):
            w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
            numpyro.sample("y", dist.Normal(X @ w, 1.0), obs=y)

        kernel = backend.SGLD(full, gradient="control_variates")
        with pytest.warns(UserWarning), pytest.raises(ValueError, match="this model has none"):
            kernel.init(jax.random.PRNGKey(0), 0, None, (jnp.asarray(X), jnp.asarray(Y)))
    else:
        def full(X, y):
            w = pyro.sample("w", pdist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
            pyro.sample("y", pdist.Normal(X @ w, 1.0).to_event(1), obs=y)

        kernel = backend.SGLD(full, gradient="control_variates")
        with pytest.warns(UserWarning), pytest.raises(ValueError, match="this model has none"):
            kernel.setup(0, torch.tensor(X), torch.tensor(Y))
