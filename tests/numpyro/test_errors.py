"""Bad input gets a clear error that names the argument and the fix."""

from functools import partial

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


def init(kernel, *args, **kwargs):
    """Only the kernel's init (the checks and the first gradient), for inputs that must be accepted."""
    return kernel.init(jax.random.PRNGKey(0), 0, model_args=args, **kwargs)


def _logistic(batch_size=20, subsample_y=True):
    """The logistic regression with a given ``subsample_size``, optionally forgetting ``numpyro.subsample(y)``."""

    def model(X, y):
        w = numpyro.sample("w", dist.Normal(0, 1).expand([2]).to_event(1))
        with numpyro.plate("data", X.shape[0], subsample_size=batch_size):
            obs = numpyro.subsample(y, event_dim=0) if subsample_y else y
            numpyro.sample("y", dist.Bernoulli(logits=numpyro.subsample(X, event_dim=1) @ w), obs=obs)

    return model


@pytest.mark.parametrize("n", [0, 201, -5, 2.5])
def test_subsample_size_must_lie_between_1_and_N(logistic_data, n):
    """n = 0 sampled the prior silently, n > N and n < 0 failed with unrelated errors."""
    message = (
        rf"SGLD: plate 'data' has size N = 200 and subsample_size n = {n}; subsample_size must be an integer with 1"
    )
    with pytest.raises(ValueError, match=message):
        run(SGLD(_logistic(n), step_size=1e-3), *logistic_data)


def test_subsample_size_equal_to_N_is_the_full_data(logistic_data):
    with pytest.warns(UserWarning, match="no plate with `subsample_size`"):
        init(SGLD(_logistic(200), step_size=1e-3), *logistic_data)


def test_non_finite_observations_name_the_site_and_rows(logistic_data):
    """NaN in the data was reported as divergences; rows outside the first minibatch too."""
    X, y = logistic_data
    y = y.at[jnp.array([3, 150])].set(jnp.nan)
    with pytest.raises(ValueError, match=r"observed site 'y' has non-finite values \(NaN or inf\) at rows \[3, 150\] "
                       r"of plate 'data' \(2 of 200 rows\)"):  # fmt: skip
        run(SGLD(_logistic(), step_size=1e-3), X, y)


def test_non_finite_covariates_name_the_subsampled_array_and_rows(logistic_data):
    X, y = logistic_data
    X = X.at[17, 1].set(jnp.inf)
    message = r"the array of shape \(200, 2\) passed to `numpyro.subsample\(..., event_dim=1\)` has non-finite values"
    with pytest.raises(ValueError, match=message + r" \(NaN or inf\) at rows \[17\] of plate 'data'"):
        run(SGLD(_logistic(), step_size=1e-3), X, y)


def test_non_finite_observations_indexed_by_the_model_are_found(logistic_data):
    """A model that indexes its data itself (``y[idx]``): the full data of its observed site are checked."""
    X, y = logistic_data

    def model(X, y):
        w = numpyro.sample("w", dist.Normal(0, 1).expand([2]).to_event(1))
        with numpyro.plate("data", X.shape[0], subsample_size=20) as idx:
            numpyro.sample("y", dist.Normal(X[idx] @ w, 1.0), obs=y[idx])

    with pytest.raises(ValueError, match=r"observed site 'y' has non-finite values .* at rows \[199\] of plate 'data'"):
        run(SGLD(model, step_size=1e-3), X, y.at[199].set(jnp.nan))


def _mean_model(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    with numpyro.plate("data", y.shape[0], subsample_size=20):
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=numpyro.subsample(y, event_dim=0))


