"""The compiled potential (``make_fx`` trace, then ``torch.compile``) against the graph as traced and against
the eager model: value, gradient, score and per-datum scores, on models with constrained latents, observed
sites with event dimensions and broadcasting; and the fallback to the eager model, with a warning, when a
model's Python control flow depends on tensor values or when compiling fails or disagrees.

The per-datum scores come from a batched backward (``is_grads_batched``) that ``make_fx`` records as
``copy_`` into views of ``zeros`` buffers: the hand-written FX simplifier that preceded ``torch.compile``
folded those buffers to constants (and dropped ``zeros_1 + zeros_2`` as ``x + 0``), which zeroed the column
of a constrained latent. The small hand-written graphs below keep checking in-place writes, aliasing and
no-ops through the compiler.
"""

import warnings
from collections import OrderedDict

import pyro
import pyro.distributions as dist
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ppl_sgmcmc.gradients import svrg
from ppl_sgmcmc.pyro import CSGLD, PSGLD, SGFS, SGHMC, SGLD, SGNHT
from ppl_sgmcmc.pyro import compile as compile_
from ppl_sgmcmc.pyro.kernel import SGMCMCKernel

aten = torch.ops.aten
N, BATCH = 40, 7
SITES_BATCH = 4  # the minibatch of `many_sites` (its docstring says why fewer rows)
KEYS = [("gradient", False), ("gradient", True), ("gradient", "per_example")]


def many_sites(X, y, c):
    """Every distribution, transform and broadcast the per-datum graph is checked on, in one model (one Inductor
    compile, seconds, instead of one per group of sites), each once:

    - the model that exposed the bug (``test_new_kernels``): a StudentT site with a HalfNormal scale and a Bernoulli
      site with an event dimension, both in the subsampled plate;
    - Gamma, LogNormal and Beta latents; a vector scale broadcast against the ``(n, d)`` data in an observed site
      with an event dimension; a Gamma-distributed observation;
    - a Dirichlet latent (stick-breaking), a matrix latent, a multivariate observation with a LogNormal scale and a
      Categorical observation, both with event/batch shapes broadcast inside the plate.

    Each latent has its own columns in the per-datum scores, which the test checks one by one (none lost). The
    minibatch holds :data:`SITES_BATCH` rows: the batched backward repeats some operations' backward once per row
    (the stick-breaking transform's ``cumprod``, the Categorical's ``gather``: about 70 of the graph's nodes a row,
    and Inductor's compile time grows with the nodes); four rows, one index twice, keep the plate's size apart from
    every other dimension (``d = 3``, the 2 event columns, the 3 categories)."""
    d = X.shape[1]
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([d]).to_event(1))
    sigma = pyro.sample("sigma", dist.HalfNormal(1.0))
    scale = pyro.sample("scale", dist.Gamma(2.0, 2.0).expand([d]).to_event(1))
    tau = pyro.sample("tau", dist.LogNormal(0.0, 1.0))
    rho = pyro.sample("rho", dist.Beta(2.0, 2.0))
    probs = pyro.sample("probs", dist.Dirichlet(torch.ones(3)))
    W = pyro.sample("W", dist.Normal(0.0, 1.0).expand([d, 2]).to_event(2))
    with pyro.plate("data", X.shape[0], subsample_size=SITES_BATCH):
        x, yb, cb = pyro.subsample(X, event_dim=1), pyro.subsample(y, event_dim=0), pyro.subsample(c, event_dim=1)
        pyro.sample("y", dist.StudentT(4.0, x @ w, sigma), obs=yb)
        pyro.sample("c", dist.Bernoulli(logits=x[:, :2] * w[0]).to_event(1), obs=cb)
        pyro.sample("x", dist.Normal(rho, scale).to_event(1), obs=x)
        pyro.sample("g", dist.Gamma(1.0 + rho, tau * (1.0 + yb**2)), obs=1.0 + cb.sum(-1))
        pyro.sample("c_normal", dist.Normal(x @ W, tau).to_event(1), obs=cb)
        pyro.sample("k", dist.Categorical(probs), obs=(yb > 0).long() + (yb > 1).long())


