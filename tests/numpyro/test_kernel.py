"""The kernels under numpyro's MCMC driver: chains, thinning, extra fields, resuming, reproducibility."""

import warnings
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import MCMC

from ppl_sgmcmc import health
from ppl_sgmcmc.numpyro import PSGLD, SGHMC, SGLD, SGNHT
from ppl_sgmcmc.numpyro import kernel as kernel_module
from ppl_sgmcmc.numpyro import mcmc as ppl_mcmc
from tests.numpyro.conftest import logistic_model

KERNELS = [
    lambda: SGLD(logistic_model, step_size=1e-3),
    lambda: SGHMC(logistic_model, step_size=1e-2, integrator="euler"),
    lambda: SGNHT(logistic_model, step_size=1e-2, thermostat="scalar"),
    lambda: PSGLD(logistic_model, step_size=1e-5, replace=False),
]


@pytest.fixture(autouse=True)
def _no_parallel_device_warning():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "There are not enough devices", UserWarning)
        yield


def run(kernel, data, key=0, driver=MCMC, **kwargs):
    """A run of 30 draws after 20 warm-up steps, or (``num_warmup=0``) without a warm-up, for the tests whose property
    is not about it: a warm-up phase is a second compiled loop, the larger part of such a short test's time."""
    options = dict(num_warmup=20, num_samples=30, progress_bar=False)
    options.update(kwargs)
    extra_fields = options.pop("extra_fields", ())
    mcmc = driver(kernel, **options)
    mcmc.run(jax.random.PRNGKey(key), *data, extra_fields=extra_fields)
    return mcmc


@pytest.mark.parametrize("make_kernel", KERNELS)
def test_samples_shapes_and_constraints(make_kernel, logistic_data):
    mcmc = run(make_kernel(), logistic_data, extra_fields=("potential_energy", "i", "step_size"))
    samples = mcmc.get_samples()
    assert samples["w"].shape == (30, 2) and samples["scale"].shape == (30,)
    assert jnp.all(samples["scale"] > 0)  # constrained back from unconstrained space
    np.testing.assert_allclose(samples["scaled_w"], samples["scale"][:, None] * samples["w"], rtol=1e-5)
    extra = mcmc.get_extra_fields()
    np.testing.assert_array_equal(extra["i"], np.arange(21, 51))
    assert jnp.all(jnp.isfinite(extra["potential_energy"])) and not extra["diverging"].any()


def run_chains(chain_method, data, replace=True):
    """Two chains under ``ppl_sgmcmc.numpyro.MCMC`` without its verdict, whose loop has no host callback: on one
    device ``parallel`` falls back to ``sequential`` (NumPyro's warning), whose compiled program it then reads back from
    the session's cache (``tests/conftest.py``) instead of compiling it again."""
    return run(SGNHT(logistic_model, step_size=1e-2, replace=replace), data, driver=partial(ppl_mcmc.MCMC, verdict=False),
               num_warmup=0, num_chains=2, chain_method=chain_method, thinning=3,
               extra_fields=("rule_state.thermostat",))  # fmt: skip


# the tests of the shared run `sequential_chains`: on one pytest-xdist worker (`--dist loadgroup`), which runs it once
on_sequential_chains = pytest.mark.xdist_group("numpyro_kernel_sequential_chains")


@pytest.fixture(scope="module")
def sequential_chains(logistic_data):
    return run_chains("sequential", logistic_data)


@pytest.mark.slow
def test_vectorized_chains_reshuffle_each_epoch_like_sequential_ones(logistic_data):
    """Epoch-wise reshuffling under ``vmap`` (its own batching rule) gives the sequential chains' draws;
    its 30 steps of 20 rows cover three epochs of the 200 rows."""
    vectorized = run_chains("vectorized", logistic_data, replace=False).get_samples(group_by_chain=True)
    sequential = run_chains("sequential", logistic_data, replace=False).get_samples(group_by_chain=True)
    np.testing.assert_allclose(vectorized["w"], sequential["w"], rtol=1e-4, atol=1e-5)


@on_sequential_chains
def test_sequential_chains(sequential_chains):
    samples = sequential_chains.get_samples(group_by_chain=True)
    assert samples["w"].shape == (2, 10, 2)
    assert sequential_chains.get_extra_fields(group_by_chain=True)["rule_state.thermostat"].shape == (2, 10, 3)
    assert not np.allclose(samples["w"][0], samples["w"][1])  # two different chains


