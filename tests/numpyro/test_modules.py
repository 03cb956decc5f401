"""Network modules as models (``numpyro.contrib.module``: flax linen, flax nnx, equinox) under every kernel's
defaults, the refusals of what a potential cannot carry, and :func:`ppl_sgmcmc.numpyro.batched_predictive`.

Which runs cover "every module kind under every kernel's defaults" (:data:`RUNS`): every kernel on the linen
network, and the nnx and equinox networks on SGNHT and SGFS, not the whole kernel × kind grid. What differs between
module kinds is how the module's parameters become sample sites (``random_flax_module``, ``random_nnx_module``,
``random_eqx_module``): a property of the model, which reaches a kernel only through the model's target
(:class:`ppl_sgmcmc.numpyro.potential.ModelTarget`: its latent sites, their shapes and supports, its minibatch
potential and gradient). A kernel sees the position as one flat vector (``ravel_pytree`` in the kernel's start), and
its rule (:mod:`ppl_sgmcmc.rules`) moves that vector; no rule reads the sites but SGRLD's positivity check (SGRLD
is not among the kernels here). The model itself is transformed in exactly two ways that depend on the kernel:

* every kernel that adapts its metric (all here but SGFS) computes the Hessian at the start by
  forward-over-reverse differentiation of the minibatch gradient (``warmup.hessian`` and ``warmup.newton``, the
  exact Hessian up to ``EXACT_HESSIAN_MAX`` = 1000 coordinates), besides the minibatch gradients of
  ``find_mode``, the noise probe and the steps, which every kernel takes alike (``ModelTarget.gradient``: the
  energy, its gradient and the mean per-datum score that PSGLD reads; the replica and contour kernels call it at
  more points or read its energy);
* SGFS adapts no metric and reads per-datum scores: the model traced with its plate holding one index, under
  ``jax.vmap`` over the minibatch (``ModelTarget.per_example``).

So SGNHT (the first) and SGFS (the second) on each module kind run every path a module's sites take, and every
kernel on one kind runs every kernel's own code. The models are built once per kind (:func:`_model`): the
initial-value search's compiled program is kept per model object (``ModelTarget._search_key``), so the kernels
share it."""

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import MCMC, Predictive

from ppl_sgmcmc._model_checks import ModelError
from ppl_sgmcmc.numpyro import SGNHT, batched_predictive, full_data
from ppl_sgmcmc.numpyro import posterior_predictive as predictive_module
from tests.helpers import assert_mc_close, conjugate_posterior, mean_and_mcse, sd_and_mcse

flax = pytest.importorskip("flax")
eqx = pytest.importorskip("equinox")
import flax.linen as nn  # noqa: E402
from flax import nnx  # noqa: E402
from numpyro.contrib.module import flax_module, random_eqx_module, random_flax_module, random_nnx_module  # noqa: E402

# the kernels whose defaults (no step size) apply to a network: SGRLD moves simplex-like latents, Santa is an
# annealed optimiser without a tuned step, and the complete recipe needs its D
KERNELS = ["SGLD", "SGHMC", "SGNHT", "PSGLD", "CSGLD", "CSGHMC", "SGFS", "ReSGLD", "ReSGHMC"]
# (kernel, module kind): every kernel on linen, and the other kinds on the metric-adapting SGNHT and on SGFS's
# per-datum scores (the module docstring says why this covers the grid)
RUNS = [(name, "linen") for name in KERNELS] + [(name, kind) for kind in ("nnx", "eqx") for name in ("SGNHT", "SGFS")]
NOISE = 0.5


