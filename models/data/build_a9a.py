"""Build ``models/data/a9a.npz`` from the LIBSVM a9a text files.

Usage (from the repository root)::

    python models/data/build_a9a.py [SOURCE_DIR]

``SOURCE_DIR`` must hold ``a9a`` (train) and ``a9a.t`` (test) in LIBSVM
format with 1-based feature indices; it defaults to ``../shared/data/a9a``
relative to the repository root.  The output stores each dense 0/1 feature
matrix bit-packed along the feature axis (``np.packbits(X, axis=1)``), the
labels as uint8 0/1 (1 = LIBSVM ``+1``) and ``n_features`` = 123.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

N_FEATURES = 123
REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_SOURCE = REPO_ROOT / ".." / "shared" / "data" / "a9a"
OUTPUT = Path(__file__).resolve().parent / "a9a.npz"


def parse_libsvm_binary(path: Path, n_features: int = N_FEATURES):
    """Parse a LIBSVM file whose feature values are all 1.

    Returns ``(X, y)`` with ``X`` a dense uint8 0/1 matrix of shape
    ``(n_rows, n_features)`` and ``y`` uint8 labels (1 for ``+1``, 0 for ``-1``).
    Raises ``ValueError`` on any non-binary value, bad label, out-of-range or
    repeated index.
    """
    rows: list[list[int]] = []
    labels: list[int] = []
    with open(path, encoding="ascii") as fh:
        for lineno, line in enumerate(fh, start=1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            tokens = line.split()
            label = float(tokens[0])
            if label == 1.0:
                labels.append(1)
            elif label == -1.0:
                labels.append(0)
            else:
                raise ValueError(f"{path}:{lineno}: label {tokens[0]!r} is not +1/-1")
            idx = []
            for tok in tokens[1:]:
                key, sep, val = tok.partition(":")
                if not sep:
                    raise ValueError(f"{path}:{lineno}: malformed token {tok!r}")
                j = int(key)
                if not 1 <= j <= n_features:
                    raise ValueError(f"{path}:{lineno}: feature index {j} out of 1..{n_features}")
                if float(val) != 1.0:
                    raise ValueError(
                        f"{path}:{lineno}: feature {j} has value {val!r}; expected binary 1"
                    )
                idx.append(j - 1)
            if len(set(idx)) != len(idx):
                raise ValueError(f"{path}:{lineno}: repeated feature index")
            rows.append(idx)
    X = np.zeros((len(rows), n_features), dtype=np.uint8)
    for i, idx in enumerate(rows):
        X[i, idx] = 1
    return X, np.asarray(labels, dtype=np.uint8)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "source",
        nargs="?",
        default=str(DEFAULT_SOURCE),
        help="folder holding a9a and a9a.t (default: ../shared/data/a9a from the repo root)",
    )
    parser.add_argument("-o", "--output", default=str(OUTPUT), help="output .npz path")
    args = parser.parse_args(argv)
    src = Path(args.source)

    X_tr, y_tr = parse_libsvm_binary(src / "a9a")
    X_te, y_te = parse_libsvm_binary(src / "a9a.t")

    out = {
        "X_train_bits": np.packbits(X_tr, axis=1),
        "y_train": y_tr,
        "X_test_bits": np.packbits(X_te, axis=1),
        "y_test": y_te,
        "n_features": np.int64(N_FEATURES),
    }
    # Round-trip check before writing.
    for name, X in (("train", X_tr), ("test", X_te)):
        back = np.unpackbits(out[f"X_{name}_bits"], axis=1, count=N_FEATURES)
        if not np.array_equal(back, X):
            raise RuntimeError(f"packbits round trip failed for {name}")
    np.savez_compressed(args.output, **out)

    for name, X, y in (("train", X_tr, y_tr), ("test", X_te, y_te)):
        print(
            f"{name}: {X.shape[0]} rows x {X.shape[1]} features, "
            f"{int((y == 0).sum())} negatives / {int((y == 1).sum())} positives, "
            f"{int(X.sum())} non-zeros"
        )
    print(f"wrote {args.output} ({Path(args.output).stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
