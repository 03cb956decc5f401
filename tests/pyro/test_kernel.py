"""The kernels under Pyro's MCMC driver: shapes, constraints, chains (sequential and in worker
processes), reproducibility, steps per sample, schedules, divergences, diagnostics, the traced potential."""

import io
import pickle
from contextlib import redirect_stdout

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC

from ppl_sgmcmc.pyro import PSGLD, SGHMC, SGLD, SGNHT
from tests.pyro.models import logistic_model

KERNELS = [
    lambda **kw: SGLD(logistic_model, step_size=1e-3, **kw),
    lambda **kw: SGHMC(logistic_model, step_size=1e-2, integrator="euler", **kw),
    lambda **kw: SGNHT(logistic_model, step_size=1e-2, thermostat="scalar", **kw),
    lambda **kw: PSGLD(logistic_model, step_size=1e-5, replace=False, **kw),
]


def run(kernel, data, seed=0, warmup_steps=20, num_samples=30, **kwargs):
    pyro.set_rng_seed(seed)
    mcmc = MCMC(kernel, warmup_steps=warmup_steps, num_samples=num_samples, disable_progbar=True, **kwargs)
    mcmc.run(*data)
    return mcmc


# the tests of the shared runs `runs`: on one pytest-xdist worker (`--dist loadgroup`), which makes each run once
on_runs = pytest.mark.xdist_group("pyro_kernel_runs")


# the kernels whose seed-0 run `test_traced_potential_matches_eager_model` compares with the eager model's: their
# shared runs compile the potential and the step. The others' runs are read only for their shapes and constraints,
# which the eager step draws alike (`test_compile.py` checks the compiled steps against the eager ones): they run the
# model eagerly, without compiling a step of their own
COMPILED_RUNS = (0, 3)


@pytest.fixture(scope="module")
def runs(logistic_data):
    """``runs(i)``: ``run(KERNELS[i](), logistic_data)`` (seed 0; ``compile_potential=False`` unless ``i`` is in
    ``COMPILED_RUNS``), made once in the module and read by every test that checks a seed-0 run of that kernel (its
    shapes, its equality with a second run of the same seed, with the eager model's run, with a thinned run), instead
    of one run each. The tests only read it."""
    made = {}

    def get(i):
        if i not in made:
            made[i] = run(KERNELS[i](**({} if i in COMPILED_RUNS else dict(compile_potential=False))), logistic_data)
        return made[i]

    return get


@on_runs
@pytest.mark.parametrize("i", range(len(KERNELS)), ids=["SGLD", "SGHMC", "SGNHT", "PSGLD"])
def test_samples_shapes_and_constraints(i, runs):
    mcmc = runs(i)
    samples = mcmc.get_samples()
    assert samples["w"].shape == (30, 2) and samples["scale"].shape == (30,)
    assert torch.all(samples["scale"] > 0)  # constrained back from unconstrained space
    # the deterministic site, recomputed at every draw
    torch.testing.assert_close(samples["scaled_w"], samples["scale"][:, None] * samples["w"])
    assert all(torch.all(torch.isfinite(v)) for v in samples.values())
    diagnostics = mcmc.diagnostics()
    assert diagnostics["divergences"] == {"chain 0": []}
    assert diagnostics["num_diverging"] == {"chain 0": 0}


@pytest.fixture(scope="module")
def sequential_chains(logistic_data):
    with pytest.warns(UserWarning, match="Chains will be drawn sequentially"):
        return run(SGNHT(logistic_model, step_size=1e-2, steps_per_sample=3), logistic_data, seed=7, num_chains=2)


def test_sequential_chains(sequential_chains):
    samples = sequential_chains.get_samples(group_by_chain=True)
    assert samples["w"].shape == (2, 30, 2) and samples["scaled_w"].shape == (2, 30, 2)
    assert not torch.allclose(samples["w"][0], samples["w"][1])  # two different chains
    out = io.StringIO()
    with redirect_stdout(out):
        sequential_chains.summary()
    assert "scaled_w[1]" in out.getvalue() and "Number of divergences: 0" in out.getvalue()


