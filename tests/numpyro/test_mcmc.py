"""ppl_sgmcmc.numpyro.MCMC: the progress bar drawn from inside the compiled loop, and repeated runs that
reuse the compilation (JAX's persistent compilation cache)."""

import warnings

import jax
import numpy as np
import numpyro.infer
import pytest
from jax.experimental.compilation_cache import compilation_cache

from ppl_sgmcmc.numpyro import MCMC, SGLD, SGNHT
from ppl_sgmcmc.numpyro import mcmc as ppl_mcmc
from tests.numpyro.conftest import logistic_model


@pytest.fixture(autouse=True)
def _no_parallel_device_warning():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "There are not enough devices", UserWarning)
        yield


def with_bar(mcmc):
    """NumPyro turns the bar off in a CI or pytest-xdist environment: turn it back on."""
    mcmc.progress_bar = True
    return mcmc


class Compilations:
    """The names of the functions JAX compiled (``jax.monitoring``) while active."""

    def __init__(self):
        self.names, self.events, self.active = [], [], False
        jax.monitoring.register_event_duration_secs_listener(self._duration)
        jax.monitoring.register_event_listener(self._event)

    def _duration(self, event, duration, **kwargs):
        if self.active and event == "/jax/core/compile/backend_compile_duration":
            self.names.append(str(kwargs.get("fun_name", "")))

    def _event(self, event, **kwargs):
        if self.active and event.startswith("/jax/compilation_cache/"):
            self.events.append(event.rsplit("/", 1)[1])

    def __enter__(self):
        self.names, self.events, self.active = [], [], True
        return self

    def __exit__(self, *exc):
        self.active = False


COMPILATIONS = Compilations()


def sgnht(**kwargs):
    return SGNHT(logistic_model, step_size=1e-2, **kwargs)


@pytest.mark.parametrize(
    "options",
    [dict(thinning=2, kernel=dict(steps_per_sample=3)), dict(num_chains=2, chain_method="vectorized")],
    ids=["one chain, thinning and steps_per_sample", "vectorized"],
)
def test_same_draws_as_without_the_bar(logistic_data, options, capfd):
    """The bar's loop and NumPyro's loop are two programs around the same step: their floating-point operations are
    the same, and they compute them bit for bit alike at the session's ``-O0`` (``tests/conftest.py``) as with XLA's
    defaults (``PPL_SGMCMC_TEST_XLA_DEFAULTS=1``). Compiled at ``-O0`` (no ``xla_optimizations`` fixture), the test
    takes about a third less CPU time (compiling its four loops and the kernel's start is its cost)."""
    options = dict(options)
    kernel_options = options.pop("kernel", {})
    runs = {}
    for name, cls in (("bar", MCMC), ("none", numpyro.infer.MCMC)):
        mcmc = cls(sgnht(**kernel_options), num_warmup=20, num_samples=40, progress_bar=name == "bar", **options)
        if name == "bar":
            with_bar(mcmc).verdict = False  # the end-of-run verdict reads the draws and changes none
        mcmc.run(jax.random.PRNGKey(1), *logistic_data, extra_fields=("potential_energy",))
        first = (mcmc.get_samples(), mcmc.get_extra_fields())
        mcmc.post_warmup_state = mcmc.last_state  # and a resumed chain
        mcmc.run(mcmc.last_state.rng_key, *logistic_data, extra_fields=("potential_energy",))
        runs[name] = (first, (mcmc.get_samples(), mcmc.get_extra_fields()), mcmc.last_state)
    jax.tree.map(np.testing.assert_array_equal, runs["bar"], runs["none"])
    err = capfd.readouterr().err
    # a tick per draw (20 + 40), thinning or not; the resumed run counts its 40
    assert "sample: 100%" in err and "60/60" in err and "40/40" in err


