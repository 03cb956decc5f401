"""``full_data``: subsampled plates run on all their data; a local site that gets neither a value nor a
random key (a local Gibbs site absent from the samples) no longer trips NumPyro's bare ``AssertionError``."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.handlers import seed, substitute, trace
from numpyro.infer import log_likelihood

from ppl_sgmcmc.numpyro import full_data

WEIGHTS = jnp.array([0.3, 0.7])
MEMBERSHIP = dist.Categorical(probs=WEIGHTS)  # one distribution object, shared by every run of the model


def mixture(x):
    mu = numpyro.sample("mu", dist.Normal(0.0, 3.0).expand([2]).to_event(1))
    with numpyro.plate("data", x.shape[0], subsample_size=3):
        xb = numpyro.subsample(x, event_dim=0)
        z = numpyro.sample("z", MEMBERSHIP)
        numpyro.sample("x", dist.Normal(mu[z], 1.0), obs=xb)


X = jnp.linspace(-2.0, 2.0, 7)
SAMPLES = {"mu": jnp.array([[-1.0, 1.0], [0.0, 2.0]])}


def test_full_data_plate_has_no_subsample():
    tr = trace(seed(full_data(mixture), 0)).get_trace(X)
    assert tr["data"]["args"] == (7, None)
    assert tr["x"]["value"].shape == (7,) and tr["z"]["value"].shape == (7,)
    assert tr["x"]["scale"] is None


def test_local_site_without_value_or_key_gives_a_nan_log_likelihood():
    with pytest.warns(UserWarning, match=r"\['z'\] inside a subsampled plate.*observed site 'x'.*is NaN"):
        pointwise = log_likelihood(full_data(mixture), SAMPLES, X)["x"]
    assert pointwise.shape == (2, 7) and bool(jnp.all(jnp.isnan(pointwise)))
    assert type(MEMBERSHIP) is dist.CategoricalProbs  # the model's own object is left as it is


def test_local_site_with_a_key_or_a_value_is_untouched(recwarn):
    # with a key, z is drawn from its prior (a posterior predictive of new units)
    tr = trace(seed(substitute(full_data(mixture), {"mu": SAMPLES["mu"][0]}), 1)).get_trace(X)
    z = tr["z"]["value"]
    assert z.shape == (7,) and bool(jnp.all((z == 0) | (z == 1))) and bool(jnp.any(z == 1))
    # with a value (the local sites given), the log-likelihood is the conditional one
    z = jnp.array([0, 1, 1, 0, 1, 0, 1])
    pointwise = log_likelihood(full_data(mixture), {"mu": SAMPLES["mu"], "z": jnp.stack([z, z])}, X)["x"]
    expected = jax.scipy.stats.norm.logpdf(np.asarray(X), np.asarray(SAMPLES["mu"])[:, z])
    np.testing.assert_allclose(pointwise, expected, rtol=1e-6)
    assert not [w for w in recwarn if "full_data" in str(w.message)]