@pytest.mark.slow
def test_parallel_chains_in_worker_processes(logistic_data, monkeypatch):
    """``num_chains=2`` in two spawned worker processes (the kernel and model are pickled). Pyro seeds
    worker ``i`` with ``initial_seed + i``, so chain 1 is the one-chain run after ``set_rng_seed(seed + 1)``."""
    import pyro.infer.mcmc.api as api

    monkeypatch.setattr(api.mp, "cpu_count", lambda: 4)  # Pyro runs chains in workers only if cpus > chains

    # each spawned worker imports torch, pyro and jax afresh (several seconds on the shared test machine);
    # tracing the potential would add torch's tracing machinery to that, so this run skips it
    def make_kernel():
        return SGNHT(logistic_model, step_size=1e-2, steps_per_sample=3, compile_potential=False)

    mcmc = run(make_kernel(), logistic_data, seed=7, num_chains=2, mp_context="spawn")
    assert isinstance(mcmc.sampler, api._MultiSampler)
    samples = mcmc.get_samples(group_by_chain=True)
    assert samples["w"].shape == (2, 30, 2) and torch.all(samples["scale"] > 0)
    single = run(make_kernel(), logistic_data, seed=8).get_samples()
    for name in ("w", "scale", "scaled_w"):
        torch.testing.assert_close(samples[name][1], single[name])
    assert set(mcmc.diagnostics()["divergences"]) == {"chain 0", "chain 1"}


@on_runs
@pytest.mark.parametrize("i", COMPILED_RUNS, ids=["SGLD", "PSGLD"])
def test_same_seed_same_samples(i, runs, logistic_data):
    a = runs(i).get_samples()["w"]
    b = run(KERNELS[i](), logistic_data, seed=0).get_samples()["w"]
    c = run(KERNELS[i](), logistic_data, seed=4).get_samples()["w"]
    assert torch.equal(a, b)
    assert not torch.allclose(a, c)


@on_runs
def test_steps_per_sample_keeps_every_kth_step(runs, logistic_data):
    full = runs(0)  # SGLD(logistic_model, step_size=1e-3), 20 + 30 steps
    thin = run(SGLD(logistic_model, step_size=1e-3, steps_per_sample=5), logistic_data, warmup_steps=4, num_samples=6)
    assert thin.kernel.state is None  # released at the end of the chain
    torch.testing.assert_close(thin.get_samples()["w"], full.get_samples()["w"][4::5])


@on_runs
def test_traced_potential_matches_eager_model(runs, logistic_data):
    """The traced graph replays what the model computes: the same chain, step for step."""
    for i in COMPILED_RUNS:  # SGLD and PSGLD, which also uses the per-datum score
        traced = runs(i).get_samples()
        eager = run(KERNELS[i](compile_potential=False), logistic_data).get_samples()
        for name in traced:
            torch.testing.assert_close(traced[name], eager[name], rtol=1e-5, atol=1e-6)


def test_step_size_schedule_and_state_in_a_hook(logistic_data):
    from ppl_sgmcmc.schedules import polynomial

    schedule = polynomial(1e-2, 1.0, 0.55)
    states = []
    kernel = SGNHT(logistic_model, step_size=schedule, steps_per_sample=2, thermostat="scalar")
    hook = lambda k, params, stage, i: states.append(k.state)  # noqa: E731
    run(kernel, logistic_data, warmup_steps=3, num_samples=4, hook_fn=hook)
    assert [s.i for s in states] == [2, 4, 6, 8, 10, 12, 14]  # steps taken, warm-up included
    for s in states:  # the schedule is indexed by the global step, from 0
        assert s.step_size == pytest.approx(float(schedule(s.i - 1)), rel=1e-6)
    assert states[-1].rule_state.thermostat.shape == ()  # scalar thermostat
    assert all(torch.isfinite(s.potential_energy) for s in states)


