"""SG-MCMC kernels for NumPyro's :class:`numpyro.infer.MCMC`."""

from ppl_sgmcmc.numpyro.handlers import full_data
from ppl_sgmcmc.numpyro.inference_data import full_data_log_likelihood, predictive, to_inference_data
from ppl_sgmcmc.numpyro.kernel import SGMCMCKernel, SGMCMCState
from ppl_sgmcmc.numpyro.kernels import (
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
from ppl_sgmcmc.numpyro.mcmc import MCMC
from ppl_sgmcmc.numpyro.posterior_predictive import PredictiveSummary, batched_predictive
from ppl_sgmcmc.numpyro.scores import full_data_score

__all__ = [
    "CSGHMC",
    "CSGLD",
    "ContourState",
    "MCMC",
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
    "to_inference_data",
]