@pytest.mark.parametrize("chain_method", ["vectorized", "parallel"])
@on_sequential_chains
def test_chain_methods_agree(chain_method, logistic_data, sequential_chains):
    samples = run_chains(chain_method, logistic_data).get_samples(group_by_chain=True)
    reference = sequential_chains.get_samples(group_by_chain=True)
    np.testing.assert_allclose(samples["w"], reference["w"], rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_thinning_keeps_every_kth_step(logistic_data):
    full = run(SGLD(logistic_model, step_size=1e-3), logistic_data, num_warmup=0, extra_fields=("i",))
    thin = run(SGLD(logistic_model, step_size=1e-3), logistic_data, num_warmup=0, thinning=5, extra_fields=("i",))
    np.testing.assert_array_equal(thin.get_extra_fields()["i"], full.get_extra_fields()["i"][4::5])
    np.testing.assert_allclose(thin.get_samples()["w"], full.get_samples()["w"][4::5], rtol=1e-6)


@pytest.mark.slow
def test_steps_per_sample_equals_thinning(logistic_data):
    """``steps_per_sample=k`` takes the same steps as ``k`` calls, keeping the last: MCMC's ``thinning=k``."""
    kernel = lambda **kw: SGNHT(logistic_model, step_size=1e-2, **kw)  # noqa: E731
    inner = run(kernel(steps_per_sample=5), logistic_data, num_warmup=4, num_samples=6,
                extra_fields=("i", "rule_state.thermostat"))
    outer = run(kernel(), logistic_data, num_warmup=20, num_samples=30, thinning=5,
                extra_fields=("i", "rule_state.thermostat"))
    np.testing.assert_array_equal(inner.get_extra_fields()["i"], outer.get_extra_fields()["i"])
    np.testing.assert_allclose(inner.get_samples()["w"], outer.get_samples()["w"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(inner.get_extra_fields()["rule_state.thermostat"],
                               outer.get_extra_fields()["rule_state.thermostat"], rtol=1e-5, atol=1e-6)


def test_steps_per_sample_reports_any_rejected_step(logistic_data):
    mcmc = run(SGLD(logistic_model, step_size=1e3, steps_per_sample=4), logistic_data, num_warmup=0,
               extra_fields=("num_diverging",))
    diverging, count = mcmc.get_extra_fields()["diverging"], mcmc.get_extra_fields()["num_diverging"]
    np.testing.assert_array_equal(diverging, np.diff(count, prepend=count[0] - diverging[0]) > 0)
    assert diverging.any()


@pytest.mark.parametrize("make_kernel", KERNELS[::3])
def test_same_seed_same_samples(make_kernel, logistic_data):
    """A fresh kernel and driver per run; ``ppl_sgmcmc.numpyro.MCMC`` without its verdict, whose loop has no host
    callback, so that the second and third runs read the first's compiled programs back from the session's cache
    (``tests/conftest.py``) instead of compiling them again (``numpyro.infer.MCMC`` gives the same draws:
    ``tests/numpyro/test_mcmc.py``)."""
    driver = partial(ppl_mcmc.MCMC, verdict=False)
    a, b, c = (run(make_kernel(), logistic_data, key=key, driver=driver, num_warmup=0).get_samples()["w"]
               for key in (3, 3, 4))
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)


@pytest.mark.slow
def test_resume_continues_the_same_chain(logistic_data):
    """Two runs of 30 steps, the second resumed from the first's last state, equal one run of 60."""
    kernel = lambda: SGNHT(logistic_model, step_size=1e-2, replace=False)  # noqa: E731
    whole = run(kernel(), logistic_data, num_warmup=0, num_samples=60, extra_fields=("i",))
    first = run(kernel(), logistic_data, num_warmup=0, num_samples=30)
    first.post_warmup_state = first.last_state
    first.run(first.last_state.rng_key, *logistic_data, extra_fields=("i",))
    np.testing.assert_array_equal(first.get_extra_fields()["i"], np.arange(31, 61))
    np.testing.assert_allclose(first.get_samples()["w"], whole.get_samples()["w"][30:], rtol=1e-5, atol=1e-6)


def test_step_size_schedule_is_indexed_by_global_step(logistic_data):
    from ppl_sgmcmc.schedules import polynomial

    schedule = polynomial(1e-2, 1.0, 0.55)
    mcmc = run(SGLD(logistic_model, step_size=schedule), logistic_data, extra_fields=("step_size", "i"))
    extra = mcmc.get_extra_fields()
    np.testing.assert_allclose(extra["step_size"], schedule(extra["i"] - 1), rtol=1e-6)


def test_potential_fn_target_with_stochastic_energy():
    """A user-written stochastic energy: its gradient is the stochastic gradient."""

    def potential(z, rng_key):
        return 0.5 * jnp.sum(z["x"] ** 2) + jnp.sum(0.1 * jax.random.normal(rng_key, z["x"].shape) * z["x"])

    mcmc = MCMC(SGLD(potential_fn=potential, step_size=0.05), num_warmup=200, num_samples=4000, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), init_params={"x": jnp.zeros(2)})
    x = mcmc.get_samples()["x"]
    assert x.shape == (4000, 2)
    assert jnp.all(jnp.abs(x.mean(0)) < 0.25) and jnp.all(jnp.abs(x.std(0) - 1) < 0.15)


def test_non_finite_steps_are_rejected_and_counted(logistic_data):
    mcmc = run(SGLD(logistic_model, step_size=1e3), logistic_data, num_warmup=0, extra_fields=("num_diverging",))
    diverging = mcmc.get_extra_fields()["diverging"]
    assert diverging.any()
    assert jnp.all(jnp.isfinite(mcmc.get_samples()["w"]))
    assert int(mcmc.last_state.num_diverging) >= int(diverging.sum())


def test_rejected_step_redraws_the_momentum():
    """A rejected step keeps the position but redraws the momentum from N(0, τ I): the momentum that made the
    move overflow is not kept (kept, it would repeat the move)."""

    def energy(z):
        return jnp.sum(jnp.exp(4 * z["x"]) + z["x"] ** 2)

    kernel = SGHMC(potential_fn=energy, step_size=0.5, temperature=4.0)
    state = kernel.init(jax.random.PRNGKey(0), 0, init_params={"x": jnp.zeros(3)})
    step = jax.jit(kernel.sample)  # compiled once: 60 eager steps dispatched each operation anew (~1 min)
    redrawn = []
    for _ in range(60):
        new = step(state, (), {})
        if new.diverging:
            np.testing.assert_array_equal(new.z["x"], state.z["x"])
            assert not np.allclose(new.rule_state.momentum, state.rule_state.momentum)
            redrawn.append(np.asarray(new.rule_state.momentum) / 2.0)  # sqrt(τ) ζ
        state = new
    assert len(redrawn) > 10 and np.all(np.isfinite(redrawn))
    assert np.abs(np.mean(redrawn)) < 0.5 and 0.5 < np.std(redrawn) < 1.5  # standard normal draws


def test_vectorized_chains_redraw_the_momentum_of_their_own_rejected_steps():
    """Under ``vmap`` the redraw is a branch taken when some chain rejected a step (``warmup.when``): each chain
    still follows the path it follows alone, rejected steps (in some chains, not all) included."""

    def energy(z):
        return jnp.sum(jnp.exp(4 * z["x"]) + z["x"] ** 2)

    kernel = SGHMC(potential_fn=energy, step_size=0.5, temperature=4.0)
    keys = jax.random.split(jax.random.PRNGKey(1), 3)
    step = jax.jit(kernel.sample)
    state = kernel.init(keys, 0, init_params={"x": jnp.zeros((3, 2))})
    vectorized = []
    for _ in range(30):
        state = step(state, (), {})
        vectorized.append(np.asarray(state.rule_state.momentum))
    rejected = np.asarray(state.num_diverging)
    assert rejected.min() < rejected.max() and rejected.max() > 3  # chains rejected different steps
    alone = SGHMC(potential_fn=energy, step_size=0.5, temperature=4.0)
    step = jax.jit(alone.sample)  # one kernel, one compiled step for the three chains run alone
    for chain, key in enumerate(keys):
        single = alone.init(key, 0, init_params={"x": jnp.zeros(2)})
        for t in range(30):
            single = step(single, (), {})
            np.testing.assert_allclose(single.rule_state.momentum, vectorized[t][chain], rtol=1e-5, atol=1e-6)
        assert int(single.num_diverging) == rejected[chain]


def _mean_model(y, batch_size=10):
    mu = numpyro.sample("mu", dist.Normal(0, 10))
    with numpyro.plate("data", y.shape[0], subsample_size=batch_size):
        numpyro.sample("y", dist.Normal(mu, 1), obs=numpyro.subsample(y, event_dim=0))


def test_unknown_extra_field_names_the_fields():
    mcmc = MCMC(SGLD(_mean_model, step_size=1e-3), num_warmup=5, num_samples=5, progress_bar=False)
    with pytest.raises(KeyError, match="no field 'accept_prob'. It is HMC's.*Collectable fields: i, z, "):
        mcmc.run(jax.random.PRNGKey(0), jnp.ones(100), extra_fields=("accept_prob",))


def test_adaptation_field_of_a_kernel_that_adapts_nothing_says_why():
    """With a given step size the adaptation state is empty: asking for one of its fields said ``tuple indices must
    be integers or slices, not str``."""
    mcmc = MCMC(SGLD(_mean_model, step_size=1e-3), num_warmup=5, num_samples=5, progress_bar=False)
    message = "adapt_state has no field 'preconditioner': the warm-up adapts nothing when `step_size` is given"
    with pytest.raises(KeyError, match=message):
        mcmc.run(jax.random.PRNGKey(0), jnp.ones(100), extra_fields=("adapt_state.preconditioner.scale",))


def test_a_batch_size_argument_stays_static():
    """A Python number among the model's arguments (used as `subsample_size`) is not traced; under
    `jit_model_args=True`, which traces it, the error says how to pass it instead."""
    mcmc = MCMC(SGLD(_mean_model, step_size=1e-3), num_warmup=5, num_samples=5, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), jnp.ones(100), 20)
    assert mcmc.get_samples()["mu"].shape == (5,)
    mcmc = MCMC(SGLD(_mean_model, step_size=1e-3), num_warmup=5, num_samples=5, progress_bar=False, jit_model_args=True)
    with pytest.raises(ValueError, match="jit_model_args=True.*positional argument 1 is a Python number.*partial"):
        mcmc.run(jax.random.PRNGKey(0), jnp.ones(100), 20)


