"""Continuing a Pyro chain (``kernel.last_state``, ``kernel.resume_from``) and checkpointed runs
(``ppl_sgmcmc.checkpoint``) under Pyro's MCMC: a run of ``W + S1`` draws continued for ``S2`` gives exactly the
draws of one run of ``W + S1 + S2``, also from a pickled state in a new kernel, whatever the global seed."""

import pickle
import shutil

import pyro
import pytest
import torch
from pyro.infer import MCMC

from ppl_sgmcmc import checkpoint
from ppl_sgmcmc.pyro import CSGLD, SGLD, SGNHT, to_inference_data
from tests.pyro.models import logistic_model

SGNHT_NO_REPLACE = lambda **options: SGNHT(logistic_model, step_size=1e-2, replace=False, **options)  # noqa: E731
# the runs run the model (or potential) eagerly where the compiled step is not what they check (the checkpoint's files,
# its checks, a continuation on a potential): with `compile_potential` a kernel compiles its gradient, step and noise
# estimate's graphs, seconds of Inductor compiling each, and the eager step draws the same values (`test_compile.py`
# checks the compiled steps against the eager ones). `test_continuation_equals_one_run` keeps the compiled step: a
# continuation must give the one run's draws bit for bit through it too
EAGER = dict(compile_potential=False)


def run(kernel, data, warmup_steps, num_samples, seed=0):
    pyro.set_rng_seed(seed)
    mcmc = MCMC(kernel, warmup_steps=warmup_steps, num_samples=num_samples, disable_progbar=True)
    mcmc.run(*data)
    return mcmc


def energy(z):
    return 0.5 * (z["x"] ** 2).sum()


