"""Local Gibbs sites (``gibbs_sites=``, ``gibbs_fn=``, ``gibbs_sweeps=``): option errors, the
``gibbs_fn`` contract, and the Fisher-identity gradient on a two-component mixture whose local
memberships ``z_i`` can be summed out exactly.

The LDA-specific checks (collapsed conditional, Fisher identity on a tiny corpus, topic recovery)
are in ``tests/models/test_lda.py``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from jax.flatten_util import ravel_pytree
from jax.scipy.special import logsumexp
from numpyro.infer import MCMC

from ppl_sgmcmc.numpyro import SGLD, SGNHT
from ppl_sgmcmc.numpyro.gibbs import GibbsFnError
from tests.helpers import K_SIGMA

N, BATCH = 40, 8
WEIGHTS = jnp.array([0.3, 0.7])
PRIOR_SD = 3.0


def mixture(x):
    mu = numpyro.sample("mu", dist.Normal(0.0, PRIOR_SD).expand([2]).to_event(1))
    with numpyro.plate("data", x.shape[0], subsample_size=BATCH):
        xb = numpyro.subsample(x, event_dim=0)
        z = numpyro.sample("z", dist.Categorical(probs=WEIGHTS))
        numpyro.sample("x", dist.Normal(mu[z], 1.0), obs=xb)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(1)
    z = rng.random(N) < 0.7
    return jnp.asarray(np.where(z, 2.0, -1.5) + rng.normal(size=N), dtype=jnp.float32)


def make_gibbs_fn(x):
    """The exact conditional ``p(z_i | x_i, μ) ∝ w_k N(x_i; μ_k, 1)`` of the minibatch's memberships."""

    def gibbs_fn(rng_key, gibbs_sites, hmc_sites, subsample_indices):
        xb = x[subsample_indices["data"]]
        logits = jnp.log(WEIGHTS) + dist.Normal(hmc_sites["mu"], 1.0).log_prob(xb[:, None])
        return {"z": jax.random.categorical(rng_key, logits)}

    return gibbs_fn


def run(kernel, *args, num_samples=2):
    mcmc = MCMC(kernel, num_warmup=2, num_samples=num_samples, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), *args)
    return mcmc


# --- option errors ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(gibbs_sites=["z"]), ValueError, r"SGLD: `gibbs_sites` needs `gibbs_fn`"),
        (dict(gibbs_fn=lambda *a: a[1]), ValueError, r"`gibbs_fn` needs `gibbs_sites`"),
        (dict(gibbs_sites=["z"], gibbs_fn="sweep"), TypeError, r"`gibbs_fn` must be callable"),
        (dict(gibbs_sites=[], gibbs_fn=lambda *a: a[1]), ValueError, r"non-empty list of site names"),
        (dict(gibbs_sites=["z"], gibbs_fn=lambda *a: a[1], gibbs_sweeps=3), ValueError, r"pair `\(burn_in, kept\)`"),
        (dict(gibbs_sites=["z"], gibbs_fn=lambda *a: a[1], gibbs_sweeps=(2, 0)), ValueError, r"kept >= 1"),
        (dict(gibbs_sites=["z"], gibbs_fn=lambda *a: a[1], gibbs_sweeps=(-1, 2)), ValueError, r"burn_in >= 0"),
        (dict(gibbs_sites=["z"], gibbs_fn=lambda *a: a[1], gibbs_init=1), TypeError, r"`gibbs_init` must be callable"),
        (dict(gibbs_init=lambda *a: a[1]), ValueError, r"`gibbs_init` needs `gibbs_sites` and `gibbs_fn`"),
    ],
)
def test_option_errors(kwargs, error, message):
    with pytest.raises(error, match=message):
        SGLD(mixture, step_size=1e-3, **kwargs)


def test_gibbs_needs_a_model():
    with pytest.raises(ValueError, match=r"local Gibbs sites need a `model`"):
        SGLD(potential_fn=lambda z: 0.0, step_size=1e-3, gibbs_sites=["z"], gibbs_fn=lambda *a: a[1])


def test_unknown_site_is_named(data):
    kernel = SGLD(mixture, step_size=1e-3, gibbs_sites=["zz"], gibbs_fn=make_gibbs_fn(data))
    with pytest.raises(ValueError, match=r"`gibbs_sites` names 'zz', which is not a sample site.*'mu', 'z'"):
        run(kernel, data)