def _half_valid_model(y):
    """A model whose potential is infinite for a < 0: half of init_to_uniform's first tries are invalid."""
    a = numpyro.sample("a", dist.Normal(0.0, 1.0))
    numpyro.factor("positive", jnp.where(a > 0, 0.0, -jnp.inf))
    with numpyro.plate("data", y.shape[0], subsample_size=10):
        numpyro.sample("y", dist.Normal(a, 1.0), obs=numpyro.subsample(y, event_dim=0))


def test_initial_values_search_retries_until_valid():
    """The compiled initial-value search (NumPyro's, run as one program) retries invalid draws as NumPyro does."""
    y = jnp.ones(100)
    starts = [float(SGLD(_half_valid_model, step_size=1e-3).init(jax.random.PRNGKey(seed), 0, None, (y,)).z["a"])
              for seed in range(8)]
    assert all(a > 0 for a in starts) and len(set(starts)) == 8


def test_no_valid_initial_values_raises_numpyros_error():
    def model(y):
        a = numpyro.sample("a", dist.Normal(0.0, 1.0))
        numpyro.factor("never", -jnp.inf)
        with numpyro.plate("data", y.shape[0], subsample_size=10):
            numpyro.sample("y", dist.Normal(a, 1.0), obs=numpyro.subsample(y, event_dim=0))

    with pytest.raises(RuntimeError, match="Cannot find valid initial parameters"):
        SGLD(model, step_size=1e-3).init(jax.random.PRNGKey(0), 0, None, (jnp.ones(100),))


