"""Bad input gets a clear error that names the argument and the fix: the same messages as the NumPyro
backend (``tests/numpyro/test_errors.py``) for the same mistakes."""

from functools import partial

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC

from ppl_sgmcmc.pyro import PSGLD, SGFS, SGHMC, SGLD, SGNHT
from tests.pyro.models import logistic_model


def run(kernel, *args, **kwargs):
    MCMC(kernel, warmup_steps=2, num_samples=2, disable_progbar=True).run(*args, **kwargs)


# runs whose checks are not about compilation run the model eagerly: the compiled gradient and step (checked against
# the eager ones in ``test_compile.py``) would cost seconds of Inductor compiling a run, more than the eager steps
EAGER = dict(compile_potential=False)


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
    mcmc = MCMC(SGLD(logistic_model, step_size=1e-3, **EAGER), warmup_steps=2, num_samples=3, disable_progbar=True)
    mcmc.run(X, y)
    assert mcmc.get_samples()["w"].dtype == torch.float32


def test_model_without_subsampled_plate_warns_once(logistic_data):
    def model(X, y=None):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        with pyro.plate("data", X.shape[0]):
            pyro.sample("y", dist.Bernoulli(logits=X @ w), obs=y)

    kernel = SGLD(model, step_size=1e-3, **EAGER)
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


def test_initial_params_must_have_the_sites_shapes(logistic_data):
    """A site given the wrong shape ran the whole chain on part of it, then failed in Pyro's ``MCMC`` with a reshape
    error."""
    message = r"`initial_params` gives the latent site\(s\) 'w' the shape \(3,\); the model's are 'w': \(2,\)"
    with pytest.raises(ValueError, match=message):
        MCMC(SGLD(logistic_model, step_size=1e-3), warmup_steps=1, num_samples=1, disable_progbar=True,
             initial_params={"w": torch.zeros(3), "scale": torch.zeros(())}).run(*logistic_data)  # fmt: skip


