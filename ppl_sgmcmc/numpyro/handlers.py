"""Effect handlers that change how a NumPyro model's subsampled plates behave."""

import jax.numpy as jnp
from numpyro.primitives import Messenger


class full_data(Messenger):
    """Run every subsampled plate on all of its data: ``plate(name, N, subsample_size=n)`` becomes
    ``plate(name, N)`` with indices ``0..N-1`` and scale 1.

    This is the view of the model that evaluation needs: ArviZ's pointwise log-likelihood and
    observed data, posterior predictive checks, and deterministic sites.

    **Example**::

        >>> import jax, numpyro, numpyro.distributions as dist
        >>> def model(y):
        ...     mu = numpyro.sample("mu", dist.Normal(0, 1))
        ...     with numpyro.plate("data", y.shape[0], subsample_size=2):
        ...         numpyro.sample("y", dist.Normal(mu, 1), obs=numpyro.subsample(y, event_dim=0))
        >>> tr = numpyro.handlers.trace(numpyro.handlers.seed(full_data(model), 0)).get_trace(jax.numpy.zeros(5))
        >>> tr["y"]["value"].shape
        (5,)
    """

    def process_message(self, msg):
        """Give a subsampled plate's message (``args = (N, n)``) the full size: ``args = (N, None)``
        and the indices ``0..N-1``; other messages pass unchanged.

        **Example**::

            >>> msg = {"type": "plate", "args": (5, 2), "value": None}
            >>> full_data().process_message(msg)
            >>> msg["args"], msg["value"].tolist()
            ((5, None), [0, 1, 2, 3, 4])
        """
        if msg["type"] == "plate" and msg["args"][1] is not None:
            size = msg["args"][0]
            msg["value"] = jnp.arange(size)
            msg["args"] = (size, None)
