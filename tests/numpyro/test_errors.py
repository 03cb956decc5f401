"""Bad input gets a clear error that names the argument and the fix."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import MCMC

from ppl_sgmcmc.numpyro import PSGLD, SGHMC, SGLD, SGNHT
from tests.numpyro.conftest import logistic_model


def run(kernel, *args, **kwargs):
    MCMC(kernel, num_warmup=2, num_samples=2, progress_bar=False).run(jax.random.PRNGKey(0), *args, **kwargs)


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), "1e-3", True])
def test_step_size_must_be_positive_finite(bad):
    with pytest.raises(ValueError, match=r"SGLD: `step_size` must be a finite positive number"):
        SGLD(logistic_model, step_size=bad)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: SGHMC(logistic_model, step_size=1e-3, friction=0), "`friction` must be a finite positive"),
        (lambda: SGHMC(logistic_model, step_size=1e-3, integrator="leapfrog"), "unknown integrator 'leapfrog'"),
        (lambda: SGNHT(logistic_model, step_size=1e-3, diffusion=-1), "`diffusion` must be a finite positive"),
        (lambda: SGNHT(logistic_model, step_size=1e-3, thermostat="vector"), "unknown thermostat 'vector'"),
        (lambda: SGNHT(logistic_model, step_size=1e-3, integrator="Euler"), "choose one of 'splitting', 'euler'"),
        (lambda: PSGLD(logistic_model, step_size=1e-3, alpha=1.0), "`alpha` must lie strictly between 0 and 1"),
        (lambda: PSGLD(logistic_model, step_size=1e-3, eps=0.0), "`eps` must be a finite positive"),
        (lambda: SGLD(logistic_model, step_size=1e-3, temperature=0), "`temperature` must be a finite positive"),
        (lambda: SGLD(logistic_model, step_size=1e-3, steps_per_sample=2.5), "`steps_per_sample` must be a positive"),
        (lambda: SGLD(step_size=1e-3), "exactly one of `model` and `potential_fn`"),
    ],
)
def test_hyperparameter_errors(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_discrete_latent_is_refused(logistic_data):
    def model(X, y=None):
        numpyro.sample("switch", dist.Bernoulli(0.5))
        logistic_model(X, y)

    with pytest.raises(NotImplementedError, match=r"latent site 'switch' is discrete .* Gibbs step"):
        run(SGLD(model, step_size=1e-3), *logistic_data)


def test_local_latent_in_subsampled_plate_is_refused(logistic_data):
    def model(X, y=None):
        w = numpyro.sample("w", dist.Normal(0, 1).expand([2]).to_event(1))
        with numpyro.plate("data", X.shape[0], subsample_size=20):
            u = numpyro.sample("u", dist.Normal(0, 1))
            logits = numpyro.subsample(X, event_dim=1) @ w + u
            numpyro.sample("y", dist.Bernoulli(logits=logits), obs=numpyro.subsample(y, event_dim=0))

    with pytest.raises(NotImplementedError, match=r"latent site 'u' lies inside the subsampled plate 'data'"):
        run(SGLD(model, step_size=1e-3), *logistic_data)


def test_shape_mismatch_names_the_plate(logistic_data):
    X, y = logistic_data
    with pytest.raises(ValueError, match=r"(?s)SGLD: tracing the model failed: .*plate(.)s size"):
        run(SGLD(logistic_model, step_size=1e-3), X, y[:150])


def test_numpy_global_indexed_by_traced_indices(logistic_data):
    X, y = (np.asarray(a) for a in logistic_data)

    def model(y):
        w = numpyro.sample("w", dist.Normal(0, 1).expand([2]).to_event(1))
        with numpyro.plate("data", 200, subsample_size=20) as idx:
            numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ w), obs=y[idx])

    with pytest.raises(TypeError, match=r"indexes a NumPy array with traced minibatch indices.*jax.numpy.asarray"):
        run(SGLD(model, step_size=1e-3), jnp.asarray(y))


def test_numpy_model_arguments_are_converted(logistic_data):
    run(SGLD(logistic_model, step_size=1e-3), *(np.asarray(a) for a in logistic_data))


def test_model_without_subsampled_plate_warns_once(logistic_data):
    def model(X, y=None):
        w = numpyro.sample("w", dist.Normal(0, 1).expand([2]).to_event(1))
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.Bernoulli(logits=X @ w), obs=y)

    with pytest.warns(UserWarning, match="no plate with `subsample_size`") as record:
        run(SGLD(model, step_size=1e-3), *logistic_data)
    assert sum("subsample_size" in str(w.message) for w in record) == 1


def test_potential_fn_needs_init_params():
    with pytest.raises(ValueError, match=r"needs `init_params`"):
        run(SGLD(potential_fn=lambda z: jnp.sum(z**2), step_size=1e-2))
