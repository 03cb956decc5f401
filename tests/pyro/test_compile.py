"""``compile.simplify`` against the graph as traced and against the eager model: value, gradient, score and
per-datum scores, on models with constrained latents, observed sites with event dimensions and broadcasting.

The per-datum scores come from a batched backward (``is_grads_batched``) that ``make_fx`` records as
``copy_`` into views of ``zeros`` buffers: ``simplify`` used to fold those buffers to constants (and to
drop ``zeros_1 + zeros_2`` as ``x + 0``), which zeroed the column of a constrained latent.
"""

import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ppl_sgmcmc.pyro import SGFS
from ppl_sgmcmc.pyro import compile as compile_

aten = torch.ops.aten
N, BATCH = 40, 7
KEYS = [("gradient", False), ("gradient", True), ("gradient", "per_example")]


def two_site_model(X, y, c):
    """The model that exposed the bug (``test_new_kernels``): a StudentT site with a HalfNormal scale and a
    Bernoulli site with an event dimension, both in the subsampled plate."""
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    sigma = pyro.sample("sigma", dist.HalfNormal(1.0))
    with pyro.plate("data", X.shape[0], subsample_size=BATCH):
        x = pyro.subsample(X, event_dim=1)
        pyro.sample("y", dist.StudentT(4.0, x @ w, sigma), obs=pyro.subsample(y, event_dim=0))
        logits = x[:, :2] * w[0]
        pyro.sample("c", dist.Bernoulli(logits=logits).to_event(1), obs=pyro.subsample(c, event_dim=1))


def regression(X, y, c):
    """The SGFS trajectory model of ``test_new_kernels``: Normal likelihood, HalfNormal scale."""
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    sigma = pyro.sample("sigma", dist.HalfNormal(1.0))
    with pyro.plate("data", X.shape[0], subsample_size=BATCH):
        x = pyro.subsample(X, event_dim=1)
        pyro.sample("y", dist.Normal(x @ w, sigma), obs=pyro.subsample(y, event_dim=0))


def positive_latents(X, y, c):
    """Gamma, LogNormal and Beta latents; a vector scale broadcast against the ``(n, d)`` data in an
    observed site with an event dimension; a Gamma-distributed observation."""
    d = X.shape[1]
    scale = pyro.sample("scale", dist.Gamma(2.0, 2.0).expand([d]).to_event(1))
    tau = pyro.sample("tau", dist.LogNormal(0.0, 1.0))
    rho = pyro.sample("rho", dist.Beta(2.0, 2.0))
    loc = pyro.sample("loc", dist.Normal(0.0, 1.0))
    with pyro.plate("data", X.shape[0], subsample_size=BATCH):
        x = pyro.subsample(X, event_dim=1)
        pyro.sample("x", dist.Normal(loc * rho, scale).to_event(1), obs=x)
        rate = tau * (1.0 + pyro.subsample(y, event_dim=0) ** 2)
        pyro.sample("g", dist.Gamma(1.0 + rho, rate), obs=1.0 + pyro.subsample(c, event_dim=1).sum(-1))


def simplex_and_matrix(X, y, c):
    """A Dirichlet latent (stick-breaking), a matrix latent, a multivariate observation with a LogNormal
    scale and a Categorical observation, both with event/batch shapes broadcast inside the plate."""
    probs = pyro.sample("probs", dist.Dirichlet(torch.ones(3)))
    W = pyro.sample("W", dist.Normal(0.0, 1.0).expand([X.shape[1], 2]).to_event(2))
    noise = pyro.sample("noise", dist.LogNormal(-1.0, 0.5))
    with pyro.plate("data", X.shape[0], subsample_size=BATCH):
        x = pyro.subsample(X, event_dim=1)
        mean = x @ W
        pyro.sample("c", dist.Normal(mean, noise).to_event(1), obs=pyro.subsample(c, event_dim=1))
        label = (pyro.subsample(y, event_dim=0) > 0).long() + (pyro.subsample(y, event_dim=0) > 1).long()
        pyro.sample("k", dist.Categorical(probs), obs=label)


MODELS = {m.__name__: m for m in (two_site_model, regression, positive_latents, simplex_and_matrix)}


@pytest.fixture(scope="module")
def data():
    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(N, 3, generator=g), torch.randn(N, generator=g)
    c = (torch.rand(N, 2, generator=g) < 0.5).float()
    return X, y, c


def _target(model, data):
    kernel = SGFS(model, alpha=1.0, ridge=1e-2)
    kernel.setup(0, *data)
    return kernel._target


def _points(target):
    flat = target.layout.ravel(target.initial_params())
    g = torch.Generator().manual_seed(1)
    batches = [torch.tensor([3, 10, 10, 0, 39, 21, 7]), torch.randperm(N, generator=g)[:BATCH]]
    noises = [torch.zeros_like(flat), 0.3 * torch.randn(flat.shape, generator=g)]
    return [(flat + noise, {"data": batch}) for noise, batch in zip(noises, batches)]


