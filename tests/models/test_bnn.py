"""Bayesian MLPs declared in NumPyro (``models/bnn.py``): the declared sites, the subsampled plate's
log-likelihood estimator, the model average, and the posterior of the network without hidden layers (Bayesian
linear regression, conjugate once the noise precision is fixed) against the exact one. (The quality bars, short runs
that learn on the shipped UCI and MNIST subsets, are ``benchmarks/quality_checks.py --only uci-numpyro`` and
``--only mnist-numpyro``.)
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpyro import handlers
from numpyro.infer import MCMC

from models import bnn
from ppl_sgmcmc.numpyro import SGLD
from tests.helpers import assert_linear_network_posterior


def _toy(rows=20, features=3, classes=4, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(rows, features)).astype(np.float32), rng.integers(0, classes, rows).astype(np.int32)


def _weights(sizes, seed=1, draws=()):
    rng = np.random.default_rng(seed)
    params = {}
    for layer, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        params[f"layers.{layer}.weight"] = jnp.asarray(rng.normal(size=(*draws, b, a)), jnp.float32)
        params[f"layers.{layer}.bias"] = jnp.asarray(rng.normal(size=(*draws, b)), jnp.float32)
    return params


def _log_likelihood(model, params, indices, *args, **kwargs):
    """The model's log-likelihood term (the ``y`` site, scaled by the plate) at ``params`` on the rows ``indices``."""
    conditioned = handlers.substitute(model, data={**params, "data": jnp.asarray(indices)})
    tr = handlers.trace(handlers.seed(conditioned, 0)).get_trace(*args, **kwargs)
    site = tr["y"]
    scale = 1.0 if site["scale"] is None else site["scale"]
    return float(scale * site["fn"].log_prob(site["value"]).sum())


def test_sites_shapes_and_names():
    X, y = _toy()
    tr = handlers.trace(handlers.seed(bnn.classifier, 0)).get_trace(X, y, hidden=(5, 6), num_classes=4, batch_size=7)
    shapes = {name: site["value"].shape for name, site in tr.items() if site["type"] == "sample"}
    assert shapes == {"layers.0.weight": (5, 3), "layers.0.bias": (5,), "layers.1.weight": (6, 5),
                      "layers.1.bias": (6,), "layers.2.weight": (4, 6), "layers.2.bias": (4,), "y": (7,)}  # fmt: skip
    assert bnn.num_weights(3, (5, 6), 4) == sum(int(np.prod(s)) for name, s in shapes.items() if name != "y")
    assert not any(site["type"] == "deterministic" for site in tr.values())  # nothing per-draw over the N rows
    # the data plate is subsampled, the weights are outside it
    assert tr["data"]["args"] == (20, 7)
    assert all(not site["cond_indep_stack"] for name, site in tr.items() if name.startswith("layers."))


def test_bad_arguments_are_named():
    X, y = _toy()
    with pytest.raises(ValueError, match="`activation` must be one of"):
        handlers.seed(bnn.classifier, 0)(X, y, activation="softplus")
    with pytest.raises(ValueError, match="`batch_size` must be a positive integer"):
        handlers.seed(bnn.regressor, 0)(X, y.astype(np.float32), batch_size=0)
    with pytest.raises(ValueError, match="`log_weights` has shape"):
        bnn.predict_proba(_weights((3, 4), draws=(2,)), X, log_weights=jnp.zeros(3))


def test_subsampled_log_likelihood_is_unbiased_and_exact_at_full_batch():
    X, y = _toy(rows=20)
    params = _weights((3, 5, 4))
    full = _log_likelihood(bnn.classifier, params, np.arange(20), X, y, hidden=(5,), num_classes=4, batch_size=None)
    direct = float(jnp.sum(jax.nn.log_softmax(bnn.forward(params, X))[np.arange(20), y]))
    np.testing.assert_allclose(full, direct, rtol=1e-5)
    # n = N: the subsampled model is the full-data one
    whole = _log_likelihood(bnn.classifier, params, np.arange(20), X, y, hidden=(5,), num_classes=4, batch_size=20)
    np.testing.assert_allclose(whole, full, rtol=1e-5)
    # n < N: each minibatch's term is scaled by N/n, so averaging over the 4 blocks of any partition of the rows
    # (the expectation over minibatches drawn without replacement, exactly) gives the full-data value
    order = np.random.default_rng(3).permutation(20)
    blocks = [_log_likelihood(bnn.classifier, params, order[k : k + 5], X, y, hidden=(5,), num_classes=4, batch_size=5)
              for k in range(0, 20, 5)]  # fmt: skip
    np.testing.assert_allclose(np.mean(blocks), full, rtol=1e-5)
    assert np.std(blocks) > 1e-3 * abs(full)  # the blocks do differ: the estimator is noisy, not constant


