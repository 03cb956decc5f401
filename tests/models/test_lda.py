"""Semi-collapsed LDA (``models/lda.py``, with ``models/lda_common.py``, ``models/lda_evaluation.py`` and
``models/run_lda.py``): the collapsed prior of the topic assignments, the
collapsed-Gibbs conditional against brute-force enumeration, the Fisher-identity gradient against the
exact gradient of the collapsed marginal, the perplexity functions on hand-computable cases. (The
quality bars, topic recovery on a synthetic corpus and the Reuters end-to-end run, are
``benchmarks/quality_checks.py --only lda-topics-numpyro`` and ``--only reuters``.)

Statistical tolerances are Monte Carlo errors: ``K_SIGMA = 4.5`` standard errors of the estimate.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree
from jax.scipy.special import logsumexp

from models import lda, lda_common, lda_evaluation, run_lda
from tests.helpers import K_SIGMA

ALPHA = 0.1


def polya_log_prob(z, num_topics, alpha):
    """``log p(z)`` of a Dirichlet-multinomial sequence by the Pólya urn: ``Π_i (n_{<i, z_i} + α) / (i + Kα)``."""
    counts = np.zeros(num_topics)
    total = 0.0
    for i, k in enumerate(z):
        total += np.log((counts[k] + alpha) / (i + num_topics * alpha))
        counts[k] += 1
    return total


def assert_frequencies(samples, probabilities, label):
    """Empirical frequencies of the rows of ``samples`` (tuples of states) against exact probabilities."""
    counts = {}
    for s in map(tuple, np.asarray(samples)):
        counts[s] = counts.get(s, 0) + 1
    m = len(samples)
    for state, p in probabilities.items():
        freq = counts.get(state, 0) / m
        se = np.sqrt(max(p * (1 - p), 1e-12) / m)
        assert abs(freq - p) < K_SIGMA * se + 1e-12, f"{label}: state {state}: frequency {freq:.4f}, exact {p:.4f}"
    assert set(counts) <= set(probabilities), f"{label}: impossible states sampled"


# --- data -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, docs, vocab, tokens", [("ap", 2246, 10473, 435838), ("reuters", 395, 4258, 84010)])
def test_bundled_corpora(name, docs, vocab, tokens):
    from models.datasets import CORPUS_PATHS, load_corpus

    corpus = load_corpus(name)
    assert CORPUS_PATHS[name].stat().st_size < 1_000_000
    assert (corpus.num_documents, corpus.vocab_size, corpus.num_tokens) == (docs, vocab, tokens)
    lengths = corpus.lengths()
    assert lengths.sum() == tokens and sum(len(corpus.tokens(d)) for d in range(docs)) == tokens
    matrix = corpus.matrix()
    assert matrix.shape == (docs, vocab) and matrix.sum() == tokens
    np.testing.assert_array_equal(np.asarray(matrix.sum(1)).ravel(), lengths)
    words, mask = lda_common.pad_documents([corpus.tokens(d) for d in range(3)])
    np.testing.assert_array_equal(mask.sum(1), lengths[:3])
    np.testing.assert_array_equal(words[0, : lengths[0]], corpus.tokens(0))
    if name == "reuters":
        assert corpus.titles[0].startswith("0 UK: Prince Charles") and corpus.vocab[:3] == ("church", "pope", "years")


def test_prepare_corpus_splits():
    from models.datasets import load_corpus

    corpus = load_corpus("reuters")
    data = lda_common.prepare_corpus(corpus)
    assert len(data.train_documents) == 316 and len(data.test_documents) == 79
    assert not set(data.train_documents) & set(data.test_documents)
    observed = sum(int(b[1].sum()) for b in data.held_out.buckets)
    held = sum(int(b[3].sum()) for b in data.held_out.buckets)
    assert held == data.held_out.num_tokens and observed + held == corpus.lengths()[data.test_documents].sum()
    assert 0.19 < held / (observed + held) < 0.21
    # the split is fixed by the seed
    again = lda_common.prepare_corpus(corpus)
    for a, b in zip(data.held_out.buckets, again.held_out.buckets):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)


# --- the collapsed prior -----------------------------------------------------------------------------
def test_collapsed_log_prob_is_the_polya_urn():
    rng = np.random.default_rng(0)
    num_topics = 4
    z = rng.integers(0, num_topics, size=(3, 7))
    mask = np.ones((3, 7), bool)
    mask[1, 5:] = False  # a shorter document: padding counts for nothing
    mask[2, 1:] = False
    d = lda.CollapsedTopicAssignments(ALPHA, num_topics, mask)
    assert d.batch_shape == (3,) and d.event_shape == (7,) and d.support.is_discrete
    expected = [polya_log_prob(z[i][mask[i]], num_topics, ALPHA) for i in range(3)]
    np.testing.assert_allclose(np.asarray(d.log_prob(jnp.asarray(z))), expected, rtol=1e-5)
    # the value at padded positions is irrelevant
    z2 = np.where(mask, z, (z + 1) % num_topics)
    np.testing.assert_allclose(np.asarray(d.log_prob(jnp.asarray(z2))), expected, rtol=1e-5)


def test_collapsed_sample_matches_the_polya_urn():
    """Sampled pairs ``(z_1, z_2)`` follow ``p(z) = Π_i (n_{<i,z_i} + α)/(i + Kα)``; padding is 0."""
    num_topics = 3
    mask = jnp.array([True, True, False])
    samples = lda.CollapsedTopicAssignments(ALPHA, num_topics, mask).sample(jax.random.PRNGKey(0), (20000,))
    assert np.all(np.asarray(samples[:, 2]) == 0)
    exact = {
        (a, b, 0): np.exp(polya_log_prob([a, b], num_topics, ALPHA))
        for a, b in itertools.product(range(num_topics), repeat=2)
    }
    assert_frequencies(samples, exact, "prior")


# --- the collapsed-Gibbs conditional ----------------------------------------------------------------
NUM_TOPICS, VOCAB = 3, 4
TOPICS = np.array([[0.5, 0.2, 0.2, 0.1], [0.1, 0.1, 0.3, 0.5], [0.25, 0.4, 0.05, 0.3]])
DOC = np.array([0, 3, 1])


def joint_log_prob(z, words=DOC, topics=TOPICS, alpha=ALPHA):
    return polya_log_prob(z, len(topics), alpha) + sum(np.log(topics[k, w]) for k, w in zip(z, words))


def conditional(i, z, words=DOC, topics=TOPICS, alpha=ALPHA):
    """``p(z_i = k | z_-i, w)`` by enumerating ``k`` in the joint (no formula)."""
    logits = np.array([joint_log_prob(np.r_[z[:i], k, z[i + 1 :]], words, topics, alpha) for k in range(len(topics))])
    p = np.exp(logits - logits.max())
    return p / p.sum()


def run_sweeps(z0, num_sweeps, num_chains=20000):
    """``num_sweeps`` sweeps of ``collapsed_gibbs_sweep`` on ``num_chains`` copies of the document."""
    words = jnp.broadcast_to(jnp.asarray(DOC), (num_chains, len(DOC)))
    mask = jnp.ones(words.shape, bool)
    word_probs = lda.topic_columns(jnp.asarray(TOPICS), words, "expanded")
    z = jnp.broadcast_to(jnp.asarray(z0, jnp.int32), words.shape)

    @jax.jit
    def run(key, z):
        return jax.lax.fori_loop(
            0, num_sweeps, lambda s, z: lda.collapsed_gibbs_sweep(jax.random.fold_in(key, s), z, word_probs, mask, ALPHA), z
        )

    return run(jax.random.PRNGKey(3), z)


def one_sweep_distribution(z0, words=DOC, topics=TOPICS, alpha=ALPHA):
    """From the state ``z0`` of a 3-token document, one sweep's distribution over the ``K³`` states (27 by default):
    ``p(z'_1 | z_2, z_3) p(z'_2 | z'_1, z_3) p(z'_3 | z'_1, z'_2)``, each conditional by enumeration."""
    exact = {}
    for new in itertools.product(range(len(topics)), repeat=3):
        z, p = np.array(z0), 1.0
        for i in range(3):
            p *= conditional(i, z, words, topics, alpha)[new[i]]
            z[i] = new[i]
        exact[new] = p
    return exact


def test_one_sweep_is_the_sequence_of_exact_conditionals():
    z0 = np.array([1, 2, 0])
    assert_frequencies(run_sweeps(z0, 1), one_sweep_distribution(z0), "one sweep")


def test_sweeps_leave_the_posterior_invariant():
    """Started from ``p(z | w, π)`` (enumerated over 27 states), the chain stays there after two sweeps.
    (From a fixed state it needs many sweeps at α = 0.1: moving a token off a topic that holds the rest of
    the document costs a factor ``α``.)"""
    states = list(itertools.product(range(NUM_TOPICS), repeat=3))
    logits = np.array([joint_log_prob(np.array(s)) for s in states])
    posterior = np.exp(logits - logsumexp(logits))
    start = np.array(states)[np.random.default_rng(5).choice(len(states), size=20000, p=posterior / posterior.sum())]
    assert_frequencies(run_sweeps(start, 2), dict(zip(states, posterior)), "posterior")


# --- the Fisher-identity gradient ----------------------------------------------------------------------
# four ragged documents over V = 3 words, K = 2 topics, minibatches of 2: z can be enumerated. α = 1 so
# that a few sweeps mix (at α = 0.1 a 3-token document leaves a shared topic only at a cost α per token,
# and the expectation would test the mixing of the sweeps rather than the identity).
TINY_DOCS = [[0, 0, 2], [1, 2], [2, 2, 1], [0]]
FISHER_ALPHA = 1.0


def tiny_corpus():
    return lda_common.pad_documents([np.array(d) for d in TINY_DOCS])


def exact_marginal_gradient(theta, parametrisation):
    """``∇U(θ)`` with ``U = -log p(θ) - Σ_d log Σ_{z_d} p(z_d) p(w_d | z_d, θ)``, by enumeration."""
    import numpyro.distributions as dist

    def energy(theta):
        prior = dist.Normal(0.1, 1.0) if parametrisation == "gaussian" else dist.Gamma(0.5, 1.0)
        topics = lda.topic_word(theta, parametrisation)
        total = prior.log_prob(theta).sum()
        for doc in TINY_DOCS:
            terms = []
            for z in itertools.product(range(2), repeat=len(doc)):
                log_pz = lda.CollapsedTopicAssignments(FISHER_ALPHA, 2, jnp.ones(len(doc), bool)).log_prob(jnp.array(z))
                terms.append(log_pz + sum(jnp.log(topics[k, w]) for k, w in zip(z, doc)))
            total += logsumexp(jnp.stack(terms))
        return -total

    return np.asarray(jax.grad(energy)(theta), np.float64)


@pytest.mark.slow
@pytest.mark.parametrize("kernel_name", ["mSGNHT-S", "SGRLD"])
def test_fisher_identity_gradient_matches_the_collapsed_marginal(kernel_name):
    """Averaged over minibatches and Gibbs sweeps, the kernel's stochastic gradient is the gradient of the
    collapsed marginal (``gaussian``: in θ, which is unconstrained; ``expanded``: in θ's own positive space,
    as SGRLD uses it)."""
    words, mask = tiny_corpus()
    kernel, parametrisation = run_lda.make_kernel(kernel_name, 1e-3, words, mask, alpha=FISHER_ALPHA, gibbs_sweeps=(4, 3))
    theta = jnp.array([[0.8, -0.3, 0.5], [0.2, 1.1, 0.4]])
    if parametrisation == "expanded":
        theta = jnp.abs(theta)
    args = (jnp.asarray(words), jnp.asarray(mask))
    kwargs = dict(vocab_size=3, num_topics=2, alpha=FISHER_ALPHA, parametrisation=parametrisation, beta=0.5, batch_size=2)
    state = kernel.init(jax.random.PRNGKey(0), 0, {"theta": theta}, args, kwargs)
    target = kernel._target
    flat, unravel = ravel_pytree(state.z)

    def one(key):
        batch, _ = target.draw(key, state.batch_state)
        return target.gradient(flat, unravel, batch, args, kwargs).grad

    grads = np.asarray(jax.jit(jax.vmap(one))(jax.random.split(jax.random.PRNGKey(1), 8000)), np.float64)
    exact = exact_marginal_gradient(theta, parametrisation).ravel()
    mean, mcse = grads.mean(0), grads.std(0) / np.sqrt(len(grads))
    print("estimate", mean, "\nexact   ", exact, "\nmcse    ", mcse)
    assert np.all(np.abs(mean - exact) < K_SIGMA * mcse)


# --- perplexity -------------------------------------------------------------------------------------
def test_perplexity_by_hand():
    p = [np.array([[0.5, 0.25, 0.9], [0.1, 0.2, 0.3]]), np.array([[0.125]])]
    masks = [np.array([[True, True, False], [True, False, False]]), np.array([[True]])]
    # exp(-(log 0.5 + log 0.25 + log 0.1 + log 0.125) / 4) = (0.5 · 0.25 · 0.1 · 0.125)^(-1/4)
    assert lda_common.perplexity(p, masks) == pytest.approx((0.5 * 0.25 * 0.1 * 0.125) ** -0.25, rel=1e-12)


def test_document_completion_by_hand():
    """One observed token ``w_o``: its topic is drawn from ``p(z = k) ∝ π_{k, w_o}`` every sweep, so
    ``θ̂_k → (P(z = k) + α)/(1 + Kα)`` and a held-out token ``w`` gets ``Σ_k θ̂_k π_kw``; averaged over two
    posterior samples of ``π``."""
    samples = np.stack([TOPICS, TOPICS[::-1]])
    held = lda_common.completion_split([np.array([1, 0, 2, 3, 3])], observed_fraction=0.2, num_buckets=1)
    observed_words, _, held_words, held_mask = held.buckets[0]
    assert observed_words.shape == (1, 1) and held_mask.sum() == 4
    w_o = observed_words[0, 0]
    expected = np.zeros(held_words.shape[1])
    for topics in samples:
        p_z = topics[:, w_o] / topics[:, w_o].sum()
        theta = (p_z + ALPHA) / (1 + NUM_TOPICS * ALPHA)
        expected += theta @ topics[:, held_words[0]] / len(samples)
    accumulator = lda_evaluation.PerplexityAccumulator(held, ALPHA, burn_in=0, kept=4000)
    for topics in samples:
        accumulator.add(topics)
    estimate = accumulator.sums[0][0] / accumulator.count
    # MC error of θ̂ (an average of 4000 independent indicators per sample), propagated to p(w)
    se = 0.5 / (1 + NUM_TOPICS * ALPHA) / np.sqrt(4000) / np.sqrt(len(samples))
    np.testing.assert_allclose(estimate, expected, atol=K_SIGMA * se)
    assert accumulator.perplexity() == pytest.approx(
        np.exp(-np.log(estimate).mean()), rel=1e-10
    ) and accumulator.perplexity() == pytest.approx(np.exp(-np.log(expected).mean()), rel=0.02)