def _mean_model_event(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    with numpyro.plate("data", y.shape[0], subsample_size=20):
        numpyro.sample("y", dist.Normal(mu, 1.0).expand([1]).to_event(1), obs=numpyro.subsample(y, event_dim=1))


def test_observation_that_broadcasts_against_the_plate_is_refused():
    """``y`` of shape (N, 1) against a plate of size N at dim -1 broadcast to (N, n) pairs: a wrong posterior."""
    y = 0.7 + jax.random.normal(jax.random.PRNGKey(1), (200, 1))
    message = (
        r"(?s)observed site 'y' has a value of shape \(200, 1\) .* broadcasts with it to \(200, 20\).*"
        r"Reshape the data of 'y' to \(200,\).*`numpyro.subsample\(y, event_dim=1\)` and `.to_event\(1\)`"
    )
    with pytest.raises(ValueError, match=message):
        run(SGLD(_mean_model, step_size=1e-3), y)
    init(SGLD(_mean_model_event, step_size=1e-3), y)  # the trailing dimension declared as an event
    init(SGLD(_mean_model, step_size=1e-3), y[:, 0])  # or reshaped


def test_plate_name_reused_with_another_size_is_refused(logistic_data):
    """The kernel substitutes one set of indices per plate name: the second plate's indices were clamped."""
    X, y = logistic_data

    def model(X, y, second):
        w = numpyro.sample("w", dist.Normal(0, 1).expand([2]).to_event(1))
        with numpyro.plate("data", 200, subsample_size=20):
            numpyro.sample("y", dist.Bernoulli(logits=numpyro.subsample(X, event_dim=1) @ w),
                           obs=numpyro.subsample(y, event_dim=0))  # fmt: skip
        with numpyro.plate("data", second, subsample_size=20 if second == 200 else 10):
            numpyro.sample("y2", dist.Bernoulli(logits=numpyro.subsample(X[:second], event_dim=1) @ w),
                           obs=numpyro.subsample(y[:second], event_dim=0))  # fmt: skip

    with pytest.raises(ValueError, match=r"plate 'data' is declared with size 200 \(subsample_size 20\) and again "
                       r"with size 100 \(subsample_size 10\).*its own name"):  # fmt: skip
        run(SGLD(partial(model, second=100), step_size=1e-3), X, y)
    init(SGLD(partial(model, second=200), step_size=1e-3), X, y)  # the same plate entered twice is fine


def test_observation_not_subsampled_says_wrap_it(logistic_data):
    """Passing the full ``y`` as ``obs`` inside a subsampled plate failed later with a broadcasting error."""
    message = (
        r"observed site 'y' inside plate 'data' \(size 200, subsample_size 20, dim -1\) has a value of shape "
        r"\(200,\), with the plate's full size 200 .* Wrap it in `numpyro.subsample\(y, event_dim=0\)`"
    )
    with pytest.raises(ValueError, match=message):
        run(SGLD(_logistic(subsample_y=False), step_size=1e-3), *logistic_data)


def test_covariates_not_subsampled_say_so(logistic_data):
    def model(X, y):
        w = numpyro.sample("w", dist.Normal(0, 1).expand([2]).to_event(1))
        with numpyro.plate("data", X.shape[0], subsample_size=20):
            numpyro.sample("y", dist.Bernoulli(logits=X @ w), obs=numpyro.subsample(y, event_dim=0))

    with pytest.raises(
        ValueError, match=r"full size 200 of plate 'data' met the minibatch's 20 rows.*numpyro.subsample"
    ):
        run(SGLD(model, step_size=1e-3), *logistic_data)


def test_potential_fn_with_a_defaulted_second_argument_is_deterministic():
    """``f(z, scale=1.0)`` was called as ``f(z, rng_key)``."""

    def energy(z, scale=1.0):
        return scale * jnp.sum(z["x"] ** 2)

    kernel = SGLD(potential_fn=energy, step_size=1e-2)
    MCMC(kernel, num_warmup=2, num_samples=2, progress_bar=False).run(
        jax.random.PRNGKey(0), init_params={"x": jnp.ones(2)}
    )
    assert not kernel._target.stochastic
    with pytest.raises(TypeError, match=r"`potential_fn` must take .* `f\(z, rng_key\)`; it requires 3 positional"):
        run(SGLD(potential_fn=lambda z, rng_key, data: 0.0, step_size=1e-2), init_params={"x": jnp.ones(2)})


def test_dtype_error_says_it_is_a_dtype_error(logistic_data):
    """Float labels of a Categorical got the hint about plate shapes."""
    X, y = logistic_data

    def model(X, c):
        w = numpyro.sample("w", dist.Normal(0, 1).expand([2, 3]).to_event(2))
        with numpyro.plate("data", X.shape[0], subsample_size=20):
            numpyro.sample("c", dist.Categorical(logits=numpyro.subsample(X, event_dim=1) @ w),
                           obs=numpyro.subsample(c, event_dim=0))  # fmt: skip

    with pytest.raises(ValueError, match=r"(?s)This is a dtype error, not a shape error.*args\[1\] of dtype float32"):
        run(SGLD(model, step_size=1e-3), X, y)
    init(SGLD(model, step_size=1e-3), X, y.astype(jnp.int32))


def test_local_latent_error_points_at_local_gibbs_sites(logistic_data):
    def model(X, y=None):
        w = numpyro.sample("w", dist.Normal(0, 1).expand([2]).to_event(1))
        with numpyro.plate("data", X.shape[0], subsample_size=20):
            u = numpyro.sample("u", dist.Normal(0, 1))
            logits = numpyro.subsample(X, event_dim=1) @ w + u
            numpyro.sample("y", dist.Bernoulli(logits=logits), obs=numpyro.subsample(y, event_dim=0))

    with pytest.raises(NotImplementedError, match=r"Marginalise .* local Gibbs site: `gibbs_sites=\['u'\], gibbs_fn="):
        run(SGLD(model, step_size=1e-3), *logistic_data)


def test_a_run_without_the_cpu_platform_is_refused(monkeypatch):
    """``JAX_PLATFORMS=cuda`` leaves JAX no CPU platform, which the in-loop host callbacks (the health report)
    need: the kernel refuses to start and names the setting, instead of failing inside the compiled loop."""
    devices = jax.devices

    def no_cpu(backend=None):
        if backend == "cpu":
            raise RuntimeError("Unknown backend cpu")
        return devices(backend)

    monkeypatch.setattr(jax, "devices", no_cpu)
    kernel = SGLD(potential_fn=lambda z: jnp.sum(z["x"] ** 2), step_size=0.1)
    with pytest.raises(RuntimeError, match="JAX_PLATFORMS=cuda,cpu"):
        kernel.init(jax.random.PRNGKey(0), 0, {"x": jnp.ones(2)})