def test_the_compiled_step_has_no_effects(logistic_data):
    """The health report's host callback is not an effect: a jitted step called from Python (NumPyro's progress
    bar) keeps JAX's fast dispatch path, which a program with an effect loses."""
    kernel = SGLD(logistic_model, step_size=1e-3)
    state = kernel.init(jax.random.PRNGKey(0), 10, None, logistic_data)
    assert not kernel._reports_after_run
    assert jax.make_jaxpr(kernel.sample)(state, logistic_data, {}).effects == set()


@pytest.mark.parametrize("healthy", [True, False])
def test_the_in_run_report_calls_the_host_only_for_failures(healthy, monkeypatch):
    """Under ``numpyro.infer.MCMC`` the checks run 16 times per doubling of the step count, but a host call (as
    costly as several small steps) is made only when a check first finds a failure and at powers of two after it:
    none in a healthy run, and not one per check in a failing one (a schedule turning negative at step 5)."""
    from ppl_sgmcmc.numpyro.kernel import SGMCMCKernel

    calls, report = [], SGMCMCKernel._report_in_run
    monkeypatch.setattr(SGMCMCKernel, "_report_in_run", lambda self, *args: calls.append(1) or report(self, *args))
    step_size = 0.1 if healthy else (lambda t: jnp.where(t < 5, 0.1, -0.1))
    kernel = SGLD(potential_fn=lambda z: 0.5 * jnp.sum(z["x"] ** 2), step_size=step_size)
    mcmc = MCMC(kernel, num_warmup=0, num_samples=5000, progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        mcmc.run(jax.random.PRNGKey(0), init_params={"x": jnp.ones(2)})
        jax.block_until_ready(mcmc.last_state)
    powers_of_two = 13  # 1, 2, 4, ..., 4096
    assert len(calls) == 0 if healthy else 0 < len(calls) <= powers_of_two + len(health.KINDS)


def test_tuned_warmup_with_a_full_batch_plate():
    """A plate whose `subsample_size` is its size has no minibatches: the tuned warm-up's averages run over one
    full-data batch (it failed with "list index out of range"); SGLD's draws then follow the exact posterior."""
    from tests.helpers import assert_mc_close, mean_and_mcse

    def model(y):
        mu = numpyro.sample("mu", dist.Normal(0, 10))
        with numpyro.plate("data", y.shape[0], subsample_size=y.shape[0]):
            numpyro.sample("y", dist.Normal(mu, 1), obs=numpyro.subsample(y, event_dim=0))

    y = jnp.linspace(0, 2, 50)
    precision = 50 + 0.01
    mcmc = MCMC(SGLD(model), num_warmup=300, num_samples=2000, num_chains=2, chain_method="vectorized",
                progress_bar=False)  # fmt: skip
    mcmc.run(jax.random.PRNGKey(0), y)
    draws = np.asarray(mcmc.get_samples(group_by_chain=True)["mu"])[..., None]
    mean, mcse = mean_and_mcse(draws)
    assert_mc_close("posterior mean", mean, np.array([float(y.sum()) / precision]), mcse)


def test_another_kernel_of_the_same_model_reuses_the_initial_value_search():
    """The compiled initial-value search is kept for the next kernel of the same model and arguments (NumPyro's
    eager search reused its compiled operations across kernels; compiling the search per kernel would not)."""
    from ppl_sgmcmc.numpyro import potential

    y = jnp.ones(100)
    potential._SEARCHES.clear()
    SGLD(_half_valid_model, step_size=1e-3).init(jax.random.PRNGKey(0), 0, None, (y,))
    (first,) = potential._SEARCHES.values()
    SGNHT(_half_valid_model, step_size=1e-3).init(jax.random.PRNGKey(1), 0, None, (y,))
    assert list(potential._SEARCHES.values()) == [first]
    SGLD(_half_valid_model, step_size=1e-3).init(jax.random.PRNGKey(0), 0, None, (jnp.ones(50),))  # another plate
    assert len(potential._SEARCHES) == 2 and first in potential._SEARCHES.values()


def _regression(x, y):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    with numpyro.plate("data", x.shape[0], subsample_size=10):
        numpyro.sample("y", dist.Normal(numpyro.subsample(x, event_dim=1) @ w, 1.0), obs=numpyro.subsample(y, 0))


def test_another_kernel_of_the_same_model_reuses_the_start_stages():
    """A hands-off kernel's start (mode search with the Hessian and Newton steps, then the noise probe) is compiled
    as two programs kept for the next kernel of the same model, arguments and options (`kernel._START_STAGES`), which
    starts from them exactly where it would have compiled its own; other shapes compile their own."""
    x = jnp.asarray(np.random.default_rng(0).normal(size=(100, 2)), jnp.float32)
    y = x @ jnp.array([1.0, -0.5])
    kernel_module._START_STAGES.clear()
    first = SGLD(_regression).init(jax.random.PRNGKey(0), 200, None, (x, y))
    stages = kernel_module._START_STAGES.values()
    assert len(stages) == 2  # the mode and curvature; the probe
    kept = SGHMC(_regression).init(jax.random.PRNGKey(0), 200, None, (x, y))
    assert kernel_module._START_STAGES.values() == stages
    kernel_module._START_STAGES.clear()
    own = SGHMC(_regression).init(jax.random.PRNGKey(0), 200, None, (x, y))
    for a, b in zip(jax.tree.leaves(kept), jax.tree.leaves(own), strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(kept.z["w"], first.z["w"])  # both start at the mode of the same search
    SGLD(_regression).init(jax.random.PRNGKey(0), 200, None, (x[:50], y[:50]))  # another plate size
    assert len(kernel_module._START_STAGES) == 4