def _regression(prior_scale):
    def model(X, y, c):
        w = pyro.sample("w", dist.Normal(0.0, prior_scale).expand([X.shape[1]]).to_event(1))
        sigma = pyro.sample("sigma", dist.HalfNormal(1.0))
        with pyro.plate("data", X.shape[0], subsample_size=BATCH):
            x, yb = pyro.subsample(X, event_dim=1), pyro.subsample(y, event_dim=0)
            pyro.sample("y", dist.Normal(x @ w, sigma), obs=yb)

    return model


plain = _regression(1.0)  # no control flow: traced and compiled; the kernels' steps below run on it
plain_wide_prior = _regression(3.0)  # the same operations on other constants


MODELS = {"many_sites": many_sites, "plain": plain}
# the tests that compile `plain`'s graphs, on one worker: each graph is compiled once there (the
# module's memo of compiled graphs), not once per test
on_plain = pytest.mark.xdist_group("pyro_compile_plain")


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
    rows = target.plate_sizes["data"][1]  # the model's minibatch size
    batches = [torch.tensor([3, 10, 10, 0, 39, 21, 7])[:rows], torch.randperm(N, generator=g)[:rows]]
    noises = [torch.zeros_like(flat), 0.3 * torch.randn(flat.shape, generator=g)]
    return [(flat + noise, {"data": batch}) for noise, batch in zip(noises, batches)]


def _assert_close(got, expected, what):
    assert got.shape == expected.shape, what
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5, msg=lambda m: f"{what}: {m}")


def _inductor_runs():
    """How many graphs TorchInductor has compiled or loaded from its cache in this process."""
    counters = torch._dynamo.utils.counters["inductor"]
    return counters["fxgraph_cache_miss"] + counters["fxgraph_cache_hit"] + counters["fxgraph_cache_bypass"]


@pytest.fixture
def fresh_memo(monkeypatch):
    """An empty memo of compiled graphs for the test (none compiled by other tests reused, none kept)."""
    monkeypatch.setattr(compile_, "_memo", OrderedDict())


# Which graphs go through Inductor here. The per-datum score graph (``"per_example"``) holds all that the other two
# hold: every site's forward, the backward of the prior part and of the data part (whose sum is the gradient and
# whose data part, scaled, is the score) and the batched backward of the per-datum log-likelihoods, where the
# constrained latents' columns were lost. So every model's distributions, transforms, event dimensions and
# broadcasting are compiled in its per-datum graph. The graphs of ``with_score=False`` (one backward of the sum)
# and ``True`` (no batched backward) differ from it in how the outputs are assembled, the same for every model:
# each is compiled once, on ``plain``, whose three graphs are also those of the kernels' steps below (SGLD, PSGLD, SGFS:
# compiled once in the process, the module's memo). One Inductor compile per graph, seconds each.
GRAPH_CASES = [(name, KEYS[2]) for name in MODELS] + [("plain", key) for key in KEYS[:2]]


@on_plain  # `plain`'s graphs are those of the kernels' steps below, compiled once on a worker
@pytest.mark.parametrize("name, key", GRAPH_CASES, ids=lambda case: str(case[1]) if isinstance(case, tuple) else case)
def test_compiled_graph_matches_traced_and_eager(name, key, data):
    """The kernel's :meth:`gradient` traces the model and compiles the whole graph with Inductor (no eager fallback,
    no warning; at most one Inductor run, none when this process compiled the same graph before). The graph as
    traced and as compiled give the eager model's outputs at two points, twice (a call must not change the graph's
    buffers), and so does the kernel; the per-datum scores lose no column and average to the score."""
    target = _target(MODELS[name], data)
    points = _points(target)
    before = _inductor_runs()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        target.gradient(*points[0], key[1])
    compiled = target._compiled[key]
    assert isinstance(compiled.graph, compile_.InductorGraph)  # Inductor compiled it, as one graph:
    assert _inductor_runs() - before <= 1 and compiled.graph.graph.code == compiled.traced.code
    args = (points[0][0], points[0][1]["data"], *target._arg_tensors)
    raw = compile_.compile_graph(compiled.traced, args, compile=False)  # the graph as traced
    fields = ["energy", "grad", "score", "per_example"][: 2 + bool(key[1]) + (key[1] == "per_example")]
    for flat, batch in points * 2:
        args = (flat, batch["data"], *target._arg_tensors)
        eager = target._eager_gradient(flat, batch, key[1])
        expected = [getattr(eager, what) for what in fields]
        got_raw, got = raw(*args), compiled(*args)
        assert len(got) == len(got_raw) == len(expected)
        for what, a, b, e in zip(fields, got, got_raw, expected):
            _assert_close(b, e, f"{name} {what} (traced)")
            _assert_close(a, e, f"{name} {what} (compiled)")
        if key[1] == "per_example":
            assert bool((got[3].abs().sum(0) > 0).all())  # no column lost, constrained latents' included
            _assert_close(got[3].mean(0), got[2], f"{name} per-datum scores average to the score")
        result = target.gradient(flat, batch, key[1])
        for what, e in zip(fields, expected):
            _assert_close(getattr(result, what), e, f"{name} {what} (the kernel's)")


