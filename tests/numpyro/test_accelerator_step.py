"""The accelerator step (``ppl_sgmcmc.numpyro.kernel.STEP_PATH``), checked on the CPU with the path forced.

On a GPU, XLA copies a conditional's predicate to the host and the device waits for it: a rarely taken
``lax.cond`` in a step costs a host round trip at every step. The step after the warm-up, as
:class:`ppl_sgmcmc.numpyro.MCMC` compiles it on an accelerator, must therefore hold

1. **no branch on device data and no host callback**: the lowered step of every kernel (with its defaults,
   several steps per draw, vectorized chains) has no ``stablehlo.case``/``stablehlo.if``, no ``custom_call`` to a
   host callback, and every ``while`` of the compiled step has a trip count known to XLA; the same check finds the
   CPU step's branches, so it can fail;
2. **the CPU step's chain**: the same draws (same seed) to float tolerance, with and without the progress bar
   (drawn per chunk of draws there), single and vectorized chains, from the start and resumed after
   ``warmup()``;
3. **the same health warnings** for runs that trigger them (a step-size schedule that turns negative; a step size
   so large that steps are rejected and the thermostat's momentum is redrawn).

The tuned kernels skip the mode search (``find_mode=False``): it only moves the chain's start, inside ``init``, and
leaves the step's program as the default's, while its optimiser is about 40% of the CPU time that compiling a tuned
kernel's start takes.
"""

import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest

from ppl_sgmcmc import numpyro as backend
from ppl_sgmcmc.numpyro import kernel as kernel_module
from ppl_sgmcmc.numpyro import mcmc as mcmc_module
from tests.numpyro.conftest import logistic_model

WARMUP = 200
SGHMC_Q = np.block([[np.zeros((3, 3)), -np.eye(3)], [np.eye(3), np.zeros((3, 3))]])


def rates_model(y):
    """Positive latents, for SGRLD."""
    rate = numpyro.sample("rate", dist.Gamma(2.0, 1.0).expand([2]).to_event(1))
    with numpyro.plate("data", y.shape[0], subsample_size=20):
        numpyro.sample("y", dist.Poisson(rate).to_event(1), obs=numpyro.subsample(y, event_dim=1))


def weights_model(X, y):
    """Every latent in the likelihood, for SGFS (its Fisher estimate ignores the prior)."""
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=20):
        numpyro.sample(
            "y", dist.Bernoulli(logits=numpyro.subsample(X, event_dim=1) @ w), obs=numpyro.subsample(y, event_dim=0)
        )


KERNELS = {
    "SGLD": lambda: backend.SGLD(logistic_model, find_mode=False),
    "SGHMC": lambda: backend.SGHMC(logistic_model, find_mode=False),
    "SGNHT": lambda: backend.SGNHT(logistic_model, find_mode=False),
    "SGNHT-4-steps": lambda: backend.SGNHT(logistic_model, find_mode=False, steps_per_sample=4),
    "SGNHT-svrg": lambda: backend.SGNHT(logistic_model, find_mode=False, gradient="svrg"),
    "SGNHT-svrg-20-steps": lambda: backend.SGNHT(logistic_model, find_mode=False, steps_per_sample=20, gradient="svrg"),
    "PSGLD": lambda: backend.PSGLD(logistic_model, find_mode=False),
    "SGFS": lambda: backend.SGFS(weights_model),
    "CSGLD": lambda: backend.CSGLD(logistic_model, find_mode=False),
    "CSGHMC": lambda: backend.CSGHMC(logistic_model, find_mode=False),
    "Santa": lambda: backend.Santa(logistic_model, step_size=1e-3),
    "Recipe": lambda: backend.Recipe(logistic_model, step_size=1e-3, D=2.0, Q=SGHMC_Q, momentum=True),
    "SGRLD": lambda: backend.SGRLD(rates_model, step_size=1e-3),
}


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "There are not enough devices", UserWarning)
        warnings.filterwarnings("ignore", ".*does not tell a kernel when its run ends", UserWarning)
        yield


@pytest.fixture
def path(monkeypatch):
    """``path(name)`` sets the step the kernels compile from their next ``init`` on."""
    return lambda name: monkeypatch.setattr(kernel_module, "STEP_PATH", name)


