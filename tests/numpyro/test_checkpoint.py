"""Checkpointed runs (``ppl_sgmcmc.checkpoint``) under NumPyro's MCMC: a run interrupted after some chunks and
resumed by a fresh ``MCMC`` (and kernel) gives exactly the draws, statistics and final state of one uninterrupted
run; the draws saved so far read as InferenceData at any time."""

import hashlib
import json
import pickle
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpyro.infer import MCMC

from ppl_sgmcmc import checkpoint
from ppl_sgmcmc.numpyro import CSGLD, SGLD, SGNHT, ReSGLD
from tests.numpyro.conftest import logistic_model

OPTIONS = dict(num_warmup=10, num_samples=40, progress_bar=False)


def interrupt_after(mcmc, num_runs):
    """Make ``mcmc.run`` raise ``KeyboardInterrupt`` at its call ``num_runs + 1`` (as a Ctrl-C during that chunk)."""
    run, calls = mcmc.run, []

    def interrupted(*args, **kwargs):
        calls.append(None)
        if len(calls) > num_runs:
            raise KeyboardInterrupt
        run(*args, **kwargs)

    mcmc.run = interrupted


def assert_same_run(mcmc, whole):
    """The draws, the collected fields and the final state of two runs are identical, bit for bit."""
    a, b = mcmc.get_samples(group_by_chain=True), whole.get_samples(group_by_chain=True)
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])
    a, b = mcmc.get_extra_fields(group_by_chain=True), whole.get_extra_fields(group_by_chain=True)
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])
    for leaf, expected in zip(jax.tree.leaves(mcmc.last_state), jax.tree.leaves(whole.last_state)):
        np.testing.assert_array_equal(leaf, expected)


@pytest.mark.slow
def test_interrupted_run_resumes_bit_for_bit_with_vectorized_chains(logistic_data, tmp_path):
    """Two vectorized chains, thinned by 2, 4 chunks of 10 draws; Ctrl-C during the second chunk, then a new
    ``MCMC`` with a new kernel calls ``run`` again (its chunks go on from each other): the same chains as one
    ``mcmc.run``."""
    make = lambda: MCMC(SGNHT(logistic_model, step_size=1e-2, replace=False),  # noqa: E731
                        num_chains=2, chain_method="vectorized", thinning=2, **OPTIONS)  # fmt: skip
    fields = ("i", "rule_state.thermostat", "potential_energy")
    whole = make()
    whole.run(jax.random.PRNGKey(1), *logistic_data, extra_fields=fields)

    mcmc = make()
    interrupt_after(mcmc, 1)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.run(mcmc, jax.random.PRNGKey(1), *logistic_data, extra_fields=fields,
                       checkpoint=tmp_path, checkpoint_every=10)  # fmt: skip
    idata = checkpoint.load(tmp_path)  # what the interrupted run kept: 1 chunk of 10 draws, thinned by 2
    assert idata.posterior["w"].shape == (2, 5, 2)
    np.testing.assert_array_equal(idata.posterior["w"], whole.get_samples(group_by_chain=True)["w"][:, :5])
    np.testing.assert_array_equal(idata.sample_stats["i"], whole.get_extra_fields(group_by_chain=True)["i"][:, :5])
    assert mcmc.num_samples == 40 and mcmc.post_warmup_state is None  # the MCMC object is left as it was

    resumed = make()  # a new process would do the same: everything comes from the checkpoint
    checkpoint.run(resumed, jax.random.PRNGKey(1), *logistic_data, extra_fields=fields,
                   checkpoint=tmp_path, checkpoint_every=10)  # fmt: skip
    assert_same_run(resumed, whole)
    assert int(resumed.last_state.i[0]) == 50 and resumed.post_warmup_state is None
    idata = checkpoint.load(tmp_path)
    np.testing.assert_array_equal(idata.posterior["scaled_w"], whole.get_samples(group_by_chain=True)["scaled_w"])
    np.testing.assert_array_equal(
        idata.sample_stats["minibatch_lp"], -whole.get_extra_fields(group_by_chain=True)["potential_energy"]
    )
    names = [f"draws-0000{k}.npz" for k in range(4)] + ["manifest.json", "state-00003.npz"]
    assert sorted(tmp_path.iterdir()) == [tmp_path / name for name in names]  # no pickle, one state


