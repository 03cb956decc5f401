"""Loaders for the data sets shipped under ``models/data/``."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy
import numpy.typing
from numpy.typing import ArrayLike

if TYPE_CHECKING:
    import scipy.sparse

A9A_PATH = Path(__file__).parent / "data" / "a9a.npz"


def load_a9a(
    dtype: numpy.typing.DTypeLike = numpy.float32,
) -> tuple[numpy.ndarray, numpy.ndarray, numpy.ndarray, numpy.ndarray]:
    """Load the LIBSVM a9a data set (UCI Adult, binarised) from the bundled npz.

    Returns ``(X_train, y_train, X_test, y_test)`` as numpy arrays:

    * ``X_train``: shape ``(32561, 123)``, ``dtype``, entries 0/1;
    * ``y_train``: shape ``(32561,)``, ``dtype``, 0/1 labels (24720 zeros, 7841 ones);
    * ``X_test``:  shape ``(16281, 123)``, ``dtype``, entries 0/1;
    * ``y_test``:  shape ``(16281,)``, ``dtype``, 0/1 labels (12435 zeros, 3846 ones).

    Label 1 is the positive class, i.e. LIBSVM label ``+1`` (income > 50K);
    label 0 is LIBSVM ``-1``.  Feature ``j`` (0-based) is LIBSVM feature ``j + 1``.

    Provenance, licence and the rebuild command are in ``models/data/README.md``;
    the file is produced by ``models/data/build_a9a.py``.

    For reference, Li et al., "High-Order Stochastic Gradient Thermostats for
    Bayesian Learning of Deep Models" (AAAI 2016) report 84.95% test accuracy on
    a9a for Bayesian logistic regression with mSGNHT-S.
    """
    with numpy.load(A9A_PATH) as d:
        n_features = int(d["n_features"])
        X_train = numpy.unpackbits(d["X_train_bits"], axis=1, count=n_features).astype(dtype)
        X_test = numpy.unpackbits(d["X_test_bits"], axis=1, count=n_features).astype(dtype)
        y_train = d["y_train"].astype(dtype)
        y_test = d["y_test"].astype(dtype)
    return X_train, y_train, X_test, y_test


CORPUS_PATHS = {name: Path(__file__).parent / "data" / f"{name}.npz" for name in ("ap", "reuters")}


class Corpus:
    """A bag-of-words corpus: document ``d`` holds word ``word_ids[p]`` ``counts[p]`` times for the pairs
    ``p`` in ``offsets[d]:offsets[d + 1]``.

    * ``num_documents``, ``vocab_size``, ``num_tokens``; ``vocab[i]`` the word with id ``i``; ``titles``
      (or ``None``).
    * :meth:`tokens` the word ids of one document's tokens, each repeated by its count.
    * :meth:`matrix` the sparse document-word count matrix (``scipy.sparse.csr_matrix``).
    """

    def __init__(
        self,
        doc_sizes: ArrayLike,
        word_ids: ArrayLike,
        counts: ArrayLike,
        vocab: Iterable[str],
        titles: Iterable[str] | None = None,
    ) -> None:
        self.word_ids = numpy.asarray(word_ids, dtype=numpy.int64)
        self.counts = numpy.asarray(counts, dtype=numpy.int64)
        self.offsets = numpy.concatenate([[0], numpy.cumsum(numpy.asarray(doc_sizes, dtype=numpy.int64))])
        self.vocab = tuple(vocab)
        self.titles = None if titles is None else tuple(titles)
        self.num_documents = len(self.offsets) - 1
        self.vocab_size = len(self.vocab)
        self.num_tokens = int(self.counts.sum())

    def tokens(self, d: int) -> numpy.ndarray:
        """The word ids of document ``d``'s tokens (a word counted ``c`` times appears ``c`` times in a row)."""
        pairs = slice(self.offsets[d], self.offsets[d + 1])
        return numpy.repeat(self.word_ids[pairs], self.counts[pairs])

    def lengths(self) -> numpy.ndarray:
        """The number of tokens of every document."""
        return numpy.add.reduceat(self.counts, self.offsets[:-1])

    def matrix(self, docs: ArrayLike | None = None) -> scipy.sparse.csr_matrix:
        """The ``(len(docs), vocab_size)`` document-word count matrix of ``docs`` (default: all), CSR."""
        import scipy.sparse

        rows = numpy.repeat(numpy.arange(self.num_documents), numpy.diff(self.offsets))
        full = scipy.sparse.csr_matrix(
            (self.counts, (rows, self.word_ids)), shape=(self.num_documents, self.vocab_size)
        )
        return full if docs is None else full[numpy.asarray(docs)]


def _unpack_text(array: ArrayLike) -> list[str]:
    return bytes(numpy.asarray(array, dtype=numpy.uint8)).decode("utf-8").split("\n")


def load_corpus(name: str) -> Corpus:
    """Load a bundled bag-of-words corpus: ``"ap"`` (Blei's AP news, 2246 documents, vocabulary 10473,
    435838 tokens) or ``"reuters"`` (the ``lda`` package's Reuters sample, 395 documents, vocabulary 4258,
    84010 tokens, with titles). Returns a :class:`Corpus`.

    Provenance, licence and the rebuild command are in ``models/data/README.md``; the files are produced
    by ``models/data/build_corpora.py``.
    """
    if name not in CORPUS_PATHS:
        raise ValueError(f"unknown corpus {name!r}; choose one of {', '.join(map(repr, CORPUS_PATHS))}")
    with numpy.load(CORPUS_PATHS[name]) as d:
        corpus = Corpus(
            d["doc_sizes"],
            d["word_ids"],
            d["counts"],
            _unpack_text(d["vocab"]),
            _unpack_text(d["titles"]) if "titles" in d else None,
        )
        expected = (int(d["num_documents"]), int(d["vocab_size"]), int(d["num_tokens"]))
    if (corpus.num_documents, corpus.vocab_size, corpus.num_tokens) != expected:
        raise RuntimeError(f"{CORPUS_PATHS[name]} is inconsistent: rebuild it with models/data/build_corpora.py")
    return corpus
