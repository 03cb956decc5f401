"""Data sharded over several devices and hosts (:mod:`ppl_sgmcmc.numpyro.sharding`).

JAX fixes its device count when it starts, so the runs happen in subprocesses: one process with
``XLA_FLAGS=--xla_force_host_platform_device_count=4``, which runs every check on one host (the data on one
device, and sharded over a mesh of 4 CPU devices) so that they share its start, its JAX import and its
compiles, and two processes under ``jax.distributed.initialize`` with 2 devices each (gloo).

* The global draw gathers the same minibatch rows as one device: the trajectories on 4 devices and on two hosts
  equal the one-device (unsharded) one to float tolerance (the all-reduce that gathers the rows adds zeros, and
  XLA may fuse the gradient's sums in another order), and so does the full-data log-likelihood for ArviZ
  (computed shard by shard): on two hosts, vectorised chains with a fixed step size; on 4 devices, vectorised
  chains whose warm-up tunes the step size and the metric hands-off, resumed, and the hands-off warm-up of each
  kernel whose sharded code differs (below). A step with a fixed step size is the hands-off one after its
  warm-up, so the hands-off run covers it. Each ``MCMC.run`` compiles anew, so the runs are few and short: a
  warm-up of 200 steps holds all of the warm-up's windows (``adaptation_schedule(200)``: a buffer, four slow
  windows, a buffer), at whose ends the step size and the metric change. The runs with a fixed step size adapt
  nothing: 20 warm-up steps and 30 draws of 2 chains (5,000 minibatch rows drawn from the 1,000), the two hosts'
  run among them, each of whose steps waits on an all-reduce between the processes (gloo).
* 4 devices stand for any mesh: XLA's SPMD partitioner compiles the same program for every size ``k`` of the
  data axis (each device gathers the drawn rows among the ``N/k`` it holds, at its offset ``index × N/k``,
  zeros elsewhere, and one all-reduce sums the ``k`` parts). A mesh of 4 has shards with neighbours on both
  sides, which one of 2 lacks, and the two hosts hold 2 devices each: a mesh of 2 would add no code path.
* Which kernels: the data enter a chain only through the model on gathered rows: the minibatch draw (the same
  for every kernel: its indices come from the key alone, with or without replacement), the row sums of the
  minibatch energy and gradient, and the warm-up's stacked minibatches (the mode search, the Hessian and the
  Newton steps, the noise probe: :mod:`ppl_sgmcmc.numpyro.warmup`); the update rules and the adaptation act on
  their replicated results. The kernels that tune their step size differ there only in what they take from the
  rows: SGLD, SGHMC, SGNHT and pSGLD the energy and the gradient, with the Hessian and the Newton steps of the
  adapted metric (run: SGLD); CSGLD and CSGHMC also the energy as the index of a discrete bin and the
  calibration of the bins (run: CSGLD); SGFS the per-datum scores, not summed, and no Hessian (run: SGFS).
* ``chain_method="parallel"`` (NumPyro's ``pmap`` of each chain over a device) gives the vectorised chains'
  draws (which are the sequential chains': ``test_kernel.py``).
* The posterior on 4 devices is the conjugate one, within Monte Carlo error (``tests/helpers.py``): the
  mean exactly, the covariance up to the predicted bias of the step size (as in ``test_posterior.py``).
"""

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import (
    assert_mc_close,
    assert_small_bias,
    conjugate_posterior,
    ess,
    linear_regression_data,
    mahalanobis,
    mean_and_mcse,
    minibatch_gradient_cov,
    predicted_thermostat,
)

ROOT = Path(__file__).resolve().parents[2]
# the hands-off kernels whose sharded code is not SGLD's ("tuned"): see the module's docstring
KERNELS = ("CSGLD", "SGFS")
NUM_DATA, NUM_FEATURES, BATCH, NOISE, PRIOR = 1000, 3, 50, 16.0, 1.0
STEP, DIFFUSION = 5e-3, 2.0  # as test_posterior.py's "sgnht-multivariate-splitting"
FIXED_WARMUP, FIXED_SAMPLES = 20, 30  # the runs with a fixed step size: no adaptation to cover
NUM_CHAINS, NUM_WARMUP, NUM_SAMPLES, THINNING = 8, 2_000, 16_000, 4
RTOL, ATOL = 1e-4, 1e-5  # float32 sums in another order, over a few hundred steps

