"""Mass-matrix adaptation in the kernels (``adapt_mass=True``), on both backends: the adapted preconditioner
estimates the posterior covariance, it is frozen after the warm-up, the chain then samples the target, and
bad options are refused with a message."""

import jax
import jax.numpy as jnp
import numpy as np
import pyro
import pytest
import torch
from numpyro.infer import MCMC

from ppl_sgmcmc import adaptation
from ppl_sgmcmc import numpyro as np_backend
from ppl_sgmcmc import pyro as pyro_backend
from tests.helpers import K_SIGMA, mean_and_mcse

SCALES = np.array([3.0, 0.3])  # a diagonal Gaussian whose variances differ 100-fold
STEP = 0.1  # stable for the narrow coordinate (h/σ² = 1.1); the wide one relaxes in ~100 steps unpreconditioned


def energy_jax(z):
    return 0.5 * jnp.sum((z["x"] / SCALES) ** 2)


def energy_torch(z):
    return 0.5 * ((z["x"] / torch.as_tensor(SCALES, dtype=torch.float32)) ** 2).sum()


def test_numpyro_adapts_freezes_and_samples():
    chains = 16
    kernel = np_backend.SGLD(potential_fn=energy_jax, step_size=STEP, adapt_mass=True, steps_per_sample=5)
    mcmc = MCMC(kernel, num_warmup=800, num_samples=2000, num_chains=chains, chain_method="vectorized",
                progress_bar=False)  # fmt: skip
    mcmc.warmup(jax.random.PRNGKey(0), init_params={"x": jnp.zeros((chains, 2))})
    adapted = np.asarray(mcmc.post_warmup_state.adapt_state.preconditioner.scale)  # (chains, 2): sqrt of Σ's diagonal
    # each chain's last window (2000 steps, ~9 independent draws of the wide coordinate) estimates σ²;
    # pooled over 16 chains the log-variance is within K_SIGMA of its sampling error (about sqrt(2/ESS))
    log_ratio = np.log(adapted**2 / SCALES**2).mean(0)
    assert np.all(np.abs(log_ratio) < K_SIGMA * np.sqrt(2 / (chains * 9))), log_ratio
    mcmc.run(jax.random.PRNGKey(1), extra_fields=("adapt_state.preconditioner.scale",))
    frozen = np.asarray(mcmc.get_extra_fields(group_by_chain=True)["adapt_state.preconditioner.scale"])
    np.testing.assert_array_equal(frozen, np.broadcast_to(adapted[:, None], frozen.shape))  # a fixed kernel
    draws = np.asarray(mcmc.get_samples(group_by_chain=True)["x"])
    mean, mcse = mean_and_mcse(draws / SCALES)
    assert np.all(np.abs(mean) < K_SIGMA * mcse)
    var, var_mcse = mean_and_mcse((draws / SCALES) ** 2)
    predicted = 1 / (1 - STEP / 2)  # SGLD's stationary variance in the preconditioned coordinates
    assert np.all(np.abs(var - predicted) < K_SIGMA * var_mcse + 0.1), (var, var_mcse)  # + the estimate's error


def test_pyro_adapts_and_freezes():
    pyro.set_rng_seed(0)
    kernel = pyro_backend.SGLD(potential_fn=energy_torch, step_size=STEP, adapt_mass=True, steps_per_sample=5)
    mcmc = pyro.infer.MCMC(kernel, warmup_steps=800, num_samples=200, initial_params={"x": torch.zeros(2)},
                           disable_progbar=True)  # fmt: skip
    scales = []
    kernel_sample = kernel.sample

    def recording(params):
        out = kernel_sample(params)
        scales.append(kernel.state.adapt_state.preconditioner.scale.clone())
        return out

    kernel.sample = recording
    mcmc.run()
    after = torch.stack(scales[800:])
    assert torch.equal(after, after[:1].expand_as(after))  # frozen after the warm-up
    assert not torch.equal(scales[0], after[0])  # and adapted during it
    ratio = (after[0].numpy() / SCALES) ** 2
    assert np.all((ratio > 0.2) & (ratio < 5)), ratio  # one chain's last window: a rough estimate


@pytest.mark.parametrize("backend", [np_backend, pyro_backend])
def test_bad_adaptation_options(backend):
    with pytest.raises(ValueError, match="SGRLD: `adapt_mass` is not available"):
        backend.SGRLD(potential_fn=lambda z: 0.0, step_size=0.1, adapt_mass=True)
    with pytest.raises(ValueError, match="SGFS: `adapt_mass` is not available"):
        backend.SGFS(lambda: None, alpha=0.0, adapt_mass=True)
    with pytest.raises(ValueError, match="set adapt_mass=True"):
        backend.SGLD(potential_fn=lambda z: 0.0, step_size=0.1, dense_mass=True)
    minimum = adaptation.minimum_warmup_steps()
    kernel = backend.SGLD(potential_fn=energy_jax if backend is np_backend else energy_torch, step_size=0.1,
                          adapt_mass=True)  # fmt: skip
    with pytest.raises(ValueError, match=f"at least {minimum} warm-up steps"):
        if backend is np_backend:
            kernel.init(jax.random.PRNGKey(0), minimum - 1, {"x": jnp.zeros(2)})
        else:
            kernel.initial_params = {"x": torch.zeros(2)}
            kernel.setup(minimum - 1)


def test_dense_adaptation_runs_on_both_backends():
    """The dense form adapts a full Cholesky factor (lower triangular, d×d)."""
    kernel = np_backend.SGNHT(potential_fn=energy_jax, step_size=0.05, adapt_mass=True, dense_mass=True)
    state = kernel.init(jax.random.PRNGKey(0), 200, {"x": jnp.zeros(2)})
    step = jax.jit(kernel.sample)
    for _ in range(200):
        state = step(state, (), {})
    scale = np.asarray(state.adapt_state.preconditioner.scale)
    assert scale.shape == (2, 2) and scale[0, 1] == 0 and np.all(np.diag(scale) > 0)
    pyro.set_rng_seed(0)
    kernel = pyro_backend.SGNHT(potential_fn=energy_torch, step_size=0.05, adapt_mass=True, dense_mass=True)
    kernel.initial_params = {"x": torch.zeros(2)}
    kernel.setup(200)
    z = kernel.initial_params
    for _ in range(200):
        z = kernel.sample(z)
    scale = kernel.state.adapt_state.preconditioner.scale
    assert scale.shape == (2, 2) and float(scale[0, 1]) == 0 and bool(torch.all(torch.diag(scale) > 0))
