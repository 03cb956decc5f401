"""The backend-neutral parts of semi-collapsed LDA, in NumPy: what the NumPyro declaration
(:mod:`models.lda`), the Pyro declaration (:mod:`models.lda_pyro`), the evaluation
(:mod:`models.lda_evaluation`) and the command-line runner (:mod:`models.run_lda`) share.

* :data:`PARAMETRISATIONS`, the names of the two parametrisations of the topics (see :mod:`models.lda`).
* **Documents** are rows of a padded ``(D, L)`` array of word ids with a boolean ``mask`` (tokens first,
  padding after; :func:`pad_documents`).
* **The split for evaluation.** :func:`prepare_corpus` splits a corpus 80/20 by documents with a seeded
  permutation; the test documents are split again, once, by a seeded random permutation of each
  document's tokens, into an observed 80% and a held-out 20% (:func:`completion_split`), for the
  perplexity by document completion of :mod:`models.lda_evaluation`.
* :func:`perplexity` of per-token predictive probabilities, and :func:`top_words` of topics.

This module imports neither declaration, so that both can import it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from models.datasets import Corpus

PARAMETRISATIONS = ("gaussian", "expanded")
"""The parametrisations of the topics: ``"gaussian"`` (``θ_kw ~ N(0.1, 1)``, ``π ∝ |θ|``) and
``"expanded"`` (the expanded mean, ``θ_kw ~ Gamma(β, 1)``, ``π ∝ θ``)."""


def pad_documents(
    token_lists: Sequence[Sequence[int] | np.ndarray], length: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
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


def completion_split(
    token_lists: Sequence[Sequence[int] | np.ndarray],
    observed_fraction: float = 0.8,
    seed: int = 0,
    num_buckets: int = 4,
) -> HeldOut:
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
    def vocab_size(self) -> int:
        return len(self.vocab)


def prepare_corpus(
    corpus: Corpus, test_fraction: float = 0.2, seed: int = 0, observed_fraction: float = 0.8, num_buckets: int = 4
) -> PreparedCorpus:
    """Split ``corpus`` (a :class:`models.datasets.Corpus`) by a seeded permutation of its documents:
    ``test_fraction`` of them for testing (split again by :func:`completion_split`), the rest for training."""
    rng = np.random.default_rng(seed)
    perm = rng.permutation(corpus.num_documents)
    num_test = int(round(test_fraction * corpus.num_documents))
    test, train = np.sort(perm[:num_test]), np.sort(perm[num_test:])
    words, mask = pad_documents([corpus.tokens(d) for d in train])
    held_out = completion_split([corpus.tokens(d) for d in test], observed_fraction, seed=seed + 1, num_buckets=num_buckets)
    return PreparedCorpus(words, mask, train, test, held_out, corpus.vocab)


def perplexity(probabilities: np.ndarray | Sequence[np.ndarray], masks: np.ndarray | Sequence[np.ndarray]) -> float:
    """``exp(-Σ log p / #tokens)`` over the unmasked entries of per-token probabilities (arrays or lists of them)."""
    if not isinstance(probabilities, (list, tuple)):
        probabilities, masks = [probabilities], [masks]
    total = sum(float(np.sum(np.where(m, np.log(np.where(m, p, 1.0)), 0.0))) for p, m in zip(probabilities, masks))
    count = sum(int(np.sum(m)) for m in masks)
    return float(np.exp(-total / count))


def top_words(topics: np.ndarray, vocab: Sequence[str], num_words: int = 10) -> list[list[str]]:
    """The ``num_words`` most probable words of each topic (``topics``: ``(K, V)``, any array type)."""
    order = np.argsort(-np.asarray(topics), axis=-1)[:, :num_words]
    return [[vocab[i] for i in row] for row in order]