# subprocesses that compile every run afresh (~2 min of CPU in all): the slow tier only
pytestmark = pytest.mark.slow
# every test shares the 4-device process and runs on one pytest-xdist worker (run with `--dist loadgroup`): else
# each worker that gets one of them starts its own
on_four_devices = pytest.mark.xdist_group("sharding_four_devices")

COMMON = f"""
import json, os, sys
import jax, jax.numpy as jnp, numpy as np, numpyro, numpyro.distributions as dist
from numpyro.infer import MCMC
from ppl_sgmcmc.numpyro import SGLD, full_data_log_likelihood
from ppl_sgmcmc.numpyro.sharding import data_mesh, shard_rows
from tests.helpers import linear_regression_data

N, D, BATCH, NOISE, PRIOR = {NUM_DATA}, {NUM_FEATURES}, {BATCH}, {NOISE}, {PRIOR}
X, Y, _ = linear_regression_data(N, D, NOISE, seed=0)


def regression(X, y):
    w = numpyro.sample("w", dist.Normal(0.0, PRIOR).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=BATCH):
        numpyro.sample("y", dist.Normal(numpyro.subsample(X, event_dim=1) @ w, NOISE), obs=numpyro.subsample(y, event_dim=0))


def run(kernel, data, num_warmup=200, num_samples=100, num_chains=2, chain_method="vectorized", **mcmc_options):
    mcmc = MCMC(kernel, num_warmup=num_warmup, num_samples=num_samples, num_chains=num_chains,
                chain_method=chain_method, progress_bar=False, **mcmc_options)
    mcmc.run(jax.random.PRNGKey(0), *data)
    return mcmc


def fixed():  # a fixed step size
    return SGLD(regression, step_size=5e-4)


def run_fixed(data, **options):  # short: see the module's docstring
    return run(fixed(), data, num_warmup={FIXED_WARMUP}, num_samples={FIXED_SAMPLES}, **options)


def draws(mcmc):
    return np.asarray(mcmc.get_samples()["w"])
"""

DEVICES = COMMON + f"""
import ppl_sgmcmc.numpyro as sg
from ppl_sgmcmc.numpyro import SGFS, SGNHT
KERNELS = {KERNELS!r}


def tuned():  # the hands-off warm-up
    return SGLD(regression)


def trajectories(data):
    out = {{}}
    for name, mcmc in (("tuned", run(tuned(), data)),
                       *((name, run(getattr(sg, name)(regression), data, num_samples=20, num_chains=1)) for name in KERNELS)):
        out[name], out[name + "/step_size"] = draws(mcmc), np.asarray(mcmc.get_extra_fields()["step_size"])
        if name == "tuned":
            out["log_likelihood"] = full_data_log_likelihood(mcmc)["y"]
            mcmc.post_warmup_state = mcmc.last_state
            mcmc.run(mcmc.post_warmup_state.rng_key, *data)
            out["resumed"] = draws(mcmc)
    return out


unsharded, mesh = (jnp.asarray(X), jnp.asarray(Y)), data_mesh()
assert shard_rows(X, mesh=mesh).addressable_shards[0].data.shape == (N // 4, D)
results = {{"unsharded": trajectories(unsharded), "4": trajectories(shard_rows(X, Y, mesh=mesh))}}
fixed_run = run_fixed(unsharded)  # the reference of the two hosts
results["unsharded"].update(fixed=draws(fixed_run), fixed_log_likelihood=full_data_log_likelihood(fixed_run)["y"])
try:
    shard_rows(X[:10], mesh=mesh)
except ValueError as err:
    error = str(err)
# chains on separate devices (pmap), for a given and a tuned step size
results["parallel"] = {{"fixed": draws(run_fixed(unsharded, chain_method="parallel")),
                       "tuned": draws(run(tuned(), unsharded, chain_method="parallel"))}}
try:  # SGFS checks per-datum scores on the host at its start, which a traced `init` cannot do
    run(SGFS(regression), unsharded, num_samples=10, chain_method="parallel")
except ValueError as err:
    sgfs_error = str(err)
mcmc = MCMC(SGNHT(regression, step_size={STEP}, diffusion={DIFFUSION}), num_warmup={NUM_WARMUP}, num_samples={NUM_SAMPLES},
            num_chains={NUM_CHAINS}, chain_method="vectorized", thinning={THINNING}, progress_bar=False)
mcmc.run(jax.random.PRNGKey(1), *shard_rows(X, Y, mesh=mesh))
np.savez(sys.argv[1], posterior=np.asarray(mcmc.get_samples(group_by_chain=True)["w"]),
         diverging=np.asarray(mcmc.get_extra_fields()["diverging"]),
         **{{f"{{k}}/{{name}}": v for k, out in results.items() for name, v in out.items()}})
print(json.dumps({{"devices": len(jax.devices()), "error": error, "sgfs_error": sgfs_error}}), flush=True)
sys.stderr.flush()
os._exit(0)  # skip the interpreter's teardown: collecting what ~500 compiles left took 3-18 s of CPU time
"""

