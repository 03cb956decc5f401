"""The main job's helpers (``models/logistic_regression.py``)."""

import warnings

import arviz as az
import numpy as np

from models.logistic_regression import loo


def test_loo_in_chunks_is_arviz_loo():
    """PSIS-LOO a few data points at a time (the main job's memory peak): ArviZ's numbers, bit for bit."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 3))
    sign = np.where(rng.random(300) < 0.3, 1.0, -1.0)
    w = rng.normal(0.5, 0.2, size=(3, 200, 3))
    w[..., 0] += 0.3 * rng.standard_t(2, size=(3, 200))  # heavy tails: some Pareto k above 0.7
    log_likelihood = -np.logaddexp(0, -sign * (w @ X.T)).astype(np.float32)
    idata = az.from_dict(posterior={"w": w}, log_likelihood={"y": log_likelihood}, dims={"y": ["data"]})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected, chunked = az.loo(idata, pointwise=True), loo(idata, observations=37)
    assert str(chunked) == str(expected)
    for key in ("elpd_loo", "se", "p_loo", "n_samples", "n_data_points", "warning", "good_k"):
        assert chunked[key] == expected[key], key
    np.testing.assert_array_equal(chunked.loo_i, expected.loo_i)
    np.testing.assert_array_equal(chunked.pareto_k, expected.pareto_k)
