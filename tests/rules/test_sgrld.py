"""SGRLD (expanded-mean metric, mirrored): the pure rule against a NumPy restatement of ALGORITHMS.md
on ``jax.numpy`` and ``torch``, the NumPyro kernel's error for latents that are not positive, and its
posterior on a conjugate Poisson-Gamma model (Monte Carlo tolerances as in ``tests/numpyro``)."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
import torch
from numpyro.infer import MCMC

from ppl_sgmcmc.numpyro import SGRLD
from ppl_sgmcmc.rules import StochasticGradient, sgrld
from tests.helpers import assert_mc_close, assert_small_bias, mean_and_mcse, sd_and_mcse

X0 = np.array([0.7, 1.2, 0.05, 3.0])
A_COEF = np.array([1.5, 0.5, 2.0, 0.8])


def gradient_np(x):
    # U(x) = Σ a x - 2 log x  (a Gamma(3, a) energy): ∇U = a - 2/x
    return A_COEF - 2 / x


def make_grad_fn(x_like):
    a = torch.tensor(A_COEF, dtype=x_like.dtype) if isinstance(x_like, torch.Tensor) else jnp.asarray(A_COEF, x_like.dtype)

    def grad_fn(x):
        grad = a - 2 / x
        return StochasticGradient((a * x).sum(), grad, -grad)

    return grad_fn


def ref_sgrld(x, zeta, h, tau=1.0):
    """ALGORITHMS.md: θ ← θ - h (G ∇U - τ Γ) + sqrt(2hτ G) ζ with G = diag(θ), Γ = 1, then mirrored."""
    return np.abs(x - h * (x * gradient_np(x) - tau) + np.sqrt(2 * h * tau * x) * zeta)


def trajectory(to_array, h, tau, num_steps=30):
    noises = np.random.default_rng(4).normal(size=(num_steps, X0.size)).astype(np.float32)
    x = to_array(X0.astype(np.float32))
    state = sgrld.init(x, to_array(noises[0]))
    grad_fn = make_grad_fn(x)
    out = []
    for zeta in noises:
        x, state, _ = sgrld.step(x, state, grad_fn, to_array(zeta), h, temperature=tau)
        out.append(x)
    return out, noises


def as_np(a):
    return a.detach().numpy() if isinstance(a, torch.Tensor) else np.asarray(a)


def test_literal_step_and_mirroring():
    x = jnp.asarray([0.5, 0.01], jnp.float32)
    grad_fn = lambda x: StochasticGradient(0.0, jnp.asarray([2.0, 100.0]), 0.0)  # noqa: E731
    zeta = jnp.asarray([0.3, -1.0])
    new, _, _ = sgrld.step(x, sgrld.init(x, zeta), grad_fn, zeta, 0.1)
    # θ - h(θ g - 1) + sqrt(2hθ) ζ: 0.5 - 0.1·(1 - 1) + sqrt(0.1)·0.3 ; 0.01 - 0.1·(1 - 1) - sqrt(0.002) < 0 -> mirrored
    np.testing.assert_allclose(np.asarray(new), [0.5 + np.sqrt(0.1) * 0.3, np.sqrt(0.002) - 0.01], rtol=1e-5)


@pytest.mark.parametrize("tau", [1.0, 0.5])
def test_jax_and_torch_agree_and_follow_the_reference(tau):
    h = 0.05
    traj_jax, noises = trajectory(jnp.asarray, h, tau)
    traj_torch, _ = trajectory(torch.from_numpy, h, tau)
    x = X0
    for step, (a_jax, a_torch, zeta) in enumerate(zip(traj_jax, traj_torch, noises)):
        assert isinstance(a_torch, torch.Tensor) and a_torch.dtype == torch.float32 and a_jax.dtype == jnp.float32
        np.testing.assert_allclose(as_np(a_torch), as_np(a_jax), rtol=2e-5, atol=2e-6, err_msg=f"step {step}")
        x = ref_sgrld(x, zeta.astype(np.float64), h, tau)
        np.testing.assert_allclose(as_np(a_jax), x, rtol=1e-4, atol=1e-5, err_msg=f"step {step}")
        assert np.all(as_np(a_jax) >= 0)
    assert np.abs(as_np(traj_jax[-1]) - X0).max() > 0.1


# --- the kernel -------------------------------------------------------------------------------------
def test_non_positive_latent_is_refused():
    def model(y):
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
        rate = numpyro.sample("rate", dist.Gamma(2.0, 1.0))
        with numpyro.plate("data", y.shape[0], subsample_size=5):
            numpyro.sample("y", dist.Normal(mu, 1 / rate), obs=numpyro.subsample(y, event_dim=0))

    mcmc = MCMC(SGRLD(model, step_size=1e-3), num_warmup=1, num_samples=1, progress_bar=False)
    with pytest.raises(ValueError, match=r"SGRLD: latent site 'mu' has support Real\(\).*positive-support prior"):
        mcmc.run(jax.random.PRNGKey(0), jnp.ones(20))


A_PRIOR, B_PRIOR, N, BATCH = 2.0, 1.0, 200, 50


def poisson_model(x):
    rate = numpyro.sample("rate", dist.Gamma(A_PRIOR, B_PRIOR))
    numpyro.deterministic("log_rate", jnp.log(rate))
    with numpyro.plate("data", x.shape[0], subsample_size=BATCH):
        numpyro.sample("x", dist.Poisson(rate), obs=numpyro.subsample(x, event_dim=0))


def test_poisson_gamma_posterior():
    """SGRLD samples the conjugate posterior Gamma(a + Σx, b + N) of a Poisson rate in the rate's own space.

    Allowance: linearised at the posterior mean μ, a step is θ' = θ - h c (θ - μ) + noise with
    c = b + N (θ ⊙ ∇U is linear in θ here up to the prior's constant), injected variance 2hμ and minibatch
    variance h² (N²/n) Var(x): the stationary variance is (2hμ + h² C)/(2hc - h²c²)."""
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.poisson(3.0, size=N), jnp.float32)
    a_post, b_post = A_PRIOR + float(x.sum()), B_PRIOR + N
    mean, sd = a_post / b_post, np.sqrt(a_post) / b_post
    h = 1e-4
    c, C = b_post, N**2 / BATCH * float(np.var(np.asarray(x)))
    predicted_var = (2 * h * mean + h**2 * C) / (2 * h * c - (h * c) ** 2)
    sd_allowance = np.sqrt(predicted_var) - sd
    assert_small_bias("sd", sd_allowance, sd, 0.05)

    kernel = SGRLD(poisson_model, step_size=h, steps_per_sample=10)
    mcmc = MCMC(kernel, num_warmup=300, num_samples=3000, num_chains=8, chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(1), x)
    samples = mcmc.get_samples(group_by_chain=True)
    draws = np.asarray(samples["rate"])
    np.testing.assert_allclose(np.asarray(samples["log_rate"]), np.log(draws), rtol=1e-5)
    assert int(mcmc.last_state.num_diverging.sum()) == 0
    est_mean, mcse_mean = mean_and_mcse(draws)
    est_sd, mcse_sd = sd_and_mcse(draws)
    assert_mc_close("rate mean", est_mean, mean, mcse_mean)
    assert_mc_close("rate sd", est_sd, sd, mcse_sd, allowance=sd_allowance)