def test_bar_updates_from_the_compiled_loop(logistic_data, capfd, monkeypatch):
    shown = []
    show = ppl_mcmc._Bar._show
    monkeypatch.setattr(ppl_mcmc._Bar, "_show", lambda bar, state: (shown.append(bar.bar.n), show(bar, state)))
    mcmc = with_bar(MCMC(sgnht(), num_warmup=10, num_samples=200, progress_rate=50, verdict=False))
    with COMPILATIONS as compiled:
        mcmc.run(jax.random.PRNGKey(0), *logistic_data)
    # one compiled loop (the run's own, as for progress_bar=False), not numpyro's per-draw `_body_fn` calls
    assert "jit(_collect_draws)" in compiled.names and "jit(_body_fn)" not in compiled.names
    err = capfd.readouterr().err
    assert "warmup" in err and "sample: 100%" in err and "210/210" in err
    assert "Ũ_t" in err and "ξ̄" in err  # the kernel's diagnostics string
    assert shown == [0, 50, 100, 150, 200]  # host callbacks at draws 50, 100, 150, 200 and 210


@pytest.mark.slow
def test_bar_toggled_between_runs_of_one_object(logistic_data, capfd):
    """The bar follows ``progress_bar`` from run to run (no warm-up, which would add a compiled loop per run, and no
    verdict on the draws, which is not what is tested). 100 draws: the run without the bar is then the program of the
    second run of ``test_a_run_that_leaves_a_latent_out_of_its_draws_is_not_judged``, which the session's JAX cache
    (``tests/conftest.py``) compiles once for both."""
    mcmc = with_bar(MCMC(SGLD(logistic_model, step_size=1e-3), num_warmup=0, num_samples=100, verdict=False))
    mcmc.run(jax.random.PRNGKey(0), *logistic_data)
    assert "100/100" in capfd.readouterr().err
    mcmc.progress_bar = False
    mcmc.run(jax.random.PRNGKey(0), *logistic_data)
    assert "100/100" not in capfd.readouterr().err
    mcmc.progress_bar = True
    mcmc.run(jax.random.PRNGKey(0), *logistic_data)
    assert "100/100" in capfd.readouterr().err


def test_health_reported_after_a_run_with_the_bar(logistic_data):
    kernel = SGLD(logistic_model, step_size=lambda t: 1e-3 - 1e-4 * t)  # non-positive from step 10
    mcmc = with_bar(MCMC(kernel, num_warmup=0, num_samples=40))
    with pytest.warns(RuntimeWarning, match="step_size"):
        mcmc.run(jax.random.PRNGKey(0), *logistic_data)


