"""Bayesian multilayer perceptrons declared as Pyro models (``pyro.nn.PyroModule`` with ``PyroSample`` priors),
and their predictions by Bayesian model averaging: the twin of :mod:`models.bnn` (NumPyro), with the same
sites, priors, plate and predictions, sampled by the kernels of :mod:`ppl_sgmcmc.pyro`::

    model = BNNClassifier(784, hidden=(100, 100), num_classes=10, batch_size=100)
    mcmc = MCMC(SGNHT(model, step_size=1e-4, steps_per_sample=600), warmup_steps=10, num_samples=30)
    mcmc.run(X, y)
    probabilities = predict_proba(mcmc.get_samples(), X_test)          # (N_test, 10)

The network is the Pyro tutorials' Bayesian network: ``PyroModule[nn.Linear]`` layers whose ``weight`` and
``bias`` are ``PyroSample``\\ s of ``N(0, prior_scale²)``, so the sites are ``layers.{l}.weight`` ``(out, in)``
and ``layers.{l}.bias`` ``(out,)``, as in :mod:`models.bnn`. The module's ``forward(X, y=None)`` is the model:
the likelihood in a plate over the rows of ``X``, subsampled to ``batch_size`` rows. See :mod:`models.bnn` for
the models' equations and the papers they come from.

``nn.Linear`` takes one draw of the weights at a time, so the model average, :func:`predict_proba` and
:func:`predict_regression`, evaluates the network from the draws with :func:`forward` (batched matrix
products over a chunk of draws), not through the module. The models declare no deterministic site (see
:mod:`models.bnn`, "Memory").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import pyro
import pyro.distributions as dist
import torch
from pyro.nn import PyroModule, PyroSample
from torch import nn

from models.bnn import PRECISION_PRIOR, ROW_BLOCK, check_options, layer_sizes, num_layers

__all__ = ["ACTIVATIONS", "BNNClassifier", "BNNRegressor", "BayesianMLP", "forward", "predict_proba",
           "predict_regression"]  # fmt: skip

#: The hidden layers' activations, by name (as in :mod:`models.bnn`).
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"relu": torch.relu, "tanh": torch.tanh,
                                                                    "sigmoid": torch.sigmoid}  # fmt: skip


def _normal_prior(scale: float, shape: tuple[int, ...]) -> Callable[[PyroModule], dist.Distribution]:
    """The prior ``N(0, scale²)`` over a weight of ``shape``, built when the site is sampled: a distribution built
    once in ``__init__`` would keep the validation setting of that moment, and its argument checks (a branch on
    the weights' values) would stop ``ppl_sgmcmc.pyro`` from tracing the potential into a compiled graph."""
    return lambda module: dist.Normal(0.0, scale).expand(list(shape)).to_event(len(shape))


class BayesianMLP(PyroModule):
    """The network ``f``'s weights: ``PyroModule[nn.Linear]`` layers of widths ``in_features → hidden →
    out_features`` whose weights and biases are ``PyroSample``\\ s of ``N(0, prior_scale²)``, the named
    ``activation`` between them. :meth:`weights` draws them (one draw per call of the enclosing module: a
    ``PyroModule`` caches its samples for the call), :meth:`forward` evaluates the network.

    >>> import torch
    >>> from pyro import poutine
    >>> net = BayesianMLP(4, (8,), 3)
    >>> tr = poutine.trace(net).get_trace(torch.zeros(5, 4))
    >>> [(name, tuple(site["value"].shape)) for name, site in tr.nodes.items() if site["type"] == "sample"]
    [('layers.0.weight', (8, 4)), ('layers.0.bias', (8,)), ('layers.1.weight', (3, 8)), ('layers.1.bias', (3,))]
    """

    def __init__(self, in_features: int, hidden: Sequence[int], out_features: int, prior_scale: float = 1.0,
                 activation: str = "relu") -> None:  # fmt: skip
        super().__init__()
        check_options(activation, None, prior_scale)
        sizes = layer_sizes(in_features, hidden, out_features)
        self.activation = activation
        self.layers = PyroModule[nn.ModuleList]([PyroModule[nn.Linear](a, b) for a, b in zip(sizes[:-1], sizes[1:])])
        for layer, (a, b) in zip(self.layers, zip(sizes[:-1], sizes[1:])):
            layer.weight = PyroSample(_normal_prior(prior_scale, (b, a)))
            layer.bias = PyroSample(_normal_prior(prior_scale, (b,)))

    def weights(self) -> dict[str, torch.Tensor]:
        """The weight and bias sites, ``{"layers.{l}.weight": (out, in), "layers.{l}.bias": (out,)}``. Call it
        outside the data plate: sampled inside, a weight would get the plate's batch dimension."""
        params = {}
        for index, layer in enumerate(self.layers):
            params[f"layers.{index}.weight"] = layer.weight
            params[f"layers.{index}.bias"] = layer.bias
        return params

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        """The network's output for the rows of ``X``, ``(rows, out_features)``, for one draw of the weights."""
        return forward(self.weights(), X, self.activation)


class BNNClassifier(BayesianMLP):
    """A Bayesian MLP classifier (:func:`models.bnn.classifier` in Pyro): ``y_i ~ Categorical(logits = f(x_i))``
    in a plate subsampled to ``batch_size`` rows (``None``: all rows). Its sites are those of
    :class:`BayesianMLP` and ``y``.

    >>> import torch
    >>> from pyro import poutine
    >>> model = BNNClassifier(4, hidden=(8,), num_classes=3, batch_size=5)
    >>> tr = poutine.trace(model).get_trace(torch.zeros(50, 4), torch.zeros(50))
    >>> [(name, tuple(site["value"].shape)) for name, site in tr.nodes.items() if site["type"] == "sample"][-3:]
    [('layers.1.bias', (3,)), ('data', (5,)), ('y', (5,))]
    """

    def __init__(self, in_features: int, hidden: Sequence[int] = (100,), num_classes: int = 10,
                 prior_scale: float = 1.0, activation: str = "relu", batch_size: int | None = 100) -> None:  # fmt: skip
        super().__init__(in_features, hidden, num_classes, prior_scale, activation)
        check_options(activation, batch_size)
        self.batch_size = batch_size

    def forward(self, X: torch.Tensor, y: torch.Tensor | None = None) -> None:  # type: ignore[override]
        """The model: the weights' priors and the subsampled likelihood of the rows of ``(X, y)``."""
        params = self.weights()
        size = X.shape[0]
        with pyro.plate("data", size, subsample_size=None if self.batch_size is None else min(self.batch_size, size)):
            Xb = pyro.subsample(X, event_dim=1)
            yb = pyro.subsample(y, event_dim=0) if y is not None else None
            pyro.sample("y", dist.Categorical(logits=forward(params, Xb, self.activation)), obs=yb)


class BNNRegressor(BayesianMLP):
    """A Bayesian MLP regression (:func:`models.bnn.regressor` in Pyro): ``y_i ~ N(f(x_i), 1/precision)`` with
    ``precision ~ Gamma(6, 6)``, in a plate subsampled to ``batch_size`` rows.

    >>> import torch
    >>> from pyro import poutine
    >>> model = BNNRegressor(3, hidden=(4,), batch_size=5)
    >>> tr = poutine.trace(model).get_trace(torch.zeros(20, 3), torch.zeros(20))
    >>> [(name, tuple(site["value"].shape)) for name, site in tr.nodes.items() if site["type"] == "sample"][-3:]
    [('precision', ()), ('data', (5,)), ('y', (5,))]
    """

    def __init__(self, in_features: int, hidden: Sequence[int] = (50,), prior_scale: float = 1.0,
                 activation: str = "relu", batch_size: int | None = 50) -> None:  # fmt: skip
        super().__init__(in_features, hidden, 1, prior_scale, activation)
        check_options(activation, batch_size)
        self.batch_size = batch_size

    def forward(self, X: torch.Tensor, y: torch.Tensor | None = None) -> None:  # type: ignore[override]
        """The model: the priors and the subsampled likelihood of the rows of ``(X, y)``."""
        params = self.weights()
        precision = pyro.sample("precision", dist.Gamma(*PRECISION_PRIOR))
        size = X.shape[0]
        with pyro.plate("data", size, subsample_size=None if self.batch_size is None else min(self.batch_size, size)):
            Xb = pyro.subsample(X, event_dim=1)
            yb = pyro.subsample(y, event_dim=0) if y is not None else None
            pyro.sample("y", dist.Normal(forward(params, Xb, self.activation)[..., 0], precision.rsqrt()), obs=yb)


# --- Bayesian model averaging -------------------------------------------------------------------------------
def forward(params: Mapping[str, torch.Tensor], X: torch.Tensor, activation: str = "relu") -> torch.Tensor:
    """The network's output from its weights (:func:`models.bnn.forward` in torch): ``params`` holds
    ``layers.{l}.weight`` ``(..., out, in)`` and ``layers.{l}.bias`` ``(..., out)``, whose leading dimensions
    (draws) broadcast; returns ``(..., rows, out)``.

    >>> import torch
    >>> params = {"layers.0.weight": torch.ones(3, 2), "layers.0.bias": torch.zeros(3),
    ...           "layers.1.weight": torch.ones(1, 3), "layers.1.bias": -torch.ones(1)}
    >>> forward(params, torch.tensor([[1.0, -2.0], [1.0, 1.0]])).tolist()
    [[-1.0], [5.0]]
    """
    check_options(activation, None)
    act = ACTIVATIONS[activation]
    layers = num_layers(params)
    h = X
    for layer in range(layers):
        h = h @ params[f"layers.{layer}.weight"].transpose(-1, -2) + params[f"layers.{layer}.bias"].unsqueeze(-2)
        if layer < layers - 1:
            h = act(h)
    return h


def _model_average(
    statistic: Callable[[dict[str, torch.Tensor], torch.Tensor], torch.Tensor],
    samples: Mapping[str, torch.Tensor],
    X: torch.Tensor,
    sites: Sequence[str],
    log_weights: torch.Tensor | None,
    max_floats: int,
) -> torch.Tensor:
    """``Σ_s w_s statistic(draw_s, x)`` for the rows of ``X`` in blocks of :data:`~models.bnn.ROW_BLOCK` and the
    draws in chunks of about ``max_floats`` activations (views of ``samples``: nothing is copied)."""
    draws = {name: torch.as_tensor(samples[name]) for name in sites}
    count = draws[sites[0]].shape[0]
    if any(a.shape[0] != count for a in draws.values()):
        raise ValueError("every site of `samples` needs the same number of draws (the leading dimension)")
    if log_weights is None:
        weights = torch.full((count,), 1.0 / count)
    else:
        log_weights = torch.as_tensor(log_weights)
        if tuple(log_weights.shape) != (count,):
            raise ValueError(f"`log_weights` has shape {tuple(log_weights.shape)}; expected ({count},), one per draw")
        weights = torch.softmax(log_weights.to(torch.get_default_dtype()), 0)
    X = torch.as_tensor(X)
    rows = min(X.shape[0], ROW_BLOCK)
    width = max(a.shape[-2] for name, a in draws.items() if name.endswith(".weight"))
    chunk = max(1, min(count, max_floats // (rows * width)))
    blocks = []
    with torch.no_grad():
        for start in range(0, X.shape[0], rows):
            block = X[start : start + rows]
            total = None
            for first in range(0, count, chunk):
                part = {name: a[first : first + chunk] for name, a in draws.items()}
                term = torch.tensordot(weights[first : first + chunk].to(block.dtype), statistic(part, block), dims=1)
                total = term if total is None else total + term
            blocks.append(total)
    return torch.cat(blocks)


def predict_proba(
    samples: Mapping[str, torch.Tensor],
    X: torch.Tensor,
    *,
    activation: str = "relu",
    log_weights: torch.Tensor | None = None,
    max_floats: int = 2**24,
) -> torch.Tensor:
    """The posterior predictive class probabilities of :class:`BNNClassifier` by Bayesian model averaging,
    ``Σ_s w_s softmax(f(x; θ_s))``, ``(rows, classes)``; the arguments are those of
    :func:`models.bnn.predict_proba` (``samples``: e.g. ``mcmc.get_samples()``).

    >>> import torch
    >>> draws = {"layers.0.weight": torch.tensor([[[1.0], [0.0]], [[0.0], [1.0]]]), "layers.0.bias": torch.zeros(2, 2)}
    >>> predict_proba(draws, torch.tensor([[100.0]])).tolist()
    [[0.5, 0.5]]
    """
    sites = [f"layers.{layer}.{kind}" for layer in range(num_layers(samples)) for kind in ("weight", "bias")]

    def probabilities(draws: dict[str, torch.Tensor], block: torch.Tensor) -> torch.Tensor:
        return torch.softmax(forward(draws, block, activation), -1)

    return _model_average(probabilities, samples, X, sites, log_weights, max_floats)


def predict_regression(
    samples: Mapping[str, torch.Tensor],
    X: torch.Tensor,
    *,
    activation: str = "relu",
    log_weights: torch.Tensor | None = None,
    max_floats: int = 2**24,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean and standard deviation of the posterior predictive of :class:`BNNRegressor` by Bayesian model
    averaging, each ``(rows,)`` (see :func:`models.bnn.predict_regression`).

    >>> import torch
    >>> draws = {"layers.0.weight": torch.zeros(2, 1, 1), "layers.0.bias": torch.tensor([[-1.0], [1.0]]),
    ...          "precision": torch.ones(2)}
    >>> [round(v.item(), 4) for v in predict_regression(draws, torch.zeros(1, 1))]
    [0.0, 1.4142]
    """
    sites = [f"layers.{layer}.{kind}" for layer in range(num_layers(samples)) for kind in ("weight", "bias")]

    def moments(draws: dict[str, torch.Tensor], block: torch.Tensor) -> torch.Tensor:
        f = forward(draws, block, activation)[..., 0]
        return torch.stack([f, f * f + 1.0 / draws["precision"].unsqueeze(-1)], -1)

    total = _model_average(moments, samples, X, [*sites, "precision"], log_weights, max_floats)
    mean = total[:, 0]
    return mean, (total[:, 1] - mean * mean).clamp(min=0.0).sqrt()