def data_for(name, logistic_data):
    if name == "SGRLD":
        rng = np.random.default_rng(0)
        return (jnp.asarray(rng.poisson([3.0, 0.5], size=(200, 2)).astype(np.float32)),)
    return logistic_data


def lowered_step(kernel, data, num_chains=None):
    """The step after the warm-up, as :class:`ppl_sgmcmc.numpyro.MCMC` traces it: ``(StableHLO text, compiled
    HLO text)``."""
    key = jax.random.PRNGKey(0) if num_chains is None else jax.random.split(jax.random.PRNGKey(0), num_chains)
    state = kernel.init(key, WARMUP, model_args=data)
    kernel._reports_after_run, kernel._last_step = True, 2 * WARMUP * kernel._steps_per_sample
    try:
        with kernel._traced_after_warmup():
            lowered = jax.jit(kernel.sample).lower(state, data, {})
    finally:
        kernel._reports_after_run, kernel._last_step = False, None
    return lowered.as_text(), lowered.compile().as_text()


def data_branches(stablehlo):
    """The ``stablehlo.case``/``stablehlo.if`` ops of a lowered program whose selector is not a constant. JAX
    lowers some operations (``jnp.diagonal``) through ``lax.platform_dependent``: a ``case`` on the platform's
    index, a constant (then a ``case`` on the index that one returns), which XLA folds away: no branch on device
    data. The compiled program's ``conditional`` ops are checked too (:func:`host_round_trips`)."""
    found = []
    for function in re.split(r"\bfunc\.func\b", stablehlo):
        static = set()
        for line in function.splitlines():
            match = re.match(r"\s*(%[\w.]+)(?::\d+)? = (.*)", line)
            if match is None:
                continue
            name, op = match.groups()
            if op.startswith("stablehlo.constant"):
                static.add(name)
            branch = re.match(r'"?stablehlo\.(case|if)"?\((%[\w.]+)', op)
            if branch is None:
                continue
            if branch.group(2) not in static:
                found.append(f"stablehlo.{branch.group(1)}")
            else:  # a case on a constant: XLA keeps the one branch (here, the platform's index passed on)
                static.add(name)
    return found


def host_round_trips(stablehlo, hlo):
    """What in a lowered step makes the device wait for the host: branches on device data, host callbacks, loops
    whose trip count XLA does not know (their predicate is read on the host at every iteration)."""
    found = data_branches(stablehlo)
    found += [call for call in re.findall(r"custom_call @(\w+)", stablehlo) if "callback" in call]
    found += ["conditional"] * len(re.findall(r"= \S+ conditional\(", hlo))
    found += ["while without a known trip count" for line in hlo.splitlines()
              if re.search(r"\swhile\(", line) and "known_trip_count" not in line]  # fmt: skip
    return found


# --- 1. no branch, no host callback -----------------------------------------------------------------------------
@pytest.mark.parametrize("name", KERNELS)
def test_the_step_after_the_warmup_has_no_branch_and_no_host_call(name, path, logistic_data):
    path("accelerator")
    assert host_round_trips(*lowered_step(KERNELS[name](), data_for(name, logistic_data))) == []


def test_vectorized_chains_step_has_no_branch_and_no_host_call(path, logistic_data):
    path("accelerator")
    assert host_round_trips(*lowered_step(KERNELS["SGNHT"](), logistic_data, num_chains=4)) == []


def test_the_check_finds_the_cpu_steps_branches(path, logistic_data):
    path("cpu")
    found = host_round_trips(*lowered_step(KERNELS["SGNHT"](), logistic_data))
    assert "stablehlo.case" in found and "conditional" in found