HOSTS = """
import sys
process, port, path = int(sys.argv[1]), sys.argv[2], sys.argv[3]
import jax
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"localhost:{port}", num_processes=2, process_id=process)
""" + COMMON + """
rows = slice(process * N // 2, (process + 1) * N // 2)  # each host reads its own rows
data = shard_rows(X[rows], Y[rows])
assert data[0].shape == (N, D) and len(jax.devices()) == 4
mcmc = run_fixed(data, jit_model_args=True)
out = {"fixed": draws(mcmc), "fixed_log_likelihood": full_data_log_likelihood(mcmc)["y"]}
errors = {}
try:  # MCMC closes over its arguments without jit_model_args=True
    MCMC(SGLD(regression, step_size=5e-4), num_warmup=1, num_samples=1, progress_bar=False).run(
        jax.random.PRNGKey(0), *data)
except ValueError as err:
    errors["closure"] = str(err)
try:  # the hosts disagree on the data's size
    shard_rows(X[: N // 2 + process])
except ValueError as err:
    errors["rows"] = str(err)
if process == 0:
    np.savez(path, **out)
print(json.dumps(errors), flush=True)
sys.stderr.flush()
jax.distributed.shutdown()  # both processes are done: then skip the interpreter's teardown (~1.5 s of CPU time)
os._exit(0)
"""


def _jax_env():
    """The subprocess's JAX settings: the test session's compilation cache (tests/conftest.py), so that the processes
    load the programs they share (the model's initial-value search) instead of compiling them again."""
    import jax

    env = {}
    if jax.config.jax_compilation_cache_dir:
        env["JAX_COMPILATION_CACHE_DIR"] = jax.config.jax_compilation_cache_dir
        for name in ("jax_persistent_cache_min_compile_time_secs", "jax_persistent_cache_min_entry_size_bytes",
                     "jax_compilation_cache_max_size"):  # fmt: skip
            env[name.upper()] = str(getattr(jax.config, name))
    return env


