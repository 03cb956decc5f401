import numpy as np
import pytest

from models.datasets import A9A_PATH, load_a9a


@pytest.fixture(scope="module")
def a9a():
    return load_a9a()


def test_a9a_file_is_compact():
    assert A9A_PATH.is_file()
    assert A9A_PATH.stat().st_size < 1_000_000


def test_a9a_shapes_and_dtype(a9a):
    X_train, y_train, X_test, y_test = a9a
    assert X_train.shape == (32561, 123)
    assert y_train.shape == (32561,)
    assert X_test.shape == (16281, 123)
    assert y_test.shape == (16281,)
    for a in a9a:
        assert a.dtype == np.float32


def test_a9a_dtype_argument():
    X_train, y_train, X_test, y_test = load_a9a(dtype=np.float64)
    assert X_train.dtype == y_train.dtype == X_test.dtype == y_test.dtype == np.float64


def test_a9a_binary_entries(a9a):
    for a in a9a:
        assert np.all((a == 0) | (a == 1))


def test_a9a_label_counts(a9a):
    _, y_train, _, y_test = a9a
    assert int((y_train == 0).sum()) == 24720
    assert int((y_train == 1).sum()) == 7841
    assert int((y_test == 0).sum()) == 12435
    assert int((y_test == 1).sum()) == 3846


def test_a9a_nonzeros(a9a):
    X_train, _, X_test, _ = a9a
    assert int(np.count_nonzero(X_train)) == 451592
    assert int(np.count_nonzero(X_test)) == 225731
