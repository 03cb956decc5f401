"""What a default NumPyro run compiles, and what its start costs to compile, piece by piece.

Most of the test suite's time, and a user's first run of a new model, is JAX tracing the programs of a run, lowering
them to MLIR and XLA compiling them, not running them. This script measures that, on two models:

* ``regression``: a 3-weight linear regression (1000 rows, minibatches of 50), the suite's typical small model;
* ``supports``: one latent site of each constrained support NumPyro has a bijection for (simplex, positive, ordered,
  lower Cholesky, correlation Cholesky, positive definite, circular; 17 unconstrained coordinates, 100 rows), as
  ``tests/numpyro/test_errors.py::test_constrained_supports_run`` runs it: a gradient through seven transforms.

Two tables per model:

1. **Programs of one run**: ``MCMC(SGNHT(model), num_warmup=300, num_samples=100)`` (the defaults: the step size and a
   dense metric tuned in the warm-up) in a fresh process; the seconds JAX spent tracing (``jaxpr_trace``), lowering
   (``jaxpr_to_mlir_module``) and compiling (``backend_compile``) each program (``jax.monitoring``'s duration events,
   by function name): ``run`` is the two stages of the chain's start (the mode search with the Hessian and the
   Newton steps, then the noise probe), ``_collect_draws`` NumPyro's loop over the warm-up and the draws, ``search``
   the initial-value search, ``init_one`` the chain's first state; "other" sums the small eager programs.
2. **Pieces of the start** (``ppl_sgmcmc.numpyro.warmup``), each compiled alone as the start compiles it (through the
   kernel's jitted minibatch gradient): one gradient, ``find_mode`` (100 Adam steps), ``hessian``, ``newton`` (the
   Newton steps, each with its Hessian and its line search) and ``probe``; each piece ``--repeats`` times, the pieces
   interleaved, the median reported.

Compiled as the test suite compiles (``jax_disable_most_optimizations`` and the XLA flags of ``tests/conftest.py``)
unless ``--xla-defaults``. Run it pinned to one core on a quiet machine::

    taskset -c 0 python -m benchmarks.start_compile --model regression supports --repeats 3
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import subprocess
import sys
import time

PROGRAMS = ("run", "_collect_draws", "search", "init_one")
PIECES = ("gradient", "find_mode", "hessian", "newton", "probe")


def _model(name):
    import jax.numpy as jnp
    import numpy as np
    import numpyro
    import numpyro.distributions as dist

    if name == "regression":
        rng = np.random.default_rng(0)
        X = jnp.asarray(rng.normal(size=(1000, 3)), jnp.float32)
        y = X @ jnp.array([1.0, -1.0, 0.5]) + jnp.asarray(rng.normal(size=1000), jnp.float32)

        def regression(X, y):
            w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([3]).to_event(1))
            with numpyro.plate("data", X.shape[0], subsample_size=50):
                Xb, yb = numpyro.subsample(X, event_dim=1), numpyro.subsample(y, event_dim=0)
                numpyro.sample("y", dist.Normal(Xb @ w, 1.0), obs=yb)

        return regression, (X, y)
    from tests.numpyro.test_errors import _Y, _every_support

    return _every_support, (_Y,)


def programs(name: str) -> dict[str, tuple[float, float, float]]:
    """``{program: (trace, lower, compile seconds)}`` of one default SGNHT run of model ``name``."""
    import jax
    from jax import monitoring

    from ppl_sgmcmc.numpyro import MCMC, SGNHT

    phases = {"jaxpr_trace_duration": 0, "jaxpr_to_mlir_module_duration": 1, "backend_compile_duration": 2}
    times: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0])

    def listener(event, duration, **kwargs):
        phase = phases.get(event.rsplit("/", 1)[-1])
        if phase is not None:
            fun = str(kwargs.get("fun_name", "?")).removeprefix("jit(").removesuffix(")")
            times[fun if fun in PROGRAMS else "other"][phase] += duration

    monitoring.register_event_duration_secs_listener(listener)
    model, args = _model(name)
    mcmc = MCMC(SGNHT(model), num_warmup=300, num_samples=100, progress_bar=False, verdict=False)
    mcmc.run(jax.random.PRNGKey(0), *args)
    return {program: tuple(times[program]) for program in (*PROGRAMS, "other")}


def pieces(name: str, repeats: int) -> dict[str, tuple[float, float, float]]:
    """``{piece: (trace, lower, compile seconds)}``, medians over ``repeats`` interleaved compilations."""
    import jax
    from jax.flatten_util import ravel_pytree

    from ppl_sgmcmc import adaptation
    from ppl_sgmcmc.numpyro import SGNHT, warmup
    from ppl_sgmcmc.numpyro.kernel import _jitted_gradient
    from ppl_sgmcmc.numpyro.potential import split_arrays

    model, args = _model(name)
    kernel = SGNHT(model)
    state = kernel.init(jax.random.PRNGKey(0), 300, None, args, {})
    target, unravel = kernel._target, kernel._unravel
    data, merge = split_arrays((args, {}))
    flat = ravel_pytree(state.z)[0]
    rows = adaptation.hessian_rows(target.data_size, flat.shape[0])
    bodies = {
        "gradient": lambda x, key, g: g(x, target.draw(key, target.init_batch(key))[0]).grad,
        "find_mode": lambda x, key, g: warmup.find_mode(g, target.draw, target.init_batch(key), x, key, 100),
        "hessian": lambda x, key, g: warmup.hessian(g, target.epoch(key, rows), x),
        "newton": lambda x, key, g: warmup.newton(g, target.epoch(key, rows), x),
        "probe": lambda x, key, g: warmup.probe(g, target.epoch(key, 10 * target.plate_sizes["data"][1]), x),
    }
    measured: dict[str, list[tuple[float, float, float]]] = collections.defaultdict(list)
    for _ in range(repeats):
        for piece, body in bodies.items():

            def run(x, key, data, body=body):
                jitted = _jitted_gradient(target, unravel, merge)  # a new function: traced afresh
                return body(x, key, lambda y, batch: jitted(y, batch, data))

            t0 = time.perf_counter()
            jax.make_jaxpr(run)(flat, jax.random.PRNGKey(1), data)
            t1 = time.perf_counter()
            lowered = jax.jit(run).lower(flat, jax.random.PRNGKey(1), data)
            t2 = time.perf_counter()
            lowered.compile()
            t3 = time.perf_counter()
            measured[piece].append((t1 - t0, t2 - t1, t3 - t2))
    return {piece: tuple(statistics.median(v[i] for v in measured[piece]) for i in range(3)) for piece in PIECES}


def _table(title: str, rows: dict[str, tuple[float, float, float]]) -> str:
    lines = [f"**{title}**", "", "| | trace (s) | lower (s) | compile (s) | total (s) |", "|---|---:|---:|---:|---:|"]
    for what, (trace, lower, compile_) in rows.items():
        lines.append(f"| `{what}` | {trace:.2f} | {lower:.2f} | {compile_:.2f} | {trace + lower + compile_:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", nargs="+", choices=("regression", "supports"), default=["regression", "supports"])
    parser.add_argument("--repeats", type=int, default=3, help="compilations of each piece (median reported)")
    parser.add_argument("--xla-defaults", action="store_true", help="compile as users' programs are, not as the tests")
    parser.add_argument("--worker", nargs=2, metavar=("MODEL", "WHAT"), help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.worker:  # one measurement in this fresh process
        model, what = options.worker
        rows = programs(model) if what == "programs" else pieces(model, options.repeats)
        title = "Programs of one default SGNHT run" if what == "programs" else "Pieces of the start, alone"
        print(_table(f"{model}: {title}", rows))
        return
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    if not options.xla_defaults:  # the test session's settings, from where the tests take them
        from tests.conftest import _FAST_COMPILE_XLA_FLAGS

        env.update(JAX_DISABLE_MOST_OPTIMIZATIONS="1", XLA_FLAGS=f"{env.get('XLA_FLAGS', '')} {_FAST_COMPILE_XLA_FLAGS}")
    for model in options.model:
        for what in ("programs", "pieces"):
            command = [sys.executable, "-m", "benchmarks.start_compile", "--repeats", str(options.repeats),
                       "--worker", model, what]  # fmt: skip
            out = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
            print(out.stdout)


if __name__ == "__main__":
    main()
