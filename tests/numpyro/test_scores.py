"""The full-data score of a NumPyro kernel's target (:mod:`ppl_sgmcmc.numpyro.scores`), against autodiff of the
full-data log density written out by hand."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import NUTS

from ppl_sgmcmc.numpyro import SGLD, SGRLD, full_data_score
from ppl_sgmcmc.numpyro.potential import PotentialTarget


def regression_model(X, y):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    scale = numpyro.sample("scale", dist.HalfNormal(1.0))
    with numpyro.plate("data", X.shape[0], subsample_size=8):
        X_batch = numpyro.subsample(X, event_dim=1)
        numpyro.sample("y", dist.Normal(X_batch @ w, scale), obs=numpyro.subsample(y, event_dim=0))


def log_density(w, log_scale, X, y):
    """The full-data log density in the unconstrained coordinates ``(w, log scale)``, with the Jacobian."""
    scale = jnp.exp(log_scale)
    return (
        jnp.sum(dist.Normal(0.0, 1.0).log_prob(w))
        + dist.HalfNormal(1.0).log_prob(scale)
        + log_scale
        + jnp.sum(dist.Normal(X @ w, scale).log_prob(y))
    )


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 2)).astype(np.float32)  # 40 rows, minibatches of 8: an epoch holds every row
    y = (X @ np.array([1.0, -0.5]) + 0.7 * rng.normal(size=40)).astype(np.float32)
    return jnp.asarray(X), jnp.asarray(y)


@pytest.mark.slow
def test_full_data_score_is_the_gradient_of_the_full_data_log_density(data):
    X, y = data
    rng = np.random.default_rng(1)
    latents = {"w": rng.normal(size=(5, 2)).astype(np.float32), "scale": rng.normal(size=5).astype(np.float32)}
    score = np.asarray(full_data_score(SGLD(regression_model, step_size=1e-3), latents, (X, y)))
    grad = jax.vmap(jax.grad(log_density, argnums=(0, 1)), in_axes=(0, 0, None, None))
    want_w, want_scale = grad(jnp.asarray(latents["w"]), jnp.asarray(latents["scale"]), X, y)
    assert score.shape == (5, 3)  # sites in sorted order: scale, w
    np.testing.assert_allclose(score[:, 0], want_scale, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(score[:, 1:], want_w, rtol=1e-4, atol=1e-3)


@pytest.mark.slow
def test_sgrld_scores_are_in_the_unconstrained_coordinates(data):
    """SGRLD moves ``scale`` itself; the score is still that of ``log scale``, Jacobian included."""

    def scale_model(y):
        scale = numpyro.sample("scale", dist.HalfNormal(1.0))
        with numpyro.plate("data", y.shape[0], subsample_size=8):
            numpyro.sample("y", dist.Normal(0.0, scale), obs=numpyro.subsample(y, event_dim=0))

    _, y = data
    log_scale = jnp.array([-0.5, 0.0, 0.4])

    def log_density_scale(s):
        return dist.HalfNormal(1.0).log_prob(jnp.exp(s)) + s + jnp.sum(dist.Normal(0.0, jnp.exp(s)).log_prob(y))

    score = full_data_score(SGRLD(scale_model, step_size=1e-3), {"scale": log_scale}, (y,))
    np.testing.assert_allclose(score[:, 0], jax.vmap(jax.grad(log_density_scale))(log_scale), rtol=1e-4, atol=1e-3)


def test_potential_fn_scores():
    precision = jnp.array([[2.0, 0.3], [0.3, 1.0]])
    x = jnp.array([[1.0, -1.0], [0.5, 2.0], [0.0, 0.0]])
    kernel = SGLD(potential_fn=lambda z: 0.5 * z["x"] @ precision @ z["x"], step_size=0.1)
    np.testing.assert_allclose(full_data_score(kernel, {"x": x}), -x @ precision, rtol=1e-6)

    def noisy(z, rng_key):  # unbiased: a zero-mean uniform perturbation of the gradient, sd 0.29 per key
        return 0.5 * z["x"] @ precision @ z["x"] + jnp.sum(z["x"] * (jax.random.uniform(rng_key, (2,)) - 0.5))

    # the mean over EPOCH_KEYS keys: within 4.5 standard errors of the exact score
    tolerance = 4.5 / np.sqrt(12 * PotentialTarget.EPOCH_KEYS)
    noisy_score = full_data_score(SGLD(potential_fn=noisy, step_size=0.1), {"x": x})
    assert np.max(np.abs(noisy_score - (-x @ precision))) < tolerance


def test_full_data_score_bad_input(data):
    X, y = data
    with pytest.raises(TypeError, match="the run's kernel is NUTS, not a ppl_sgmcmc kernel"):
        full_data_score(NUTS(regression_model), {"w": np.zeros((1, 2))}, (X, y))
    with pytest.raises(ValueError, match=r"must hold the model's latent sites \['scale', 'w'\]"):
        full_data_score(SGLD(regression_model, step_size=1e-3), {"w": np.zeros((1, 2))}, (X, y))

    def gibbs_fn(rng_key, gibbs_sites, hmc_sites, subsample_indices):
        return gibbs_sites

    def local_model(y):
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
        with numpyro.plate("data", y.shape[0], subsample_size=8):
            z = numpyro.sample("z", dist.Normal(mu, 1.0))
            numpyro.sample("y", dist.Normal(z, 1.0), obs=numpyro.subsample(y, event_dim=0))

    kernel = SGLD(local_model, step_size=1e-3, gibbs_sites=["z"], gibbs_fn=gibbs_fn)
    with pytest.raises(ValueError, match=r"updates the local sites \['z'\] by Gibbs sweeps"):
        full_data_score(kernel, {"mu": np.zeros(1)}, (y,))
