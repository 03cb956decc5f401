"""SG-MCMC kernels for NumPyro's :class:`numpyro.infer.MCMC`."""

from ppl_sgmcmc.numpyro.handlers import full_data
from ppl_sgmcmc.numpyro.inference_data import full_data_log_likelihood, to_inference_data
from ppl_sgmcmc.numpyro.kernel import SGMCMCKernel, SGMCMCState
from ppl_sgmcmc.numpyro.kernels import PSGLD, SGHMC, SGLD, SGNHT

__all__ = ["PSGLD", "SGHMC", "SGLD", "SGMCMCKernel", "SGMCMCState", "SGNHT", "full_data", "full_data_log_likelihood", "to_inference_data"]