def test_sgfs_runs_a_float64_model():
    """SGFS's start-up check of the per-datum scores ran the model on float32 latents next to float64 data."""
    X = torch.randn(200, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    y = X @ torch.tensor([1.0, -1.0], dtype=torch.float64)

    def model(X, y):
        w = pyro.sample("w", dist.Normal(torch.zeros(2, dtype=X.dtype), 1.0).to_event(1))
        with pyro.plate("data", X.shape[0], subsample_size=20):
            pyro.sample("y", dist.Normal(pyro.subsample(X, event_dim=1) @ w, 0.5), obs=pyro.subsample(y, event_dim=0))

    # α = 0 from the init strategy's start: no mode search. The start-up check runs the model eagerly whatever
    # `compile_potential`; the step runs it eagerly too (EAGER): compiling its gradient and step in float64 took ~12 s
    kernel = setup(SGFS(model, find_mode=False, **EAGER), X, y)
    assert kernel.sample(kernel.initial_params)["w"].dtype == torch.float64


def setup(kernel, *args, **kwargs):
    """Only the kernel's setup (the checks, initial values, the full-data view), for inputs that must be accepted."""
    kernel.setup(0, *args, **kwargs)
    return kernel


def _logistic(batch_size=20, subsample_y=True):
    """The logistic regression with a given ``subsample_size``, optionally forgetting ``pyro.subsample(y)``."""

    def model(X, y):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        with pyro.plate("data", X.shape[0], subsample_size=batch_size):
            obs = pyro.subsample(y, event_dim=0) if subsample_y else y
            pyro.sample("y", dist.Bernoulli(logits=pyro.subsample(X, event_dim=1) @ w), obs=obs)

    return model


@pytest.mark.parametrize("n", [0, 201, -5, 2.5])
def test_subsample_size_must_lie_between_1_and_N(logistic_data, n):
    """n = 0 divided by zero, n > N and n < 0 failed with unrelated errors."""
    message = rf"SGLD: plate 'data' has size N = 200 and subsample_size n = {n}; subsample_size must be an integer"
    with pytest.raises(ValueError, match=message) as info:
        run(SGLD(_logistic(n), step_size=1e-3), *logistic_data)
    assert "Trace Shapes" not in str(info.value)


def test_subsample_size_equal_to_N_is_the_full_data(logistic_data):
    with pytest.warns(UserWarning, match="no plate with `subsample_size`"):
        setup(SGLD(_logistic(200), step_size=1e-3), *logistic_data)


def test_non_finite_observations_name_the_site_and_rows(logistic_data):
    """NaN in the data was reported as "found no initial values" (or as divergences, outside the first minibatch)."""
    X, y = logistic_data
    y = y.clone()
    y[[3, 150]] = float("nan")
    with pytest.raises(ValueError, match=r"observed site 'y' has non-finite values \(NaN or inf\) at rows \[3, 150\] "
                       r"of plate 'data' \(2 of 200 rows\)"):  # fmt: skip
        run(SGLD(_logistic(), step_size=1e-3), X, y)


def test_non_finite_covariates_name_the_subsampled_array_and_rows(logistic_data):
    X, y = logistic_data
    X = X.clone()
    X[17, 1] = float("inf")
    message = r"the array of shape \(200, 2\) passed to `pyro.subsample\(..., event_dim=1\)` has non-finite values"
    with pytest.raises(ValueError, match=message + r" \(NaN or inf\) at rows \[17\] of plate 'data'"):
        run(SGLD(_logistic(), step_size=1e-3), X, y)


def test_non_finite_observations_indexed_by_the_model_are_found(logistic_data):
    """A model that indexes its data itself (``y[idx]``): the full data of its observed site are checked."""
    X, y = logistic_data
    y = y.clone()
    y[199] = float("nan")

    def model(X, y):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        with pyro.plate("data", X.shape[0], subsample_size=20) as idx:
            pyro.sample("y", dist.Normal(X[idx] @ w, 1.0), obs=y[idx])

    with pytest.raises(ValueError, match=r"observed site 'y' has non-finite values .* at rows \[199\] of plate 'data'"):
        run(SGLD(model, step_size=1e-3), X, y)


def _mean_model(y):
    mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
    with pyro.plate("data", y.shape[0], subsample_size=20):
        pyro.sample("y", dist.Normal(mu, 1.0), obs=pyro.subsample(y, event_dim=0))


def _mean_model_event(y):
    mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
    with pyro.plate("data", y.shape[0], subsample_size=20):
        pyro.sample("y", dist.Normal(mu, 1.0).expand([1]).to_event(1), obs=pyro.subsample(y, event_dim=1))


def test_observation_that_broadcasts_against_the_plate_is_refused():
    """``y`` of shape (N, 1) against a plate of size N at dim -1 broadcast to (N, n) pairs: a wrong posterior."""
    y = 0.7 + torch.randn(200, 1, generator=torch.Generator().manual_seed(1))
    message = (
        r"(?s)observed site 'y' has a value of shape \(200, 1\) .* broadcasts with it to \(200, 20\).*"
        r"Reshape the data of 'y' to \(200,\).*`pyro.subsample\(y, event_dim=1\)` and `.to_event\(1\)`"
    )
    with pytest.raises(ValueError, match=message):
        run(SGLD(_mean_model, step_size=1e-3), y)
    setup(SGLD(_mean_model_event, step_size=1e-3), y)  # the trailing dimension declared as an event
    setup(SGLD(_mean_model, step_size=1e-3), y[:, 0])  # or reshaped


def test_plate_name_reused_is_refused(logistic_data):
    """Another size: the kernel would index both plates' data with one set of indices. The same size: Pyro
    records a plate's indices as a sample site, so the plate must be built once and entered twice."""
    X, y = logistic_data

    def model(X, y, second, reuse=False):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        data = pyro.plate("data", 200, subsample_size=20)
        with data:
            pyro.sample("y", dist.Bernoulli(logits=pyro.subsample(X, event_dim=1) @ w),
                        obs=pyro.subsample(y, event_dim=0))  # fmt: skip
        with data if reuse else pyro.plate("data", second, subsample_size=20 if second == 200 else 10):
            pyro.sample("y2", dist.Bernoulli(logits=pyro.subsample(X[:second], event_dim=1) @ w),
                        obs=pyro.subsample(y[:second], event_dim=0))  # fmt: skip

    with pytest.raises(ValueError, match=r"plate 'data' is declared with size 200 \(subsample_size 20\) and again "
                       r"with size 100 \(subsample_size 10\).*its own name"):  # fmt: skip
        run(SGLD(partial(model, second=100), step_size=1e-3), X, y)
    with pytest.raises(ValueError, match=r"plate 'data' \(size 200, subsample_size 20\) is constructed twice.*"
                       r"`data = pyro.plate\('data', 200, subsample_size=20\)`, then `with data: ...`"):  # fmt: skip
        run(SGLD(partial(model, second=200), step_size=1e-3), X, y)
    setup(SGLD(partial(model, second=200, reuse=True), step_size=1e-3), X, y)


def test_observation_not_subsampled_says_wrap_it(logistic_data):
    """Passing the full ``y`` as ``obs`` inside a subsampled plate failed later with a broadcasting error."""
    message = (
        r"observed site 'y' inside plate 'data' \(size 200, subsample_size 20, dim -1\) has a value of shape "
        r"\(200,\), with the plate's full size 200 .* Wrap it in `pyro.subsample\(y, event_dim=0\)`"
    )
    with pytest.raises(ValueError, match=message):
        run(SGLD(_logistic(subsample_y=False), step_size=1e-3), *logistic_data)


def test_covariates_not_subsampled_say_so(logistic_data):
    def model(X, y):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        with pyro.plate("data", X.shape[0], subsample_size=20):
            pyro.sample("y", dist.Bernoulli(logits=X @ w), obs=pyro.subsample(y, event_dim=0))

    with pytest.raises(
        ValueError, match=r"(?s)full size 200 of plate 'data' met the minibatch's 20 rows.*pyro.subsample"
    ):
        run(SGLD(model, step_size=1e-3), *logistic_data)


def test_potential_fn_with_a_defaulted_second_argument_is_deterministic():
    """``f(z, scale=1.0)`` was called as ``f(z, generator)``."""

    def energy(z, scale=1.0):
        return scale * (z["x"] ** 2).sum()

    kernel = SGLD(potential_fn=energy, step_size=1e-2)
    MCMC(kernel, warmup_steps=2, num_samples=2, disable_progbar=True, initial_params={"x": torch.ones(2)}).run()
    with pytest.raises(TypeError, match=r"`potential_fn` must take .* `f\(z, generator\)`; it requires 3 positional"):
        MCMC(SGLD(potential_fn=lambda z, generator, data: 0.0, step_size=1e-2), warmup_steps=1, num_samples=1,
             disable_progbar=True, initial_params={"x": torch.ones(2)}).run()  # fmt: skip


def test_dtype_error_says_it_is_a_dtype_error(logistic_data):
    """float64 (or integer) covariates against float32 latents got the hint about plate shapes."""
    X, y = logistic_data
    with pytest.raises(
        ValueError, match=r"(?s)This is a dtype error, not a shape error.*args\[0\] of dtype torch.float64"
    ):
        run(SGLD(_logistic(), step_size=1e-3), X.double(), y)
    with pytest.raises(
        ValueError, match=r"(?s)This is a dtype error, not a shape error.*args\[0\] of dtype torch.int64"
    ):
        run(SGLD(_logistic(), step_size=1e-3), X.long(), y)


def test_local_latent_error_points_at_local_gibbs_sites(logistic_data):
    def model(X, y=None):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        with pyro.plate("data", X.shape[0], subsample_size=20):
            u = pyro.sample("u", dist.Normal(0.0, 1.0))
            logits = pyro.subsample(X, event_dim=1) @ w + u
            pyro.sample("y", dist.Bernoulli(logits=logits), obs=pyro.subsample(y, event_dim=0))

    with pytest.raises(NotImplementedError, match=r"Marginalise .* local Gibbs site: `gibbs_sites=\['u'\], gibbs_fn="):
        run(SGLD(model, step_size=1e-3), *logistic_data)


def test_same_model_messages_as_numpyro(logistic_data):
    """The model checks share their messages (``ppl_sgmcmc._model_checks``): the same bad input gets the same
    message on both backends, up to the PPL's name."""
    import jax
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as ndist
    from numpyro.infer import MCMC as NumPyroMCMC

    from ppl_sgmcmc import numpyro as np_backend

    def numpyro_logistic(batch_size=20, subsample_y=True):
        def model(X, y):
            w = numpyro.sample("w", ndist.Normal(0, 1).expand([2]).to_event(1))
            with numpyro.plate("data", X.shape[0], subsample_size=batch_size):
                obs = numpyro.subsample(y, event_dim=0) if subsample_y else y
                numpyro.sample("y", ndist.Bernoulli(logits=numpyro.subsample(X, event_dim=1) @ w), obs=obs)

        return model

    X, y = logistic_data
    y_nan = y.clone()
    y_nan[[3, 150]] = float("nan")
    cases = [  # (pyro model, numpyro model, data)
        (_logistic(0), numpyro_logistic(0), (X, y)),
        (_logistic(), numpyro_logistic(), (X, y_nan)),
        (_logistic(subsample_y=False), numpyro_logistic(subsample_y=False), (X, y)),
        (_mean_model, _numpyro_mean_model(), (y[:, None],)),
    ]
    for pyro_model, numpyro_model, data in cases:
        with pytest.raises(ValueError) as pyro_error:
            run(SGLD(pyro_model, step_size=1e-3), *data)
        with pytest.raises(ValueError) as numpyro_error:
            NumPyroMCMC(np_backend.SGLD(numpyro_model, step_size=1e-3), num_warmup=1, num_samples=1,
                        progress_bar=False).run(jax.random.PRNGKey(0), *(jnp.asarray(a.numpy()) for a in data))  # fmt: skip
        assert str(pyro_error.value) == str(numpyro_error.value).replace("numpyro.", "pyro.")


def _numpyro_mean_model():
    """The NumPyro twin of :func:`_mean_model`."""
    import numpyro
    import numpyro.distributions as ndist

    def model(y):
        mu = numpyro.sample("mu", ndist.Normal(0.0, 10.0))
        with numpyro.plate("data", y.shape[0], subsample_size=20):
            numpyro.sample("y", ndist.Normal(mu, 1.0), obs=numpyro.subsample(y, event_dim=0))

    return model


# --- every input NUTS takes works or is refused clearly (issue 31) -------------------------------------------------
_Y = torch.linspace(0.0, 2.0, 100)  # mean 1


def _mean(y):
    mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
    with pyro.plate("data", y.shape[0], subsample_size=20):
        pyro.sample("y", dist.Normal(mu, 1.0), obs=pyro.subsample(y, event_dim=0))


def _run(kernel, *args, warmup_steps=20, num_samples=50, **kwargs):
    pyro.set_rng_seed(0)
    mcmc = MCMC(kernel, warmup_steps=warmup_steps, num_samples=num_samples, disable_progbar=True, **kwargs)
    mcmc.run(*args)
    return mcmc


def test_model_without_a_latent_site_is_refused():
    """It failed computing the first gradient: 'element 0 of tensors does not require grad'."""

    def model(y):
        with pyro.plate("data", y.shape[0], subsample_size=20):
            pyro.sample("y", dist.Normal(0.0, 1.0), obs=pyro.subsample(y, event_dim=0))

    with pytest.raises(ValueError, match=r"SGLD: the model has no latent sample site .* Declare at least one"):
        _run(SGLD(model, step_size=1e-3), _Y)


@pytest.mark.parametrize(
    "params, message",
    [
        ({"nu": torch.tensor(0.0)}, r"`initial_params` lacks the latent site\(s\) 'mu' and names 'nu', which is not"),
        ({"mu": torch.tensor(float("nan"))}, r"`initial_params` holds NaN or inf at the site\(s\) 'mu'"),
    ],
)
def test_bad_initial_params_name_the_site(params, message):
    """A NaN start failed in the full-data check with a validation error about the prior's support."""
    with pytest.raises(ValueError, match=message):
        _run(SGLD(_mean, step_size=1e-3), _Y, initial_params=params)


def test_initial_params_are_where_the_model_is_first_traced():
    """A model undefined at the init strategy's draw (``log(mu)`` of a negative ``mu``) failed in the kernel's first
    trace of the model although `initial_params` gave a valid start."""

    def model(y):
        mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
        pyro.factor("log_mu", torch.log(mu))
        with pyro.plate("data", y.shape[0], subsample_size=20):
            pyro.sample("y", dist.Normal(mu, 1.0), obs=pyro.subsample(y, event_dim=0))

    for seed in range(4):  # the strategy's draw is negative for about half of the seeds
        pyro.set_rng_seed(seed)
        # the first trace is the kernel's setup's, whatever `compile_potential`: the steps run the model eagerly
        mcmc = MCMC(SGLD(model, step_size=1e-3, **EAGER), warmup_steps=5, num_samples=5, disable_progbar=True,
                    initial_params={"mu": torch.tensor(1.0)})  # fmt: skip
        mcmc.run(_Y)
        assert torch.all(mcmc.get_samples()["mu"] > 0)


@pytest.mark.parametrize("initial_params", [None, {"mu": torch.tensor(0.5)}])
def test_improper_uniform_prior_runs(initial_params):
    """Pyro's init strategies draw from the prior, which an ImproperUniform cannot: NotImplementedError. A given
    step size (the init strategy is the same with the warm-up's adaptation): h = 1e-3 against the posterior's
    curvature 100 relaxes by e^-0.1 a step, so the 300 warm-up steps leave the start far behind, and the 300 draws
    (autocorrelation time ~20 steps, ~15 effective draws) give the mean of the posterior N(1, 0.1²) to about
    0.1 / √15 ≈ 0.03, ten times inside the bound 0.3."""

    def model(y):
        mu = pyro.sample("mu", dist.ImproperUniform(dist.constraints.real, (), ()))
        with pyro.plate("data", y.shape[0], subsample_size=20):
            pyro.sample("y", dist.Normal(mu, 1.0), obs=pyro.subsample(y, event_dim=0))

    kwargs = {} if initial_params is None else dict(initial_params=initial_params)
    mu = _run(SGLD(model, step_size=1e-3, **EAGER), _Y, warmup_steps=300, num_samples=300, **kwargs).get_samples()["mu"]
    assert abs(float(mu.mean()) - 1.0) < 0.3


def _labels(y):
    w = pyro.sample("w", dist.Normal(0.0, 1.0))
    with pyro.plate("data", y.shape[0], subsample_size=20):
        pyro.sample("y", dist.Bernoulli(logits=w), obs=pyro.subsample(y, event_dim=0))


def test_observations_outside_the_support_name_the_site_and_rows():
    """Labels ±1 for a Bernoulli failed in the full-data check with Pyro's validation message and a hint about
    shapes."""
    y = torch.where(torch.arange(100) % 2 == 0, 1.0, -1.0)
    with pytest.raises(ValueError, match=r"observed site 'y' has values outside the support Boolean\(\) of its "
                                         r"Bernoulli distribution at rows \[1, 3, 5, 7, 9, \.\.\.\] of plate 'data' "
                                         r"\(50 of 100 rows; e.g. -1\)"):  # fmt: skip
        _run(SGLD(_labels, step_size=1e-3), y)


def test_num_samples_zero_is_refused_before_the_warm_up():
    """Pyro ran the whole warm-up and then failed: 'stack expects a non-empty TensorList' (NUTS too)."""
    with pytest.raises(ValueError, match=r"SGLD: MCMC\(num_samples=0\): .* Pass num_samples >= 1"):
        _run(SGLD(_mean, step_size=1e-3), _Y, warmup_steps=10**6, num_samples=0)


def test_resuming_another_algorithms_chain_is_refused():
    """An SGLD chain continued by SGNHT failed with 'not enough values to unpack'."""
    first = SGLD(_mean, step_size=1e-3, **EAGER)
    _run(first, _Y)
    second = SGNHT(_mean, step_size=1e-3)
    second.resume_from = first.last_state
    with pytest.raises(TypeError, match=r"SGNHT: `resume_from` holds the state of another algorithm's chain .* "
                                        r"`kernel.initial_params = state.state.z`"):  # fmt: skip
        _run(second, _Y, warmup_steps=0)


@pytest.mark.parametrize(
    "strategy",
    [
        "init_to_median", "init_to_sample", "init_to_feasible", "init_to_mean", "init_to_uniform", "init_to_value",
    ],
)
def test_init_strategies_run(strategy):
    """Each strategy gives the chain a finite start. The strategy acts only when the chain starts (the kernel's
    `setup`): the steps after it are those of any other start of this model, which
    `test_resuming_another_algorithms_chain_is_refused` runs."""
    from pyro.infer.autoguide import initialization

    init = getattr(initialization, strategy)
    init = init(values={"mu": torch.tensor(1.0)}) if strategy == "init_to_value" else init
    kernel = setup(SGLD(_mean, init_strategy=init, step_size=1e-3), _Y)
    assert torch.isfinite(kernel.initial_params["mu"]).all()


# one latent site of each support: (prior, the statistic of it that the data observe)
_SUPPORTS = {
    "simplex": (dist.Dirichlet(torch.ones(3)), lambda p: p @ torch.arange(3.0)),
    "positive": (dist.LogNormal(0.0, 1.0).expand([2]).to_event(1), lambda s: s[0]),
    "ordered": (dist.ImproperUniform(dist.constraints.ordered_vector, (), (3,)), lambda c: c[1]),
    "corr_cholesky": (dist.LKJCholesky(3, 2.0), lambda L: L[1, 0]),
    "circular": (dist.VonMises(torch.tensor(0.0), torch.tensor(1.0)), torch.cos),
}


def _latent(prior, statistic, name="x"):
    """A latent site ``name`` and the statistic of it that the data observe: an ImproperUniform gets a proper
    Normal density by a factor."""
    x = pyro.sample(name, prior)
    if isinstance(prior, dist.ImproperUniform):
        pyro.factor(f"{name}_prior", -0.5 * (x**2).sum())
    return statistic(x)


def _supports(names):
    """A model of one site of each support ``names`` of `_SUPPORTS`, each observing the rows of ``y`` through a
    statistic of its own latent: its posterior is the product of the one-site models' posteriors, and one chain
    samples them all. All its observed sites subsample one tensor, so the data checks must name every site that
    observes a checked array (else the kernel would run the model on its full data for the others' checks, where an
    ImproperUniform prior has no sampler)."""

    def model(y):
        statistics = {name: _latent(*_SUPPORTS[name], name) for name in names}
        with pyro.plate("data", y.shape[0], subsample_size=20):
            for name, value in statistics.items():
                pyro.sample(f"y_{name}", dist.Normal(value, 1.0), obs=pyro.subsample(y, event_dim=0))

    return model


@pytest.mark.parametrize(
    "names",
    [("simplex", "ordered", "circular"), ("positive", "corr_cholesky")],
    # the second's transforms branch on values (a data-dependent guard): its potential falls back to the eager model
    ids=["compiled", "eager"],
)
def test_constrained_supports_run(names):
    """On a model with a latent site of each support, every draw of every site is finite and lies in its support,
    with SGNHT hands-off: its warm-up finds the mode and tunes in the unconstrained coordinates (the potential's
    gradient and Hessian through the transforms). A run with a given step size takes the same steps through the same
    transforms, so it checks nothing this run does not. The supports whose potential compiles into a graph run in
    one model, and those that fall back to the eager model in another, so that both paths see constrained latents.
    The warm-up is the least the defaults allow (200 steps: windows of at least 10 steps): the draws' supports do not
    depend on its length."""
    samples = _run(SGNHT(_supports(names)), _Y, warmup_steps=200).get_samples()
    for name in names:
        prior = _SUPPORTS[name][0]
        x = samples[name]
        assert torch.isfinite(x).all() and bool(prior.support.check(x).all()), f"{name}: draws outside the support"


@pytest.mark.parametrize(
    "prior",
    [
        dist.ImproperUniform(dist.constraints.lower_cholesky, (), (2, 2)),
        dist.Wishart(torch.tensor(4.0), scale_tril=torch.eye(2)),
        dist.ProjectedNormal(torch.ones(3)),
    ],
    ids=["lower cholesky", "positive definite", "sphere"],
)
def test_a_support_without_a_bijection_is_refused(prior):
    """Pyro's `biject_to` has no bijection for these supports (NUTS refuses them too): 'Cannot transform
    _LowerCholesky constraints', naming no site."""

    def model(y):
        value = _latent(prior, lambda x: x.reshape(-1)[0])
        with pyro.plate("data", y.shape[0], subsample_size=20):
            pyro.sample("y", dist.Normal(value, 1.0), obs=pyro.subsample(y, event_dim=0))

    with pytest.raises(NotImplementedError, match=r"latent site 'x' \(\w+\) has the support .* Reparametrise it"):
        _run(SGLD(model, step_size=1e-3), _Y)


def test_same_input_messages_as_numpyro():
    """The new model and input checks share their messages (``ppl_sgmcmc._model_checks``), up to the PPL's name and
    the driver's argument name."""
    import jax
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as ndist
    from numpyro.infer import MCMC as NumPyroMCMC

    from ppl_sgmcmc import numpyro as np_backend

    def numpyro_labels(y):
        w = numpyro.sample("w", ndist.Normal(0.0, 1.0))
        with numpyro.plate("data", y.shape[0], subsample_size=20):
            numpyro.sample("y", ndist.Bernoulli(logits=w), obs=numpyro.subsample(y, event_dim=0))

    def numpyro_none(y):
        with numpyro.plate("data", y.shape[0], subsample_size=20):
            numpyro.sample("y", ndist.Normal(0.0, 1.0), obs=numpyro.subsample(y, event_dim=0))

    def pyro_none(y):
        with pyro.plate("data", y.shape[0], subsample_size=20):
            pyro.sample("y", dist.Normal(0.0, 1.0), obs=pyro.subsample(y, event_dim=0))

    labels = torch.where(torch.arange(100) % 3 == 0, -1.0, 1.0)
    cases = [  # (pyro model, numpyro model, data, initial values)
        (_labels, numpyro_labels, labels, None),
        (pyro_none, numpyro_none, _Y, None),
        (_labels, numpyro_labels, (labels + 1) / 2, {"v": 0.0}),
        (_labels, numpyro_labels, (labels + 1) / 2, {"w": float("inf")}),
    ]
    for pyro_model, numpyro_model, data, initial in cases:
        with pytest.raises(ValueError) as pyro_error:
            initial_params = None if initial is None else {k: torch.tensor(v) for k, v in initial.items()}
            _run(SGLD(pyro_model, step_size=1e-3), data, initial_params=initial_params)
        with pytest.raises(ValueError) as numpyro_error:
            init_params = None if initial is None else {k: jnp.array(v) for k, v in initial.items()}
            NumPyroMCMC(np_backend.SGLD(numpyro_model, step_size=1e-3), num_warmup=1, num_samples=1,
                        progress_bar=False).run(jax.random.PRNGKey(0), jnp.asarray(data.numpy()),
                                                init_params=init_params)  # fmt: skip
        expected = str(numpyro_error.value).replace("numpyro.", "pyro.").replace("`init_params`", "`initial_params`")
        assert str(pyro_error.value) == expected


@pytest.mark.slow
def test_tuned_step_size_goes_back_with_its_preconditioner(logistic_data):
    """The recorded step size is one in the adapted preconditioner's coordinates: a new kernel takes it with the
    preconditioner (`tuned_options`) and continues the tuned chain as the tuned kernel does, draw for draw; a fresh
    chain of it samples the posterior with no warm-up to adapt."""
    # every kernel runs the model eagerly (EAGER): what is checked is what the options carry, and the eager step
    # draws what the compiled one draws (`test_compile.py`, whose tuned SGHMC row takes the warm-up's preconditioner)
    tuned = SGLD(logistic_model, **EAGER)
    reference = _run(tuned, *logistic_data, warmup_steps=300, num_samples=300).get_samples()["w"]
    state = tuned.last_state
    options = tuned.tuned_options(state)
    assert options["step_size"] == pytest.approx(tuned.diagnostics()["step_size"][-1])
    again = SGLD(logistic_model, **options, **EAGER)
    assert not again.adapts
    draws = []
    for kernel in (tuned, again):
        kernel.resume_from = state
        draws.append(_run(kernel, *logistic_data, warmup_steps=0, num_samples=30).get_samples()["w"])
    torch.testing.assert_close(draws[0], draws[1])
    fresh = _run(SGLD(logistic_model, **options, **EAGER), *logistic_data, warmup_steps=100, num_samples=300,
                 initial_params=dict(state.state.z)).get_samples()["w"]  # fmt: skip
    torch.testing.assert_close(fresh.mean(0), reference.mean(0), atol=0.3, rtol=0)
