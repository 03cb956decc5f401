"""Bayesian multilayer perceptrons declared as NumPyro models, and their predictions by Bayesian model averaging.

A fully connected network with ``L`` layers of weights, each ``h ← act(h Wᵀ + b)`` (no activation after the
last), with independent Gaussian priors on every weight and bias, ``N(0, prior_scale²)``, and the
likelihood in a plate over the examples, subsampled to ``batch_size`` rows per step: the Bayesian neural
networks of Li, Chen, Fan & Carin, "High-Order Stochastic Gradient Thermostats for Bayesian Learning of Deep
Models" (AAAI 2016, §5.4; MNIST, ReLU) and of Chen, Carlson, Gan, Li & Carin, "Bridging the Gap between
Stochastic Gradient MCMC and Stochastic Optimization" (AISTATS 2016; MNIST, FNN-400). The regression model is
that of Hernández-Lobato & Adams, "Probabilistic Backpropagation for Scalable Learning of Bayesian Neural
Networks" (ICML 2015), used by Deng, Lin & Liang, "A Contour Stochastic Gradient Langevin Dynamics Algorithm
for Simulations of Multi-modal Distributions" (NeurIPS 2020, §4.2): Gaussian noise whose precision has a
``Gamma(6, 6)`` prior.

* :func:`classifier`: ``y_i ~ Categorical(softmax(f(x_i)))``.
* :func:`regressor`: ``y_i ~ N(f(x_i), 1/precision)``, ``precision ~ Gamma(6, 6)``.

The weight sites are named and shaped as PyTorch names and shapes ``nn.Linear`` parameters:
``layers.{l}.weight`` of shape ``(out, in)`` and ``layers.{l}.bias`` of shape ``(out,)``; the Pyro twin,
:mod:`models.bnn_pyro`, declares the same sites. Run them with any kernel of :mod:`ppl_sgmcmc.numpyro`::

    mcmc = MCMC(SGNHT(classifier, step_size=1e-4, steps_per_sample=600), num_warmup=10, num_samples=30)
    mcmc.run(jax.random.PRNGKey(0), X, y, hidden=(100, 100))
    probabilities = predict_proba(mcmc.get_samples(), X_test)          # (N_test, 10)

**Memory.** The models declare no deterministic site: one inside the plate would be evaluated on all ``N``
rows for every kept draw (``MCMC`` evaluates deterministic sites on the full data), 500 draws × 50 000 rows ×
10 classes = 1 GB. :func:`predict_proba` and :func:`predict_regression` compute the model average after the
run from the draws instead, a chunk of draws and a block of rows at a time, in at most about ``max_floats``
floats of activations.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
from jax import lax
from jax.typing import ArrayLike

__all__ = [
    "ACTIVATIONS",
    "PRECISION_PRIOR",
    "check_options",
    "classifier",
    "forward",
    "layer_sizes",
    "num_layers",
    "num_weights",
    "predict_proba",
    "predict_regression",
    "regressor",
]

#: The hidden layers' activations, by name (a name, not a function, so that a model's arguments stay static).
ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {"relu": jax.nn.relu, "tanh": jnp.tanh,
                                                             "sigmoid": jax.nn.sigmoid}  # fmt: skip
#: ``(concentration, rate)`` of the Gamma prior of the regression noise's precision (Hernández-Lobato & Adams).
PRECISION_PRIOR = (6.0, 6.0)
#: Rows of ``X`` per block of the model average.
ROW_BLOCK = 2048


def check_options(activation: str, batch_size: int | None, prior_scale: float = 1.0) -> None:
    """Check a network's ``activation`` (a name of :data:`ACTIVATIONS`), ``batch_size`` (a positive integer or
    ``None``) and ``prior_scale`` (positive), raising a ``ValueError`` that names the argument and its fix.

    >>> check_options("softplus", 100)
    Traceback (most recent call last):
    ...
    ValueError: `activation` must be one of 'relu', 'tanh', 'sigmoid'; got 'softplus'
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"`activation` must be one of {', '.join(map(repr, ACTIVATIONS))}; got {activation!r}")
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
        raise ValueError(f"`batch_size` must be a positive integer (rows per minibatch) or None (all rows); got {batch_size!r}")
    if not prior_scale > 0:
        raise ValueError(f"`prior_scale` must be positive (the weights' prior standard deviation); got {prior_scale!r}")