def test_a_chain_continues_only_with_its_kind_of_gradient_estimator(logistic_data, tmp_path):
    """A chain saved with the minibatch gradient does not continue with SVRG's, nor the other way round (their
    estimators' states differ): a clear error naming the option, before anything runs; with the run's `gradient`
    it continues. The run's 40 draws in two chunks (each compiles its loop), the fewest with a chunk after the
    interruption."""
    for saved, other in (("minibatch", "svrg"), ("svrg", "minibatch")):
        make = lambda gradient: MCMC(SGLD(logistic_model, step_size=1e-3, gradient=gradient), **OPTIONS)  # noqa: E731
        directory = tmp_path / saved
        mcmc = make(saved)
        interrupt_after(mcmc, 1)
        with pytest.raises(KeyboardInterrupt):
            checkpoint.run(mcmc, jax.random.PRNGKey(0), *logistic_data, checkpoint=directory, checkpoint_every=20)
        with pytest.raises(ValueError, match=f"took its gradients with .*takes them with '{other}'.*`gradient`"):
            checkpoint.run(make(other), jax.random.PRNGKey(0), *logistic_data, checkpoint=directory,
                           checkpoint_every=20)  # fmt: skip
        checkpoint.run(make(saved), jax.random.PRNGKey(0), *logistic_data, checkpoint=directory, checkpoint_every=20)
        assert checkpoint.load(directory).posterior["w"].shape == (1, 40, 2)


def resumed_and_whole(make, key, data, tmp_path, **kwargs):
    """``(resumed, whole)``: a run of ``make()`` interrupted during its second chunk of 20 draws and resumed by a new
    ``make()`` from the checkpoint, and one uninterrupted run, with the same key, data and ``run`` arguments."""
    whole = make()
    whole.run(jax.random.PRNGKey(key), *data, **kwargs)
    mcmc = make()
    interrupt_after(mcmc, 1)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.run(mcmc, jax.random.PRNGKey(key), *data, checkpoint=tmp_path, checkpoint_every=20, **kwargs)
    resumed = make()
    checkpoint.run(resumed, jax.random.PRNGKey(key), *data, checkpoint=tmp_path, checkpoint_every=20, **kwargs)
    return resumed, whole


@pytest.mark.slow
def test_csgld_with_an_auto_grid_resumes_bit_for_bit(logistic_data, tmp_path):
    """CSGLD calibrates its energy grid during the warm-up (the first chunk); a new kernel resuming the chain with
    the second chunk continues with that grid, ``θ`` and the chain's warm-up windows."""
    make = lambda: MCMC(CSGLD(logistic_model, step_size=1e-3, num_partitions=10), **OPTIONS)  # noqa: E731
    resumed, whole = resumed_and_whole(make, 2, logistic_data, tmp_path)
    assert_same_run(resumed, whole)  # log_weight and partition included
    assert np.all(np.isfinite(resumed.last_state.energy_gap))


@pytest.mark.slow
def test_replica_exchange_with_anchors_resumes_bit_for_bit(logistic_data, tmp_path):
    """ReSGLD adapts its ladder in the warm-up (the first chunk) and carries its hot replica, the anchors of its
    variance-reduced energies and the swap statistics in its state: a new kernel resuming with the second chunk
    continues the same chain."""
    make = lambda: MCMC(ReSGLD(logistic_model, step_size=1e-3, anchor_every=5), **OPTIONS)  # noqa: E731
    fields = ("swap_probability", "num_swaps", "cold_replica")
    resumed, whole = resumed_and_whole(make, 3, logistic_data, tmp_path, extra_fields=fields)
    assert_same_run(resumed, whole)
    assert bool(resumed.last_state.rule_state.anchored) and int(resumed.last_state.swaps[0]) > 0


