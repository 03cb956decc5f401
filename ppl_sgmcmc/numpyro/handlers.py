"""Effect handlers that change how a NumPyro model's subsampled plates behave."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
from numpyro.distributions import Distribution
from numpyro.primitives import Messenger

__all__ = ["full_data"]

_UNSAMPLED_CLASSES: dict[type, type] = {}
_NAN_LOG_PROB_CLASSES: dict[type, type] = {}


def _unsampled_class(cls: type[Distribution]) -> type[Distribution]:
    """A subclass of ``cls`` that, asked for a sample without a random key, returns zeros and tells its
    :class:`full_data` handler (``self._full_data_handler``) instead of failing NumPyro's bare
    ``assert is_prng_key(key)``."""
    if cls not in _UNSAMPLED_CLASSES:

        def __call__(self: Distribution, *args: Any, **kwargs: Any) -> Any:
            site = getattr(self, "_full_data_site", None)  # None in a copy made by JAX (unflattened)
            if kwargs.get("rng_key") is not None or site is None:
                return super(subclass, self).__call__(*args, **kwargs)
            sample_shape = kwargs.get("sample_shape", ())
            dtype = jnp.int32 if self.support.is_discrete else jnp.result_type(float)
            value = jnp.zeros(self.shape(sample_shape), dtype)
            handler, name = site
            handler._unsampled.append(name)
            return (value, []) if kwargs.get("sample_intermediates") else value

        namespace = {"__call__": __call__, "__module__": __name__}
        subclass: type[Distribution] = type(f"Unsampled{cls.__name__}", (cls,), namespace)
        _UNSAMPLED_CLASSES[cls] = subclass
    return _UNSAMPLED_CLASSES[cls]


def _nan_log_prob_class(cls: type[Distribution]) -> type[Distribution]:
    """A subclass of ``cls`` whose ``log_prob`` is NaN (of the shape ``cls.log_prob`` would have)."""
    if cls not in _NAN_LOG_PROB_CLASSES:

        def log_prob(self: Distribution, value: Any, *args: Any, **kwargs: Any) -> Any:
            shape = jnp.shape(value)[: jnp.ndim(value) - len(self.event_shape)]
            return jnp.full(jnp.broadcast_shapes(shape, self.batch_shape), jnp.nan)

        _NAN_LOG_PROB_CLASSES[cls] = type(
            f"Unavailable{cls.__name__}", (cls,), {"log_prob": log_prob, "__module__": __name__}
        )
    return _NAN_LOG_PROB_CLASSES[cls]


class full_data(Messenger):
    """Run every subsampled plate on all of its data: ``plate(name, N, subsample_size=n)`` becomes
    ``plate(name, N)`` with indices ``0..N-1`` and scale 1.

    This is the view of the model that evaluation needs: ArviZ's pointwise log-likelihood and
    observed data, posterior predictive checks (``Predictive(full_data(model), samples)``: the
    subsampled model would predict a random minibatch of rows per draw), deterministic sites, and a
    full-data NUTS run (``NUTS(full_data(model))``).

    A latent site inside a subsampled plate that gets neither a value nor a random key (a kernel's
    local Gibbs site, absent from the samples, when ``numpyro.infer.log_likelihood`` or
    ``arviz.from_numpyro`` replays the model) is set to zeros, and every observed site after it gets a
    NaN log-likelihood, with a warning: its pointwise likelihood would need the local site marginalised.

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

    def __init__(self, fn: Callable[..., Any] | None = None) -> None:
        super().__init__(fn)
        self._enlarged: set[str] = set()  # the plates this run enlarged
        self._unsampled: list[str] = []  # local latent sites that got neither a value nor a key

    def __enter__(self) -> full_data:
        self._enlarged, self._unsampled = set(), []
        return super().__enter__()

    def process_message(self, msg: dict[str, Any]) -> None:
        """Give a subsampled plate's message (``args = (N, n)``) the full size: ``args = (N, None)``
        and the indices ``0..N-1``. A latent site inside such a plate falls back to zeros if it gets
        neither a value nor a random key; an observed site after such a fallback gets a NaN
        log-likelihood. Other messages pass unchanged.

        **Example**::

            >>> msg = {"type": "plate", "name": "data", "args": (5, 2), "value": None}
            >>> full_data().process_message(msg)
            >>> msg["args"], msg["value"].tolist()
            ((5, None), [0, 1, 2, 3, 4])
        """
        if msg["type"] == "plate" and msg["args"][1] is not None:
            size = msg["args"][0]
            msg["value"] = jnp.arange(size)
            msg["args"] = (size, None)
            self._enlarged.add(msg["name"])
        elif msg["type"] == "sample" and isinstance(msg["fn"], Distribution):
            if msg["is_observed"]:
                if self._unsampled:
                    warnings.warn(
                        f"full_data: the latent site(s) {sorted(set(self._unsampled))} inside a subsampled plate "
                        "have no value (they are not among the samples: a kernel's local Gibbs sites) and no "
                        f"random key, so the log-likelihood of the observed site {msg['name']!r}, which needs "
                        "them marginalised, is NaN. Use ppl_sgmcmc.numpyro.to_inference_data(mcmc), which leaves "
                        "the log-likelihood out, or az.from_numpyro(mcmc, log_likelihood=False).",
                        UserWarning,
                        stacklevel=2,
                    )
                    msg["fn"] = copy.copy(msg["fn"])  # the model's own object stays as it is
                    msg["fn"].__class__ = _nan_log_prob_class(type(msg["fn"]))
            elif msg["value"] is None and any(frame.name in self._enlarged for frame in msg["cond_indep_stack"]):
                msg["fn"] = copy.copy(msg["fn"])
                msg["fn"].__class__ = _unsampled_class(type(msg["fn"]))
                msg["fn"]._full_data_site = (self, msg["name"])
