"""Semi-collapsed latent Dirichlet allocation, declared as an ordinary NumPyro model and sampled by
SG-MCMC with a local Gibbs step for the topic assignments (paper 000, §5.1; Patterson & Teh 2013).

**The model.** ``K`` topics over a vocabulary of ``V`` words; ``D`` documents in a plate subsampled
to ``batch_size`` documents per step. The per-document topic proportions ``Dirichlet(α)`` are
integrated out analytically (:class:`CollapsedTopicAssignments`), the per-token topic assignments
``z`` are a discrete latent site, the words are observed given ``z`` (:class:`TopicWords`). The
topic parameters come in two parametrisations:

* ``"gaussian"`` (paper 000, after Ding et al. 2014; for SGNHT and SGHMC):
  ``θ_kw ~ N(0.1, 1)``, ``π_kw = |θ_kw| / Σ_w |θ_kw|``;
* ``"expanded"`` (the expanded mean of Patterson & Teh; for SGRLD, which moves ``θ`` itself, and for
  SGNHT/SGHMC, which move ``log θ``): ``θ_kw ~ Gamma(β, 1)``, ``π_kw = θ_kw / Σ_w θ_kw``, so that
  ``π_k ~ Dirichlet(β)``, the model collapsed Gibbs samples with ``η = β``.

On AP and Reuters the posterior of the ``"gaussian"`` model has nearly flat topics (its ``|θ|`` acts
like a Dirichlet prior of concentration about 1 per word, with the vocabulary larger than the tokens
per topic), so its perplexity is far above collapsed Gibbs whatever the sampler; the ``"expanded"``
model with ``β = 0.1`` is the one to use (``benchmarks/RESULTS.md``). The same model declared in
Pyro is :mod:`models.lda_pyro` (``--backend pyro`` on the command line).

The kernels sample ``θ`` with ``z`` as local Gibbs sites (:mod:`ppl_sgmcmc.numpyro.gibbs`):
:func:`make_gibbs_fn` is the collapsed-Gibbs conditional of ``z`` given ``π``, and the stochastic
gradient is the Fisher-identity estimate ``(D/|S|) Σ_d E_{z_d|w_d,π}[∇ log p(w_d, z_d | θ)]`` averaged
over the kept sweeps::

    kernel = SGNHT(lda_model, step_size=1e-3, diffusion=0.75, gibbs_sites=["z"],
                   gibbs_fn=make_gibbs_fn(words, mask, alpha=0.1), gibbs_init=make_gibbs_init(words, mask),
                   gibbs_sweeps=(5, 5))
    MCMC(kernel, num_warmup=..., num_samples=...).run(key, words, mask, vocab_size=V)

**Documents** are rows of a padded ``(D, L)`` array of word ids with a boolean ``mask`` (tokens first,
padding after; :func:`pad_documents`). Each Gibbs sweep loops over token positions only up to the
longest document of the minibatch, so padding to the corpus' longest document costs memory, not
time.

**Evaluation: held-out perplexity by document completion** (:func:`held_out_perplexity`). The test
documents are split once, by a seeded random permutation of each document's tokens, into an
observed 80% and a held-out 20% (:func:`completion_split`). For each posterior sample of the topics
``π^(s)``, collapsed Gibbs on the observed part alone (``burn_in`` sweeps from ``z_i ∝ π_{k,w_i}``,
then ``kept`` sweeps) estimates the document's topic proportions
``θ̂_d = mean over kept sweeps of (n_dk + α) / (L_obs + K α)``; each held-out token ``w`` gets the
predictive probability ``p_s(w) = Σ_k θ̂_dk π^(s)_kw``. The probabilities are averaged over the
posterior samples, ``p̄(w) = mean_s p_s(w)``, and the perplexity is
``exp(-Σ_{held-out tokens} log p̄(w) / #held-out tokens)``. Baselines (``benchmarks/lda.py``) are
scored by exactly this function, from their own topic estimates.

``python -m models.lda --help`` runs a sampler on AP or Reuters and prints the perplexity and the
top words of the topics.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from jax import lax, random
from jax.scipy.special import gammaln
from numpyro.distributions import constraints

PARAMETRISATIONS = ("gaussian", "expanded")


# --- distributions ----------------------------------------------------------------------------------
def topic_counts(z, mask, num_topics):
    """``n_dk``: the number of unmasked tokens of each document assigned to each topic, shape ``(..., K)``."""
    return jnp.sum(jax.nn.one_hot(z, num_topics) * mask[..., None], axis=-2)


class CollapsedTopicAssignments(dist.Distribution):
    """The topic assignments ``z_d = (z_d1..z_dL)`` of a document whose topic proportions
    ``Dirichlet(α 1_K)`` are integrated out (a Dirichlet-multinomial sequence)::

        log p(z_d) = log Γ(Kα) - log Γ(Kα + L_d) + Σ_k [log Γ(α + n_dk) - log Γ(α)]

    with ``n_dk`` the tokens of ``d`` assigned to ``k`` and ``L_d`` the document's length; masked
    (padding) positions count for nothing and are sampled as 0.

    :param concentration: ``α > 0`` (a scalar).
    :param int num_topics: ``K``.
    :param mask: boolean ``(..., L)``; batch shape ``mask.shape[:-1]``, event shape ``(L,)``.
    """

    arg_constraints = {"concentration": constraints.positive}
    pytree_data_fields = ("concentration", "mask")
    pytree_aux_fields = ("num_topics",)

    def __init__(self, concentration, num_topics, mask, *, validate_args=None):
        self.concentration = jnp.asarray(concentration, dtype=jnp.result_type(float))
        self.num_topics = int(num_topics)
        self.mask = jnp.asarray(mask, dtype=bool)
        super().__init__(self.mask.shape[:-1], self.mask.shape[-1:], validate_args=validate_args)

    @constraints.dependent_property(is_discrete=True, event_dim=1)
    def support(self):
        return constraints.independent(constraints.integer_interval(0, self.num_topics - 1), 1)

    def sample(self, key, sample_shape=()):
        """Proportions ``θ_d ~ Dirichlet(α)`` (drawn in log space, stable for small ``α``), then ``z_di ~ θ_d``."""
        key_theta, key_z = random.split(key)
        shape = sample_shape + self.batch_shape
        log_theta = random.loggamma(key_theta, self.concentration, shape + (self.num_topics,))
        z = random.categorical(key_z, log_theta[..., None, :], shape=shape + self.event_shape)
        return jnp.where(self.mask, z, 0)

    def log_prob(self, value):
        alpha, num_topics = self.concentration, self.num_topics
        counts = topic_counts(value, self.mask, num_topics)
        length = jnp.sum(self.mask, axis=-1)
        return (
            gammaln(num_topics * alpha)
            - gammaln(num_topics * alpha + length)
            + jnp.sum(gammaln(alpha + counts), axis=-1)
            - num_topics * gammaln(alpha)
        )


class TopicWords(dist.Distribution):
    """Words given their topic assignments: ``w_di ~ Categorical(π[z_di])``, masked positions excluded.

    ``log_prob`` gathers ``π[z, w]`` (it never forms the ``(..., L, V)`` table of ``π[z]``).

    :param topics: ``π``, shape ``(K, V)``, rows on the simplex.
    :param assignments: ``z``, integer ``(..., L)``.
    :param mask: boolean, the shape of ``assignments``.
    """

    arg_constraints = {}
    pytree_data_fields = ("topics", "assignments", "mask")

    def __init__(self, topics, assignments, mask, *, validate_args=None):
        self.topics = topics
        self.assignments = assignments
        self.mask = jnp.asarray(mask, dtype=bool)
        batch_shape = jnp.broadcast_shapes(jnp.shape(assignments), self.mask.shape)
        super().__init__(batch_shape[:-1], batch_shape[-1:], validate_args=validate_args)

    @constraints.dependent_property(is_discrete=True, event_dim=1)
    def support(self):
        return constraints.independent(constraints.integer_interval(0, self.topics.shape[-1] - 1), 1)

    def sample(self, key, sample_shape=()):
        logits = jnp.log(self.topics)[self.assignments]
        words = random.categorical(key, logits, shape=sample_shape + self.batch_shape + self.event_shape)
        return jnp.where(self.mask, words, 0)

    def log_prob(self, value):
        return jnp.sum(jnp.where(self.mask, jnp.log(self.topics[self.assignments, value]), 0.0), axis=-1)


# --- the model --------------------------------------------------------------------------------------
def topic_word(theta, parametrisation="gaussian"):
    """The topics ``π`` (rows on the simplex) from the topic parameters ``θ`` (``(..., K, V)``)."""
    weights = jnp.abs(theta) if parametrisation == "gaussian" else theta
    return weights / jnp.sum(weights, axis=-1, keepdims=True)


def lda_model(
    words,
    mask,
    vocab_size,
    num_topics=30,
    alpha=0.1,
    parametrisation="gaussian",
    beta=0.1,
    prior_mean=0.1,
    batch_size=5,
):
    """Semi-collapsed LDA on padded documents ``words`` (``(D, L)`` word ids) with ``mask``.

    :param int vocab_size: ``V``.
    :param int num_topics: ``K``.
    :param float alpha: ``α``, the Dirichlet concentration of the (collapsed) topic proportions.
    :param str parametrisation: ``"gaussian"``: ``θ_kw ~ N(prior_mean, 1)``, ``π ∝ |θ|`` (paper 000);
        ``"expanded"``: ``θ_kw ~ Gamma(beta, 1)``, ``π ∝ θ`` (Patterson & Teh's expanded mean).
    :param int batch_size: documents per minibatch (the plate's ``subsample_size``).
    """
    num_docs = words.shape[0]
    if parametrisation == "gaussian":
        prior = dist.Normal(prior_mean, 1.0)
    elif parametrisation == "expanded":
        prior = dist.Gamma(beta, 1.0)
    else:
        raise ValueError(f"unknown parametrisation {parametrisation!r}; choose one of {PARAMETRISATIONS}")
    theta = numpyro.sample("theta", prior.expand([num_topics, vocab_size]).to_event(2))
    topics = topic_word(theta, parametrisation)
    with numpyro.plate("documents", num_docs, subsample_size=min(batch_size, num_docs)):
        batch_words = numpyro.subsample(words, event_dim=1)
        batch_mask = numpyro.subsample(mask, event_dim=1)
        z = numpyro.sample("z", CollapsedTopicAssignments(alpha, num_topics, batch_mask))
        numpyro.sample("words", TopicWords(topics, z, batch_mask), obs=batch_words)


# --- collapsed Gibbs ----------------------------------------------------------------------------------
def collapsed_gibbs_sweep(rng_key, z, word_probs, mask, alpha):
    """One sequential collapsed-Gibbs sweep over the tokens of a batch of documents.

    Token ``i`` of document ``d`` is redrawn from ``p(z_di = k | z_d,-i, w) ∝ (n_dk^{-di} + α) π_{k,w_di}``,
    positions in order, all documents at once. ``word_probs[d, i, k] = π_{k, w_di}``; masked positions
    keep their value and count for nothing. The loop stops at the last unmasked position of the batch.

    :return: the new ``z`` (same shape, ``(n, L)``).
    """
    num_docs, length, num_topics = word_probs.shape
    counts = topic_counts(z, mask, num_topics)
    uniforms = random.uniform(rng_key, (length, num_docs), dtype=counts.dtype)
    positions = jnp.max(jnp.where(mask, jnp.arange(1, length + 1), 0))
    z_t, mask_t, probs_t = z.T, mask.T, jnp.swapaxes(word_probs, 0, 1)

    def body(i, carry):
        z_t, counts = carry
        old, on = z_t[i], mask_t[i]
        counts = counts - jax.nn.one_hot(old, num_topics, dtype=counts.dtype) * on[:, None]
        cdf = jnp.cumsum((counts + alpha) * probs_t[i], axis=-1)
        new = jnp.sum(cdf < uniforms[i][:, None] * cdf[:, -1:], axis=-1)
        new = jnp.where(on, jnp.minimum(new, num_topics - 1), old).astype(z_t.dtype)
        counts = counts + jax.nn.one_hot(new, num_topics, dtype=counts.dtype) * on[:, None]
        return z_t.at[i].set(new), counts

    z_t, _ = lax.fori_loop(0, positions, body, (z_t, counts))
    return z_t.T


def topic_columns(theta, words, parametrisation="gaussian"):
    """``π_{k, w_di}`` for the tokens ``words`` (``(n, L)``), shape ``(n, L, K)``, without forming all of ``π``."""
    weights = jnp.abs(theta) if parametrisation == "gaussian" else theta
    norms = jnp.sum(weights, axis=-1)
    return jnp.moveaxis(weights[:, words], 0, -1) / norms


def make_gibbs_fn(words, mask, alpha=0.1, parametrisation="gaussian", plate="documents", site="z"):
    """The collapsed-Gibbs conditional of the topic assignments, as a ``gibbs_fn`` for the kernels'
    ``gibbs_sites=["z"]`` option: one sweep (:func:`collapsed_gibbs_sweep`) over the minibatch's
    documents given the topics of ``hmc_sites["theta"]``. ``words`` and ``mask`` are the full padded
    corpus given to the model; the minibatch's rows are taken by ``subsample_indices[plate]``."""
    words, mask = jnp.asarray(words), jnp.asarray(mask, dtype=bool)

    def gibbs_fn(rng_key, gibbs_sites, hmc_sites, subsample_indices):
        rows = subsample_indices[plate]
        batch_words, batch_mask = words[rows], mask[rows]
        word_probs = topic_columns(hmc_sites["theta"], batch_words, parametrisation)
        return {site: collapsed_gibbs_sweep(rng_key, gibbs_sites[site], word_probs, batch_mask, alpha)}

    return gibbs_fn


def make_gibbs_init(words, mask, parametrisation="gaussian", plate="documents", site="z"):
    """The starting point of the sweeps, as a ``gibbs_init`` for the kernels: each token's topic drawn
    from ``p(z_di = k | w_di, π) ∝ π_{k, w_di}`` (the conditional under uniform document proportions),
    independently. The model's prior draw is a poor start at small ``α``: it puts each document on one
    or two random topics, which the collapsed sweeps leave only at a cost ``α`` per token."""
    words, mask = jnp.asarray(words), jnp.asarray(mask, dtype=bool)

    def gibbs_init(rng_key, gibbs_sites, hmc_sites, subsample_indices):
        rows = subsample_indices[plate]
        word_probs = topic_columns(hmc_sites["theta"], words[rows], parametrisation)
        z = random.categorical(rng_key, jnp.log(word_probs))
        return {site: jnp.where(mask[rows], z, 0)}

    return gibbs_init


# --- data -------------------------------------------------------------------------------------------
def pad_documents(token_lists, length=None):
    """``(words, mask)``: documents as rows of int32 word ids, tokens first, padded with 0 to ``length``
    (default: the longest document)."""
    length = max((len(t) for t in token_lists), default=0) if length is None else length
    words = np.zeros((len(token_lists), max(length, 1)), np.int32)
    mask = np.zeros(words.shape, bool)
    for d, tokens in enumerate(token_lists):
        words[d, : len(tokens)] = tokens
        mask[d, : len(tokens)] = True
    return words, mask


@dataclass
class HeldOut:
    """Test documents split for document completion, grouped into buckets of similar length.

    ``buckets``: list of ``(observed_words, observed_mask, held_words, held_mask)`` NumPy arrays;
    ``documents``: the test documents' indices in each bucket; ``num_tokens``: held-out tokens in all."""

    buckets: list
    documents: list
    num_tokens: int


def completion_split(token_lists, observed_fraction=0.8, seed=0, num_buckets=4):
    """Split each document's tokens once, by a seeded random permutation, into an observed part
    (``round(observed_fraction · L)`` tokens, at least 1) and a held-out part (the rest)."""
    rng = np.random.default_rng(seed)
    observed, held = [], []
    for tokens in token_lists:
        tokens = np.asarray(tokens)
        perm = rng.permutation(len(tokens))
        n_obs = min(len(tokens), max(1, int(round(observed_fraction * len(tokens)))))
        observed.append(tokens[np.sort(perm[:n_obs])])
        held.append(tokens[np.sort(perm[n_obs:])])
    order = np.argsort([len(t) for t in observed], kind="stable")
    buckets, documents = [], []
    for chunk in np.array_split(order, min(num_buckets, max(len(order), 1))):
        if len(chunk) == 0:
            continue
        buckets.append(pad_documents([observed[d] for d in chunk]) + pad_documents([held[d] for d in chunk]))
        documents.append(chunk)
    return HeldOut(buckets, documents, int(sum(len(h) for h in held)))


@dataclass
class PreparedCorpus:
    """A corpus split 80/20 by documents: padded training documents and the completion split of the test ones."""

    train_words: np.ndarray
    train_mask: np.ndarray
    train_documents: np.ndarray
    test_documents: np.ndarray
    held_out: HeldOut
    vocab: tuple

    @property
    def vocab_size(self):
        return len(self.vocab)


def prepare_corpus(corpus, test_fraction=0.2, seed=0, observed_fraction=0.8, num_buckets=4):
    """Split ``corpus`` (a :class:`models.datasets.Corpus`) by a seeded permutation of its documents:
    ``test_fraction`` of them for testing (split again by :func:`completion_split`), the rest for training."""
    rng = np.random.default_rng(seed)
    perm = rng.permutation(corpus.num_documents)
    num_test = int(round(test_fraction * corpus.num_documents))
    test, train = np.sort(perm[:num_test]), np.sort(perm[num_test:])
    words, mask = pad_documents([corpus.tokens(d) for d in train])
    held_out = completion_split([corpus.tokens(d) for d in test], observed_fraction, seed=seed + 1, num_buckets=num_buckets)
    return PreparedCorpus(words, mask, train, test, held_out, corpus.vocab)


# --- evaluation -------------------------------------------------------------------------------------
@partial(jax.jit, static_argnames=("burn_in", "kept"))
def completion_probabilities(rng_key, topics, observed_words, observed_mask, held_words, alpha, burn_in=20, kept=30):
    """Predictive probabilities ``Σ_k θ̂_dk π_kw`` of the held-out tokens of a batch of documents, given
    one topic matrix ``π`` (``(K, V)``), with ``θ̂_d`` from collapsed Gibbs on the observed tokens (see
    the module docstring). Shape of ``held_words``; masked entries are meaningless."""
    num_topics = topics.shape[0]
    word_probs = jnp.moveaxis(topics[:, observed_words], 0, -1)
    key_init, key_sweeps = random.split(rng_key)
    z = random.categorical(key_init, jnp.log(word_probs))
    keys = random.split(key_sweeps, burn_in + kept)
    sweep = partial(collapsed_gibbs_sweep, word_probs=word_probs, mask=observed_mask, alpha=alpha)
    z, _ = lax.scan(lambda z, k: (sweep(k, z), None), z, keys[:burn_in])
    length = jnp.sum(observed_mask, axis=-1, keepdims=True)

    def kept_sweep(z, k):
        z = sweep(k, z)
        return z, (topic_counts(z, observed_mask, num_topics) + alpha) / (length + num_topics * alpha)

    _, proportions = lax.scan(kept_sweep, z, keys[burn_in:])
    proportions = proportions.mean(0)
    return jnp.einsum("dk,kdl->dl", proportions, topics[:, held_words])


def perplexity(probabilities, masks):
    """``exp(-Σ log p / #tokens)`` over the unmasked entries of per-token probabilities (arrays or lists of them)."""
    if not isinstance(probabilities, (list, tuple)):
        probabilities, masks = [probabilities], [masks]
    total = sum(float(np.sum(np.where(m, np.log(np.where(m, p, 1.0)), 0.0))) for p, m in zip(probabilities, masks))
    count = sum(int(np.sum(m)) for m in masks)
    return float(np.exp(-total / count))


class PerplexityAccumulator:
    """Running average of the held-out predictive probabilities over posterior samples of the topics."""

    def __init__(self, held_out, alpha, burn_in=20, kept=30, seed=0):
        self.held_out, self.alpha, self.burn_in, self.kept = held_out, alpha, burn_in, kept
        self.key = random.PRNGKey(seed)
        self.sums = [np.zeros(b[2].shape) for b in held_out.buckets]
        self.count = 0

    def probabilities(self, topics):
        """Per-token probabilities of one topic matrix, per bucket."""
        topics = jnp.asarray(topics)
        out = []
        for observed_words, observed_mask, held_words, _ in self.held_out.buckets:
            self.key, key = random.split(self.key)
            p = completion_probabilities(
                key, topics, observed_words, observed_mask, held_words, self.alpha, burn_in=self.burn_in, kept=self.kept
            )
            out.append(np.asarray(p, dtype=np.float64))
        return out

    def add(self, topics):
        for total, p in zip(self.sums, self.probabilities(topics)):
            total += p
        self.count += 1
        return self

    def add_probabilities(self, probabilities):
        for total, p in zip(self.sums, probabilities):
            total += p
        self.count += 1
        return self

    def perplexity(self):
        return perplexity([s / self.count for s in self.sums], [b[3] for b in self.held_out.buckets])


def held_out_perplexity(topic_samples, held_out, alpha, burn_in=20, kept=30, seed=0):
    """Document-completion perplexity (module docstring) with predictive probabilities averaged over
    the posterior samples ``topic_samples`` (``(S, K, V)`` topic matrices, rows on the simplex)."""
    accumulator = PerplexityAccumulator(held_out, alpha, burn_in, kept, seed)
    for topics in topic_samples:
        accumulator.add(topics)
    return accumulator.perplexity()


def top_words(topics, vocab, num_words=10):
    """The ``num_words`` most probable words of each topic."""
    order = np.argsort(-np.asarray(topics), axis=-1)[:, :num_words]
    return [[vocab[i] for i in row] for row in order]


# --- command line -----------------------------------------------------------------------------------
def make_kernel(
    name,
    step_size,
    words,
    mask,
    alpha=0.1,
    diffusion=0.75,
    gibbs_sweeps=(5, 5),
    parametrisation=None,
    backend="numpyro",
    **kwargs,
):
    """A kernel for LDA by name, with the collapsed-Gibbs local step: ``mSGNHT-S``, ``mSGNHT-E``,
    ``SGHMC-S``, ``SGHMC-E`` (diffusion / friction ``D``; by default on paper 000's ``"gaussian"``
    parametrisation, or on the ``"expanded"`` mean, sampled in log space) or ``SGRLD`` (expanded mean,
    in its own positive space). ``backend="pyro"`` gives the Pyro kernel on the Pyro declaration
    (:mod:`models.lda_pyro`; ``words`` and ``mask`` as tensors). Returns ``(kernel, parametrisation)``;
    other keyword arguments go to the kernel."""
    if backend == "numpyro":
        from ppl_sgmcmc.numpyro import SGHMC, SGNHT, SGRLD

        declaration = sys.modules[__name__]
    elif backend == "pyro":
        from models import lda_pyro as declaration
        from ppl_sgmcmc.pyro import SGHMC, SGNHT, SGRLD

    else:
        raise ValueError(f"unknown backend {backend!r}; choose 'numpyro' or 'pyro'")
    if parametrisation is None:
        parametrisation = "expanded" if name == "SGRLD" else "gaussian"
    elif name == "SGRLD" and parametrisation != "expanded":
        raise ValueError("SGRLD samples the expanded-mean parametrisation only")
    gibbs = dict(
        gibbs_sites=["z"],
        gibbs_fn=declaration.make_gibbs_fn(words, mask, alpha, parametrisation),
        gibbs_init=declaration.make_gibbs_init(words, mask, parametrisation),
        gibbs_sweeps=gibbs_sweeps,
    )
    model = declaration.lda_model
    integrator = "euler" if name.endswith("-E") else "splitting"
    if name.startswith("mSGNHT"):
        kernel = SGNHT(model, step_size=step_size, diffusion=diffusion, integrator=integrator, **gibbs, **kwargs)
    elif name.startswith("SGHMC"):
        kernel = SGHMC(model, step_size=step_size, friction=diffusion, integrator=integrator, **gibbs, **kwargs)
    elif name == "SGRLD":
        kernel = SGRLD(model, step_size=step_size, **gibbs, **kwargs)
    else:
        raise ValueError(f"unknown kernel {name!r}")
    return kernel, parametrisation


KERNELS = ("mSGNHT-S", "mSGNHT-E", "SGHMC-S", "SGHMC-E", "SGRLD")


def run_chain(kernel, backend, seed, num_warmup, num_samples, words, mask, **model_kwargs):
    """Run ``kernel`` through its PPL's ``MCMC`` (``num_warmup`` / ``num_samples`` draws); returns the
    samples of ``theta`` as a NumPy array and the number of rejected (non-finite) steps."""
    if backend == "numpyro":
        from numpyro.infer import MCMC

        mcmc = MCMC(kernel, num_warmup=num_warmup, num_samples=num_samples)
        mcmc.run(random.PRNGKey(seed), words, mask, **model_kwargs)
        return np.asarray(mcmc.get_samples()["theta"]), int(mcmc.last_state.num_diverging)
    import pyro
    import torch
    from pyro.infer import MCMC

    pyro.set_rng_seed(seed)
    mcmc = MCMC(kernel, warmup_steps=num_warmup, num_samples=num_samples)
    mcmc.run(torch.as_tensor(words), torch.as_tensor(mask), **model_kwargs)
    return mcmc.get_samples()["theta"].numpy(), kernel.diagnostics()["num_diverging"]


def main(argv=None):
    from models.datasets import load_corpus

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", choices=["ap", "reuters"], default="reuters")
    parser.add_argument("--kernel", choices=KERNELS, default="mSGNHT-S")
    parser.add_argument(
        "--backend",
        choices=["numpyro", "pyro"],
        default="numpyro",
        help="the model's declaration and kernels: NumPyro (models.lda) or Pyro (models.lda_pyro; slower: "
        "its Gibbs sweeps run in a Python loop)",
    )
    parser.add_argument(
        "--parametrisation",
        choices=PARAMETRISATIONS,
        default="expanded",
        help="topic parameters of the momentum kernels: 'expanded' (default; the expanded mean, sampled in log "
        "space) or 'gaussian' (paper 000's N(0.1, 1), whose posterior topics are nearly flat on these corpora; "
        "see benchmarks/RESULTS.md). SGRLD always uses 'expanded'.",
    )
    parser.add_argument("--step-size", type=float, default=None, help="default: 1e-2 (gaussian: 3e-3; SGRLD: 1e-2)")
    parser.add_argument("--topics", type=int, default=30)
    parser.add_argument("--alpha", type=float, default=0.1)
    parser.add_argument("--beta", type=float, default=0.1, help="Gamma(β, 1) prior of the expanded mean (SGRLD)")
    parser.add_argument("--diffusion", type=float, default=0.75, help="D of SGNHT, friction of SGHMC")
    parser.add_argument("--batch-size", type=int, default=5)
    parser.add_argument("--gibbs-sweeps", type=int, nargs=2, default=(3, 2), metavar=("BURN_IN", "KEPT"))
    parser.add_argument("--num-warmup", type=int, default=2000)
    parser.add_argument("--num-samples", type=int, default=2000)
    parser.add_argument("--thinning", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    corpus = load_corpus(args.corpus)
    data = prepare_corpus(corpus)
    print(
        f"{args.corpus}: {len(data.train_documents)} training / {len(data.test_documents)} test documents, "
        f"V = {data.vocab_size}, K = {args.topics}; {data.held_out.num_tokens} held-out tokens"
    )
    parametrisation = "expanded" if args.kernel == "SGRLD" else args.parametrisation
    step_size = args.step_size or (3e-3 if parametrisation == "gaussian" else 1e-2)
    words, mask = data.train_words, data.train_mask
    if args.backend == "pyro":
        import torch

        torch.set_num_threads(1)  # per-token Gibbs updates on small tensors: threads only add overhead
        words, mask = torch.as_tensor(words), torch.as_tensor(mask)
    kernel, parametrisation = make_kernel(
        args.kernel,
        step_size,
        words,
        mask,
        args.alpha,
        args.diffusion,
        tuple(args.gibbs_sweeps),
        parametrisation=parametrisation,
        backend=args.backend,
        steps_per_sample=args.thinning,
    )
    start = time.perf_counter()
    theta, rejected = run_chain(
        kernel,
        args.backend,
        args.seed,
        args.num_warmup // args.thinning,
        args.num_samples // args.thinning,
        words,
        mask,
        vocab_size=data.vocab_size,
        num_topics=args.topics,
        alpha=args.alpha,
        parametrisation=parametrisation,
        beta=args.beta,
        batch_size=args.batch_size,
    )
    topics = topic_word(jnp.asarray(theta), parametrisation)
    seconds = time.perf_counter() - start
    value = held_out_perplexity(topics, data.held_out, args.alpha, seed=args.seed)
    uniform = held_out_perplexity(jnp.full((1, args.topics, data.vocab_size), 1.0 / data.vocab_size), data.held_out, args.alpha)
    print(
        f"{args.kernel} ({parametrisation}), h = {step_size:g}: {args.num_warmup + args.num_samples} steps "
        f"({(args.num_warmup + args.num_samples) * args.batch_size} documents seen) in {seconds:.0f} s; "
        f"({args.backend}); rejected steps: {rejected}"
    )
    print(f"held-out perplexity (document completion, {len(topics)} samples): {value:.1f}  (uniform topics: {uniform:.0f})")
    print("\ntop words of the posterior-mean topics:")
    for k, words in enumerate(top_words(topics.mean(0), data.vocab)):
        print(f"  {k:2d}: {' '.join(words)}")


if __name__ == "__main__":
    main()
