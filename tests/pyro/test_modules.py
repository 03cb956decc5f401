"""``PyroModule`` networks (``PyroSample`` priors, and ``nn.Module``\\ s converted by ``to_pyro_module_``) under
every kernel's defaults, the refusals of parameters without priors and weights sampled in the plate, and
:func:`ppl_sgmcmc.pyro.batched_predictive`.

Which runs cover "every module kind under every kernel's defaults" (:data:`RUNS`): every kernel on the
``PyroModule`` network, and the converted network on SGNHT and SGFS, not the whole kernel × kind grid (as in
``tests/numpyro/test_modules.py``). The two kinds differ only in how the module becomes a ``PyroModule`` (built
from ``PyroModule[...]`` classes, or an ``nn.Module`` whose classes ``to_pyro_module_`` swaps in place): a
property of the model, which reaches a kernel only through the model's target
(:class:`ppl_sgmcmc.pyro.potential.ModelTarget`: the sites, here of the same names and shapes for both kinds,
and its minibatch potential and gradients). A kernel sees the position as one flat vector, and its rule
(:mod:`ppl_sgmcmc.rules`) moves that vector; no rule reads the sites but SGRLD's positivity check (SGRLD is not
among the kernels here). The model's autograd graph is used in two ways that depend on the kernel: the gradients
(with the mean per-datum score that PSGLD reads) and the start's Hessian (a double backward pass), for every
kernel that adapts its metric (all here but SGFS; SGNHT stands for them), and SGFS's per-datum scores (one batched
backward pass over the minibatch's log-likelihoods, ``ModelTarget.gradient`` with ``with_score="per_example"``).
So SGNHT and SGFS on the converted network run every path its sites take."""

import warnings

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC, Predictive
from pyro.nn import PyroModule, PyroSample
from pyro.nn.module import to_pyro_module_
from torch import nn

import ppl_sgmcmc.pyro as kernels
from ppl_sgmcmc._model_checks import ModelError
from ppl_sgmcmc.pyro import SGNHT, batched_predictive, full_data
from ppl_sgmcmc.pyro import posterior_predictive as predictive_module
from tests.helpers import assert_mc_close, conjugate_posterior, mean_and_mcse, sd_and_mcse

KERNELS = ["SGLD", "SGHMC", "SGNHT", "PSGLD", "CSGLD", "CSGHMC", "SGFS", "ReSGLD", "ReSGHMC"]
# (kernel, network kind): every kernel on the PyroModule network, and the converted one on the metric-adapting
# SGNHT and on SGFS's per-datum scores (the module docstring says why this covers the grid)
RUNS = [(name, "pyromodule") for name in KERNELS] + [(name, "converted") for name in ("SGNHT", "SGFS")]
# the runs whose kernel runs the network eagerly (``compile_potential=False``): each of these kernels' compiled step
# (the one Inductor compile of each, seconds, which is most of such a run's time) is checked against its eager step in
# ``test_compile.py::test_compiled_step_equals_eager`` (SGLD, PSGLD, CSGLD, SGHMC; CSGHMC's step is CSGLD's contour
# weights on SGHMC's momentum), and the network's compiled graphs run here under SGNHT, SGFS (both kinds) and the
# replica-exchange kernels (which share the gradient's graph), and in the conjugate test below (SGNHT)
EAGER_RUNS = {"SGLD", "SGHMC", "PSGLD", "CSGLD", "CSGHMC"}
NOISE = 0.5


def _prior(shape):
    """``N(0, 1)`` over a weight of ``shape``, built when sampled (see models.bnn_pyro)."""
    return PyroSample(lambda module: dist.Normal(0.0, 1.0).expand(list(shape)).to_event(len(shape)))


def _with_priors(module):
    """Every parameter of a converted ``nn.Module`` made a ``PyroSample`` with an ``N(0, 1)`` prior."""
    for part in module.modules():
        for name, value in list(part.named_parameters(recurse=False)):
            setattr(part, name, _prior(tuple(value.shape)))
    return module