def layer_sizes(in_features: int, hidden: Sequence[int], out_features: int) -> tuple[int, ...]:
    """The widths of the network's layers, input and output included.

    >>> layer_sizes(784, (400, 400), 10)
    (784, 400, 400, 10)
    """
    return (int(in_features), *map(int, hidden), int(out_features))


def num_weights(in_features: int, hidden: Sequence[int], out_features: int) -> int:
    """The number ``d`` of weights and biases: the dimension the sampler moves in (FNN-400 on MNIST: 478 410).

    >>> num_weights(784, (400, 400), 10), num_weights(784, (100, 100), 10)
    (478410, 89610)
    """
    sizes = layer_sizes(in_features, hidden, out_features)
    return sum((a + 1) * b for a, b in zip(sizes[:-1], sizes[1:]))


def num_layers(params: Mapping[str, ArrayLike]) -> int:
    """The number of layers of a network's weights ``params`` (``layers.{k}.weight`` sites; either backend)."""
    layers = 0
    while f"layers.{layers}.weight" in params:
        layers += 1
    if layers == 0:
        raise ValueError(f"no site 'layers.0.weight' among {sorted(params)}: not the weights of a models.bnn network")
    return layers


def forward(params: Mapping[str, ArrayLike], X: ArrayLike, activation: str = "relu") -> jax.Array:
    """The network's output ``f(X)`` (logits, or the regression function with one output), ``(..., rows, out)``.

    ``params`` holds ``layers.{l}.weight`` ``(..., out, in)`` and ``layers.{l}.bias`` ``(..., out)``; leading
    dimensions (draws) broadcast, so one call evaluates a batch of draws.

    >>> import jax.numpy as jnp
    >>> params = {"layers.0.weight": jnp.ones((3, 2)), "layers.0.bias": jnp.zeros(3),
    ...           "layers.1.weight": jnp.ones((1, 3)), "layers.1.bias": -jnp.ones(1)}
    >>> forward(params, jnp.array([[1.0, -2.0], [1.0, 1.0]])).tolist()   # relu(-1) = 0, relu(2) = 2
    [[-1.0], [5.0]]
    """
    check_options(activation, None)
    act = ACTIVATIONS[activation]
    h = jnp.asarray(X)
    layers = num_layers(params)
    for layer in range(layers):
        weight, bias = params[f"layers.{layer}.weight"], params[f"layers.{layer}.bias"]
        h = h @ jnp.swapaxes(weight, -1, -2) + jnp.expand_dims(bias, -2)
        if layer < layers - 1:
            h = act(h)
    return h


def _weights(sizes: Sequence[int], prior_scale: float) -> dict[str, jax.Array]:
    """The weight and bias sites of a network with layer widths ``sizes``, each ``N(0, prior_scale²)``."""
    params = {}
    for layer, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        params[f"layers.{layer}.weight"] = numpyro.sample(
            f"layers.{layer}.weight", dist.Normal(0.0, prior_scale).expand([b, a]).to_event(2)
        )
        params[f"layers.{layer}.bias"] = numpyro.sample(
            f"layers.{layer}.bias", dist.Normal(0.0, prior_scale).expand([b]).to_event(1)
        )
    return params


def classifier(
    X: ArrayLike,
    y: ArrayLike | None = None,
    *,
    hidden: Sequence[int] = (100,),
    num_classes: int = 10,
    prior_scale: float = 1.0,
    activation: str = "relu",
    batch_size: int | None = 100,
) -> None:
    """A Bayesian MLP classifier: ``y_i ~ Categorical(logits = f(x_i))`` for the rows ``x_i`` of ``X``, in a plate
    subsampled to ``batch_size`` rows (``None``: all rows, a full-data model), with ``N(0, prior_scale²)``
    priors on the weights of the layers ``X.shape[1] → hidden → num_classes``.

    >>> import jax, jax.numpy as jnp
    >>> from numpyro.handlers import seed, trace
    >>> tr = trace(seed(classifier, 0)).get_trace(jnp.zeros((50, 4)), jnp.zeros(50, int), hidden=(8,),
    ...                                          num_classes=3, batch_size=5)
    >>> [(name, site["value"].shape) for name, site in tr.items() if site["type"] == "sample"]
    [('layers.0.weight', (8, 4)), ('layers.0.bias', (8,)), ('layers.1.weight', (3, 8)), ('layers.1.bias', (3,)), ('y', (5,))]
    """
    check_options(activation, batch_size, prior_scale)
    params = _weights(layer_sizes(X.shape[1], hidden, num_classes), prior_scale)
    size = X.shape[0]
    with numpyro.plate("data", size, subsample_size=None if batch_size is None else min(batch_size, size)):
        Xb = numpyro.subsample(X, event_dim=1)
        yb = numpyro.subsample(y, event_dim=0) if y is not None else None
        numpyro.sample("y", dist.Categorical(logits=forward(params, Xb, activation)), obs=yb)