class _Linen(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(1)(jnp.tanh(nn.Dense(4)(x)))[..., 0]


class _Nnx(nnx.Module):
    def __init__(self, *, rngs):
        self.hidden = nnx.Linear(2, 4, rngs=rngs)
        self.out = nnx.Linear(4, 1, rngs=rngs)

    def __call__(self, x):
        return self.out(jnp.tanh(self.hidden(x)))[..., 0]


def _network(kind):
    """The network ``x -> f(x)`` with ``N(0, 1)`` priors on every parameter, declared outside the plate."""
    prior = dist.Normal(0.0, 1.0)
    if kind == "linen":
        return random_flax_module("net", _Linen(), prior, input_shape=(1, 2))
    if kind == "nnx":
        return random_nnx_module("net", _Nnx(rngs=nnx.Rngs(0)), prior)
    if kind == "eqx":
        mlp = eqx.nn.MLP(2, "scalar", 4, 1, activation=jnp.tanh, key=jax.random.PRNGKey(0))
        return jax.vmap(random_eqx_module("net", mlp, prior))
    if kind == "linear":  # no hidden layer: Bayesian linear regression
        dense = random_flax_module("net", nn.Dense(1), prior, input_shape=(1, 2))
        return lambda x: dense(x)[..., 0]
    raise AssertionError(kind)


def regression(kind, X, y=None):
    net = _network(kind)
    with numpyro.plate("data", X.shape[0], subsample_size=50):
        Xb = numpyro.subsample(X, event_dim=1)
        yb = numpyro.subsample(y, event_dim=0) if y is not None else None
        numpyro.sample("y", dist.Normal(numpyro.deterministic("f", net(Xb)), NOISE), obs=yb)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 2)).astype(np.float32)
    y = (X @ np.array([1.0, -0.5]) + 0.3 + NOISE * rng.normal(size=400)).astype(np.float32)
    return jnp.asarray(X), jnp.asarray(y)


@functools.cache
def _model(kind):
    """The regression on the ``kind`` network, one function per kind (the kernels share its compiled search)."""

    def model(X, y=None):
        regression(kind, X, y)

    return model


