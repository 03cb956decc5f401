"""Held-out perplexity of LDA topics by document completion, in JAX; it scores topic samples of either
backend (:mod:`models.lda`, :mod:`models.lda_pyro`) and the baselines of ``benchmarks/lda.py`` alike.

The test documents are split once, by a seeded random permutation of each document's tokens, into an
observed 80% and a held-out 20% (:func:`models.lda_common.completion_split`). For each posterior sample
of the topics ``π^(s)``, collapsed Gibbs on the observed part alone (``burn_in`` sweeps from
``z_i ∝ π_{k,w_i}``, then ``kept`` sweeps of :func:`models.lda.collapsed_gibbs_sweep`) estimates the
document's topic proportions ``θ̂_d = mean over kept sweeps of (n_dk + α) / (L_obs + K α)``; each
held-out token ``w`` gets the predictive probability ``p_s(w) = Σ_k θ̂_dk π^(s)_kw``. The probabilities
are averaged over the posterior samples, ``p̄(w) = mean_s p_s(w)``, and the perplexity is
``exp(-Σ_{held-out tokens} log p̄(w) / #held-out tokens)`` (:func:`models.lda_common.perplexity`).
This is the document-completion protocol of Wallach, Murray, Salakhutdinov & Mimno, "Evaluation
Methods for Topic Models" (ICML 2009), with the proportions estimated by collapsed Gibbs.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax, random
from jax.typing import ArrayLike

from models.lda import collapsed_gibbs_sweep, topic_counts
from models.lda_common import HeldOut, perplexity

__all__ = ["PerplexityAccumulator", "completion_probabilities", "held_out_perplexity"]


@partial(jax.jit, static_argnames=("burn_in", "kept"))
def completion_probabilities(
    rng_key: jax.Array,
    topics: ArrayLike,
    observed_words: ArrayLike,
    observed_mask: ArrayLike,
    held_words: ArrayLike,
    alpha: float,
    burn_in: int = 20,
    kept: int = 30,
) -> jax.Array:
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


class PerplexityAccumulator:
    """Running average of the held-out predictive probabilities over posterior samples of the topics."""

    def __init__(self, held_out: HeldOut, alpha: float, burn_in: int = 20, kept: int = 30, seed: int = 0) -> None:
        self.held_out, self.alpha, self.burn_in, self.kept = held_out, alpha, burn_in, kept
        self.key = random.PRNGKey(seed)
        self.sums = [np.zeros(b[2].shape) for b in held_out.buckets]
        self.count = 0

    def probabilities(self, topics: ArrayLike) -> list[np.ndarray]:
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

    def add(self, topics: ArrayLike) -> PerplexityAccumulator:
        """Add the probabilities of one topic matrix ``(K, V)`` to the average."""
        for total, p in zip(self.sums, self.probabilities(topics)):
            total += p
        self.count += 1
        return self

    def add_probabilities(self, probabilities: list[np.ndarray]) -> PerplexityAccumulator:
        """Add per-bucket probabilities computed before (by :meth:`probabilities`) to the average."""
        for total, p in zip(self.sums, probabilities):
            total += p
        self.count += 1
        return self

    def perplexity(self) -> float:
        """The perplexity of the averaged probabilities."""
        return perplexity([s / self.count for s in self.sums], [b[3] for b in self.held_out.buckets])


def held_out_perplexity(
    topic_samples: Iterable[ArrayLike],
    held_out: HeldOut,
    alpha: float,
    burn_in: int = 20,
    kept: int = 30,
    seed: int = 0,
) -> float:
    """Document-completion perplexity (module docstring) with predictive probabilities averaged over
    the posterior samples ``topic_samples`` (``(S, K, V)`` topic matrices, rows on the simplex)."""
    accumulator = PerplexityAccumulator(held_out, alpha, burn_in, kept, seed)
    for topics in topic_samples:
        accumulator.add(topics)
    return accumulator.perplexity()
