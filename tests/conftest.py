"""Session-wide test configuration: programs compiled for compile time (``_compile_for_tests``), and one JAX
compilation cache for the whole test session.

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
import subprocess
import sys
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


# XLA:CPU's options for programs compiled in a test (see `_compile_for_tests`)
_FAST_COMPILE_XLA_FLAGS = "--xla_cpu_use_fusion_emitters=false --xla_cpu_parallel_codegen_split_count=1"


def _compile_for_tests():
    """Tests compile programs that run for milliseconds: compile them for compile time, not run time.

    XLA:CPU spends most of a test's time optimising the programs it then runs once, briefly. In a test session (and in
    the processes it starts: the notebooks' kernels, the sharding subprocesses, which inherit the environment) JAX's
    ``jax_disable_most_optimizations`` (LLVM at ``-O0`` without its expensive passes) and XLA:CPU's elemental
    emitters (``--xla_cpu_use_fusion_emitters=false``) are on. They change how a program is compiled, not what it
    computes; results may differ in the last bits from a default compilation, and do not vary from run to run. The
    quick tests of ``tests/numpyro/test_kernel.py`` take 2.4 times less CPU time (``docs/src/developer/testing.md``).
    Each program's machine code is also generated as one LLVM module (``--xla_cpu_parallel_codegen_split_count=1``):
    XLA:CPU splits a module into parts that it compiles in parallel, which for a test's small modules costs more
    than it gains (XLA compile time of a default SGNHT run on a 3-weight regression 3.7 s against 4.5 s, means of
    five alternating runs; 1-5 % less time for the quick tests named in ``_fewer_garbage_collections``, side by
    side as there).
    ``PPL_SGMCMC_TEST_XLA_DEFAULTS=1`` compiles with XLA's defaults instead, as users' programs are. Tests that
    run long chains turn LLVM's optimisations back on for them (``tests.helpers.optimized_compilation``).

    The Pyro kernels' compiled steps are TorchInductor's C++ kernels: they are generated without SIMD
    vectorisation (``TORCHINDUCTOR_VEC_ISA_OK=0``), which takes a third less CPU time to compile and computes the
    same values as vectorised code up to rounding.

    The flags go into ``XLA_FLAGS``, where an XLA that no longer knows one would stop the process; a subprocess
    checks first that this XLA accepts them.
    """
    if os.environ.get("PPL_SGMCMC_TEST_XLA_DEFAULTS") == "1":
        return
    os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
    os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "0")
    flags = os.environ.get("XLA_FLAGS", "")
    if _FAST_COMPILE_XLA_FLAGS not in flags:
        combined = f"{flags} {_FAST_COMPILE_XLA_FLAGS}".strip()
        probe = [sys.executable, "-c", "import jax; jax.numpy.zeros(1).block_until_ready()"]
        env = {**os.environ, "XLA_FLAGS": combined, "JAX_PLATFORMS": "cpu"}
        if subprocess.run(probe, env=env, capture_output=True, timeout=120).returncode == 0:
            os.environ["XLA_FLAGS"] = combined
    if "jax" in sys.modules:  # imported already (by a plugin): the environment variable was read before it was set
        sys.modules["jax"].config.update("jax_disable_most_optimizations", True)
    if "torch._inductor.config" in sys.modules:  # likewise
        sys.modules["torch._inductor.config"].cpp.vec_isa_ok = False


def _fewer_garbage_collections():
    """Collect cyclic garbage every 50 000 net allocations instead of Python's default 700.

    Tracing and lowering a program allocate millions of short-lived objects, and a test process keeps large caches
    (traced functions, compiled programs) alive; under the default thresholds the collector ran about 1700 times
    in the quick tests of ``tests/numpyro/test_mcmc.py``, ``tests/numpyro/test_kernel.py``,
    ``tests/pyro/test_kernel.py`` and ``tests/test_diagnostics.py`` and took 4-5 s of their 40 s (``gc.callbacks``);
    at 50 000, 20 collections and 1.2 s, and those tests took 3-9 % less time (two rounds side by side, one core
    each, the configurations swapped between rounds). What a test computes does not depend on when cycles are
    freed; a test that needs them freed calls ``gc.collect()``."""
    import gc

    gc.set_threshold(50_000, 20, 20)


@pytest.fixture
def xla_optimizations():
    """XLA's default optimisations for the programs a test compiles (``tests.helpers.optimized_compilation``): for
    long chains (run time, not compile time), and for a test that two different programs computing the same chain
    give it bit for bit, which XLA gives when it optimises both as users' programs are (at ``-O0`` their roundings
    may differ in the last bit)."""
    from tests.helpers import optimized_compilation

    with optimized_compilation():
        yield


def pytest_configure(config):
    global _owned_dir
    _fewer_garbage_collections()
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:  # the controller (or a run without pytest-xdist), before any worker starts
        _compile_for_tests()
    if os.environ.get("PPL_SGMCMC_TEST_JAX_CACHE") == "0":
        return
    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        path = os.environ["JAX_COMPILATION_CACHE_DIR"]  # the user's: kept
    elif workerinput is not None and _OWN_DIR_KEY in workerinput:
        path = workerinput[_OWN_DIR_KEY]  # the controller's
    else:
        path = _owned_dir = tempfile.mkdtemp(prefix="ppl-sgmcmc-jax-cache-")
    if workerinput is None and getattr(config.option, "dist", "no") != "no" and getattr(config.option, "tx", None):
        return  # the pytest-xdist controller runs no test: it need not import JAX (`--dist` alone, no `-n`: no controller)
    _configure_jax_cache(path)


def pytest_collection_modifyitems(config, items):
    """The quick tier (``-m "not slow"``) leaves out, besides the tests marked ``slow`` in their files, the tests
    listed in ``tests/slow_tests.txt`` by their measured duration (``tests/tiers.py``)."""
    from tests.tiers import slow_tests, without_group

    slow = slow_tests()
    for item in items:
        if without_group(item.nodeid) in slow:
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """pytest-xdist: hand the controller's cache directory to each worker."""
    if _owned_dir is not None:
        node.workerinput[_OWN_DIR_KEY] = _owned_dir


def pytest_unconfigure(config):
    if _owned_dir is not None:  # made by this process (with pytest-xdist: the controller, after its workers)
        shutil.rmtree(_owned_dir, ignore_errors=True)
