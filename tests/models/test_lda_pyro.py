"""Semi-collapsed LDA declared in Pyro (``models/lda_pyro.py``): its distributions against the NumPyro
declaration's, its collapsed-Gibbs sweep against the exact conditionals, and the two terms of the Pyro kernels'
Fisher-identity gradient (the complete-data gradient, the ``gibbs_fn``'s sweep). (Topic recovery on a synthetic corpus, a
quality bar, is ``benchmarks/quality_checks.py --only lda-topics-pyro``.)
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from models import lda, lda_pyro
from ppl_sgmcmc.pyro import SGNHT, SGRLD
from tests.models.test_lda import (
    ALPHA,
    DOC,
    FISHER_ALPHA,
    TINY_DOCS,
    TOPICS,
    assert_frequencies,
    one_sweep_distribution,
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


def complete_data_gradient(theta, rows, kept, parametrisation, num_docs):
    """``∇Ũ(θ)`` of the complete data: ``-∇[log p(θ) + (N/n) Σ_{d in rows} mean_s log p(w_d | z_sd, θ)]`` for the
    kept sweeps ``kept`` (``(S, n, L)``) of the documents ``rows`` of ``TINY_DOCS``, with NumPyro's ``topic_word``
    (``p(z)`` does not depend on ``θ``)."""
    import numpyro.distributions as ndist

    def energy(theta):
        prior = ndist.Normal(0.1, 1.0) if parametrisation == "gaussian" else ndist.Gamma(0.5, 1.0)
        log_topics = jnp.log(lda.topic_word(theta, parametrisation))
        lik = sum(
            log_topics[z[i], w] for sweep in kept for d, z in zip(rows, sweep) for i, w in enumerate(TINY_DOCS[d])
        )
        return -(prior.log_prob(theta).sum() + num_docs / len(rows) * lik / len(kept))

    return np.asarray(jax.grad(energy)(jnp.asarray(theta.numpy())), np.float64).ravel()


@pytest.mark.slow
@pytest.mark.parametrize("kernel_cls, parametrisation", [(SGNHT, "gaussian"), (SGRLD, "expanded")])
def test_fisher_identity_terms(kernel_cls, parametrisation):
    """The Pyro kernels' stochastic gradient is the collapsed marginal's in expectation (the Fisher identity
    ``∇ log p(w | θ) = E_{z | w, θ} ∇ log p(w, z | θ)``) if its two terms are right, each checked here directly:

    1. at given kept sweeps ``z`` and minibatch, the kernel's gradient (SGRLD: in θ's own positive space) is the
       complete-data gradient with the plate's ``N/n``, exactly, on every minibatch of 2 of the 4 documents;
    2. the ``gibbs_fn`` (the parametrisation's topics, the minibatch's rows, ``α``) draws one sweep of the exact
       conditionals: its frequencies over the 8 states of one document, from 20000 copies, within ``K_SIGMA``
       standard errors of the enumerated sweep (as the sweep tests).

    An average over 2000 draws of the stochastic gradient (what this test replaced) found a wrong gradient only
    beyond 4.5 MCSE, ~0.1-0.5 here; (1) finds any beyond round-off. How the kernels average the kept sweeps and redraw
    the minibatch is the Gibbs machinery's, whose Fisher identity ``tests/pyro/test_gibbs.py`` checks by Monte
    Carlo on a mixture; NumPyro's LDA estimator is checked by Monte Carlo in ``test_lda.py``."""
    words, mask = map(torch.as_tensor, tiny_corpus())
    gibbs_fn = lda_pyro.make_gibbs_fn(words, mask, FISHER_ALPHA, parametrisation)
    kernel = kernel_cls(
        lda_pyro.lda_model, step_size=1e-3, gibbs_sites=["z"], gibbs_sweeps=(4, 3), gibbs_fn=gibbs_fn,
        gibbs_init=lda_pyro.make_gibbs_init(words, mask, parametrisation), compile_potential=False,
    )  # fmt: skip
    theta = torch.tensor([[0.8, -0.3, 0.5], [0.2, 1.1, 0.4]])
    if parametrisation == "expanded":
        theta = theta.abs()
    kernel.initial_params = {"theta": theta}
    kwargs = dict(vocab_size=3, num_topics=2, alpha=FISHER_ALPHA, parametrisation=parametrisation, beta=0.5, batch_size=2)
    kernel.setup(0, words, mask, **kwargs)
    target = kernel._target

    rng = np.random.default_rng(0)
    for rows in itertools.combinations(range(len(TINY_DOCS)), 2):
        kept = torch.as_tensor(rng.integers(0, 2, size=(3, 2, words.shape[1])))
        target.local_samples = lambda flat, indices, seed, kept=kept: {"z": kept}  # the sweeps' draws, given
        got = target.gradient(theta.reshape(-1), ({"documents": torch.tensor(rows)}, 0)).grad
        expected = complete_data_gradient(theta, rows, kept.numpy(), parametrisation, len(TINY_DOCS))
        np.testing.assert_allclose(got.double().numpy(), expected, rtol=1e-5, atol=1e-5, err_msg=f"documents {rows}")

    doc, z0, copies = 2, np.array([1, 0, 1]), 20000
    sweep = gibbs_fn(
        torch.Generator().manual_seed(3), {"z": torch.as_tensor(z0).expand(copies, 3).clone()}, {"theta": theta},
        {"documents": torch.full((copies,), doc)},
    )["z"]  # fmt: skip
    topics = np.asarray(lda.topic_word(jnp.asarray(theta.numpy()), parametrisation), np.float64)
    exact = one_sweep_distribution(z0, np.array(TINY_DOCS[doc]), topics, FISHER_ALPHA)
    assert_frequencies(sweep.numpy(), exact, "one gibbs_fn sweep")
