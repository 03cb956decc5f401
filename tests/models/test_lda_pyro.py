"""Semi-collapsed LDA declared in Pyro (``models/lda_pyro.py``): its distributions against the NumPyro
declaration's, its collapsed-Gibbs sweep against the exact conditionals, the Fisher-identity gradient of
the Pyro kernels against the exact gradient of the collapsed marginal, and topic recovery on the synthetic
corpus of ``tests/models/test_lda.py``.
"""

import jax.numpy as jnp
import numpy as np
import pyro
import pytest
import torch
from pyro.infer import MCMC

from models import lda, lda_common, lda_pyro
from ppl_sgmcmc.pyro import SGNHT, SGRLD
from tests.helpers import K_SIGMA
from tests.models.test_lda import (
    ALPHA,
    DOC,
    FISHER_ALPHA,
    TOPICS,
    assert_frequencies,
    exact_marginal_gradient,
    matched_tv,
    one_sweep_distribution,
    synthetic_corpus,
    tiny_corpus,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_distributions_match_the_numpyro_declaration():
    rng = np.random.default_rng(0)
    mask = np.arange(6)[None, :] < rng.integers(1, 7, size=(4, 1))
    z = np.where(mask, rng.integers(0, 3, size=(4, 6)), 0)
    words = np.where(mask, rng.integers(0, 5, size=(4, 6)), 0)
    topics = rng.dirichlet(np.ones(5), size=3)
    for ours, theirs in [
        (lda_pyro.CollapsedTopicAssignments(0.3, 3, torch.as_tensor(mask)), lda.CollapsedTopicAssignments(0.3, 3, mask)),
        (
            lda_pyro.TopicWords(torch.as_tensor(topics), torch.as_tensor(z), torch.as_tensor(mask)),
            lda.TopicWords(jnp.asarray(topics), jnp.asarray(z), mask),
        ),
    ]:
        value = z if isinstance(ours, lda_pyro.CollapsedTopicAssignments) else words
        np.testing.assert_allclose(ours.log_prob(torch.as_tensor(value)).numpy(), np.asarray(theirs.log_prob(value)), rtol=1e-5)
        assert ours.batch_shape == theirs.batch_shape and ours.event_shape == theirs.event_shape
    sample = lda_pyro.CollapsedTopicAssignments(0.3, 3, torch.as_tensor(mask)).sample()
    assert sample.shape == mask.shape and torch.all(sample[~torch.as_tensor(mask)] == 0)


def test_one_sweep_is_the_sequence_of_exact_conditionals():
    """As the NumPyro sweep's test: one sweep from a fixed state, on 20000 copies of a 3-token document,
    against the product of the conditionals, each by enumeration."""
    z0 = np.array([1, 2, 0])
    words = torch.as_tensor(DOC).expand(20000, len(DOC))
    word_probs = lda_pyro.topic_columns(torch.as_tensor(TOPICS), words, "expanded")
    z = torch.as_tensor(z0).expand(words.shape).clone()
    generator = torch.Generator().manual_seed(3)
    z = lda_pyro.collapsed_gibbs_sweep(generator, z, word_probs, torch.ones(words.shape, dtype=torch.bool), ALPHA)
    assert_frequencies(z.numpy(), one_sweep_distribution(z0), "one sweep")


@pytest.mark.slow
@pytest.mark.parametrize("kernel_cls, parametrisation", [(SGNHT, "gaussian"), (SGRLD, "expanded")])
def test_fisher_identity_gradient_matches_the_collapsed_marginal(kernel_cls, parametrisation):
    """Averaged over minibatches and Gibbs sweeps, the Pyro kernels' stochastic gradient is the gradient of
    the collapsed marginal (SGRLD: in θ's own positive space)."""
    words, mask = map(torch.as_tensor, tiny_corpus())
    kernel = kernel_cls(
        lda_pyro.lda_model, step_size=1e-3, gibbs_sites=["z"], gibbs_sweeps=(4, 3),
        gibbs_fn=lda_pyro.make_gibbs_fn(words, mask, FISHER_ALPHA, parametrisation),
        gibbs_init=lda_pyro.make_gibbs_init(words, mask, parametrisation),
    )  # fmt: skip
    theta = torch.tensor([[0.8, -0.3, 0.5], [0.2, 1.1, 0.4]])
    if parametrisation == "expanded":
        theta = theta.abs()
    kernel.initial_params = {"theta": theta}
    kwargs = dict(vocab_size=3, num_topics=2, alpha=FISHER_ALPHA, parametrisation=parametrisation, beta=0.5, batch_size=2)
    kernel.setup(0, words, mask, **kwargs)
    target, generator = kernel._target, torch.Generator().manual_seed(1)
    batch_state = target.init_batch(generator)
    flat = theta.reshape(-1)
    grads = torch.stack([target.gradient(flat, target.draw(generator, batch_state)[0]).grad for _ in range(2000)])
    grads = grads.double().numpy()
    exact = exact_marginal_gradient(jnp.asarray(theta.numpy()), parametrisation).ravel()
    mean, mcse = grads.mean(0), grads.std(0) / np.sqrt(len(grads))
    print("estimate", mean, "\nexact   ", exact, "\nmcse    ", mcse)
    assert np.all(np.abs(mean - exact) < K_SIGMA * mcse)


@pytest.mark.slow
def test_recovers_known_topics():
    """As the NumPyro test: on 120 documents from a known 3-topic LDA, the posterior-mean topics of Pyro's
    mSGNHT-S (expanded mean) are within total-variation distance 0.1 of the true ones after matching."""
    truth, docs = synthetic_corpus()
    words, mask = map(torch.as_tensor, lda_common.pad_documents(docs))
    kernel = SGNHT(
        lda_pyro.lda_model, step_size=5e-3, diffusion=0.75, gibbs_sites=["z"], gibbs_sweeps=(2, 2),
        gibbs_fn=lda_pyro.make_gibbs_fn(words, mask, ALPHA, "expanded"),
        gibbs_init=lda_pyro.make_gibbs_init(words, mask, "expanded"), steps_per_sample=20,
    )  # fmt: skip
    pyro.set_rng_seed(0)
    mcmc = MCMC(kernel, warmup_steps=40, num_samples=40, disable_progbar=True)
    mcmc.run(words, mask, vocab_size=12, num_topics=3, alpha=ALPHA, parametrisation="expanded", beta=0.1, batch_size=10)
    topics = lda_pyro.topic_word(mcmc.get_samples()["theta"], "expanded").mean(0).numpy()
    tv = matched_tv(topics, truth)
    print("matched TV", tv)
    assert kernel.diagnostics()["num_diverging"] == 0
    assert tv.max() < 0.1