def assert_states_equal(a, b):
    """Two states (nested named tuples, dicts, tensors, numbers) are identical, bit for bit."""
    assert type(a).__name__ == type(b).__name__  # by name: pytest's doctest collection may import a module twice
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            assert_states_equal(a[key], b[key])
    elif isinstance(a, tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_states_equal(x, y)
    elif torch.is_tensor(a):
        assert a.dtype == b.dtype and torch.equal(a, b)
    else:
        assert a == b


@pytest.mark.slow
def test_continuation_equals_one_run(logistic_data):
    """run(W + S1), then a new kernel continues the pickled ``last_state`` for S2 under another seed: the draws
    (deterministic sites included), the final state and the generator are those of run(W + S1 + S2)."""
    whole_kernel = SGNHT_NO_REPLACE()
    whole = run(whole_kernel, logistic_data, warmup_steps=10, num_samples=50)
    first_kernel = SGNHT_NO_REPLACE()
    first = run(first_kernel, logistic_data, warmup_steps=10, num_samples=20)
    state = pickle.loads(pickle.dumps(first_kernel.last_state))
    assert first_kernel.state is None and state.state.i == 30 and state.num_warmup == 10
    kernel = SGNHT_NO_REPLACE()
    kernel.resume_from = state
    second = run(kernel, logistic_data, warmup_steps=0, num_samples=30, seed=123)
    assert kernel.resume_from is None  # consumed
    a, b, w = first.get_samples(), second.get_samples(), whole.get_samples()
    for name in ("w", "scale", "scaled_w"):
        assert torch.equal(torch.cat([a[name], b[name]]), w[name])
    assert_states_equal(kernel.last_state.state, whole_kernel.last_state.state)
    assert torch.equal(kernel.last_state.generator_state, whole_kernel.last_state.generator_state)
    # the state did not change by being continued: a second continuation from it is the same again
    again = SGNHT_NO_REPLACE()
    again.resume_from = state
    assert torch.equal(run(again, logistic_data, warmup_steps=0, num_samples=30).get_samples()["w"], b["w"])


@pytest.mark.slow
def test_continuation_keeps_the_chains_warmup_windows():
    """CSGLD calibrates its grid in the warm-up; a continuation without warm-up keeps the chain's windows
    (an "auto" grid needs a warm-up) and its grid and θ: the same draws and weights as one run."""

    def make():
        return CSGLD(potential_fn=lambda z: 0.5 * (z["x"] ** 2).sum(), step_size=0.05, num_partitions=10, **EAGER)

    def csgld_run(kernel, warmup_steps, num_samples):
        pyro.set_rng_seed(0)
        mcmc = MCMC(kernel, warmup_steps=warmup_steps, num_samples=num_samples, initial_params={"x": torch.ones(2)},
                    disable_progbar=True)  # fmt: skip
        mcmc.run()
        return mcmc

    whole = csgld_run(make(), 40, 60)
    first_kernel = make()
    first = csgld_run(first_kernel, 40, 25)
    kernel = make()
    kernel.resume_from = first_kernel.last_state
    second = csgld_run(kernel, 0, 35)
    assert torch.equal(torch.cat([first.get_samples()["x"], second.get_samples()["x"]]), whole.get_samples()["x"])
    assert (
        first.diagnostics()["log_weight"]["chain 0"] + second.diagnostics()["log_weight"]["chain 0"]
        == (whole.diagnostics()["log_weight"]["chain 0"])
    )
    assert second.diagnostics()["theta"] == whole.diagnostics()["theta"]
    assert kernel.last_state.num_warmup == 40


@pytest.mark.slow
def test_checkpointed_run_interrupted_then_resumed(logistic_data, tmp_path):
    """4 chunks of 10 draws, Ctrl-C during the third; a new kernel and ``MCMC`` call ``run`` again (another
    global seed): the draws, divergences and ``num_diverging`` of one run, readable by ArviZ."""
    whole = run(SGNHT_NO_REPLACE(**EAGER), logistic_data, warmup_steps=10, num_samples=40)

    def interrupt(kernel, params, stage, i):
        if stage == "Sample" and i == 5 and kernel.last_state is not None and kernel.last_state.state.i == 30:
            raise KeyboardInterrupt  # in the middle of the third chunk

    pyro.set_rng_seed(0)
    mcmc = MCMC(SGNHT_NO_REPLACE(**EAGER), warmup_steps=10, num_samples=40, hook_fn=interrupt, disable_progbar=True)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.run(mcmc, *logistic_data, checkpoint=tmp_path, checkpoint_every=10)
    idata = checkpoint.load(tmp_path)
    assert idata.posterior["w"].shape == (1, 20, 2)
    assert torch.equal(torch.from_numpy(idata.posterior["w"].values[0]), whole.get_samples()["w"][:20])
    assert mcmc.num_samples == 40 and mcmc.warmup_steps == 10 and mcmc.kernel.resume_from is None

    pyro.set_rng_seed(99)
    resumed = MCMC(SGNHT_NO_REPLACE(**EAGER), warmup_steps=10, num_samples=40, disable_progbar=True)
    checkpoint.run(resumed, *logistic_data, checkpoint=tmp_path, checkpoint_every=10)
    a, b = resumed.get_samples(group_by_chain=True), whole.get_samples(group_by_chain=True)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert resumed.diagnostics()["divergences"] == whole.diagnostics()["divergences"]
    assert resumed.diagnostics()["num_diverging"] == whole.diagnostics()["num_diverging"]
    assert resumed.kernel.last_state.state.i == 50
    idata = to_inference_data(resumed)  # the full-data log-likelihood, from the MCMC object
    assert idata.log_likelihood["y"].shape == (1, 40, 200) and idata.sample_stats["diverging"].shape == (1, 40)


def test_checkpoint_checks_its_run(logistic_data, tmp_path):
    pyro.set_rng_seed(0)
    kernel = SGLD(potential_fn=lambda z: 0.5 * (z["x"] ** 2).sum(), step_size=0.1, **EAGER)
    mcmc = MCMC(kernel, warmup_steps=5, num_samples=10, initial_params={"x": torch.ones(2)}, disable_progbar=True)
    checkpoint.run(mcmc, checkpoint=tmp_path, checkpoint_every=4)
    other = MCMC(kernel, warmup_steps=6, num_samples=10, initial_params={"x": torch.ones(2)}, disable_progbar=True)
    with pytest.raises(ValueError, match="num_warmup=5, not 6"):
        checkpoint.run(other, checkpoint=tmp_path, checkpoint_every=4)
    with pytest.warns(UserWarning, match="sequentially"):
        two = MCMC(kernel, warmup_steps=5, num_samples=10, num_chains=200, disable_progbar=True,
                   initial_params={"x": torch.randn(200, 2)})  # fmt: skip
    with pytest.raises(ValueError, match="num_chains=1"):
        checkpoint.run(two, checkpoint=tmp_path / "two", checkpoint_every=4)
    with pytest.raises(TypeError, match="ChainState"):  # not a ChainState
        kernel.resume_from = kernel.last_state.state


def test_a_chain_continues_only_with_its_kind_of_gradient_estimator(logistic_data, tmp_path):
    """A chain saved with SVRG's gradient does not continue with the minibatch one (their estimators' states differ):
    a clear error naming the option, before anything runs; with the run's `gradient` it continues."""
    def make(gradient, num_samples):
        kernel = SGLD(logistic_model, step_size=1e-3, gradient=gradient, compile_potential=False)
        return MCMC(kernel, warmup_steps=5, num_samples=num_samples, disable_progbar=True)

    pyro.set_rng_seed(0)
    checkpoint.run(make("svrg", 20), *logistic_data, checkpoint=tmp_path, checkpoint_every=10)
    with pytest.raises(ValueError, match="took its gradients with an estimator with a centre.*'minibatch'.*`gradient`"):
        checkpoint.run(make("minibatch", 30), *logistic_data, checkpoint=tmp_path, checkpoint_every=10)
    longer = make("svrg", 30)  # the saved chain goes on
    checkpoint.run(longer, *logistic_data, checkpoint=tmp_path, checkpoint_every=10)
    assert longer.get_samples()["w"].shape == (30, 2)


def test_last_state_survives_cleanup_and_pickling():
    kernel = SGNHT(potential_fn=energy, step_size=0.1, **EAGER)
    kernel.initial_params = {"x": torch.ones(2)}
    kernel.setup(warmup_steps=0)
    for _ in range(3):
        kernel.sample(None)
    kernel.cleanup()
    kernel.cleanup()  # Pyro's MCMC calls it twice
    assert type(kernel.last_state).__name__ == "ChainState" and kernel.last_state.state.i == 3
    copy = pickle.loads(pickle.dumps(kernel))
    assert_states_equal(copy.last_state.state, kernel.last_state.state)


def small_run(num_samples, directory, seed=0, **options):
    """A checkpointed SGNHT chain on a potential (5 warm-up steps); its ``MCMC``."""
    pyro.set_rng_seed(seed)
    kernel = SGNHT(potential_fn=energy, step_size=0.1, **EAGER)
    mcmc = MCMC(kernel, warmup_steps=5, num_samples=num_samples, initial_params={"x": torch.ones(2)},
                disable_progbar=True)  # fmt: skip
    checkpoint.run(mcmc, checkpoint=directory, checkpoint_every=10, **options)
    return mcmc


class Marker:
    """Unpickled, it creates the file ``path``: what a crafted pickle could do."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return open, (self.path, "w")


def test_a_crafted_pickle_runs_no_code(tmp_path):
    marker, crafted = tmp_path / "marker", tmp_path / "crafted"
    crafted.mkdir()
    (crafted / "state.pkl").write_bytes(pickle.dumps({"format": 1, "state": Marker(marker)}))
    with pytest.raises(ValueError, match=r"state\.pkl.*pickle.*allow_pickle=True"):
        checkpoint.load(crafted)
    with pytest.raises(ValueError, match=r"state\.pkl.*pickle.*allow_pickle=True"):
        small_run(20, crafted)
    assert not marker.exists()


def test_an_old_pickle_checkpoint_is_read_with_the_opt_in_and_a_warning(tmp_path):
    """A format-1 checkpoint (``state.pkl``) of 20 draws continues to the draws and final state of one run of
    40 with ``allow_pickle=True``, with a warning, and is rewritten in the current format."""
    pyro.set_rng_seed(0)
    whole_kernel = SGNHT(potential_fn=energy, step_size=0.1, **EAGER)
    whole = MCMC(whole_kernel, warmup_steps=5, num_samples=40, initial_params={"x": torch.ones(2)},
                 disable_progbar=True)  # fmt: skip
    whole.run()
    first = small_run(20, tmp_path)
    old = {"format": 1, "backend": "pyro", "kernel": "SGNHT", "num_warmup": 5, "num_chains": 1, "thinning": 1,
           "extra_fields": (), "num_draws": 20, "chunks": ["draws-00000.npz", "draws-00001.npz"],
           "state": first.kernel.last_state, "diagnostics": first._diagnostics}  # fmt: skip
    (tmp_path / "state.pkl").write_bytes(pickle.dumps(old))
    (tmp_path / "manifest.json").unlink()
    (tmp_path / "state-00001.npz").unlink()
    with pytest.raises(ValueError, match=r"state\.pkl.*allow_pickle=True"):
        small_run(40, tmp_path)
    with pytest.warns(UserWarning, match="a pickle can run any code"):
        resumed = small_run(40, tmp_path, seed=99, allow_pickle=True)
    assert torch.equal(resumed.get_samples()["x"], whole.get_samples()["x"])
    assert_states_equal(resumed.kernel.last_state.state, whole_kernel.last_state.state)
    assert not (tmp_path / "state.pkl").exists()
    assert checkpoint.load(tmp_path).posterior["x"].shape == (1, 40, 2)  # the current format: no opt-in


def test_a_damaged_checkpoint_gives_a_clear_error(tmp_path):
    """Swapped chunks, a flipped bit, an empty state file: each named, with the file, not a bare error."""
    pristine = tmp_path / "pristine"
    small_run(30, pristine)

    def damaged(name, damage):
        directory = tmp_path / name
        shutil.copytree(pristine, directory)
        damage(directory)
        return directory

    def swap(directory):
        a, b = directory / "draws-00001.npz", directory / "draws-00002.npz"
        a_content = a.read_bytes()
        a.write_bytes(b.read_bytes())
        b.write_bytes(a_content)

    def flip(directory):
        content = bytearray((directory / "draws-00000.npz").read_bytes())
        content[-40] ^= 0x10
        (directory / "draws-00000.npz").write_bytes(bytes(content))

    with pytest.raises(ValueError, match=r"draws-00001\.npz', chunk 1 \(10 draws\) in the manifest, holds the "
                                         r"contents of draws-00002\.npz \(chunk 2\): files were swapped"):  # fmt: skip
        checkpoint.load(damaged("swap", swap))
    with pytest.raises(ValueError, match=r"draws-00000\.npz', chunk 0 .* does not match its SHA-256 checksum"):
        small_run(40, damaged("flip", flip))
    empty = damaged("empty", lambda directory: (directory / "state-00002.npz").write_bytes(b""))
    with pytest.raises(ValueError, match=r"state-00002\.npz', the chain's state in the manifest, has 0 bytes"):
        small_run(40, empty)


def test_resuming_with_other_data_is_refused(logistic_data, tmp_path, monkeypatch):
    """Other data are refused unless ``check_data=False``; arrays above the size limit are fingerprinted by a
    strided sample (here every array, every 4th value of ``y``)."""
    monkeypatch.setattr(checkpoint, "_FULL_HASH_BYTES", 0)
    monkeypatch.setattr(checkpoint, "_SAMPLE_SIZE", 50)
    X, y = logistic_data

    def checkpointed(data, num_samples, **options):
        pyro.set_rng_seed(0)
        mcmc = MCMC(SGLD(logistic_model, step_size=1e-3, **EAGER), warmup_steps=5, num_samples=num_samples,
                    disable_progbar=True)  # fmt: skip
        checkpoint.run(mcmc, *data, checkpoint=tmp_path, checkpoint_every=10, **options)
        return mcmc

    checkpointed((X, y), 10)
    other_y = y.clone()
    other_y[8] = 1 - other_y[8]
    with pytest.raises(ValueError, match="argument 1 has other values.*check_data=False"):
        checkpointed((X, other_y), 20)
    with pytest.raises(ValueError, match=r"argument 1 has shape \(200,\) and dtype float64 here, \(200,\) and float32"):
        checkpointed((X, y.double()), 20)
    assert checkpointed((X, other_y), 20, check_data=False).get_samples()["w"].shape == (20, 2)
