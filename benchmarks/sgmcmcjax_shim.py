"""SGMCMCJax 0.2.13 on current JAX, for the benchmarks that run it side by side with ppl_sgmcmc.

SGMCMCJax's ``util`` module imports ``jax.experimental.host_callback`` (removed from JAX) for its progress bars,
which the benchmarks do not use: :func:`import_sgmcmcjax` puts a stub module in ``sys.modules`` before importing
it, in the benchmark's process only.
"""

import sys
import types
from typing import Any

import jax


def import_sgmcmcjax() -> types.ModuleType:
    """``sgmcmcjax.kernels``, importable on current JAX (see the module docstring)."""
    if "jax.experimental.host_callback" not in sys.modules:
        try:
            from jax.experimental import host_callback  # noqa: F401
        except ImportError:
            stub = types.ModuleType("jax.experimental.host_callback")

            def id_tap(*args: Any, **kwargs: Any) -> Any:
                raise RuntimeError("host_callback stub: SGMCMCJax's progress bars are not available here")

            stub.id_tap = id_tap  # type: ignore[attr-defined]
            sys.modules["jax.experimental.host_callback"] = stub
            jax.experimental.host_callback = stub  # type: ignore[attr-defined]
    import sgmcmcjax.kernels

    return sgmcmcjax.kernels
