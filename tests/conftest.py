"""Session-wide test configuration: one JAX compilation cache for the whole test session.

Most of the suite's wall time is XLA compiling small programs, not running them: every fresh ``MCMC``
object (and every kernel object) is traced and compiled anew, although many tests build the very same
program again (the same model, data, shapes and hyperparameters; only the PRNG key, an argument,
differs). JAX's persistent compilation cache is keyed by the lowered program itself (plus the JAX
version, backend and compile options), so a second identical program loads the executable the first
one compiled instead of recompiling it; programs with host callbacks are never cached. What runs is
exactly what a fresh compilation would give: no test changes what it checks.

The cache lives in a temporary directory for this session only (removed at the end), shared by the
pytest-xdist workers, which take the cache's file lock (enabled by setting a size limit). Set
``JAX_COMPILATION_CACHE_DIR`` to use a directory of your own instead (kept, e.g. across CI runs: most
programs are then loaded, not compiled), or ``PPL_SGMCMC_TEST_JAX_CACHE=0`` to compile everything
afresh.
"""

import os
import shutil
import tempfile

import pytest

_OWN_DIR_KEY = "ppl_sgmcmc_jax_cache_dir"
_owned_dir = None


def _configure_jax_cache(path):
    import jax

    jax.config.update("jax_compilation_cache_dir", path)
    # only programs that took a while to compile (the MCMC loops take ~1-3 s): writing every small
    # program (eager operations, ~10 ms each) to the cache would cost more than it saves
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    try:
        import filelock  # noqa: F401  (a size limit turns on the cache's inter-process file lock)
    except ImportError:  # no lock: keep the workers apart
        path = os.path.join(path, os.environ.get("PYTEST_XDIST_WORKER", "main"))
        jax.config.update("jax_compilation_cache_dir", path)
    else:
        jax.config.update("jax_compilation_cache_max_size", 4 * 2**30)


def pytest_configure(config):
    global _owned_dir
    if os.environ.get("PPL_SGMCMC_TEST_JAX_CACHE") == "0":
        return
    workerinput = getattr(config, "workerinput", None)
    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        path = os.environ["JAX_COMPILATION_CACHE_DIR"]  # the user's: kept
    elif workerinput is not None and _OWN_DIR_KEY in workerinput:
        path = workerinput[_OWN_DIR_KEY]  # the controller's
    else:
        path = _owned_dir = tempfile.mkdtemp(prefix="ppl-sgmcmc-jax-cache-")
    if workerinput is None and getattr(config.option, "dist", "no") != "no" and getattr(config.option, "tx", None):
        return  # the pytest-xdist controller runs no test: it need not import JAX (`--dist` alone, no `-n`: no controller)
    _configure_jax_cache(path)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """pytest-xdist: hand the controller's cache directory to each worker."""
    if _owned_dir is not None:
        node.workerinput[_OWN_DIR_KEY] = _owned_dir


def pytest_unconfigure(config):
    if _owned_dir is not None:  # made by this process (with pytest-xdist: the controller, after its workers)
        shutil.rmtree(_owned_dir, ignore_errors=True)