def test_logging_for_the_progress_bar(logistic_data):
    kernel = SGNHT(logistic_model, step_size=1e-2)
    logged = []
    mcmc = MCMC(kernel, warmup_steps=5, num_samples=5, disable_progbar=True,
                hook_fn=lambda k, params, stage, i: logged.append(k.logging()))  # fmt: skip
    mcmc.run(*logistic_data)
    assert list(logged[0]) == ["Ũ_t", "h", "div", "ξ̄"]
    assert logged[0]["h"] == "1.00e-02" and logged[0]["div"] == 0


def test_potential_fn_target_with_stochastic_energy():
    """A user-written stochastic energy ``potential_fn(z, generator)``: its gradient is the stochastic gradient."""

    def potential(z, generator):
        x = z["x"]
        return 0.5 * (x**2).sum() + (0.1 * torch.randn(x.shape, generator=generator) * x).sum()

    pyro.set_rng_seed(0)
    mcmc = MCMC(SGLD(potential_fn=potential, step_size=0.05), warmup_steps=200, num_samples=4000,
                initial_params={"x": torch.zeros(2)}, disable_progbar=True)  # fmt: skip
    mcmc.run()
    x = mcmc.get_samples()["x"]
    assert x.shape == (4000, 2)
    assert torch.all(x.mean(0).abs() < 0.25) and torch.all((x.std(0) - 1).abs() < 0.15)


def test_user_initial_params_start_the_chain(logistic_data):
    start = {"w": torch.tensor([3.0, -3.0]), "scale": torch.tensor(0.0)}  # unconstrained
    kernel = SGLD(logistic_model, step_size=1e-6)
    mcmc = run(kernel, logistic_data, warmup_steps=0, num_samples=2, initial_params=start)
    torch.testing.assert_close(mcmc.get_samples()["w"][0], start["w"], atol=0.05, rtol=0)
    torch.testing.assert_close(mcmc.get_samples()["scale"][0], torch.tensor(1.0), atol=0.05, rtol=0)


def test_non_finite_steps_are_rejected_and_counted(logistic_data):
    mcmc = run(SGLD(logistic_model, step_size=1e3), logistic_data)
    divergences = mcmc.diagnostics()["divergences"]["chain 0"]
    assert divergences and all(0 <= d < 30 for d in divergences)
    assert mcmc.diagnostics()["num_diverging"]["chain 0"] >= len(divergences)
    assert torch.all(torch.isfinite(mcmc.get_samples()["w"]))


def test_rejected_step_redraws_the_momentum():
    """As in NumPyro: a rejected step keeps the position and redraws the momentum from N(0, τ I)."""
    kernel = SGHMC(potential_fn=lambda z: (torch.exp(4 * z["x"]) + z["x"] ** 2).sum(), step_size=0.5, temperature=4.0)
    kernel.initial_params = {"x": torch.zeros(3)}
    kernel.setup(0)
    params, state, redrawn = kernel.initial_params, None, []
    for _ in range(60):
        params = kernel.sample(params)
        new = kernel.state
        if new.diverging:
            assert not torch.allclose(new.rule_state.momentum, state.rule_state.momentum)
            redrawn.append(new.rule_state.momentum / 2.0)  # sqrt(τ) ζ
        state = new
    redrawn = torch.stack(redrawn)
    assert len(redrawn) > 10 and torch.all(torch.isfinite(redrawn))
    assert redrawn.mean().abs() < 0.5 and 0.5 < redrawn.std() < 1.5  # standard normal draws


def test_kernel_pickles_before_and_after_a_run(logistic_data):
    kernel = SGNHT(logistic_model, step_size=1e-2)
    pickle.loads(pickle.dumps(kernel))
    run(kernel, logistic_data, warmup_steps=2, num_samples=2)
    copy = pickle.loads(pickle.dumps(kernel))
    assert copy.model is not None and copy.transforms.keys() == {"w", "scale"}


