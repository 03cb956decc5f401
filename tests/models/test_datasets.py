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


def test_mnist_subset_is_compact_and_scaled():
    from models.datasets import MNIST_SMALL_PATH, load_mnist

    assert MNIST_SMALL_PATH.stat().st_size < 1_000_000
    X_train, y_train, X_test, y_test = load_mnist()
    assert X_train.shape == (2000, 784) and X_test.shape == (500, 784)
    assert X_train.dtype == np.float32 and y_train.dtype == np.int32
    assert 0.0 <= X_train.min() and X_train.max() == 1.0
    assert np.bincount(y_train, minlength=10).tolist() == [191, 220, 198, 191, 214, 180, 200, 224, 172, 210]
    assert np.bincount(y_test, minlength=10).tolist() == [42, 67, 55, 45, 55, 50, 43, 49, 40, 54]


def test_uci_sets_and_split():
    from models.datasets import UCI_NAMES, load_uci, split_uci

    shapes = {name: load_uci(name)[0].shape for name in UCI_NAMES}
    assert shapes == {"energy": (768, 8), "concrete": (1030, 8), "yacht": (308, 6), "wine-quality-red": (1599, 11)}
    with pytest.raises(ValueError, match="unknown UCI set 'boston'"):
        load_uci("boston")
    split = split_uci("concrete", seed=0)
    assert split.X_test.shape == (103, 8) and split.X_train.shape == (927, 8)
    np.testing.assert_allclose(split.X_train.mean(0), 0.0, atol=1e-5)
    np.testing.assert_allclose(split.y_train.std(), 1.0, rtol=1e-5)
    X, y = load_uci("concrete")
    restored = np.sort(np.concatenate([split.y_train, split.y_test]) * split.y_std + split.y_mean)
    np.testing.assert_allclose(restored, np.sort(y), rtol=1e-5)
    assert np.array_equal(split_uci("concrete", seed=0).y_test, split.y_test)  # the seed fixes the split