# --- the compiler on small hand-written graphs: in-place writes, aliasing, no-ops ------------------------------
def _trace(fn, *inputs):
    return make_fx(fn, tracing_mode="fake", _allow_non_fake_inputs=True)(*inputs)


def _compare(fn, *inputs, calls=2):
    expected = fn(*inputs)
    graph = compile_.compile_graph(_trace(fn, *inputs), inputs)
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
    before = x.clone()
    graph = compile_.compile_graph(_trace(fn, x), (x,))
    first = graph(x)
    for out in first:
        out.add_(100.0)
    torch.testing.assert_close(x, before)  # x.detach() is returned as a copy, not as x
    second = graph(x)
    torch.testing.assert_close(second[0], torch.full((3,), 2.0))
    torch.testing.assert_close(second[1], x)
    assert second[1].data_ptr() != x.data_ptr()
    assert second[2].data_ptr() != x.data_ptr()


# --- models the trace cannot follow: the kernel falls back to the eager model, with a warning ----------------
def _globals(X):
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    sigma = pyro.sample("sigma", dist.HalfNormal(1.0))
    return w, sigma


def branch_on_minibatch_data(X, y, c):
    w, sigma = _globals(X)
    with pyro.plate("data", X.shape[0], subsample_size=BATCH):
        x, yb = pyro.subsample(X, event_dim=1), pyro.subsample(y, event_dim=0)
        loc = x @ w
        if yb.sum() > 0:  # depends on which data the minibatch holds
            loc = 2.0 * loc
        pyro.sample("y", dist.Normal(loc, sigma), obs=yb)


def branch_on_full_data(X, y, c):
    w, sigma = _globals(X)
    scale = 2.0 if y.sum() > 0 else 0.5  # a model argument's value: a graph input, unknown to the trace
    with pyro.plate("data", X.shape[0], subsample_size=BATCH):
        x, yb = pyro.subsample(X, event_dim=1), pyro.subsample(y, event_dim=0)
        pyro.sample("y", dist.Normal(scale * (x @ w), sigma), obs=yb)


def branch_on_latent(X, y, c):
    w, sigma = _globals(X)
    with pyro.plate("data", X.shape[0], subsample_size=BATCH):
        x, yb = pyro.subsample(X, event_dim=1), pyro.subsample(y, event_dim=0)
        loc = x @ w
        if sigma > 1.0:  # a latent's value
            loc = loc + w[0]
        pyro.sample("y", dist.Normal(loc, sigma), obs=yb)


def loop_on_data_value(X, y, c):
    w, sigma = _globals(X)
    with pyro.plate("data", X.shape[0], subsample_size=BATCH):
        x, yb = pyro.subsample(X, event_dim=1), pyro.subsample(y, event_dim=0)
        loc = x @ w
        for _ in range(int((yb > 0).sum())):  # as many passes as the minibatch has positive y
            loc = 0.9 * loc + 0.1 * w[1]
        pyro.sample("y", dist.Normal(loc, sigma), obs=yb)


def _hand_potential(name, flat, idx, X, y):
    """``Ũ_t`` of the models above written by hand in torch (no Pyro), and which path its Python took."""
    u, w = flat[0], flat[1:]  # sites sorted by name: sigma (as log sigma), then w
    sigma = u.exp()
    xb, yb = X[idx], y[idx]
    loc, path = xb @ w, 0
    if name == "branch_on_minibatch_data" and yb.sum() > 0:
        loc, path = 2.0 * loc, 1
    elif name == "branch_on_full_data":
        loc, path = (2.0 if y.sum() > 0 else 0.5) * loc, 0
    elif name == "branch_on_latent" and sigma > 1.0:
        loc, path = loc + w[0], 1
    elif name == "loop_on_data_value":
        path = int((yb > 0).sum())
        for _ in range(path):
            loc = 0.9 * loc + 0.1 * w[1]
    normal = torch.distributions.Normal
    log_prior = normal(0.0, 1.0).log_prob(w).sum() + torch.distributions.HalfNormal(1.0).log_prob(sigma) + u
    log_lik = normal(loc, sigma).log_prob(yb).sum()
    return -(log_prior + X.shape[0] / BATCH * log_lik), path