def test_the_path_follows_the_data_and_a_bad_setting_is_named(monkeypatch, logistic_data):
    monkeypatch.setattr(kernel_module, "STEP_PATH", None)
    kernel = backend.SGLD(logistic_model, step_size=1e-3)
    kernel.init(jax.random.PRNGKey(0), 0, model_args=jax.device_put(logistic_data, jax.devices("cpu")[0]))
    assert kernel._accelerated is False  # the data is on the CPU
    if jax.default_backend() != "cpu":  # on a GPU machine: the data there
        kernel.init(jax.random.PRNGKey(0), 0, model_args=jax.device_put(logistic_data, jax.devices()[0]))
        assert kernel._accelerated is True
    monkeypatch.setattr(kernel_module, "STEP_PATH", "gpu")
    with pytest.raises(ValueError, match="STEP_PATH is 'gpu'; set it to 'accelerator', 'cpu' or None"):
        kernel.init(jax.random.PRNGKey(0), 0, model_args=logistic_data)


# --- 2. the same chain ------------------------------------------------------------------------------------------
# The accelerator step changes kernel-generic code only (`ppl_sgmcmc.numpyro.kernel`, `.mcmc`): the health checks
# and a rejected step's momentum redraw as selects, the run's loop split at the warm-up's end (a tuned kernel's
# later calls traced without the adaptation), the bar drawn per chunk of calls. The rules and the warm-up's
# adaptation are one function on both steps. So the chains are one per path through that code: a tuned kernel with
# a momentum (the split; from the start, resumed after `warmup()`), the same with several steps per draw and the bar
# (the split counted in draws, the bar's chunks on either side of it), a given step size without momentum (no split),
# vectorized chains with the bar and thinning. Equality needs no length: 50 draws after a warm-up of 200 (its
# adaptation windows) compare each draw.
CHAINS = {
    "SGNHT, tuned": KERNELS["SGNHT"],
    "SGNHT, tuned, 4 steps per draw": KERNELS["SGNHT-4-steps"],
    "SGLD, given step size": lambda: backend.SGLD(logistic_model, step_size=1e-3),
    # a centre moved every epoch (N/n = 10 steps), made a multiple of a draw (8 steps) and moved by the run's loop
    # between its loops of epochs, or a divisor (10 of 20 steps) and moved by the draw's loop of epochs
    "SGNHT, tuned, svrg, 4 steps per draw": lambda: backend.SGNHT(logistic_model, find_mode=False, steps_per_sample=4,
                                                                  gradient="svrg"),  # fmt: skip
    "SGNHT, tuned, svrg, 20 steps per draw": lambda: backend.SGNHT(logistic_model, find_mode=False,
                                                                   steps_per_sample=20, gradient="svrg"),  # fmt: skip
}
#: the tests that compare with `cpu_chains`'s runs: on one pytest-xdist worker (`--dist loadgroup`), which runs each once
on_cpu_chains = pytest.mark.xdist_group("accelerator_step_cpu_chains")


def samples(mcmc):
    return {site: np.asarray(value) for site, value in mcmc.get_samples().items()}


def draws(kernel, data, **options):
    run = dict(num_warmup=WARMUP, num_samples=50, progress_bar=False, verdict=False)
    run.update(options)
    mcmc = backend.MCMC(kernel, **run)
    mcmc.run(jax.random.PRNGKey(1), *data)
    return samples(mcmc)


def assert_same_draws(accelerator, cpu):
    assert accelerator.keys() == cpu.keys()
    for site in cpu:
        np.testing.assert_allclose(accelerator[site], cpu[site], rtol=1e-4, atol=1e-5, err_msg=site)


@pytest.fixture(scope="module")
def cpu_chains(logistic_data):
    """``cpu_chains(name)``: the CPU step's draws of ``CHAINS[name]`` (no bar), run once for the tests that compare
    with them (the CPU step's bar leaves its draws as they are: ``tests/numpyro/test_mcmc.py``)."""
    runs = {}

    def get(name):
        if name not in runs:
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(kernel_module, "STEP_PATH", "cpu")
                runs[name] = draws(CHAINS[name](), logistic_data)
        return runs[name]

    return get


@on_cpu_chains
@pytest.mark.parametrize("name", ["SGNHT, tuned", pytest.param("SGLD, given step size", marks=pytest.mark.slow)])
def test_the_accelerator_step_gives_the_cpu_steps_draws(name, path, logistic_data, cpu_chains):
    path("accelerator")
    assert_same_draws(draws(CHAINS[name](), logistic_data), cpu_chains(name))


