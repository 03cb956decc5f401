"""Pyro models of the tests, in an importable module so that Pyro's worker processes can unpickle them."""

import pyro
import pyro.distributions as dist
import torch


def logistic_model(X, y=None, batch_size=20):
    """The logistic regression of ``tests/numpyro/conftest.py``, written to broadcast over a leading
    sample dimension of ``w`` (``Predictive``, ArviZ)."""
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    scale = pyro.sample("scale", dist.HalfNormal(1.0))
    pyro.deterministic("scaled_w", scale * w)
    with pyro.plate("data", X.shape[0], subsample_size=batch_size):
        Xb = pyro.subsample(X, event_dim=1)
        yb = pyro.subsample(y, event_dim=0) if y is not None else None
        pyro.sample("y", dist.Bernoulli(logits=(Xb * w.unsqueeze(-2)).sum(-1)), obs=yb)


def logistic_data(num_data=200, seed=0):
    """The data of ``tests/numpyro/conftest.py`` (the same NumPy draws), as float32 tensors."""
    import numpy as np

    rng = np.random.default_rng(seed)
    X = rng.normal(size=(num_data, 2)).astype(np.float32)
    y = (X @ np.array([1.0, -0.5]) + rng.logistic(size=num_data) > 0).astype(np.float32)
    return torch.from_numpy(X), torch.from_numpy(y)