def regressor(
    X: ArrayLike,
    y: ArrayLike | None = None,
    *,
    hidden: Sequence[int] = (50,),
    prior_scale: float = 1.0,
    activation: str = "relu",
    batch_size: int | None = 50,
) -> None:
    """A Bayesian MLP regression: ``y_i ~ N(f(x_i), 1/precision)`` with ``precision ~ Gamma(6, 6)``
    (:data:`PRECISION_PRIOR`, for a standardised target), in a plate subsampled to ``batch_size`` rows, with
    ``N(0, prior_scale²)`` priors on the weights of the layers ``X.shape[1] → hidden → 1``.

    >>> import jax, jax.numpy as jnp
    >>> from numpyro.handlers import seed, trace
    >>> tr = trace(seed(regressor, 0)).get_trace(jnp.zeros((20, 3)), jnp.zeros(20), hidden=(4,), batch_size=5)
    >>> [(name, site["value"].shape) for name, site in tr.items() if site["type"] == "sample"][-2:]
    [('precision', ()), ('y', (5,))]
    """
    check_options(activation, batch_size, prior_scale)
    params = _weights(layer_sizes(X.shape[1], hidden, 1), prior_scale)
    precision = numpyro.sample("precision", dist.Gamma(*PRECISION_PRIOR))
    size = X.shape[0]
    with numpyro.plate("data", size, subsample_size=None if batch_size is None else min(batch_size, size)):
        Xb = numpyro.subsample(X, event_dim=1)
        yb = numpyro.subsample(y, event_dim=0) if y is not None else None
        numpyro.sample("y", dist.Normal(forward(params, Xb, activation)[..., 0], lax.rsqrt(precision)), obs=yb)


# --- Bayesian model averaging -------------------------------------------------------------------------------
def _class_probabilities(draws: Mapping[str, jax.Array], X: jax.Array, activation: str) -> jax.Array:
    """Per draw, the predictive class probabilities ``softmax(f(x))``: ``(draws, rows, classes)``."""
    return jax.nn.softmax(forward(draws, X, activation), axis=-1)


def _regression_moments(draws: Mapping[str, jax.Array], X: jax.Array, activation: str) -> jax.Array:
    """Per draw, the predictive's first two moments ``(f, f² + 1/precision)``: ``(draws, rows, 2)``."""
    f = forward(draws, X, activation)[..., 0]
    return jnp.stack([f, f * f + 1.0 / draws["precision"][:, None]], axis=-1)