def _assert_close(got, expected, what):
    assert got.shape == expected.shape, what
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("key", KEYS, ids=lambda k: str(k[1]))
@pytest.mark.parametrize("name", list(MODELS))
def test_simplified_graph_matches_traced_and_eager(name, key, data):
    target = _target(MODELS[name], data)
    points = _points(target)
    fn, inputs, _ = target.traceable(key, *points[0])
    always = lambda compiled: True  # noqa: E731 - compare here, not through the target's own check
    raw = compile_.trace(fn, inputs, always, "test", optimize=False)
    simplified = compile_.trace(fn, inputs, always, "test", optimize=True)
    assert raw is not None and simplified is not None
    assert len(simplified.graph.graph.nodes) < len(raw.graph.graph.nodes)  # simplify did something
    for flat, batch in points * 2:  # twice: a call must not change the graph's buffers
        args = (flat, batch["data"], *target._arg_tensors)
        eager = target._eager_gradient(flat, batch, key[1])
        expected = [eager.energy, eager.grad, eager.score, eager.per_example]
        expected = expected[: 2 + bool(key[1]) + (key[1] == "per_example")]
        got_raw, got = raw(*args), simplified(*args)
        assert len(got) == len(got_raw) == len(expected)
        for what, a, b, e in zip(["energy", "grad", "score", "per_example"], got, got_raw, expected):
            _assert_close(b, e, f"{name} {what} (traced)")
            _assert_close(a, e, f"{name} {what} (simplified)")
        if key[1] == "per_example":
            assert bool((got[3].abs().sum(0) > 0).all())  # no column lost, constrained latents' included
            _assert_close(got[3].mean(0), got[2], f"{name} per-datum scores average to the score")


@pytest.mark.parametrize("name", list(MODELS))
def test_per_example_graph_is_simplified_and_used(name, data):
    """The kernel traces and simplifies the per-datum score graph (no eager fallback, no unsimplified graph)."""
    target = _target(MODELS[name], data)
    (flat, batch), _ = _points(target)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        result = target.gradient(flat, batch, "per_example")
    compiled = target._compiled[("gradient", "per_example")]
    assert compiled is not None
    assert any(n.op == "get_attr" and n.target.startswith("_folded") for n in compiled.graph.graph.nodes)
    eager = target._eager_gradient(flat, batch, "per_example")
    _assert_close(result.per_example, eager.per_example, name)


# --- simplify on small hand-written graphs: in-place writes, aliasing, no-ops ---------------------------------
def _trace(fn, *inputs):
    return make_fx(fn, tracing_mode="fake", _allow_non_fake_inputs=True)(*inputs)


def _compare(fn, *inputs, calls=2):
    expected = fn(*inputs)
    graph = compile_.simplify(_trace(fn, *inputs))
    for _ in range(calls):
        got = graph(*inputs)
        for a, b in zip(got, expected):
            torch.testing.assert_close(a, b)
    return graph


def test_writes_into_folded_zeros_are_kept():
    """The structure of the batched backward: columns of ``zeros`` filled through ``copy_`` into views."""

    def fn(x):
        left = torch.zeros(4, 3)
        left[:, 1:].copy_(x[:, :2] * 2.0)
        right = torch.zeros(4, 3)
        right.select(1, 0).copy_(x[:, 2].exp())
        acc = torch.zeros(4, 3)
        acc.add_(x)  # accumulating into a buffer: a folded one would grow with every call
        return left + right, acc * 1, right + 0

    _compare(fn, torch.randn(4, 3), calls=3)


def test_aliases_of_written_tensors_are_not_bypassed():
    def fn(x):
        y = x * 1  # a copy: bypassing it would make the write below a write into x
        y.view(-1).mul_(2.0)
        z = torch.ones(2, 3).detach()
        z.view(3, 2)[0].fill_(5.0)
        return x + 0, y, z

    x = torch.randn(2, 3)
    before = x.clone()
    _compare(fn, x)
    torch.testing.assert_close(x, before)


def test_add_with_alpha_is_not_a_noop():
    def fn(x):
        zeros = torch.zeros(1, 3)
        return torch.add(zeros, x, alpha=-2.0), torch.sub(x, torch.zeros(3), alpha=3.0), torch.mul(torch.ones(1, 3), x)

    _compare(fn, torch.randn(2, 3))


def test_constant_outputs_are_copies():
    """A caller writing into an output must not change the next call's outputs."""

    def fn(x):
        return torch.ones(3) * 2.0, x * 1, x.detach()

    x = torch.randn(3)
    graph = compile_.simplify(_trace(fn, x))
    first = graph(x)
    for out in first:
        out.add_(100.0)
    second = graph(x)
    torch.testing.assert_close(second[0], torch.full((3,), 2.0))
    torch.testing.assert_close(second[1], x)
    assert second[1].data_ptr() != x.data_ptr()