def test_observed_and_global_sites_are_refused(data):
    kernel = SGLD(mixture, step_size=1e-3, gibbs_sites=["x"], gibbs_fn=make_gibbs_fn(data))
    with pytest.raises(ValueError, match=r"Gibbs site 'x' is observed"):
        run(kernel, data)
    kernel = SGLD(mixture, step_size=1e-3, gibbs_sites=["mu"], gibbs_fn=make_gibbs_fn(data))
    with pytest.raises(ValueError, match=r"Gibbs site 'mu' is not inside a subsampled plate"):
        run(kernel, data)


def test_discrete_local_without_gibbs_is_refused(data):
    with pytest.raises(NotImplementedError, match=r"latent site 'z' is discrete .*gibbs_sites"):
        run(SGLD(mixture, step_size=1e-3), data)


def test_gibbs_fn_must_return_the_sites(data):
    kernel = SGLD(mixture, step_size=1e-3, gibbs_sites=["z"], gibbs_fn=lambda key, g, h, i: {"w": g["z"]})
    with pytest.raises(GibbsFnError, match=r"`gibbs_fn` must return a dict with the keys \['z'\]"):
        run(kernel, data)
    kernel = SGLD(mixture, step_size=1e-3, gibbs_sites=["z"], gibbs_fn=lambda key, g, h, i: {"z": g["z"][:2]})
    with pytest.raises(GibbsFnError, match=r"returned 'z' of shape \(2,\); the minibatch's site has shape \(8,\)"):
        run(kernel, data)


# --- the contract and the Fisher identity -----------------------------------------------------------
def test_gibbs_fn_sees_the_minibatch_and_constrained_globals(data):
    """``gibbs_fn`` gets the minibatch's indices, the current globals and the local sites of the minibatch;
    the samples hold the globals only."""
    seen = []

    def gibbs_fn(rng_key, gibbs_sites, hmc_sites, subsample_indices):
        seen.append((set(gibbs_sites), set(hmc_sites), {k: v.shape for k, v in subsample_indices.items()}))
        return make_gibbs_fn(data)(rng_key, gibbs_sites, hmc_sites, subsample_indices)

    starts = []

    def gibbs_init(rng_key, gibbs_sites, hmc_sites, subsample_indices):
        starts.append(gibbs_sites["z"].shape)
        return {"z": jnp.zeros(BATCH, jnp.int32)}

    kernel = SGNHT(mixture, step_size=1e-3, gibbs_sites="z", gibbs_fn=gibbs_fn, gibbs_sweeps=(1, 2), gibbs_init=gibbs_init)
    mcmc = run(kernel, data)
    assert set(mcmc.get_samples()) == {"mu"}
    assert seen and all(s == ({"z"}, {"mu"}, {"data": (BATCH,)}) for s in seen)
    assert starts and all(s == (BATCH,) for s in starts)


def exact_gradient(mu, x):
    """``∇U(μ)`` of the marginal ``U = -log N(μ; 0, 3²) - Σ_i log Σ_k w_k N(x_i; μ_k, 1)``."""

    def energy(mu):
        prior = dist.Normal(0.0, PRIOR_SD).log_prob(mu).sum()
        lik = logsumexp(jnp.log(WEIGHTS) + dist.Normal(mu, 1.0).log_prob(x[:, None]), axis=-1).sum()
        return -(prior + lik)

    return jax.grad(energy)(mu)


@pytest.mark.slow
@pytest.mark.parametrize("sweeps", [(0, 1), (2, 3)])
def test_fisher_identity_gradient_is_unbiased(data, sweeps):
    """Averaged over minibatches and Gibbs draws, the kernel's stochastic gradient equals the gradient of
    the exact marginal potential (the memberships summed out)."""
    kernel = SGLD(mixture, step_size=1e-3, gibbs_sites=["z"], gibbs_fn=make_gibbs_fn(data), gibbs_sweeps=sweeps)
    state = kernel.init(jax.random.PRNGKey(0), 0, {"mu": jnp.array([-1.0, 1.5])}, (data,), {})
    target = kernel._target
    flat, unravel = ravel_pytree(state.z)

    def one(key):
        batch, _ = target.draw(key, state.batch_state)
        return target.gradient(flat, unravel, batch, (data,), {}).grad

    grads = np.asarray(jax.jit(jax.vmap(one))(jax.random.split(jax.random.PRNGKey(1), 8000)), np.float64)
    exact = np.asarray(exact_gradient(jnp.array([-1.0, 1.5]), data))
    mcse = grads.std(0) / np.sqrt(len(grads))
    print("mean", grads.mean(0), "exact", exact, "mcse", mcse)
    assert np.all(np.abs(grads.mean(0) - exact) < K_SIGMA * mcse)
