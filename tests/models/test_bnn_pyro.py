"""Bayesian MLPs declared in Pyro (``models/bnn_pyro.py``): the same sites as the NumPyro declaration, the
subsampled plate's log-likelihood estimator, the model average against the NumPyro one on the same draws, and the
network without hidden layers (conjugate Bayesian linear regression once the noise precision is fixed) against its
exact posterior. (The quality bars, short runs that learn on the shipped UCI and MNIST subsets, are
``benchmarks/quality_checks.py --only uci-pyro`` and ``--only mnist-pyro``.)
"""

import numpy as np
import pyro
import pytest
import torch
from pyro import poutine
from pyro.infer import MCMC

from models import bnn, bnn_pyro
from ppl_sgmcmc.pyro import SGLD
from tests.helpers import assert_linear_network_posterior

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _weights(sizes, seed=1, draws=()):
    rng = np.random.default_rng(seed)
    params = {}
    for layer, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        params[f"layers.{layer}.weight"] = torch.as_tensor(rng.normal(size=(*draws, b, a)), dtype=torch.float32)
        params[f"layers.{layer}.bias"] = torch.as_tensor(rng.normal(size=(*draws, b)), dtype=torch.float32)
    return params


def _log_likelihood(model, params, indices, X, y):
    conditioned = poutine.condition(model, data={**params, "data": torch.as_tensor(indices)})
    tr = poutine.trace(conditioned).get_trace(X, y)
    tr.compute_log_prob()
    return float(tr.nodes["y"]["log_prob_sum"])


def test_sites_match_the_numpyro_declaration():
    X, y = torch.randn(20, 3), torch.randint(0, 4, (20,))
    tr = poutine.trace(bnn_pyro.BNNClassifier(3, hidden=(5, 6), num_classes=4, batch_size=7)).get_trace(X, y)
    shapes = {name: tuple(site["value"].shape) for name, site in tr.nodes.items() if site["type"] == "sample"}
    assert shapes == {"data": (7,), "layers.0.weight": (5, 3), "layers.0.bias": (5,), "layers.1.weight": (6, 5),
                      "layers.1.bias": (6,), "layers.2.weight": (4, 6), "layers.2.bias": (4,), "y": (7,)}  # fmt: skip
    assert all(not site["cond_indep_stack"] for name, site in tr.nodes.items() if name.startswith("layers."))
    with pytest.raises(ValueError, match="`batch_size` must be a positive integer"):
        bnn_pyro.BNNRegressor(3, batch_size=-1)


def test_subsampled_log_likelihood_is_unbiased_and_exact_at_full_batch():
    X, y = torch.randn(20, 3), torch.randint(0, 4, (20,))
    params = _weights((3, 5, 4))
    full = _log_likelihood(bnn_pyro.BNNClassifier(3, (5,), 4, batch_size=None), params, np.arange(20), X, y)
    direct = float(torch.log_softmax(bnn_pyro.forward(params, X), -1)[torch.arange(20), y].sum())
    np.testing.assert_allclose(full, direct, rtol=1e-5)
    whole = _log_likelihood(bnn_pyro.BNNClassifier(3, (5,), 4, batch_size=20), params, np.arange(20), X, y)
    np.testing.assert_allclose(whole, full, rtol=1e-5)
    order = np.random.default_rng(3).permutation(20)
    model = bnn_pyro.BNNClassifier(3, (5,), 4, batch_size=5)
    blocks = [_log_likelihood(model, params, order[k : k + 5], X, y) for k in range(0, 20, 5)]
    np.testing.assert_allclose(np.mean(blocks), full, rtol=1e-5)  # N/n scaling: the partition's mean is exact
    assert np.std(blocks) > 1e-3 * abs(full)


def test_model_average_matches_numpyro():
    params = _weights((3, 6, 4), draws=(7,))
    X = np.random.default_rng(2).normal(size=(bnn.ROW_BLOCK + 37, 3)).astype(np.float32)
    log_w = np.linspace(-1.0, 1.0, 7).astype(np.float32)
    torch_p = bnn_pyro.predict_proba(params, torch.as_tensor(X), log_weights=torch.as_tensor(log_w), max_floats=1)
    jax_p = bnn.predict_proba({k: v.numpy() for k, v in params.items()}, X, log_weights=log_w)
    np.testing.assert_allclose(torch_p.numpy(), np.asarray(jax_p), rtol=1e-4, atol=1e-6)
    reg = {**_weights((3, 5, 1), draws=(7,)), "precision": torch.linspace(1.0, 4.0, 7)}
    torch_m = bnn_pyro.predict_regression(reg, torch.as_tensor(X[:50]))
    jax_m = bnn.predict_regression({k: v.numpy() for k, v in reg.items()}, X[:50])
    for a, b in zip(torch_m, jax_m):
        np.testing.assert_allclose(a.numpy(), np.asarray(b), rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_linear_network_samples_the_conjugate_posterior():
    """As in ``tests/models/test_bnn.py``: no hidden layer, the precision fixed; SGLD with a given step size
    ``h = 2e-5``: ``h λ_max ≈ 0.03`` for the posterior's curvature ``λ ≈ 1/0.025²``, so the discretisation's bias
    on the sd, about ``h λ / 4``, is under 1% of it (well inside the Monte Carlo tolerance)."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 3)).astype(np.float32)
    noise, prior = 0.5, 1.0
    y = (X @ np.array([1.0, -0.5, 0.25]) + 0.3 + noise * rng.normal(size=400)).astype(np.float32)
    pyro.set_rng_seed(2)
    fixed = {"precision": torch.tensor(1 / noise**2)}
    model = poutine.condition(bnn_pyro.BNNRegressor(3, hidden=(), batch_size=40), data=fixed)
    mcmc = MCMC(SGLD(model, step_size=2e-5), warmup_steps=300, num_samples=6000, disable_progbar=True)
    mcmc.run(torch.as_tensor(X), torch.as_tensor(y))
    samples = {k: v.numpy() for k, v in mcmc.get_samples(group_by_chain=True).items()}
    assert_linear_network_posterior(samples, X, y, noise, prior)
