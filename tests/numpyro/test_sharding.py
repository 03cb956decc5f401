"""Data sharded over several devices and hosts (:mod:`ppl_sgmcmc.numpyro.sharding`).

JAX fixes its device count when it starts, so the runs happen in subprocesses: one process with
``XLA_FLAGS=--xla_force_host_platform_device_count=4`` (the data on one device, and sharded over meshes of
2 and 4 CPU devices), and two processes under ``jax.distributed.initialize`` with 2 devices each (gloo).

* The global draw gathers the same minibatch rows as one device: the trajectories of meshes of 2 and 4
  devices and of two hosts equal the one-device (unsharded) one to float tolerance (the all-reduce that
  gathers the rows adds zeros, and XLA may fuse the gradient's sums in another order): vectorised chains
  with a fixed step size, the hands-off warm-up of every kernel that tunes its step size, and, on 4 devices,
  the tuned warm-up with epochs; so do the full-data
  log-likelihood for ArviZ (computed shard by shard) and, on 4 devices, a resumed run. Each ``MCMC.run``
  compiles anew, so the runs are few and short.
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
TUNED_KERNELS = ("SGLD", "SGHMC", "SGNHT", "PSGLD", "CSGLD", "CSGHMC", "SGFS")
NUM_DATA, NUM_FEATURES, BATCH, NOISE, PRIOR = 1000, 3, 50, 16.0, 1.0
STEP, DIFFUSION = 5e-3, 2.0  # as test_posterior.py's "sgnht-multivariate-splitting"
NUM_CHAINS, NUM_WARMUP, NUM_SAMPLES, THINNING = 8, 2_000, 16_000, 4
RTOL, ATOL = 1e-4, 1e-5  # float32 sums in another order, over a few hundred steps

# subprocesses that compile every run afresh (~4 min of CPU in all): the slow tier only
pytestmark = pytest.mark.slow
# the tests that share the 4-device process run on one pytest-xdist worker (run with `--dist loadgroup`): else
# each worker that gets one of them starts its own
on_four_devices = pytest.mark.xdist_group("sharding_four_devices")

COMMON = f"""
import json, os, sys
import jax, jax.numpy as jnp, numpy as np, numpyro, numpyro.distributions as dist
from numpyro.infer import MCMC
from ppl_sgmcmc.numpyro import SGFS, SGLD, SGNHT, full_data_log_likelihood
from ppl_sgmcmc.numpyro.sharding import data_mesh, shard_rows
from tests.helpers import linear_regression_data

N, D, BATCH, NOISE, PRIOR = {NUM_DATA}, {NUM_FEATURES}, {BATCH}, {NOISE}, {PRIOR}
TUNED_KERNELS = {TUNED_KERNELS!r}
X, Y, _ = linear_regression_data(N, D, NOISE, seed=0)


def regression(X, y):
    w = numpyro.sample("w", dist.Normal(0.0, PRIOR).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=BATCH):
        numpyro.sample("y", dist.Normal(numpyro.subsample(X, event_dim=1) @ w, NOISE), obs=numpyro.subsample(y, event_dim=0))


def trajectories(data, runs, **mcmc_options):
    # "fixed": a fixed step size, with replacement, 2 vectorised chains (+ the log-likelihood, "resumed": a
    # resumed run); "tuned": the warm-up's adaptation, epochs without replacement
    out = {{}}
    if "fixed" in runs:
        mcmc = MCMC(SGLD(regression, step_size=5e-4), num_warmup=200, num_samples=100, num_chains=2,
                    chain_method="vectorized", progress_bar=False, **mcmc_options)
        mcmc.run(jax.random.PRNGKey(0), *data)
        out["fixed"] = np.asarray(mcmc.get_samples()["w"])
        out["log_likelihood"] = full_data_log_likelihood(mcmc)["y"]
        if "resumed" in runs:
            mcmc.post_warmup_state = mcmc.last_state
            mcmc.run(mcmc.post_warmup_state.rng_key, *data)
            out["resumed"] = np.asarray(mcmc.get_samples()["w"])
    if "tuned" in runs:
        mcmc = MCMC(SGNHT(regression, replace=False), num_warmup=200, num_samples=100, progress_bar=False,
                    **mcmc_options)
        mcmc.run(jax.random.PRNGKey(0), *data)
        out["tuned"] = np.asarray(mcmc.get_samples()["w"])
        out["tuned_step_size"] = np.asarray(mcmc.get_extra_fields()["step_size"])
    return out