def test_arguments_are_checked(tmp_path):
    mcmc = MCMC(SGLD(potential_fn=lambda z: 0.0, step_size=0.1), num_warmup=0, num_samples=30, thinning=3,
                progress_bar=False)  # fmt: skip
    with pytest.raises(ValueError, match="thinning"):
        checkpoint.run(mcmc, jax.random.PRNGKey(0), checkpoint=tmp_path, checkpoint_every=10)
    with pytest.raises(ValueError, match="checkpoint_every"):
        checkpoint.run(mcmc, jax.random.PRNGKey(0), checkpoint=tmp_path, checkpoint_every=0)
    with pytest.raises(TypeError, match="PRNG key"):
        checkpoint.run(mcmc, checkpoint=tmp_path, checkpoint_every=9)
    with pytest.raises(TypeError, match="NumPyro or Pyro"):
        checkpoint.run(object(), checkpoint=tmp_path, checkpoint_every=9)
    with pytest.raises(FileNotFoundError):
        checkpoint.load(tmp_path / "nothing")


def small_mcmc(num_samples):
    """A quick chain on a potential: 5 warm-up steps, then ``num_samples`` draws."""
    kernel = SGNHT(potential_fn=lambda z: 0.5 * jnp.sum(z["x"] ** 2), step_size=0.1)
    return MCMC(kernel, num_warmup=5, num_samples=num_samples, progress_bar=False)


INIT = {"x": jnp.ones(2)}
#: the tests that copy `three_chunks`: on one pytest-xdist worker (`--dist loadgroup`), which builds it once
on_three_chunks = pytest.mark.xdist_group("checkpoint_three_chunks")


@pytest.fixture(scope="module")
def three_chunks(tmp_path_factory):
    """A checkpoint of 3 chunks of 10 draws of :func:`small_mcmc` (seed 0), to copy, damage and continue, and its
    ``MCMC``."""
    directory = tmp_path_factory.mktemp("three_chunks")
    mcmc = small_mcmc(30)
    checkpoint.run(mcmc, jax.random.PRNGKey(0), init_params=INIT, checkpoint=directory, checkpoint_every=10)
    return directory, mcmc


@pytest.fixture(scope="module")
def forty_draws():
    """One uninterrupted run of :func:`small_mcmc` (seed 0): 40 draws, which a continued ``three_chunks`` gives."""
    whole = small_mcmc(40)
    whole.run(jax.random.PRNGKey(0), init_params=INIT)
    return whole


def copied(three_chunks, tmp_path):
    """A copy of the checkpoint of ``three_chunks`` in ``tmp_path``."""
    shutil.copytree(three_chunks[0], tmp_path / "checkpoint")
    return tmp_path / "checkpoint"


