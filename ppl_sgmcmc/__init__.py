"""Stochastic-gradient MCMC as inference kernels for NumPyro (``ppl_sgmcmc.numpyro``) and
Pyro (``ppl_sgmcmc.pyro``).

The update rules live once, as pure functions, in :mod:`ppl_sgmcmc.rules`; step-size schedules
in :mod:`ppl_sgmcmc.schedules`.
"""

from ppl_sgmcmc import schedules

__version__ = "0.1.0"
__all__ = ["schedules", "__version__"]
