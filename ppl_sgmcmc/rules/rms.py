"""The RMSprop running average of squared gradients, a preconditioner piece shared by rules.

``V ← α V + (1 - α) g ⊙ g`` (Tieleman & Hinton's RMSprop, as optax's ``scale_by_rms`` keeps it): pSGLD
preconditions by ``1 ⊘ (λ + sqrt(V))`` of the mean per-datum score (Li, Chen, Carlson & Carin, AAAI
2016), and Santa by ``1 ⊘ sqrt(λ + sqrt(V))`` of the scaled stochastic gradient (Chen, Carlson, Gan, Li &
Carin, "Bridging the Gap between Stochastic Gradient MCMC and Stochastic Optimization", AISTATS 2016).
Written once, on the array-API subset shared by ``jax.numpy`` and ``torch``.
"""

from typing import Any

from array_api_compat import array_namespace


def init(position: Any) -> Any:
    """``V = 0`` of the shape and dtype of ``position``.

    **Example**::

        >>> import jax.numpy as jnp
        >>> from ppl_sgmcmc.rules import rms
        >>> rms.init(jnp.ones(3)).tolist()
        [0.0, 0.0, 0.0]
    """
    return array_namespace(position).zeros_like(position)


def update(square_avg: Any, gradient: Any, decay: Any) -> Any:
    """One update of the average, ``V ← α V + (1 - α) g ⊙ g`` with ``α = decay``.

    **Example**::

        >>> import torch
        >>> from ppl_sgmcmc.rules import rms
        >>> rms.update(torch.zeros(2), torch.tensor([1.0, -2.0]), decay=0.9)
        tensor([0.1000, 0.4000])
    """
    return decay * square_avg + (1 - decay) * gradient * gradient