class Regression(PyroModule):
    """``y ~ N(f(x), NOISE²)`` for a network ``f`` whose weights are read outside the plate: the plate draws its
    minibatch, the network runs on it outside, and the likelihood enters the same plate again."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, X, y=None):
        data = pyro.plate("data", X.shape[0], subsample_size=min(50, X.shape[0]))
        with data:
            Xb = pyro.subsample(X, event_dim=1)
            yb = pyro.subsample(y, event_dim=0) if y is not None else None
        f = self.net(Xb).squeeze(-1)
        with data:
            pyro.sample("y", dist.Normal(pyro.deterministic("f", f), NOISE), obs=yb)


def _network(kind):
    if kind == "pyromodule":  # PyroModule[nn.Linear] layers with PyroSample weights
        net = PyroModule[nn.Sequential](PyroModule[nn.Linear](2, 4), PyroModule[nn.Tanh](), PyroModule[nn.Linear](4, 1))
        return _with_priors(net)
    if kind == "converted":  # a plain nn.Module converted in place
        net = nn.Sequential(nn.Linear(2, 4), nn.Tanh(), nn.Linear(4, 1))
        to_pyro_module_(net)
        return _with_priors(net)
    if kind == "linear":
        return _with_priors(PyroModule[nn.Linear](2, 1))
    raise AssertionError(kind)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 2)).astype(np.float32)
    y = (X @ np.array([1.0, -0.5]) + 0.3 + NOISE * rng.normal(size=400)).astype(np.float32)
    return torch.from_numpy(X), torch.from_numpy(y)


# the network runs on one pytest-xdist worker (`--dist loadgroup`): the kernels' compiled graphs of the network (the
# gradient, shared by every kernel but those of `EAGER_RUNS`; SGFS's per-datum scores and step, shared by both kinds,
# whose graphs are the same) are compiled once in a process (the memo of `ppl_sgmcmc.pyro.compile`), not once per
# worker (SGFS's: seconds)
on_networks = pytest.mark.xdist_group("pyro_modules_networks")


@pytest.mark.slow
@on_networks
@pytest.mark.parametrize(("name", "kind"), RUNS)
def test_network_runs_with_defaults(name, kind, data):
    """The kernel runs the network with its defaults (no step size): finite draws of every weight site with its
    shape, every coordinate moving (not stuck at its start), and finite predictions. The sizes are the least the
    defaults allow (a warm-up of 200 steps) and 10 draws, as this checks that the run works, not what it samples
    (the conjugate test below does): a kernel rejects a step that is not finite (the chain stays where it was), so
    more draws would not make a non-finite draw likelier, and fewer draws make "every coordinate moving" harder to
    pass, not easier (an eager step of the network costs about 15 ms). The kernels of :data:`EAGER_RUNS` run the
    model eagerly (the defaults but ``compile_potential``): what this checks is their defaults' tuning on a network,
    not their compiled steps."""
    X, y = data
    model = Regression(_network(kind))
    kernel = getattr(kernels, name)(model, **({"compile_potential": False} if name in EAGER_RUNS else {}))
    mcmc = MCMC(kernel, warmup_steps=200, num_samples=10, disable_progbar=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # a short run's verdict and noise warnings
        mcmc.run(X, y)
    samples = mcmc.get_samples()
    params = {site: value for site, value in samples.items() if site.startswith("net.")}
    assert len(params) == 4 and all(value.dim() >= 2 for value in params.values())
    assert all(bool(torch.isfinite(value).all()) for value in samples.values())
    assert all(bool((value.amax(0) > value.amin(0)).all()) for value in params.values())
    out = batched_predictive(model, params, X[:30], return_sites=["f"], batch_rows=16)
    assert out.mean["f"].shape == (30,) and np.isfinite(out.sd["f"]).all()


@pytest.mark.slow
def test_linear_network_predictive_matches_conjugate(data):
    """A ``PyroModule[nn.Linear](2, 1)`` with ``N(0, 1)`` priors and a Gaussian likelihood is a Bayesian linear
    regression: SGNHT's defaults give the exact predictive mean and sd of ``f(x)`` at test inputs, in and
    outside the data, within Monte Carlo error.

    The warm-up is the least the defaults allow (200 steps; the chain starts at the mode, the defaults' start): the
    tolerances are the Monte Carlo errors of the 4000 kept draws, which a shorter warm-up does not change (it could only
    leave more burn-in or a less adapted step, which would fail the test). ``f`` at the test inputs is the network's
    output ``X_test wᵀ + b`` for each draw; :func:`batched_predictive` gives it exactly, in blocks of draws (checked on
    every eighth draw, 500 draws in 8 blocks, the last one partial, as the 4000 draws in blocks of 512 would be: each
    draw is one eager run of the model, about 1.5 ms, 6 s for all draws)."""
    X, y = data
    model = Regression(_network("linear"))
    mcmc = MCMC(SGNHT(model), warmup_steps=200, num_samples=4000, disable_progbar=True)
    mcmc.run(X, y)
    samples = mcmc.get_samples(group_by_chain=True)
    params = {name: value.reshape((-1,) + value.shape[2:]) for name, value in samples.items() if name != "f"}
    X_test = torch.tensor([[0.0, 0.0], [1.0, -1.0], [3.0, 3.0], [-4.0, 2.0]])  # the last two outside the data
    f = (params["net.weight"][:, 0, :] @ X_test.T + params["net.bias"]).numpy()  # (draws, 4)
    every_eighth = {name: value[::8] for name, value in params.items()}
    predictive = batched_predictive(model, every_eighth, X_test, return_sites=["f"], batch_draws=64, summary=False)
    np.testing.assert_allclose(predictive["f"], f[::8], rtol=1e-6, atol=1e-6)
    f = f.reshape(1, -1, 4)
    mu, cov = conjugate_posterior(np.hstack([X.numpy(), np.ones((X.shape[0], 1))]), y.numpy(), NOISE, 1.0)
    features = np.hstack([X_test.numpy(), np.ones((4, 1))])
    mean, mean_mcse = mean_and_mcse(f)
    sd, sd_mcse = sd_and_mcse(f)
    assert_mc_close("predictive mean", mean, features @ mu, mean_mcse)
    assert_mc_close("predictive sd", sd, np.sqrt(np.einsum("ij,jk,ik->i", features, cov, features)), sd_mcse)


def _draws(model, num_draws, squeeze=True):
    """Prior draws of the network's weights (the latent sites), ``{site: (num_draws, ...)}``, shaped as
    ``mcmc.get_samples()`` shapes them, or (``squeeze=False``) as ``Predictive`` does, with the model's plate
    dimension left of a global site (what a model batched over the draws by ``parallel=True`` broadcasts)."""
    prior = Predictive(full_data(model), num_samples=num_draws)(torch.zeros(3, 2))
    return {name: value.squeeze(1) if squeeze else value for name, value in prior.items() if name.startswith("net.")}


@pytest.mark.parametrize("kind", ["pyromodule", "converted"])
def test_batched_predictive_equals_predictive(kind):
    """The per-draw values equal ``pyro.infer.Predictive`` on the full-data model: the network's output
    whatever the blocks, and the observed site's draws (same seed) when everything fits one block."""
    model = Regression(_network(kind))
    X = torch.randn(23, 2)
    params = _draws(model, 11)
    pyro.set_rng_seed(1)
    expected = Predictive(full_data(model), params, return_sites=["f", "y"])(X)
    blocked = batched_predictive(model, params, X, batch_draws=4, batch_rows=5, summary=False)
    np.testing.assert_allclose(blocked["f"], expected["f"].numpy(), atol=1e-5)
    pyro.set_rng_seed(1)
    one_block = batched_predictive(model, params, X, return_sites=["f", "y"], summary=False)
    np.testing.assert_allclose(one_block["y"], expected["y"].numpy(), atol=1e-5)
    summary = batched_predictive(model, params, X, return_sites=["f"], batch_draws=3, batch_rows=7)
    np.testing.assert_allclose(summary.mean["f"], expected["f"].mean(0).numpy(), atol=1e-5)
    np.testing.assert_allclose(summary.sd["f"], expected["f"].std(0, unbiased=False).numpy(), atol=1e-5)


def test_batched_predictive_memory_is_bounded(monkeypatch):
    """The largest array evaluated is one block, ``batch_draws × batch_rows``, whatever the draws and rows (with
    ``parallel=True``: one batched run of a block's draws)."""
    shapes = []

    class Recording(Predictive):
        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            shapes.extend(tuple(value.shape) for value in out.values())
            return out

    monkeypatch.setattr(predictive_module, "Predictive", Recording)

    class Broadcasting(PyroModule):  # f = X w + b, batched over a leading draws dimension
        def forward(self, X, y=None):
            w = pyro.sample("net.w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
            b = pyro.sample("net.b", dist.Normal(0.0, 1.0))
            with pyro.plate("data", X.shape[0], subsample_size=min(50, X.shape[0])):
                Xb = pyro.subsample(X, event_dim=1)
                f = pyro.deterministic("f", (Xb * w).sum(-1) + b)
                pyro.sample("y", dist.Normal(f, NOISE), obs=y)

    model = Broadcasting()
    out = batched_predictive(model, _draws(model, 37, squeeze=False), torch.randn(103, 2), batch_draws=8, batch_rows=16,
                             parallel=True)  # fmt: skip
    assert out.mean["f"].shape == out.sd["y"].shape == (103,)
    # 2 sites, 5 × 7 blocks of at most 8 draws × 16 rows (the last block of draws holds 5)
    assert len(shapes) == 2 * 5 * 7 and set(shapes) == {(8, 16), (5, 16)}


def test_batched_predictive_refuses_bad_input():
    model = Regression(_network("pyromodule"))
    params = _draws(model, 3)
    with pytest.raises(ValueError, match="`batch_draws` must be a positive integer"):
        batched_predictive(model, params, torch.zeros(5, 2), batch_draws=-1)
    with pytest.raises(ValueError, match="same leading size"):
        batched_predictive(model, params, torch.zeros(5, 2), torch.zeros(4))


def test_parameters_without_prior_are_refused(data):
    """A ``PyroModule``'s parameter that is not a ``PyroSample`` is a ``pyro.param``: it would stay at its
    initial value, so it is refused, naming the site and the fix."""
    X, y = data
    net = nn.Sequential(nn.Linear(2, 4), nn.Tanh(), nn.Linear(4, 1))
    to_pyro_module_(net)  # parameters left as they are
    with pytest.raises(ModelError, match="site 'net.0.weight' is a `pyro.param`.*PyroSample"):
        SGNHT(Regression(net)).setup(0, X, y)


def test_weights_sampled_in_the_plate_are_refused(data):
    """A ``PyroSample`` weight first read inside the subsampled plate gets the plate's batch dimension: refused
    as a local latent, with the fix for modules."""
    X, y = data

    class InPlate(PyroModule):
        def __init__(self):
            super().__init__()
            self.net = _network("pyromodule")

        def forward(self, X, y=None):
            with pyro.plate("data", X.shape[0], subsample_size=50):
                Xb = pyro.subsample(X, event_dim=1)
                yb = pyro.subsample(y, event_dim=0) if y is not None else None
                pyro.sample("y", dist.Normal(self.net(Xb).squeeze(-1), NOISE), obs=yb)

    with pytest.raises(NotImplementedError, match="'net.0.weight' lies inside the subsampled plate 'data'.*PyroSample"):
        SGNHT(InPlate()).setup(0, X, y)