def test_regressor_log_likelihood_matches_gaussian():
    X, _ = _toy(rows=12)
    y = np.linspace(-1, 1, 12).astype(np.float32)
    params = {**_weights((3, 4, 1)), "precision": jnp.asarray(2.5)}
    value = _log_likelihood(bnn.regressor, params, np.arange(12), X, y, hidden=(4,), batch_size=None)
    mean = np.asarray(bnn.forward(params, X))[:, 0]
    expected = np.sum(-0.5 * np.log(2 * np.pi / 2.5) - 0.5 * 2.5 * (y - mean) ** 2)
    np.testing.assert_allclose(value, expected, rtol=1e-5)


def test_model_average_over_draws_chunks_and_row_blocks():
    sizes, draws = (3, 6, 4), 7
    params = _weights(sizes, draws=(draws,))
    X = np.random.default_rng(2).normal(size=(bnn.ROW_BLOCK + 37, 3)).astype(np.float32)  # two row blocks
    per_draw = jax.nn.softmax(bnn.forward(params, X), axis=-1)  # (draws, rows, classes)
    np.testing.assert_allclose(bnn.predict_proba(params, X), per_draw.mean(0), rtol=1e-5, atol=1e-6)
    # chunks of 2 draws (the last chunk overlaps the previous one and must not count its draws twice)
    small = bnn.predict_proba(params, X, max_floats=2 * bnn.ROW_BLOCK * 6)
    np.testing.assert_allclose(small, per_draw.mean(0), rtol=1e-5, atol=1e-6)
    log_w = jnp.linspace(-1.0, 1.0, draws)
    weighted = jnp.tensordot(jax.nn.softmax(log_w), per_draw, axes=1)
    np.testing.assert_allclose(bnn.predict_proba(params, X, log_weights=log_w, max_floats=1), weighted, rtol=1e-5,
                               atol=1e-6)  # fmt: skip
    # regression: the mixture's mean and sd
    reg = {**_weights((3, 5, 1), draws=(draws,)), "precision": jnp.linspace(1.0, 4.0, draws)}
    f = np.asarray(bnn.forward(reg, X[:50]))[..., 0]
    mean, sd = bnn.predict_regression(reg, X[:50])
    np.testing.assert_allclose(mean, f.mean(0), rtol=1e-4, atol=1e-5)
    variance = (f**2 + 1 / np.asarray(reg["precision"])[:, None]).mean(0) - f.mean(0) ** 2
    np.testing.assert_allclose(sd, np.sqrt(variance), rtol=1e-4)


@pytest.mark.slow
def test_linear_network_samples_the_conjugate_posterior():
    """No hidden layer and the noise precision fixed: Bayesian linear regression with prior N(0, s² I) on the
    weights and the bias, whose posterior is Gaussian and known. SGLD with the tuned step size (noise ratio 0.1)
    and four chains; means and sds within 4.5 MCSE."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 3)).astype(np.float32)
    noise, prior = 0.5, 1.0
    y = (X @ np.array([1.0, -0.5, 0.25]) + 0.3 + noise * rng.normal(size=400)).astype(np.float32)
    model = handlers.condition(bnn.regressor, {"precision": 1 / noise**2})
    mcmc = MCMC(SGLD(model), num_warmup=400, num_samples=2000, num_chains=4, chain_method="vectorized",
                progress_bar=False)  # fmt: skip
    mcmc.run(jax.random.PRNGKey(2), X, y, hidden=(), prior_scale=prior, batch_size=100)
    samples = {k: np.asarray(v) for k, v in mcmc.get_samples(group_by_chain=True).items()}
    assert_linear_network_posterior(samples, X, y, noise, prior)