def _hand_gradient(name, flat, idx, X, y):
    x = flat.detach().requires_grad_()
    energy, path = _hand_potential(name, x, idx, X, y)
    (grad,) = torch.autograd.grad(energy, x)
    return energy.detach(), grad, path


UNTRACEABLE = {
    m.__name__: m for m in (branch_on_minibatch_data, branch_on_full_data, branch_on_latent, loop_on_data_value)
}


def _sgld_target(model, data, **kwargs):
    kernel = SGLD(model, step_size=1e-3, **kwargs)
    kernel.setup(0, *data)
    target = kernel._target
    assert target.layout.names == ["sigma", "w"]
    return target


def _two_paths(data):
    """Two (point, minibatch) pairs: sigma 0.5 and 2, a minibatch of the largest and of the smallest y."""
    X, y, _ = data
    order = torch.argsort(y)
    w = torch.tensor([0.3, -0.2, 0.5])
    flats = [torch.cat([torch.tensor([float(torch.tensor(s).log())]), w]) for s in (0.5, 2.0)]
    return [(flats[0], {"data": order[-BATCH:]}), (flats[1], {"data": order[:BATCH]})]


@pytest.mark.parametrize("name", list(UNTRACEABLE))
def test_data_dependent_control_flow_falls_back_to_eager(name, data):
    """Control flow on the minibatch's data, on a model argument, on a latent, and a loop whose length is a
    tensor's value: the trace raises, the kernel warns once and runs the model eagerly, and its potential and
    gradient are the hand-written ones on every path the model's Python takes."""
    target = _sgld_target(UNTRACEABLE[name], data)
    points = _two_paths(data)
    with pytest.warns(RuntimeWarning, match="could not trace the potential into a compiled graph"):
        target.gradient(*points[0])
    assert target._compiled[("gradient", False)] is None
    paths = set()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # warned once, not at every step
        for flat, batch in points * 2:
            got = target.gradient(flat, batch)
            energy, grad, path = _hand_gradient(name, flat, batch["data"], *data[:2])
            paths.add(path)
            _assert_close(got.energy, energy, f"{name} energy")
            _assert_close(got.grad, grad, f"{name} gradient")
    if name != "branch_on_full_data":
        assert len(paths) == 2  # both paths taken: a graph with one path baked in would be wrong on the other


@on_plain
def test_compiled_gradient_equals_eager_and_hand_written(data):
    """On a model without control flow the kernel uses the compiled graph (no warning), and its potential and
    gradient equal the eager model's and the hand-written ones."""
    target = _sgld_target(plain, data)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        for flat, batch in _two_paths(data) * 2:
            got = target.gradient(flat, batch)
            eager = target._eager_gradient(flat, batch, False)
            energy, grad, _ = _hand_gradient("plain", flat, batch["data"], *data[:2])
            for what, a, b in [("energy", got.energy, eager.energy), ("gradient", got.grad, eager.grad)]:
                _assert_close(a, b, f"compiled vs eager {what}")
            _assert_close(got.energy, energy, "compiled vs hand-written energy")
            _assert_close(got.grad, grad, "compiled vs hand-written gradient")
    assert isinstance(target._compiled[("gradient", False)].graph, compile_.InductorGraph)