class Marker:
    """Unpickled, it creates the file ``path``: what a crafted pickle could do."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return open, (self.path, "w")


def rewrite_manifest(directory, change):
    """Change the manifest as a forger would: ``change(manifest)``, then its checksum recomputed."""
    path = directory / "manifest.json"
    manifest = json.loads(path.read_text())
    del manifest["checksum"]
    change(manifest)
    text = json.dumps(manifest, sort_keys=True, separators=(",", ":"))
    path.write_text(json.dumps({**manifest, "checksum": hashlib.sha256(text.encode()).hexdigest()}))


@on_three_chunks
def test_a_crafted_checkpoint_runs_no_code(three_chunks, tmp_path):
    """A ``state.pkl`` (the old format) is not unpickled without the opt-in, and the current format has no
    pickle anywhere: a pickled object array in the state file, or a manifest naming a function as a
    NamedTuple class, is refused, even with valid checksums. None of them creates the marker file."""
    marker = tmp_path / "marker"
    crafted = tmp_path / "crafted"
    crafted.mkdir()
    (crafted / "state.pkl").write_bytes(pickle.dumps({"format": 1, "chunks": [Marker(marker)]}))
    with pytest.raises(ValueError, match=r"state\.pkl.*pickle.*allow_pickle=True"):
        checkpoint.load(crafted)
    with pytest.raises(ValueError, match=r"state\.pkl.*pickle.*allow_pickle=True"):
        checkpoint.run(small_mcmc(20), jax.random.PRNGKey(0), init_params=INIT, checkpoint=crafted, checkpoint_every=10)
    assert not marker.exists()

    real = copied(three_chunks, tmp_path)
    state_file = real / "state-00002.npz"

    def forge(arrays, tree):  # a state file and its structure, with valid checksums
        np.savez(state_file, **arrays)
        content = state_file.read_bytes()
        state = {"file": state_file.name, "bytes": len(content), "sha256": hashlib.sha256(content).hexdigest()}
        rewrite_manifest(real, lambda manifest: manifest.update(state={**state, "tree": tree}))

    forge({"0": np.array([Marker(marker)], dtype=object)}, {"array": "0", "numpy": "object"})  # a pickle in the .npz
    with pytest.raises(ValueError, match=r"the chain's state in .*state-00002\.npz.* does not rebuild .*pickle"):
        checkpoint.run(small_mcmc(40), jax.random.PRNGKey(0), init_params=INIT, checkpoint=real, checkpoint_every=10)
    forge({}, {"namedtuple": "os:system", "fields": {}})  # a function where a NamedTuple class goes
    with pytest.raises(ValueError, match="'os:system' is not a NamedTuple class"):
        checkpoint.run(small_mcmc(40), jax.random.PRNGKey(0), init_params=INIT, checkpoint=real, checkpoint_every=10)
    assert not marker.exists()


@on_three_chunks
@pytest.mark.slow
def test_an_old_pickle_checkpoint_is_read_with_the_opt_in_and_a_warning(three_chunks, forty_draws, tmp_path):
    """A format-1 checkpoint (``state.pkl``) resumes bit for bit with ``allow_pickle=True``, with a warning,
    and is rewritten in the current format."""
    tmp_path = copied(three_chunks, tmp_path)
    old = {"format": 1, "backend": "numpyro", "kernel": "SGNHT", "num_warmup": 5, "num_chains": 1, "thinning": 1,
           "extra_fields": (), "num_draws": 30, "chunks": [f"draws-0000{k}.npz" for k in range(3)],
           "state": three_chunks[1].last_state, "diagnostics": None}  # fmt: skip
    (tmp_path / "state.pkl").write_bytes(pickle.dumps(old))
    (tmp_path / "manifest.json").unlink()
    (tmp_path / "state-00002.npz").unlink()

    with pytest.raises(ValueError, match=r"state\.pkl.*allow_pickle=True"):
        checkpoint.load(tmp_path)
    with pytest.warns(UserWarning, match="a pickle can run any code"):
        assert checkpoint.load(tmp_path, allow_pickle=True).posterior["x"].shape == (1, 30, 2)
    resumed = small_mcmc(40)
    with pytest.warns(UserWarning, match="a pickle can run any code"):
        checkpoint.run(resumed, jax.random.PRNGKey(0), init_params=INIT, checkpoint=tmp_path, checkpoint_every=10,
                       allow_pickle=True)  # fmt: skip
    assert_same_run(resumed, forty_draws)
    assert not (tmp_path / "state.pkl").exists() and (tmp_path / "manifest.json").exists()
    checkpoint.load(tmp_path)  # the current format: no opt-in needed


@on_three_chunks
@pytest.mark.slow
def test_a_finished_run_continues_with_a_larger_num_samples(three_chunks, forty_draws, tmp_path):
    """A complete checkpoint is only loaded; with more ``num_samples`` the chain goes on."""
    tmp_path = copied(three_chunks, tmp_path)
    loaded = small_mcmc(30)
    checkpoint.run(loaded, jax.random.PRNGKey(0), init_params=INIT, checkpoint=tmp_path, checkpoint_every=10)
    assert_same_run(loaded, three_chunks[1])
    longer = small_mcmc(40)
    checkpoint.run(longer, jax.random.PRNGKey(0), init_params=INIT, checkpoint=tmp_path, checkpoint_every=10)
    assert_same_run(longer, forty_draws)
    shorter = small_mcmc(30)
    with pytest.raises(ValueError, match="holds 40 draws, more than num_samples=30"):
        checkpoint.run(shorter, jax.random.PRNGKey(0), init_params=INIT, checkpoint=tmp_path, checkpoint_every=10)
    with pytest.raises(ValueError, match="num_warmup=5, not 6"):
        mcmc = MCMC(SGNHT(potential_fn=lambda z: 0.0, step_size=0.1), num_warmup=6, num_samples=40, progress_bar=False)
        checkpoint.run(mcmc, jax.random.PRNGKey(0), init_params=INIT, checkpoint=tmp_path, checkpoint_every=10)


@on_three_chunks
@pytest.mark.parametrize(
    "damage, message",
    [
        ("swap", r"draws-00000\.npz', chunk 0 \(10 draws\) in the manifest, holds the contents of draws-00001\.npz "
                 r"\(chunk 1\): files were swapped"),
        ("flip", r"draws-00001\.npz', chunk 1 \(10 draws\) in the manifest, does not match its SHA-256 checksum"),
        ("remove", r"draws-00002\.npz', chunk 2 \(10 draws\) in the manifest, is missing"),
        ("truncate state", r"state-00002\.npz', the chain's state in the manifest, has 100 bytes, not \d+: it is "
                           "truncated"),
        ("empty manifest", r"manifest\.json' is not a checkpoint manifest \(empty, truncated or damaged"),
        ("edit manifest", r"manifest\.json': its contents do not match its checksum"),
    ],
    ids=["swap", "flip", "remove", "truncate state", "empty manifest", "edit manifest"],
)  # fmt: skip
def test_a_damaged_checkpoint_gives_a_clear_error(three_chunks, tmp_path, damage, message):
    """Each damage is named, with the file, and no run goes on from it (nor a bare EOFError/BadZipFile)."""
    tmp_path = copied(three_chunks, tmp_path)
    chunk = tmp_path / "draws-00001.npz"
    if damage == "swap":
        shutil.move(tmp_path / "draws-00000.npz", tmp_path / "swap")
        shutil.move(chunk, tmp_path / "draws-00000.npz")
        shutil.move(tmp_path / "swap", chunk)
    elif damage == "flip":
        content = bytearray(chunk.read_bytes())
        content[len(content) // 2] ^= 1
        chunk.write_bytes(bytes(content))
    elif damage == "remove":
        (tmp_path / "draws-00002.npz").unlink()
    elif damage == "truncate state":
        state = tmp_path / "state-00002.npz"
        state.write_bytes(state.read_bytes()[:100])
    elif damage == "empty manifest":
        (tmp_path / "manifest.json").write_bytes(b"")
    else:
        manifest = tmp_path / "manifest.json"
        manifest.write_text(manifest.read_text().replace('"num_warmup": 5', '"num_warmup": 6'))
    with pytest.raises(ValueError, match=message) as error:
        checkpoint.run(small_mcmc(40), jax.random.PRNGKey(0), init_params=INIT, checkpoint=tmp_path,
                       checkpoint_every=10)  # fmt: skip
    assert "start the run again in a new directory" in str(error.value)
    if damage != "truncate state":  # `load` reads the manifest and the chunks, not the state
        with pytest.raises(ValueError, match=message):
            checkpoint.load(tmp_path)


@pytest.mark.slow
def test_resuming_with_other_data_is_refused(logistic_data, tmp_path):
    """The checkpoint keeps a fingerprint of the model's arguments: other values, shapes or dtypes are refused
    (naming the argument), unless ``check_data=False``."""
    X, y = logistic_data
    make = lambda n: MCMC(SGLD(logistic_model, step_size=1e-3), num_warmup=5, num_samples=n, progress_bar=False)  # noqa: E731
    checkpoint.run(make(10), jax.random.PRNGKey(0), X, y, checkpoint=tmp_path, checkpoint_every=10)
    other_y = y.at[7].set(1 - y[7])
    with pytest.raises(ValueError, match="argument 1 has other values.*check_data=False"):
        checkpoint.run(make(20), jax.random.PRNGKey(0), X, other_y, checkpoint=tmp_path, checkpoint_every=10)
    with pytest.raises(ValueError, match=r"argument 0 has shape \(100, 2\) and dtype float32 here, \(200, 2\)"):
        checkpoint.run(make(20), jax.random.PRNGKey(0), X[:100], y[:100], checkpoint=tmp_path, checkpoint_every=10)
    with pytest.raises(ValueError, match="keyword argument 'batch_size' is new"):
        checkpoint.run(make(20), jax.random.PRNGKey(0), X, y, batch_size=20, checkpoint=tmp_path, checkpoint_every=10)
    checkpoint.run(make(10), jax.random.PRNGKey(0), X, y, checkpoint=tmp_path, checkpoint_every=10)  # the same data
    resumed = make(20)
    checkpoint.run(resumed, jax.random.PRNGKey(0), X, other_y, checkpoint=tmp_path, checkpoint_every=10,
                   check_data=False)  # fmt: skip
    assert resumed.get_samples()["w"].shape == (20, 2)