@partial(jax.jit, static_argnames=("statistic", "chunk", "activation"))
def _weighted_sum(
    statistic: Callable[..., jax.Array], draws: dict[str, jax.Array], weights: jax.Array, X: jax.Array, chunk: int,
    activation: str,
) -> jax.Array:  # fmt: skip
    """``Σ_s weights_s statistic(draw_s, X)``, over the draws ``chunk`` at a time (``lax.scan``; the last chunk
    is clamped to the end and its draws already counted get weight 0, so nothing is copied or padded)."""
    count = weights.shape[0]

    def body(total, c):
        start = jnp.minimum(c * chunk, count - chunk)
        part = jax.tree.map(lambda a: lax.dynamic_slice_in_dim(a, start, chunk), draws)
        w = lax.dynamic_slice_in_dim(weights, start, chunk) * (start + jnp.arange(chunk) >= c * chunk)
        return total + jnp.tensordot(w, statistic(part, X, activation), axes=1), None

    shape = jax.eval_shape(lambda: statistic(jax.tree.map(lambda a: a[:chunk], draws), X, activation))
    total = jnp.zeros(shape.shape[1:], shape.dtype)
    return lax.scan(body, total, jnp.arange(-(-count // chunk)))[0]


def _model_average(
    statistic: Callable[..., jax.Array],
    samples: Mapping[str, ArrayLike],
    X: ArrayLike,
    sites: Sequence[str],
    activation: str,
    log_weights: ArrayLike | None,
    max_floats: int,
) -> jax.Array:
    """The (weighted) average over the draws of ``statistic``, over the rows of ``X`` in blocks of
    :data:`ROW_BLOCK` (the last block padded) and the draws in chunks of about ``max_floats`` activations."""
    draws = {name: jnp.asarray(samples[name]) for name in sites}
    count = draws[sites[0]].shape[0]
    if any(a.shape[0] != count for a in draws.values()):
        raise ValueError("every site of `samples` needs the same number of draws (the leading dimension)")
    if log_weights is None:
        weights = jnp.full(count, 1.0 / count)
    else:
        log_weights = jnp.asarray(log_weights)
        if log_weights.shape != (count,):
            raise ValueError(f"`log_weights` has shape {log_weights.shape}; expected ({count},), one per draw")
        weights = jax.nn.softmax(log_weights)
    X = jnp.asarray(X)
    rows = min(X.shape[0], ROW_BLOCK)
    width = max(a.shape[-2] for name, a in draws.items() if name.endswith(".weight"))
    chunk = max(1, min(count, max_floats // (rows * width)))
    padded = jnp.concatenate([X, jnp.zeros((-X.shape[0] % rows, X.shape[1]), X.dtype)])
    blocks = [
        _weighted_sum(statistic, draws, weights, padded[start : start + rows], chunk, activation)
        for start in range(0, X.shape[0], rows)
    ]
    return jnp.concatenate(blocks)[: X.shape[0]]


def _weight_sites(samples: Mapping[str, ArrayLike]) -> list[str]:
    layers = num_layers(samples)
    return [f"layers.{layer}.{kind}" for layer in range(layers) for kind in ("weight", "bias")]


def predict_proba(
    samples: Mapping[str, ArrayLike],
    X: ArrayLike,
    *,
    activation: str = "relu",
    log_weights: ArrayLike | None = None,
    max_floats: int = 2**24,
) -> jax.Array:
    """The posterior predictive class probabilities of :func:`classifier` by Bayesian model averaging,
    ``p(y | x) ≈ Σ_s w_s softmax(f(x; θ_s))``, ``(rows, classes)``.

    :param samples: draws ``{site: (draws, ...)}`` with the weight sites, e.g. ``mcmc.get_samples()``.
    :param X: the rows to predict.
    :param activation: the hidden layers' activation the model was run with.
    :param log_weights: log importance weights of the draws (CSGLD's ``log_weight``, :mod:`ppl_sgmcmc.importance`),
        normalised here; ``None``: equal weights.
    :param max_floats: about the most activations held at once: the rows are taken in blocks of
        :data:`ROW_BLOCK`, the draws in chunks that fit.

    >>> import jax.numpy as jnp
    >>> draws = {"layers.0.weight": jnp.array([[[1.0], [0.0]], [[0.0], [1.0]]]), "layers.0.bias": jnp.zeros((2, 2))}
    >>> predict_proba(draws, jnp.array([[100.0]])).round(3).tolist()   # draw 1 says class 0, draw 2 class 1
    [[0.5, 0.5]]
    """
    return _model_average(_class_probabilities, samples, X, _weight_sites(samples), activation, log_weights,
                          max_floats)  # fmt: skip


def predict_regression(
    samples: Mapping[str, ArrayLike],
    X: ArrayLike,
    *,
    activation: str = "relu",
    log_weights: ArrayLike | None = None,
    max_floats: int = 2**24,
) -> tuple[jax.Array, jax.Array]:
    """The mean and standard deviation of the posterior predictive of :func:`regressor` by Bayesian model
    averaging (a mixture over the draws of ``N(f(x; θ_s), 1/precision_s)``), each ``(rows,)``. The arguments
    are those of :func:`predict_proba`; ``samples`` also needs ``precision``.

    >>> import jax.numpy as jnp
    >>> draws = {"layers.0.weight": jnp.array([[[0.0]], [[0.0]]]), "layers.0.bias": jnp.array([[-1.0], [1.0]]),
    ...          "precision": jnp.array([1.0, 1.0])}
    >>> [v.tolist() for v in predict_regression(draws, jnp.zeros((1, 1)))]   # N(±1, 1): mean 0, variance 2
    [[0.0], [1.414...]]
    """
    moments = _model_average(_regression_moments, samples, X, [*_weight_sites(samples), "precision"], activation,
                             log_weights, max_floats)  # fmt: skip
    mean = moments[:, 0]
    return mean, jnp.sqrt(jnp.maximum(moments[:, 1] - mean * mean, 0.0))