@on_plain
def test_identical_graphs_share_one_compiled_module(data):
    """A second kernel of the same model on the same data reuses the compiled module; a model whose graph
    differs only in its constants, or data of another size, gets its own, with its own (right) gradient."""
    flat, batch = _two_paths(data)[0]
    key = ("gradient", False)
    targets = [_sgld_target(model, d) for model, d in [(plain, data), (plain, data), (plain_wide_prior, data)]]
    X, y, c = data
    small = (X[: N // 2], y[: N // 2], c[: N // 2])
    targets.append(_sgld_target(plain, small))
    batches = [batch] * 3 + [{"data": batch["data"] % (N // 2)}]
    for target, b in zip(targets, batches):
        got = target.gradient(flat, b)
        eager = target._eager_gradient(flat, b, False)
        _assert_close(got.energy, eager.energy, "energy")
        _assert_close(got.grad, eager.grad, "gradient")
    modules = [target._compiled[key].graph for target in targets]
    assert modules[1] is modules[0]
    assert modules[2] is not modules[0] and modules[3] is not modules[0]
    assert modules[2].graph.code == modules[0].graph.code  # told apart by their constants only


def test_failing_compiler_falls_back_to_eager(data, monkeypatch, fresh_memo):
    """The compiler raising (no C++ compiler, an unsupported operation): warn, then run the model eagerly."""

    def broken(*args, **kwargs):
        raise RuntimeError("no C++ compiler found")

    monkeypatch.setattr(torch._inductor, "compile", broken)
    target = _sgld_target(plain, data)
    flat, batch = _two_paths(data)[0]
    with pytest.warns(RuntimeWarning, match=r"could not trace the potential .*RuntimeError: no C\+\+ compiler"):
        got = target.gradient(flat, batch)
    assert target._compiled[("gradient", False)] is None
    energy, grad, _ = _hand_gradient("plain", flat, batch["data"], *data[:2])
    _assert_close(got.energy, energy, "energy")
    _assert_close(got.grad, grad, "gradient")


def test_compiled_graph_disagreeing_with_the_model_is_not_used(data, monkeypatch, fresh_memo):
    """A compiled graph whose results differ from the eager model's at the check points is dropped, with a
    warning, and the model runs eagerly."""

    def wrong(graph, example_inputs):
        return lambda *inputs: tuple(2.0 * out for out in graph(*inputs))

    monkeypatch.setattr(torch._inductor, "compile", wrong)
    target = _sgld_target(plain, data)
    flat, batch = _two_paths(data)[1]
    with pytest.warns(RuntimeWarning, match="the compiled graph disagrees with the model"):
        got = target.gradient(flat, batch)
    assert target._compiled[("gradient", False)] is None
    energy, grad, _ = _hand_gradient("plain", flat, batch["data"], *data[:2])
    _assert_close(got.energy, energy, "energy")
    _assert_close(got.grad, grad, "gradient")


# One row per path through the compiled step (`SGMCMCKernel._trace_step`): the gradient graph it calls (no score:
# SGLD, CSGLD, SGHMC; the mean score: PSGLD; per-datum scores: SGFS), a rule whose gradient is taken at the chain's
# position, where a rejected step returns (SGLD, PSGLD, SGFS), or not (CSGLD, SGHMC, whose rejected step refreshes a
# momentum), the rule's own state (none: SGLD; one
# tensor: PSGLD; a Fisher estimate: SGFS; the contour's weights: CSGLD; a momentum: SGHMC), the warm-up's
# preconditioner as inputs (tuned SGHMC) and rejected steps. SGNHT's step takes the same paths as SGHMC's (a momentum
# and a thermostat, both rule-state tensors), and its arithmetic is checked against NumPyro's in
# `test_cross_backend.py`; its matrix thermostat adds an eigendecomposition to the graph (its row). Each row costs an
# Inductor compile of its step, seconds. The SGLD row's graph is the one
# `test_one_compiled_step_serves_every_step_size` compiles (on the same worker: once).
STEP_KERNELS = {
    "SGLD": lambda: SGLD(plain, step_size=1e-4),
    "SGFS": lambda: SGFS(plain, alpha=1.0, ridge=1e-2),
    "PSGLD": lambda: PSGLD(plain, step_size=1e-4),
    "CSGLD": lambda: CSGLD(plain, step_size=1e-4),
    # tuned: the warm-up adapts the step size and the dense metric, whose preconditioner the graph takes as inputs;
    # where the chain starts is not what the row checks (find_mode=False: no mode search, whose optimiser and Newton
    # steps took a third of the row's time outside the compiler, in each of its two runs)
    "SGHMC, tuned, dense mass": lambda: SGHMC(plain, dense_mass=True, gradient="minibatch", find_mode=False),
    "SGHMC, rejected steps": lambda: SGHMC(plain, step_size=30.0),
    "SGNHT, matrix thermostat": lambda: SGNHT(plain, step_size=1e-4, thermostat="matrix"),
    # a new centre every three steps, which the eager step moves and the graph takes as an input
    "SGNHT, svrg": lambda: SGNHT(plain, step_size=1e-4, gradient=svrg(epoch_length=3)),
}


@on_plain
@pytest.mark.parametrize("kind", STEP_KERNELS)
def test_compiled_step_equals_eager(kind, data, monkeypatch):
    """After the warm-up a step is one compiled graph (the gradient's traced graph, the rule's move, the finiteness
    sum and the noise estimate's update: ``_CompiledStep``): the chain, its rule state, the noise estimate and each
    draw's noise ratio are those of the eager step, draw for draw (the same generator draws), and so are its
    rejected steps (the last row). The tuned SGHMC row runs in the warm-up's preconditioned coordinates, whose
    preconditioner the graph takes as inputs. The first state's ``previous`` and ``variance`` are one tensor, which
    the trace must keep apart."""
    warmup = 200 if kind.startswith("SGHMC") else 0

    def run(compiled):
        if not compiled:
            monkeypatch.setattr(SGMCMCKernel, "_compiled_step", lambda self, *args: None)
            monkeypatch.setattr(SGMCMCKernel, "_compiled", lambda self, *args: None)
        kernel = STEP_KERNELS[kind]()
        pyro.set_rng_seed(0)
        kernel.setup(warmup, *data)
        z = kernel.sample(kernel.initial_params)
        for _ in range(warmup):
            z = kernel.sample(z)
        states = []
        for _ in range(6):
            z = kernel.sample(z)
            state = kernel.state
            states.append((*z.values(), *[leaf for leaf in state.rule_state if leaf is not None], *state.noise,
                           state.potential_energy, state.noise_ratio, state.noise_variance))  # fmt: skip
        monkeypatch.undo()
        return kernel, states

    kernel, compiled = run(True)
    num_diverging = kernel.diagnostics()["num_diverging"]
    assert (num_diverging > 0) == kind.endswith("rejected steps")
    steps = [graph for key, graph in kernel._graphs.items() if key[0] == "step"]
    assert len(steps) == 1 and isinstance(steps[0].graph, compile_.CompiledFunction)
    eager_kernel, eager = run(False)
    assert eager_kernel.diagnostics()["num_diverging"] == num_diverging
    # the noise estimate's count: the first draw's step and the rest
    assert int(compiled[-1][-4]) == 6 + warmup - num_diverging
    for a, b in zip(compiled, eager):
        for x, y in zip(a, b):
            torch.testing.assert_close(torch.as_tensor(x), torch.as_tensor(y), rtol=1e-5, atol=1e-6,
                                       equal_nan=True)  # fmt: skip  # SGFS: noise not measured (NaN)


def step_graph(kernel, data):
    """The compiled graph of ``kernel``'s step after its first draw on ``data`` (seeded)."""
    pyro.set_rng_seed(0)
    kernel.setup(0, *data)
    kernel.sample(kernel.initial_params)
    (graph,) = [graph for key, graph in kernel._graphs.items() if key[0] == "step"]
    return graph.graph.graph


@on_plain
def test_one_compiled_step_serves_every_step_size(data):
    """The step size is an input of the compiled step, not a constant of it: a second kernel on the same model with
    another step size calls the same compiled code (no second compilation, about a second each), with its own
    step size (its first step is checked against the eager step)."""
    graphs = [step_graph(SGLD(plain, step_size=step_size), data) for step_size in (1e-4, 3e-4)]
    assert isinstance(graphs[0], compile_.InductorGraph) and graphs[0] is graphs[1]


@on_plain
def test_two_kernels_with_a_nan_constant_share_one_compiled_step(data):
    """SGFS's step holds a NaN constant (its noise scale: the noise is not measured), which ``torch.equal`` finds
    unequal to itself: the memo of compiled graphs compares constants bit for bit, so a second SGFS kernel on the same
    model calls the compiled code of the first (no second compilation, seconds each; the networks of
    ``test_modules.py`` compiled SGFS's step twice)."""
    graphs = [step_graph(SGFS(plain, alpha=1.0, ridge=1e-2), data) for _ in range(2)]
    assert isinstance(graphs[0], compile_.InductorGraph) and graphs[0] is graphs[1]
    assert any(bool(c.isnan().any()) for c in compile_._constants(graphs[0].graph))  # what the test is about


@on_plain
def test_step_with_a_schedule_is_not_compiled(data):
    """A step-size schedule changes the step at every step: it runs eagerly (one compiled graph per step would
    cost seconds each), with the gradient's graph and the noise estimate's compiled as before."""
    kernel = SGLD(plain, step_size=lambda t: 1e-4 / (1 + t))
    pyro.set_rng_seed(0)
    kernel.setup(0, *data)
    z = kernel.sample(kernel.initial_params)
    for _ in range(3):
        z = kernel.sample(z)
    assert {key[0] for key in kernel._graphs} == {"noise update", "noise summary"}


def test_memo_reuses_a_graph_whose_constants_are_equal_bit_for_bit(fresh_memo):
    """A graph identical to one compiled before in the process (the same code, constants equal bit for bit) is not
    compiled again, also when a constant is NaN; constants that differ, ``0.0`` and ``-0.0`` included, are compiled
    each, and each graph gives its own constant's results."""

    def times(value):
        constant = torch.tensor(value)
        return lambda x: (x * constant,)

    x = torch.ones(3)
    values = [float("nan"), float("nan"), 0.0, -0.0]
    graphs = [compile_.compile_graph(_trace(times(value), x), (x,)) for value in values]
    assert graphs[0].graph is graphs[1].graph
    assert len({id(graph.graph) for graph in graphs}) == 3
    for graph, value in zip(graphs, values):
        torch.testing.assert_close(graph(x)[0], x * value, equal_nan=True)
    assert not graphs[2](x)[0].signbit().any() and graphs[3](x)[0].signbit().all()  # 0.0 and -0.0


def test_inductor_graph_called_with_other_inputs_specialises_again():
    """An :class:`~ppl_sgmcmc.pyro.compile.InductorGraph` runs Inductor's code only for inputs like its example
    (its generated code assumes their sizes and strides); other shapes, strides or dtypes go through
    ``torch.compile``, with the right results."""

    def fn(x, y):
        return (x * y + 1.0, (x - y).sum())

    x, y = torch.arange(3.0), torch.full((3,), 2.0)
    graph = compile_.InductorGraph(_trace(fn, x, y), (x, y))
    cases = [(x, y), (torch.arange(5.0), torch.ones(5)), (torch.arange(6.0)[::2], y), (x.double(), y.double())]
    for inputs in cases:
        for got, expected in zip(graph(*inputs), fn(*inputs)):
            torch.testing.assert_close(got, expected)
    assert graph._other is not None  # the example's signature alone did not serve them all


_SECOND_PROCESS = """
import pyro, pyro.distributions as dist, torch
from pyro.infer import MCMC
from torch._dynamo.utils import counters
from ppl_sgmcmc.pyro import SGLD

def model(x, y):
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([3]).to_event(1))
    with pyro.plate("n", x.shape[0], subsample_size=20) as i:
        pyro.sample("y", dist.Normal(x[i] @ w, 1.0), obs=y[i])

torch.manual_seed(0)
x = torch.randn(200, 3)
y = x @ torch.tensor([1.0, -1.0, 0.5]) + torch.randn(200)
pyro.set_rng_seed(0)
mcmc = MCMC(SGLD(model, step_size=1e-3), num_samples=20, warmup_steps=0, disable_progbar=True)
mcmc.run(x, y)
print(sorted(k for k in counters["inductor"] if k.startswith("fxgraph")), mcmc.get_samples()["w"].sum().item())
"""


@pytest.mark.slow
def test_a_second_process_loads_the_compiled_graphs(tmp_path):
    """Inductor's FX graph cache keys the kernel's graphs (``compile._cacheable``): a second process with the same
    cache directory loads them instead of lowering them again, and samples the same chain. Without the tracing
    context every graph bypasses the cache ("No shape env")."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path)}
    runs = [
        subprocess.run([sys.executable, "-c", _SECOND_PROCESS], env=env, capture_output=True, text=True, timeout=300)
        for _ in range(2)
    ]
    outputs = [run.stdout.strip().splitlines()[-1] for run in runs]
    assert all(run.returncode == 0 for run in runs), [run.stderr[-2000:] for run in runs]
    (first, first_sum), (second, second_sum) = (output.rsplit(" ", 1) for output in outputs)
    assert first == "['fxgraph_cache_miss']" and second == "['fxgraph_cache_hit']", outputs
    assert first_sum == second_sum