"""

DEVICES = COMMON + f"""
import jax
ALL = ("fixed", "resumed", "tuned")
results = {{"unsharded": trajectories((jnp.asarray(X), jnp.asarray(Y)), ALL)}}
for k in (2, 4):
    mesh = data_mesh(jax.devices()[:k])
    results[k] = trajectories(shard_rows(X, Y, mesh=mesh), ALL if k == 4 else ("fixed",))
    assert shard_rows(X, mesh=mesh).addressable_shards[0].data.shape == (N // k, D)
try:
    shard_rows(X[:10], mesh=data_mesh())
except ValueError as err:
    error = str(err)
for method in ("sequential", "parallel"):  # chains on separate devices (pmap), for a given and a tuned step size
    for h in (5e-4, None):
        mcmc = MCMC(SGLD(regression, step_size=h), num_warmup=200, num_samples=100, num_chains=2, chain_method=method,
                    progress_bar=False)
        mcmc.run(jax.random.PRNGKey(0), jnp.asarray(X), jnp.asarray(Y))
        results[method] = {{**results.get(method, {{}}), f"h={{h}}": np.asarray(mcmc.get_samples()["w"])}}
try:  # SGFS checks per-datum scores on the host at its start, which a traced `init` cannot do
    MCMC(SGFS(regression), num_warmup=200, num_samples=10, num_chains=2, chain_method="parallel",
         progress_bar=False).run(jax.random.PRNGKey(0), jnp.asarray(X), jnp.asarray(Y))
except ValueError as err:
    sgfs_error = str(err)
mesh = data_mesh()
mcmc = MCMC(SGNHT(regression, step_size={STEP}, diffusion={DIFFUSION}), num_warmup={NUM_WARMUP}, num_samples={NUM_SAMPLES},
            num_chains={NUM_CHAINS}, chain_method="vectorized", thinning={THINNING}, progress_bar=False)
mcmc.run(jax.random.PRNGKey(1), *shard_rows(X, Y, mesh=mesh))
np.savez(sys.argv[1], posterior=np.asarray(mcmc.get_samples(group_by_chain=True)["w"]),
         diverging=np.asarray(mcmc.get_extra_fields()["diverging"]),
         **{{f"{{k}}/{{name}}": v for k, out in results.items() for name, v in out.items()}})
print(json.dumps({{"devices": len(jax.devices()), "error": error, "sgfs_error": sgfs_error}}))
"""

KERNELS = COMMON + """
import ppl_sgmcmc.numpyro as sg
results = {}
for name in sys.argv[2:]:  # hands-off: the warm-up tunes the step size and the metric
    for k in (1, 2, 4):
        mesh = data_mesh(jax.devices()[:k])
        data = (jnp.asarray(X), jnp.asarray(Y)) if k == 1 else shard_rows(X, Y, mesh=mesh)
        mcmc = MCMC(getattr(sg, name)(regression), num_warmup=200, num_samples=20, progress_bar=False)
        mcmc.run(jax.random.PRNGKey(0), *data)
        results[f"{name}/{k}"] = np.asarray(mcmc.get_samples()["w"])
        results[f"{name}/{k}/step_size"] = np.asarray(mcmc.get_extra_fields()["step_size"])
np.savez(sys.argv[1], **results)
print(json.dumps({}))
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
out = trajectories(data, ("fixed",), jit_model_args=True)
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
print(json.dumps(errors))
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
    env = dict(os.environ, PYTHONPATH=str(ROOT), XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
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
@pytest.mark.parametrize("devices", [2, 4])
def test_same_trajectory_as_one_device(four_devices, devices):
    """With the global draw, meshes of 2 and 4 devices follow the one-device (unsharded) trajectory (4: also the tuned
    warm-up with epochs, and a resumed run) and give the same full-data log-likelihood."""
    results, _ = four_devices
    names = {key.split("/", 1)[1] for key in results if key.startswith(f"{devices}/")}
    assert names == ({"fixed", "log_likelihood", "resumed", "tuned", "tuned_step_size"} if devices == 4
                     else {"fixed", "log_likelihood"})
    for name in sorted(names):
        np.testing.assert_allclose(
            results[f"{devices}/{name}"], results[f"unsharded/{name}"], rtol=RTOL, atol=ATOL, err_msg=name
        )
    assert results["unsharded/log_likelihood"].shape == (2, 100, NUM_DATA)


@pytest.mark.parametrize("name", TUNED_KERNELS)
def test_every_tuned_kernel_tunes_the_same_chain(tmp_path, name):
    """Every kernel whose warm-up tunes, hands-off, follows the same chain on rows sharded over 2 and 4 devices as
    on one: the same step size and the same draws, to float rounding (the warm-up's decisions are continuous in
    what it measures, so sums in another order do not change them). One process a kernel, so that pytest-xdist
    spreads them."""
    path = tmp_path / "kernels.npz"
    _result(_run(KERNELS, path, name, devices=4, jax_env=_jax_env()))
    results = dict(np.load(path))
    for devices in (2, 4):
        for field in ("", "/step_size"):
            np.testing.assert_allclose(results[f"{name}/{devices}{field}"], results[f"{name}/1{field}"], rtol=RTOL,
                                       atol=ATOL, err_msg=f"{name} on {devices} devices{field}")  # fmt: skip


@on_four_devices
def test_parallel_chains_on_several_devices(four_devices):
    """``chain_method="parallel"`` (NumPyro's ``pmap`` over devices, which traces the kernel's ``init``) gives the
    draws of sequential chains, with a given and with a tuned step size; SGFS, whose start needs concrete values,
    says to use another chain method."""
    results, info = four_devices
    for name in ("h=0.0005", "h=None"):
        np.testing.assert_allclose(results[f"parallel/{name}"], results[f"sequential/{name}"], rtol=RTOL, atol=ATOL)
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
    for name in ("fixed", "log_likelihood"):
        np.testing.assert_allclose(hosts[name], results[f"unsharded/{name}"], rtol=RTOL, atol=ATOL, err_msg=name)
    for process_errors in errors:
        assert "Pass `jit_model_args=True` to `MCMC`" in process_errors["closure"]
        assert "the processes disagree on the data" in process_errors["rows"]
        assert "[[500, 2, 3, 11], [501, 2, 3, 11]]" in process_errors["rows"]
