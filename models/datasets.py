"""Loaders for the data sets shipped under ``models/data/``."""

from __future__ import annotations

from pathlib import Path

import numpy

A9A_PATH = Path(__file__).parent / "data" / "a9a.npz"


def load_a9a(dtype=numpy.float32):
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
