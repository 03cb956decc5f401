"""Bad input gets a clear error that names the argument and the fix: the same messages as the NumPyro
backend (``tests/numpyro/test_errors.py``) for the same mistakes."""

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC

from ppl_sgmcmc.pyro import PSGLD, SGHMC, SGLD, SGNHT
from tests.pyro.models import logistic_model


def run(kernel, *args, **kwargs):
    MCMC(kernel, warmup_steps=2, num_samples=2, disable_progbar=True).run(*args, **kwargs)


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


def test_same_messages_as_numpyro():
    """The two backends validate with the same code (``ppl_sgmcmc._checks``): identical messages."""
    from ppl_sgmcmc import numpyro as np_backend

    for kwargs in (dict(step_size=-1.0), dict(step_size=1e-3, friction=0), dict(step_size=1e-3, integrator="x")):
        messages = []
        for SGHMC_ in (SGHMC, np_backend.SGHMC):
            with pytest.raises(ValueError) as info:
                SGHMC_(logistic_model, **kwargs)
            messages.append(str(info.value))
        assert messages[0] == messages[1]


def test_model_must_be_callable():
    with pytest.raises(TypeError, match="`model` must be callable"):
        SGLD("model", step_size=1e-3)


def test_discrete_latent_is_refused(logistic_data):
    def model(X, y=None):
        pyro.sample("switch", dist.Bernoulli(0.5))
        logistic_model(X, y)

    with pytest.raises(NotImplementedError, match=r"latent site 'switch' is discrete .* Gibbs step"):
        run(SGLD(model, step_size=1e-3), *logistic_data)


def test_local_latent_in_subsampled_plate_is_refused(logistic_data):
    def model(X, y=None):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        with pyro.plate("data", X.shape[0], subsample_size=20):
            u = pyro.sample("u", dist.Normal(0.0, 1.0))
            logits = pyro.subsample(X, event_dim=1) @ w + u
            pyro.sample("y", dist.Bernoulli(logits=logits), obs=pyro.subsample(y, event_dim=0))

    with pytest.raises(NotImplementedError, match=r"latent site 'u' lies inside the subsampled plate 'data'"):
        run(SGLD(model, step_size=1e-3), *logistic_data)


def test_shape_mismatch_names_the_plate(logistic_data):
    X, y = logistic_data
    with pytest.raises(ValueError, match=r"(?s)SGLD: tracing the model failed: .*plate(.)s size"):
        run(SGLD(logistic_model, step_size=1e-3), X, y[:150])


def test_shape_mismatch_of_indexed_data_is_caught_before_sampling(logistic_data):
    """A model that indexes its data itself (``X[idx]``) passes the prototype trace (indices ``0..n-1``);
    the full-data check finds the mismatch before any step, not at a random step later."""
    X, y = logistic_data

    def model(X, y):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        with pyro.plate("data", X.shape[0], subsample_size=20) as idx:
            pyro.sample("y", dist.Bernoulli(logits=X[idx] @ w), obs=y[idx])

    with pytest.raises(ValueError, match=r"(?s)running the model on its full data \(plates 'data' of size 200\)"):
        run(SGLD(model, step_size=1e-3), X, y[:150])


def test_numpy_model_arguments_are_converted(logistic_data):
    """NumPy arrays (float64 too) become tensors of torch's default dtype, as JAX arrays in the NumPyro backend."""
    X, y = (np.asarray(a, dtype=np.float64) for a in logistic_data)
    mcmc = MCMC(SGLD(logistic_model, step_size=1e-3), warmup_steps=2, num_samples=3, disable_progbar=True)
    mcmc.run(X, y)
    assert mcmc.get_samples()["w"].dtype == torch.float32


def test_model_without_subsampled_plate_warns_once(logistic_data):
    def model(X, y=None):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        with pyro.plate("data", X.shape[0]):
            pyro.sample("y", dist.Bernoulli(logits=X @ w), obs=y)

    kernel = SGLD(model, step_size=1e-3)
    with pytest.warns(UserWarning, match="no plate with `subsample_size`") as record:
        run(kernel, *logistic_data)
        run(kernel, *logistic_data)  # a second run of the same kernel does not repeat it
    assert sum("subsample_size" in str(w.message) for w in record) == 1


def test_potential_fn_needs_init_params():
    with pytest.raises(ValueError, match=r"needs `init_params`: pass them as `MCMC\(kernel, \.\.\., initial_params"):
        run(SGLD(potential_fn=lambda z: (z["x"] ** 2).sum(), step_size=1e-2))


def test_untraceable_model_falls_back_to_eager_with_a_warning(logistic_data):
    """Python control flow on a latent's value cannot be traced into a graph: the kernel says so and
    runs the model eagerly, with the same results as ``compile_potential=False``."""

    def model(X, y):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        if w[0] > 0:  # data-dependent branch
            w = w * 1.0
        with pyro.plate("data", X.shape[0], subsample_size=20):
            logits = pyro.subsample(X, event_dim=1) @ w
            pyro.sample("y", dist.Bernoulli(logits=logits), obs=pyro.subsample(y, event_dim=0))

    draws = []
    for compile_potential in (True, False):
        pyro.set_rng_seed(5)
        mcmc = MCMC(SGLD(model, step_size=1e-3, compile_potential=compile_potential), warmup_steps=3,
                    num_samples=5, disable_progbar=True)  # fmt: skip
        if compile_potential:
            with pytest.warns(RuntimeWarning, match="could not trace the potential"):
                mcmc.run(*logistic_data)
        else:
            mcmc.run(*logistic_data)
        draws.append(mcmc.get_samples()["w"])
    torch.testing.assert_close(draws[0], draws[1])


def test_initial_params_must_cover_every_latent(logistic_data):
    with pytest.raises(ValueError, match=r"`initial_params` lacks the latent site\(s\) 'scale'"):
        MCMC(SGLD(logistic_model, step_size=1e-3), warmup_steps=1, num_samples=1, disable_progbar=True,
             initial_params={"w": torch.zeros(2)}).run(*logistic_data)  # fmt: skip