def _run(script, *args, devices, jax_env=None):
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}".strip()
    env = dict(os.environ, PYTHONPATH=str(ROOT), XLA_FLAGS=flags)  # the session's XLA flags (tests/conftest.py), too
    env.update(jax_env or {})  # the hosts' processes (jax.distributed): JAX's defaults, as in the reference run
    env.pop("JAX_PLATFORMS", None)
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script), *map(str, args)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _result(process, timeout=600):
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, err[-4000:]
    return json.loads(out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def four_devices(tmp_path_factory):
    path = tmp_path_factory.mktemp("sharding") / "devices.npz"
    info = _result(_run(DEVICES, path, devices=4, jax_env=_jax_env()))
    assert info["devices"] == 4
    return dict(np.load(path)), info


@on_four_devices
def test_same_trajectory_as_one_device(four_devices):
    """On 4 devices, the one-device (unsharded) trajectory of vectorised chains whose warm-up tunes hands-off (the
    same step sizes and draws, to float rounding: the warm-up's decisions are continuous in what it measures, so
    sums in another order do not change them), resumed, and the same full-data log-likelihood."""
    results, _ = four_devices
    names = {"tuned", "tuned/step_size", "log_likelihood", "resumed"}
    kernels = {f"{name}{field}" for name in KERNELS for field in ("", "/step_size")}
    assert {key.split("/", 1)[1] for key in results if key.startswith("4/")} == names | kernels
    for name in sorted(names):
        np.testing.assert_allclose(results[f"4/{name}"], results[f"unsharded/{name}"], rtol=RTOL, atol=ATOL, err_msg=name)
    assert results["unsharded/log_likelihood"].shape == (2, 100, NUM_DATA)
    assert results["unsharded/tuned"].shape == (200, NUM_FEATURES)  # 2 vectorised chains


@on_four_devices
@pytest.mark.parametrize("name", KERNELS)
def test_hands_off_kernel_tunes_the_same_chain(four_devices, name):
    """A kernel whose warm-up tunes, hands-off, and whose sharded code is not SGLD's (the module's docstring)
    follows the same chain on rows sharded over 4 devices as on one: the same step size and the same draws, to
    float rounding."""
    results, _ = four_devices
    for field in ("", "/step_size"):
        np.testing.assert_allclose(results[f"4/{name}{field}"], results[f"unsharded/{name}{field}"], rtol=RTOL,
                                   atol=ATOL, err_msg=f"{name} on 4 devices{field}")  # fmt: skip


@on_four_devices
def test_parallel_chains_on_several_devices(four_devices):
    """``chain_method="parallel"`` (NumPyro's ``pmap`` over devices, which traces the kernel's ``init``) gives the
    draws of vectorised chains, with a given and with a tuned step size; SGFS, whose start needs concrete values,
    says to use another chain method."""
    results, info = four_devices
    for name in ("fixed", "tuned"):
        np.testing.assert_allclose(results[f"parallel/{name}"], results[f"unsharded/{name}"], rtol=RTOL, atol=ATOL,
                                   err_msg=name)  # fmt: skip
    assert "chain_method='parallel' does not allow" in info["sgfs_error"] and "'vectorized'" in info["sgfs_error"]


@on_four_devices
def test_rows_that_do_not_divide_the_mesh(four_devices):
    _, info = four_devices
    assert "10 rows, which do not divide evenly over the mesh's data axis of 4 devices" in info["error"]
    assert "[1, 2]" in info["error"] and "drop the last 2 rows" in info["error"] and "pad to 12 rows" in info["error"]


@on_four_devices
def test_posterior_on_four_devices(four_devices):
    """SGNHT on data sharded over 4 devices: the conjugate posterior within Monte Carlo error."""
    results, _ = four_devices
    X, Y, _ = linear_regression_data(NUM_DATA, NUM_FEATURES, NOISE, seed=0)
    post_mean, post_cov = conjugate_posterior(X, Y, NOISE, PRIOR)
    grad_cov = minibatch_gradient_cov(X, Y, post_mean, NOISE, BATCH)
    predicted_bias = predicted_thermostat(np.linalg.inv(post_cov), grad_cov, STEP, DIFFUSION, "splitting")[1] - post_cov
    assert_small_bias("sgnht", predicted_bias, np.sqrt(np.outer(np.diag(post_cov), np.diag(post_cov))), 0.05)
    draws = results["posterior"]
    assert draws.shape == (NUM_CHAINS, NUM_SAMPLES // THINNING, NUM_FEATURES)
    assert not results["diverging"].any()
    print(f"\nESS of w {np.round(ess(draws))}")
    mean, mean_se = mean_and_mcse(draws)
    assert_mc_close("mean on 4 devices", mean, post_mean, mean_se)
    distance, distance_se = mean_and_mcse(mahalanobis(draws, post_mean, post_cov)[..., None] / NUM_FEATURES)
    bias = np.trace(np.linalg.inv(post_cov) @ predicted_bias) / NUM_FEATURES
    assert_mc_close("Mahalanobis/d on 4 devices", distance, 1.0, distance_se, allowance=bias)


def _free_port():
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        return sock.getsockname()[1]


@on_four_devices
def test_two_hosts(tmp_path, four_devices):
    """Two processes with 2 CPU devices each (gloo): the trajectory of one device, and clear errors."""
    results, _ = four_devices
    path, port = tmp_path / "hosts.npz", _free_port()
    processes = [_run(HOSTS, process, port, path, devices=2) for process in (0, 1)]
    errors = [_result(process) for process in processes]
    hosts = dict(np.load(path))
    assert hosts["fixed"].shape == (2 * FIXED_SAMPLES, NUM_FEATURES)  # 2 vectorised chains
    for name in ("fixed", "fixed_log_likelihood"):
        np.testing.assert_allclose(hosts[name], results[f"unsharded/{name}"], rtol=RTOL, atol=ATOL, err_msg=name)
    for process_errors in errors:
        assert "Pass `jit_model_args=True` to `MCMC`" in process_errors["closure"]
        assert "the processes disagree on the data" in process_errors["rows"]
        assert "[[500, 2, 3, 11], [501, 2, 3, 11]]" in process_errors["rows"]
