"""SG-MCMC kernels for Pyro's :class:`pyro.infer.MCMC`.

The same algorithms, arguments and update rules as :mod:`ppl_sgmcmc.numpyro`::

    from pyro.infer import MCMC
    from ppl_sgmcmc.pyro import SGNHT

    mcmc = MCMC(SGNHT(model, step_size=1e-3), warmup_steps=1000, num_samples=3000, num_chains=2)
    mcmc.run(X, y)
    mcmc.summary()
    idata = arviz.from_pyro(mcmc)   # full-data log_likelihood and observed_data
"""

from ppl_sgmcmc.checkpoint import ChainState
from ppl_sgmcmc.pyro.handlers import FullDataModel, full_data, subsample_plates
from ppl_sgmcmc.pyro.inference_data import full_data_log_likelihood, predictive, sample_stats, to_inference_data
from ppl_sgmcmc.pyro.kernel import SGMCMCKernel, SGMCMCState
from ppl_sgmcmc.pyro.kernels import (
    CSGHMC,
    CSGLD,
    PSGLD,
    SGFS,
    SGHMC,
    SGLD,
    SGNHT,
    SGRLD,
    ContourState,
    Recipe,
    ReplicaState,
    ReSGHMC,
    ReSGLD,
    Santa,
)
from ppl_sgmcmc.pyro.posterior_predictive import PredictiveSummary, batched_predictive
from ppl_sgmcmc.pyro.scores import full_data_score

__all__ = [
    "CSGHMC",
    "CSGLD",
    "ChainState",
    "ContourState",
    "FullDataModel",
    "PSGLD",
    "PredictiveSummary",
    "ReSGHMC",
    "ReSGLD",
    "Recipe",
    "ReplicaState",
    "SGFS",
    "SGHMC",
    "SGLD",
    "SGMCMCKernel",
    "SGMCMCState",
    "SGNHT",
    "SGRLD",
    "Santa",
    "batched_predictive",
    "full_data",
    "full_data_log_likelihood",
    "full_data_score",
    "predictive",
    "sample_stats",
    "subsample_plates",
    "to_inference_data",
]
