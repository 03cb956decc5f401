"""Checkpointed runs (``ppl_sgmcmc.checkpoint``) under NumPyro's MCMC: a run interrupted after some chunks and
resumed by a fresh ``MCMC`` (and kernel) gives exactly the draws, statistics and final state of one uninterrupted
run; the draws saved so far read as InferenceData at any time."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpyro.infer import MCMC

from ppl_sgmcmc import checkpoint
from ppl_sgmcmc.numpyro import CSGLD, SGLD, SGNHT
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


def test_interrupted_run_resumes_bit_for_bit_with_vectorized_chains(logistic_data, tmp_path):
    """Two vectorized chains, thinned by 2, 4 chunks of 10 draws; Ctrl-C during the third chunk, then a new
    ``MCMC`` with a new kernel calls ``run`` again: the same chains as one ``mcmc.run``."""
    make = lambda: MCMC(SGNHT(logistic_model, step_size=1e-2, replace=False),  # noqa: E731
                        num_chains=2, chain_method="vectorized", thinning=2, **OPTIONS)  # fmt: skip
    fields = ("i", "rule_state.thermostat", "potential_energy")
    whole = make()
    whole.run(jax.random.PRNGKey(1), *logistic_data, extra_fields=fields)

    mcmc = make()
    interrupt_after(mcmc, 2)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.run(mcmc, jax.random.PRNGKey(1), *logistic_data, extra_fields=fields,
                       checkpoint=tmp_path, checkpoint_every=10)  # fmt: skip
    idata = checkpoint.load(tmp_path)  # what the interrupted run kept: 2 chunks of 10 draws, thinned by 2
    assert idata.posterior["w"].shape == (2, 10, 2)
    np.testing.assert_array_equal(idata.posterior["w"], whole.get_samples(group_by_chain=True)["w"][:, :10])
    np.testing.assert_array_equal(idata.sample_stats["i"], whole.get_extra_fields(group_by_chain=True)["i"][:, :10])
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
    assert sorted((tmp_path).iterdir()) == [tmp_path / f"draws-0000{k}.npz" for k in range(4)] + [
        tmp_path / "state.pkl"
    ]


def test_csgld_with_an_auto_grid_resumes_bit_for_bit(logistic_data, tmp_path):
    """CSGLD calibrates its energy grid during the warm-up (the first chunk); the later chunks, and a new kernel
    resuming them, continue with that grid, ``θ`` and the chain's warm-up windows."""
    make = lambda: MCMC(CSGLD(logistic_model, step_size=1e-3, num_partitions=10), **OPTIONS)  # noqa: E731
    whole = make()
    whole.run(jax.random.PRNGKey(2), *logistic_data)
    mcmc = make()
    interrupt_after(mcmc, 1)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.run(mcmc, jax.random.PRNGKey(2), *logistic_data, checkpoint=tmp_path, checkpoint_every=15)
    resumed = make()
    checkpoint.run(resumed, jax.random.PRNGKey(2), *logistic_data, checkpoint=tmp_path, checkpoint_every=15)
    assert_same_run(resumed, whole)  # log_weight and partition included
    assert np.all(np.isfinite(resumed.last_state.energy_gap))


def test_a_finished_run_continues_with_a_larger_num_samples(tmp_path):
    """A complete checkpoint is only loaded; with more ``num_samples`` the chain goes on."""
    make = lambda num_samples: MCMC(  # noqa: E731
        SGLD(potential_fn=lambda z: 0.5 * jnp.sum(z["x"] ** 2), step_size=0.1),
        num_warmup=5, num_samples=num_samples, progress_bar=False,
    )  # fmt: skip
    init = {"x": jnp.ones(2)}
    whole = make(30)
    whole.run(jax.random.PRNGKey(0), init_params=init)
    short = make(20)
    checkpoint.run(short, jax.random.PRNGKey(0), init_params=init, checkpoint=tmp_path, checkpoint_every=20)
    longer = make(30)
    checkpoint.run(longer, jax.random.PRNGKey(0), init_params=init, checkpoint=tmp_path, checkpoint_every=20)
    assert_same_run(longer, whole)
    with pytest.raises(ValueError, match="holds 30 draws, more than num_samples=20"):
        checkpoint.run(make(20), jax.random.PRNGKey(0), init_params=init, checkpoint=tmp_path, checkpoint_every=20)
    with pytest.raises(ValueError, match="num_warmup=5, not 6"):
        mcmc = MCMC(SGLD(potential_fn=lambda z: 0.0, step_size=0.1), num_warmup=6, num_samples=30, progress_bar=False)
        checkpoint.run(mcmc, jax.random.PRNGKey(0), init_params=init, checkpoint=tmp_path, checkpoint_every=20)


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
