"""What cyclical SGLD's kept draws should be on a Gaussian posterior with the full-data gradient, for the
conjugate tests of both backends (``tests/numpyro/test_cyclical.py``, ``tests/pyro/test_cyclical.py``)."""

import numpy as np


def predicted_cov(kernel, step_sizes, scales, precision, num_warmup, num_samples):
    """The covariance of the kept draws that the chains' linear recursions predict, averaged over the chains.

    With the full-data gradient, SGLD in the coordinates ``u = L⁻¹ θ`` of a chain's preconditioner is
    ``u ← u - h_i P u + sqrt(2 h_i) s_i ζ`` with ``P = Lᵀ H L`` (``H`` the posterior precision) and ``s_i`` 0 while
    exploring: along each eigenvector of ``P`` (eigenvalue ``λ``) the variance follows
    ``v ← (1 - h_i λ)² v + 2 h_i s_i``, from ``1/λ`` (the warm-up's end, stationary at the tuned step size up to
    O(h)). The kept draws' covariance is ``L Q diag(mean of v over kept draws) Qᵀ Lᵀ``: the discretisation bias
    of the cycle's step sizes and the collapse to the mode that each sampling stage starts from.

    :param kernel: the cyclical kernel after its run (one step per draw).
    :param step_sizes: each chain's tuned step size (the cycles' peak), ``(chains,)``.
    :param scales: each chain's preconditioner ``L``, ``(chains, d, d)``.
    :param precision: ``H``, ``(d, d)``.
    """
    steps = np.arange(num_warmup, num_warmup + num_samples)
    factor = np.asarray(kernel.cycles.factor(steps, num_warmup, 1), np.float64)
    noisy = np.asarray(kernel.cycles.sampling(steps, num_warmup, 1), np.float64)
    kept = kernel.sampling_stage(steps + 1)
    covs = []
    for h, scale in zip(np.asarray(step_sizes, np.float64), np.asarray(scales, np.float64)):
        lam, Q = np.linalg.eigh(scale.T @ precision @ scale)
        v, kept_v = 1 / lam, []
        for hi, si in zip(h * factor, noisy):
            v = (1 - hi * lam) ** 2 * v + 2 * hi * si
            kept_v.append(v)
        covs.append(scale @ Q @ np.diag(np.mean(np.array(kept_v)[kept], axis=0)) @ Q.T @ scale.T)
    return np.mean(covs, axis=0)