@on_cpu_chains
@pytest.mark.slow
@pytest.mark.parametrize("name", ["SGNHT, tuned, 4 steps per draw", "SGNHT, tuned, svrg, 4 steps per draw",
                                  "SGNHT, tuned, svrg, 20 steps per draw"])  # fmt: skip
def test_the_same_draws_with_a_progress_bar(name, path, logistic_data, cpu_chains):
    """The bar drawn after each chunk of calls, of the warm-up's and of the later ones; with SVRG, the chunks after
    the warm-up inside the run's loop of epochs, or epochs inside each draw."""
    path("accelerator")
    assert_same_draws(draws(CHAINS[name](), logistic_data, progress_bar=True), cpu_chains(name))


@pytest.mark.slow
@pytest.mark.parametrize("gradient", ["minibatch", "svrg"])
def test_the_same_draws_with_vectorized_chains(gradient, path, logistic_data):
    """Three vectorized chains, thinned by 3, with the bar (a given step size: vectorizing leaves the loop's split
    at the warm-up's end as it is); with SVRG, every chain's centre moved at once."""
    options = dict(num_chains=3, chain_method="vectorized", thinning=3)
    path("cpu")
    cpu = draws(backend.SGNHT(logistic_model, step_size=1e-2, gradient=gradient), logistic_data, **options)
    path("accelerator")
    accelerator = draws(backend.SGNHT(logistic_model, step_size=1e-2, gradient=gradient), logistic_data,
                        progress_bar=True, **options)  # fmt: skip
    assert_same_draws(accelerator, cpu)


def test_the_loop_of_epochs_has_no_branch_and_no_host_call(path, logistic_data, monkeypatch):
    """SVRG moves its centre every epoch: on the accelerator step the run's loop does it between loops of whole
    epochs, so a run without a warm-up (a given step size: every call after it) compiles a loop with no branch, no
    host call and no loop of unknown length (``jit_model_args=True``: the loop's other value)."""
    lowered, collection_loop_of = [], mcmc_module._collection_loop

    def collection_loop(*args):
        loop = collection_loop_of(*args)

        def run(init_val):
            program = loop.lower(init_val)
            lowered.append((program.as_text(), program.compile().as_text()))
            return loop(init_val)

        return run

    monkeypatch.setattr(mcmc_module, "_collection_loop", collection_loop)
    path("accelerator")
    kernel = backend.SGHMC(logistic_model, step_size=1e-2, gradient="svrg")
    draws(kernel, logistic_data, num_warmup=0, num_samples=25, jit_model_args=True)
    assert kernel._epoch_steps == 10 and len(lowered) == 1
    assert host_round_trips(*lowered[0]) == []


@on_cpu_chains
@pytest.mark.slow
def test_a_resumed_chain_after_warmup_gives_the_same_draws(path, logistic_data, cpu_chains):
    """``warmup()`` (its calls all the warm-up's), then ``run`` from its state (none of them): the chain of one
    run."""
    path("accelerator")
    mcmc = backend.MCMC(CHAINS["SGNHT, tuned"](), num_warmup=WARMUP, num_samples=50, progress_bar=False, verdict=False)
    mcmc.warmup(jax.random.PRNGKey(1), *logistic_data)
    mcmc.run(mcmc.post_warmup_state.rng_key, *logistic_data)
    assert_same_draws(samples(mcmc), cpu_chains("SGNHT, tuned"))


# --- 3. the same warnings ---------------------------------------------------------------------------------------
def warnings_of(kernel, data):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        draws(kernel, data, num_warmup=0, num_samples=300)
    return sorted(str(w.message) for w in caught if w.category is RuntimeWarning)


@pytest.mark.slow
@pytest.mark.parametrize(
    "make_kernel",
    [
        lambda: backend.SGLD(logistic_model, step_size=lambda t: 0.01 - 1e-4 * t),  # negative from step 100
        lambda: backend.SGNHT(logistic_model, step_size=50.0),  # rejected steps, redrawn momenta, a runaway
    ],
)
def test_the_same_health_warnings(make_kernel, path, logistic_data):
    path("cpu")
    cpu = warnings_of(make_kernel(), logistic_data)
    path("accelerator")
    accelerator = warnings_of(make_kernel(), logistic_data)
    assert cpu and accelerator == cpu