@pytest.fixture
def compilation_cache_dir(tmp_path):
    """JAX's persistent compilation cache in ``tmp_path`` for the test, every compilation cached; the
    configuration restored afterwards."""
    names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
             "jax_persistent_cache_min_entry_size_bytes")  # fmt: skip
    before = {name: getattr(jax.config, name) for name in names}
    compilation_cache.reset_cache()
    jax.config.update("jax_compilation_cache_dir", str(tmp_path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    yield tmp_path
    for name, value in before.items():
        jax.config.update(name, value)
    compilation_cache.reset_cache()


@pytest.mark.slow
@pytest.mark.parametrize("step_size", [1e-2, None], ids=["given step size", "tuned"])
def test_repeated_runs_reuse_the_compilation(logistic_data, compilation_cache_dir, step_size):
    """NumPyro traces its sampling loop again at every ``mcmc.run``; with the persistent cache the XLA
    compilations of the kernel's initialisation and of that loop are read back, for a second run, a
    resumed chain and a second ``MCMC`` object, because the kernel lowers to the same program each time.
    (``ppl_sgmcmc.numpyro.MCMC``: under ``numpyro.infer.MCMC`` the loop holds the health report's host
    callback, and JAX does not persist such programs.)"""
    def fresh():
        return MCMC(SGNHT(logistic_model, step_size=step_size), num_warmup=200, num_samples=20, progress_bar=False,
                    verdict=False)  # the verdict on the draws is not what is tested: its own programs, left out

    mcmc = fresh()
    with COMPILATIONS as first:
        mcmc.run(jax.random.PRNGKey(0), *logistic_data)
    assert "miss" in "".join(first.events)
    with COMPILATIONS as again:
        mcmc.run(jax.random.PRNGKey(1), *logistic_data)
    assert "cache_misses" not in again.events and again.events.count("cache_hits") >= 2
    if step_size is None:  # the rest is the same for a tuned chain
        return
    with COMPILATIONS as again:
        fresh().run(jax.random.PRNGKey(2), *logistic_data)
    assert "cache_misses" not in again.events and again.events.count("cache_hits") >= 2
    mcmc.post_warmup_state = mcmc.last_state
    mcmc.run(mcmc.last_state.rng_key, *logistic_data)  # the loop of a resumed chain: compiled once...
    mcmc.post_warmup_state = mcmc.last_state
    with COMPILATIONS as resumed:
        mcmc.run(mcmc.last_state.rng_key, *logistic_data)  # ...then read back
    assert "cache_misses" not in resumed.events and "cache_hits" in resumed.events


@pytest.mark.slow
def test_a_finished_run_is_not_kept(logistic_data):
    """Nothing keeps a finished run once its ``MCMC`` object goes: not JAX's caches of the compiled loop, nor
    NumPyro's of the step functions (NumPyro's own loop, a static argument of a module-level jitted function,
    kept every run's program, kernel and draws: a notebook cell rerun with a new kernel grew the process by
    10-20 MB, ``benchmarks/repeated_runs.py``). Two runs, one without and one with the in-loop bar (its host
    callback holds the bar), each checked: any run kept fails."""
    import gc
    import weakref

    runs = []
    for seed, bar in enumerate((False, True)):
        kernel = SGLD(logistic_model, step_size=1e-3)
        mcmc = MCMC(kernel, num_warmup=5, num_samples=10, verdict=False)
        mcmc.progress_bar = bar
        mcmc.run(jax.random.PRNGKey(seed), *logistic_data)
        runs += [weakref.ref(kernel), weakref.ref(mcmc)]
        del kernel, mcmc
    for _ in range(2):  # JAX's caches drop the loop's entries in weakref callbacks of the first collection
        gc.collect()
    assert [run() for run in runs] == [None] * len(runs)


@pytest.mark.slow
def test_a_run_that_leaves_a_latent_out_of_its_draws_is_not_judged(logistic_data):
    """``extra_fields=("~z.scale",)`` (NumPyro's way to leave a site out of the draws) runs: the verdict, which needs
    every latent site, is skipped rather than raising after the run."""
    mcmc = MCMC(SGLD(logistic_model, step_size=1e-3), num_warmup=0, num_samples=100, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), *logistic_data, extra_fields=("~z.scale",))
    assert "scale" not in mcmc.get_samples() and "w" in mcmc.get_samples()
    assert mcmc.last_verdict is None
    mcmc.run(jax.random.PRNGKey(0), *logistic_data)
    assert mcmc.last_verdict is not None


@pytest.mark.parametrize("chains", [1, 2], ids=["one chain", "vectorized"])
@pytest.mark.parametrize("as_numpy", [False, True], ids=["jax arrays", "numpy arrays"])
def test_the_data_are_arguments_of_the_compiled_loop(chains, as_numpy):
    """JAX embeds an array that a compiled function closes over in its program as a constant, copied into the
    program, its cache key and the executable (five times the data at the peak: 1e7 rows of 123 features did not fit
    in 24 GB). The sampling loop takes the model's arrays as arguments, NumPy ones too, and warns of no captured
    constants (``jax_captured_constants_warn_bytes``, here half the data's size); a Python number stays static (it
    is the plate's ``subsample_size``)."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(4000, 20)).astype(np.float32)
    y = (X[:, 0] + rng.logistic(size=4000) > 0).astype(np.float32)
    data = (X, y) if as_numpy else (jax.numpy.asarray(X), jax.numpy.asarray(y))
    mcmc = MCMC(SGLD(logistic_model, step_size=1e-3), num_warmup=10, num_samples=10, num_chains=chains,
                chain_method="vectorized", progress_bar=False, verdict=False)  # fmt: skip
    threshold = jax.config.jax_captured_constants_warn_bytes
    jax.config.update("jax_captured_constants_warn_bytes", X.nbytes // 2)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            mcmc.run(jax.random.PRNGKey(0), *data, batch_size=50)
    finally:
        jax.config.update("jax_captured_constants_warn_bytes", threshold)
    assert not [w for w in caught if "constants were captured" in str(w.message)]
    assert mcmc.get_samples()["w"].shape == (10 * chains, 20)