@pytest.mark.slow
@pytest.mark.parametrize(("name", "kind"), RUNS)
def test_network_runs_with_defaults(name, kind, data):
    """The kernel runs the network with its defaults (no step size): finite draws of every parameter site, with
    the module's event shapes, every coordinate moving (not stuck at its start), and finite predictions. The
    sizes are the least the defaults allow (a warm-up of 200 steps: windows of at least 10 steps) and 50 draws,
    as this checks that the run works, not what it samples (the conjugate test below does)."""
    import ppl_sgmcmc.numpyro as kernels

    X, y = data
    mcmc = MCMC(getattr(kernels, name)(_model(kind)), num_warmup=200, num_samples=50, progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # a short run's verdict and noise warnings
        mcmc.run(jax.random.PRNGKey(0), X, y)
    samples = mcmc.get_samples()
    params = {name: value for name, value in samples.items() if name.startswith("net/")}
    assert len(params) == 4 and all(value.ndim >= 2 for value in params.values())
    assert all(bool(jnp.isfinite(value).all()) for value in samples.values())
    assert all(bool((jnp.ptp(value, axis=0) > 0).all()) for value in params.values())
    out = batched_predictive(_model(kind), params, jax.random.PRNGKey(1), X[:30], return_sites=["f"], batch_rows=16)
    assert out.mean["f"].shape == (30,) and np.isfinite(out.sd["f"]).all()


@pytest.mark.slow
def test_linear_network_predictive_matches_conjugate(data):
    """A flax ``Dense(1)`` with ``N(0, 1)`` priors and a Gaussian likelihood is a Bayesian linear regression:
    SGNHT's defaults give the exact predictive mean and sd of ``f(x)`` at test inputs, in and outside the
    data, within Monte Carlo error."""
    X, y = data
    mcmc = MCMC(SGNHT(_model("linear")), num_warmup=1000, num_samples=3000, num_chains=2, chain_method="vectorized",
                progress_bar=False)  # fmt: skip
    mcmc.run(jax.random.PRNGKey(0), X, y)
    samples = mcmc.get_samples(group_by_chain=True)
    params = {name: value.reshape((-1,) + value.shape[2:]) for name, value in samples.items() if name != "f"}
    X_test = jnp.array([[0.0, 0.0], [1.0, -1.0], [3.0, 3.0], [-4.0, 2.0]])  # the last two outside the data
    f = batched_predictive(_model("linear"), params, jax.random.PRNGKey(1), X_test, return_sites=["f"],
                           batch_draws=512, summary=False)["f"].reshape(2, -1, 4)  # fmt: skip
    mu, cov = conjugate_posterior(np.hstack([X, np.ones((X.shape[0], 1))]), y, NOISE, 1.0)
    features = np.hstack([np.asarray(X_test), np.ones((4, 1))])
    mean, mean_mcse = mean_and_mcse(f)
    sd, sd_mcse = sd_and_mcse(f)
    assert_mc_close("predictive mean", mean, features @ mu, mean_mcse)
    assert_mc_close("predictive sd", sd, np.sqrt(np.einsum("ij,jk,ik->i", features, cov, features)), sd_mcse)


# the most prior draws a test takes (`test_batched_predictive_memory_is_bounded`)
_PRIOR_DRAWS = 37


@functools.cache
def _prior(kind):
    """:data:`_PRIOR_DRAWS` prior draws of the network's parameters (the latent sites), ``{site: (draws, ...)}``: one
    compiled ``Predictive`` per kind, which the tests below take their draws from (:func:`_draws`)."""
    prior = Predictive(full_data(_model(kind)), num_samples=_PRIOR_DRAWS)(jax.random.PRNGKey(0), jnp.zeros((3, 2)))
    return {name: value for name, value in prior.items() if name.startswith("net/")}


def _draws(kind, num_draws):
    """The first ``num_draws`` prior draws of the network's parameters, ``{site: (num_draws, ...)}``: any draws serve
    the tests below, which compare two evaluations at the same draws or check shapes and refusals."""
    return {name: value[:num_draws] for name, value in _prior(kind).items()}


# the tests that take prior draws run on one pytest-xdist worker (`--dist loadgroup`), which draws them once per kind
on_prior_draws = pytest.mark.xdist_group("numpyro_modules_prior_draws")


@on_prior_draws
@pytest.mark.parametrize("kind", ["linen", pytest.param("eqx", marks=pytest.mark.slow)])
def test_batched_predictive_equals_predictive(kind):
    """The per-draw values equal ``numpyro.infer.Predictive`` on the full-data model: the network's output
    whatever the blocks, and the observed site's draws when the rows fit one block."""
    X = jax.random.normal(jax.random.PRNGKey(3), (23, 2))
    params = _draws(kind, 11)
    key = jax.random.PRNGKey(4)
    expected = Predictive(full_data(_model(kind)), params)(key, X)
    blocked = batched_predictive(_model(kind), params, key, X, batch_draws=4, batch_rows=5, summary=False)
    np.testing.assert_allclose(blocked["f"], expected["f"], atol=1e-5)
    one_block = batched_predictive(_model(kind), params, key, X, batch_draws=4, batch_rows=23, summary=False)
    np.testing.assert_allclose(one_block["y"], expected["y"], atol=1e-5)
    # the summary merged over the same ragged blocks (4 + 4 + 3 draws, 4 × 5 + 3 rows) as `blocked`: their slices
    # of the draws and rows are compiled once
    summary = batched_predictive(_model(kind), params, key, X, return_sites=["f"], batch_draws=4, batch_rows=5)
    np.testing.assert_allclose(summary.mean["f"], expected["f"].mean(0), atol=1e-5)
    np.testing.assert_allclose(summary.sd["f"], expected["f"].std(0), atol=1e-5)


@on_prior_draws
def test_batched_predictive_memory_is_bounded(monkeypatch):
    """The largest array evaluated is one block, ``batch_draws × batch_rows``, whatever the draws and rows."""
    shapes = []
    program = predictive_module.block_program

    def recording(*args, **kwargs):
        run = program(*args, **kwargs)

        def wrapped(*inputs):
            out = run(*inputs)
            shapes.extend(tuple(value.shape) for value in out.values())
            return out

        return wrapped

    monkeypatch.setattr(predictive_module, "block_program", recording)
    X = jax.random.normal(jax.random.PRNGKey(3), (103, 2))
    out = batched_predictive(_model("linen"), _draws("linen", 37), jax.random.PRNGKey(0), X, batch_draws=8,
                             batch_rows=16)  # fmt: skip
    assert out.mean["f"].shape == out.sd["y"].shape == (103,)
    assert len(shapes) == 2 * 5 * 7 and set(shapes) == {(8, 16)}  # 2 sites, 5 × 7 blocks of 8 draws × 16 rows


@on_prior_draws
def test_batched_predictive_refuses_bad_input():
    params = _draws("linen", 3)
    X = jnp.zeros((5, 2))
    with pytest.raises(ValueError, match="`batch_rows` must be a positive integer"):
        batched_predictive(_model("linen"), params, jax.random.PRNGKey(0), X, batch_rows=0)
    with pytest.raises(ValueError, match="same leading size"):
        batched_predictive(_model("linen"), params, jax.random.PRNGKey(0), X, jnp.zeros(4))

    def with_global(X, y=None):
        numpyro.deterministic("w2", jnp.ones(3))
        regression("linen", X, y)

    with pytest.raises(ValueError, match="site 'w2' has the shape \\(3,\\) per draw, not one value per row"):
        batched_predictive(with_global, params, jax.random.PRNGKey(0), X, return_sites=["w2"])


def _refused(model, data, match):
    X, y = data
    with pytest.raises(ModelError, match=match):
        SGNHT(model).init(jax.random.PRNGKey(0), 200, None, (X, y), {})


def test_batch_norm_state_is_refused(data):
    """A ``mutable`` state (batch-norm statistics) cannot be carried by a potential: refused, naming the site."""

    class WithBatchNorm(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(1)(nn.BatchNorm(use_running_average=False)(nn.Dense(4)(x)))[..., 0]

    def model(X, y=None):
        net = random_flax_module("net", WithBatchNorm(), dist.Normal(0, 1), input_shape=(1, 2),
                                 mutable=["batch_stats"])  # fmt: skip
        with numpyro.plate("data", X.shape[0], subsample_size=50):
            numpyro.sample("y", dist.Normal(net(numpyro.subsample(X, event_dim=1)), NOISE),
                           obs=numpyro.subsample(y, event_dim=0))  # fmt: skip

    _refused(model, data, "'net\\$state' is a `numpyro.mutable` state .*LayerNorm")


def test_parameters_without_prior_are_refused(data):
    """``flax_module``'s parameters, or those a dict prior leaves out, would stay at their initial values."""

    def fixed(X, y=None):
        net = flax_module("net", nn.Dense(1), input_shape=(1, 2))
        sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
        with numpyro.plate("data", X.shape[0], subsample_size=50):
            numpyro.sample("y", dist.Normal(net(numpyro.subsample(X, event_dim=1))[..., 0], sigma),
                           obs=numpyro.subsample(y, event_dim=0))  # fmt: skip

    def partial_prior(X, y=None):
        net = random_flax_module("net", nn.Dense(1), {"bias": dist.Normal(0, 1)}, input_shape=(1, 2))
        with numpyro.plate("data", X.shape[0], subsample_size=50):
            numpyro.sample("y", dist.Normal(net(numpyro.subsample(X, event_dim=1))[..., 0], NOISE),
                           obs=numpyro.subsample(y, event_dim=0))  # fmt: skip

    for model in (fixed, partial_prior):
        _refused(
            model, data, "site 'net\\$params' is a `numpyro.param`, a parameter without a prior.*random_flax_module"
        )
