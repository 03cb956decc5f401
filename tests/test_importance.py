"""Importance-weighted InferenceData (:mod:`ppl_sgmcmc.importance`), on synthetic weighted draws.

Draws ``x ~ N(0, 1)`` with log weights ``x - 1/2`` (up to a per-chain constant) are importance samples
of ``N(1, 1)``: weighted means, probabilities and resampled draws must match ``N(1, 1)`` within their
Monte Carlo error (``K_SIGMA`` standard errors; ``tests/helpers.py``). The draws are independent, so
the standard error of a self-normalised estimate is the delta-method one,
``sqrt(Σ w² (f - f̂)²) / Σ w``.
"""

import arviz as az
import numpy as np
import pytest

from ppl_sgmcmc.importance import normalized_weights, resample, weight_ess, weighted_expectation, weighted_mean
from tests.helpers import assert_mc_close

CHAINS, DRAWS = 4, 5000


def tilted(seed=0, offsets=(0.0, 3.0, -2.0, 10.0)):
    """``N(0, 1)`` draws reweighted to ``N(1, 1)``; each chain's log weights carry their own constant."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(CHAINS, DRAWS))
    log_weight = x - 0.5 + np.asarray(offsets)[:, None]
    loglik = -0.5 * (x[..., None] - np.arange(3)) ** 2  # a per-draw group with an extra dimension
    return x, az.from_dict(
        posterior={"x": x, "y": 2 * x},
        sample_stats={"log_weight": log_weight, "diverging": np.zeros_like(x, bool)},
        log_likelihood={"obs": loglik},
        observed_data={"obs": np.arange(3.0)},
    )


def self_normalised_se(w, f):
    w = w / w.sum()
    return np.sqrt(np.sum(w**2 * (f - np.sum(w * f)) ** 2))


def test_weights_normalised_per_chain_or_pooled():
    x, idata = tilted()
    w = normalized_weights(idata)
    assert w.dims == ("chain", "draw")
    np.testing.assert_allclose(w.sum("draw"), 1 / CHAINS)
    raw = np.exp(x - 0.5)
    np.testing.assert_allclose(w.values, raw / raw.sum(1, keepdims=True) / CHAINS, rtol=1e-10)
    pooled = normalized_weights(idata, pool=True)
    raw_pooled = np.exp(idata.sample_stats["log_weight"].values)
    np.testing.assert_allclose(pooled.values, raw_pooled / raw_pooled.sum(), rtol=1e-10)
    assert pooled.values[3].sum() > 0.99  # the chain with offset +10 dominates a pooled normalisation


def test_weighted_mean_and_probability():
    x, idata = tilted()
    w = normalized_weights(idata).values.ravel()
    mean = weighted_mean(idata)
    assert set(mean.data_vars) == {"x", "y"} and mean["x"].dims == ()
    np.testing.assert_allclose(float(mean["y"]), 2 * float(mean["x"]), rtol=1e-12)
    np.testing.assert_allclose(float(mean["x"]), np.sum(w * x.ravel()), rtol=1e-12)
    assert_mc_close("weighted mean", float(mean["x"]), 1.0, self_normalised_se(w, x.ravel()))
    below = (x < 1).ravel().astype(float)
    p = weighted_expectation(idata, lambda post: post["x"] < 1)
    assert_mc_close("P(x < 1)", float(p), 0.5, self_normalised_se(w, below))
    second = weighted_expectation(idata, lambda post: post["x"] ** 2, var_names=["x"])
    assert_mc_close("E x²", float(second), 2.0, self_normalised_se(w, x.ravel() ** 2))
    # pooled normalisation of equal per-chain constants gives the same numbers
    _, equal = tilted(offsets=(0.0, 0.0, 0.0, 0.0))
    np.testing.assert_allclose(
        float(weighted_mean(equal, pool=True)["x"]),
        np.sum(np.exp(x - 0.5) * x) / np.sum(np.exp(x - 0.5)),
        rtol=1e-10,
    )


def test_weight_ess_is_kish():
    x, idata = tilted()
    raw = np.exp(x - 0.5)
    per_chain = raw.sum(1) ** 2 / (raw**2).sum(1)
    np.testing.assert_allclose(weight_ess(idata, by_chain=True).values, per_chain, rtol=1e-10)
    w = raw / raw.sum(1, keepdims=True) / CHAINS
    np.testing.assert_allclose(weight_ess(idata), 1 / np.sum(w**2), rtol=1e-10)
    # for this tilt E[w]² / E[w²] = 1/e of the draws
    assert abs(weight_ess(idata) / x.size - np.exp(-1)) < 0.03
    _, uniform = tilted(offsets=(0.0, 0.0, 0.0, 0.0))
    uniform.sample_stats["log_weight"] = uniform.sample_stats["log_weight"] * 0
    assert weight_ess(uniform) == pytest.approx(x.size)


@pytest.mark.parametrize("method", ["systematic", "multinomial"])
def test_resample_follows_the_target(method):
    x, idata = tilted(seed=1)
    out = resample(idata, seed=2, method=method)
    assert out.posterior["x"].shape == (CHAINS, DRAWS)
    draws = out.posterior["x"].values
    # every group indexed by the same draws
    np.testing.assert_array_equal(out.posterior["y"].values, 2 * draws)
    np.testing.assert_allclose(out.log_likelihood["obs"].values, -0.5 * (draws[..., None] - np.arange(3)) ** 2)
    np.testing.assert_array_equal(out.observed_data["obs"].values, np.arange(3.0))
    assert "log_weight" not in out.sample_stats and "diverging" in out.sample_stats
    assert out.posterior.attrs["importance_resampled"] == method
    assert out.posterior.attrs["importance_weight_ess"] == pytest.approx(weight_ess(idata))
    # within each chain, only that chain's draws
    for c in range(CHAINS):
        assert np.isin(draws[c], x[c]).all()
    # mean and variance of N(1, 1): the resampled mean's error is the weighted mean's plus the resampling noise
    ess = weight_ess(idata)
    assert_mc_close("resampled mean", draws.mean(), 1.0, np.sqrt(1 / ess + 1 / draws.size))
    assert_mc_close("resampled var", draws.var(), 1.0, np.sqrt(2 / ess + 2 / draws.size))
    if method == "systematic":  # time order kept: the indices are non-decreasing within each chain
        idx = np.argmax(x[:, None, :] == draws[..., None], axis=-1)
        assert np.all(np.diff(idx, axis=1) >= 0)
        summary = az.summary(out, var_names=["x"])
        assert summary.loc["x", "ess_bulk"] < x.size  # repeats lower ArviZ's ESS
        assert summary.loc["x", "r_hat"] < 1.01


def test_resample_pooled_and_num_draws():
    x, idata = tilted(offsets=(0.0, 0.0, 0.0, 0.0))
    out = resample(idata, num_draws=100, seed=0, pool=True)
    assert out.posterior["x"].shape == (CHAINS, 100)
    assert np.isin(out.posterior["x"].values, x).all()
    assert out.posterior.attrs["importance_normalisation"] == "pooled"


def test_low_weight_ess_warns():
    x, idata = tilted()
    idata.sample_stats["log_weight"] = idata.sample_stats["log_weight"] * 20
    with pytest.warns(UserWarning, match="effective sample size"):
        resample(idata, seed=0)


def test_errors():
    _, idata = tilted()
    with pytest.raises(KeyError, match="no `log_weight` in `sample_stats`"):
        weighted_mean(az.from_dict(posterior={"x": np.zeros((1, 5))}))
    with pytest.raises(ValueError, match="unknown method 'residual'"):
        resample(idata, method="residual")
    with pytest.raises(ValueError, match="`num_draws` must be a positive integer"):
        resample(idata, num_draws=0)
    bad = idata.copy()
    bad.sample_stats["log_weight"][0, 0] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        weighted_mean(bad)
