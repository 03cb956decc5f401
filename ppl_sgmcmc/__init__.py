"""Stochastic-gradient MCMC as inference kernels for NumPyro (``ppl_sgmcmc.numpyro``) and
Pyro (``ppl_sgmcmc.pyro``).

The update rules live once, as pure functions, in :mod:`ppl_sgmcmc.rules`; step-size schedules
in :mod:`ppl_sgmcmc.schedules`.
"""

import importlib

__version__ = "0.1.0"
__all__ = ["schedules", "__version__"]


def __getattr__(name):
    # ``schedules`` imports JAX and optax; load it on first use so that ``import ppl_sgmcmc.pyro``
    # (and every worker process Pyro spawns) does not pay for them
    if name == "schedules":
        return importlib.import_module("ppl_sgmcmc.schedules")
    raise AttributeError(f"module 'ppl_sgmcmc' has no attribute {name!r}")