def test_model_with_two_subsampled_plates_and_a_constrained_vector():
    """Two plates of different sizes each get their own minibatch and ``N/n`` scale; a simplex latent
    goes through its stick-breaking bijection, with its log-Jacobian: the traced potential and its
    gradient equal the energy written out by hand."""
    from pyro.distributions.transforms import biject_to

    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(50, generator=g) + 1.0, torch.randn(30, generator=g) - 1.0

    def model(a, b):
        probs = pyro.sample("probs", dist.Dirichlet(torch.ones(3)))
        loc = pyro.sample("loc", dist.Normal(0.0, 5.0))
        with pyro.plate("a", 50, subsample_size=10):
            pyro.sample("obs_a", dist.Normal(loc, 1.0), obs=pyro.subsample(a, event_dim=0))
        with pyro.plate("b", 30, subsample_size=5):
            pyro.sample("obs_b", dist.Normal(loc - 2 * probs[..., :1], 1.0), obs=pyro.subsample(b, event_dim=0))

    # the run checks the draws' shapes and support, which the eager step draws alike: it runs the model eagerly, and
    # the traced potential is compiled below, for the comparison with the hand-written energy
    kernel = SGHMC(model, step_size=0.02, compile_potential=False)
    mcmc = run(kernel, (a, b), warmup_steps=100, num_samples=100)
    samples = mcmc.get_samples()
    assert samples["probs"].shape == (100, 3) and torch.all(samples["probs"] > 0)
    torch.testing.assert_close(samples["probs"].sum(-1), torch.ones(100))

    pyro.set_rng_seed(1)
    kernel.setup(0, a, b)
    target = kernel._target
    assert target.plate_sizes == {"a": (50, 10), "b": (30, 5)}
    assert target.layout.shapes == {"loc": torch.Size([]), "probs": torch.Size([2])}
    flat = torch.tensor([0.3, -0.4, 0.9])  # loc, then the 2 free coordinates of probs (sites sorted by name)
    batch = {"a": torch.tensor([0, 3, 3, 7, 9, 11, 20, 31, 40, 49]), "b": torch.tensor([1, 2, 2, 28, 29])}

    def energy(x):
        loc, u = x[0], x[1:]
        simplex = biject_to(dist.Dirichlet(torch.ones(3)).support)
        probs = simplex(u)
        log_prior = (
            dist.Dirichlet(torch.ones(3)).log_prob(probs)
            + simplex.log_abs_det_jacobian(u, probs)
            + dist.Normal(0.0, 5.0).log_prob(loc)
        )
        log_lik = 50 / 10 * dist.Normal(loc, 1.0).log_prob(a[batch["a"]]).sum()
        log_lik = log_lik + 30 / 5 * dist.Normal(loc - 2 * probs[0], 1.0).log_prob(b[batch["b"]]).sum()
        return -(log_prior + log_lik)

    x = flat.clone().requires_grad_()
    expected = energy(x)
    (expected_grad,) = torch.autograd.grad(expected, x)
    for compiled in (True, False):
        target.compile = compiled
        target._compiled.clear()
        gradient = target.gradient(flat, batch)
        torch.testing.assert_close(gradient.energy, expected.detach())
        torch.testing.assert_close(gradient.grad, expected_grad)
    kernel.cleanup()


def test_a_process_group_of_several_processes_is_refused(logistic_data, monkeypatch):
    """Under torch.distributed with several processes each would run a chain of its own: refused, with the way out."""
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 2)
    mcmc = MCMC(SGLD(logistic_model, step_size=1e-3), warmup_steps=5, num_samples=5, disable_progbar=True)
    with pytest.raises(NotImplementedError, match="2 processes.*shard_rows"):
        mcmc.run(*logistic_data)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 1)  # a group of one process runs as before
    mcmc.run(*logistic_data)
    assert mcmc.get_samples()["w"].shape[0] == 5
