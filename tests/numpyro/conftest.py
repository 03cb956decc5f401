import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest


def logistic_model(X, y=None, batch_size=20):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    scale = numpyro.sample("scale", dist.HalfNormal(1.0))
    numpyro.deterministic("scaled_w", scale * w)
    with numpyro.plate("data", X.shape[0], subsample_size=batch_size):
        Xb = numpyro.subsample(X, event_dim=1)
        yb = numpyro.subsample(y, event_dim=0) if y is not None else None
        numpyro.sample("y", dist.Bernoulli(logits=Xb @ w), obs=yb)


@pytest.fixture(scope="session")
def logistic_data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 2)).astype(np.float32)
    y = (X @ np.array([1.0, -0.5]) + rng.logistic(size=200) > 0).astype(np.float32)
    return jnp.asarray(X), jnp.asarray(y)
