"""Build ``models/data/ap.npz`` and ``models/data/reuters.npz`` from their LDA-C text files.

Usage (from the repository root)::

    python models/data/build_corpora.py [SHARED_DATA_DIR]

``SHARED_DATA_DIR`` defaults to ``../shared/data`` relative to the repository root and must hold
``ap/ap.dat`` + ``ap/vocab.txt`` and ``reuters/reuters.ldac`` + ``reuters/reuters.tokens`` +
``reuters/reuters.titles``. LDA-C format: one document per line, ``N id:count id:count ...`` with
0-based word ids and ``N`` the number of distinct words.

Each output stores the bag-of-words corpus as flat arrays (see ``models/data/README.md``):

* ``doc_sizes``: uint16, the number of distinct words of each document (LDA-C's ``N``);
* ``word_ids``: uint16, the word id of each (document, word) pair, documents in file order and
  pairs in the file's order within a document;
* ``counts``: uint16, the count of each pair;
* ``vocab``: uint8, the UTF-8 bytes of the vocabulary joined by ``\\n`` (word ``i`` is line ``i``);
* ``titles`` (Reuters only): uint8, the UTF-8 bytes of the titles joined by ``\\n``;
* ``num_documents``, ``vocab_size``, ``num_tokens``: int64 checks.

The script fails loudly on malformed lines, a pair count that disagrees with ``N``, repeated or
out-of-range word ids, and on any disagreement of the round trip.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_SOURCE = REPO_ROOT / ".." / "shared" / "data"
OUTPUT_DIR = Path(__file__).resolve().parent

# name -> (LDA-C file, vocabulary file, titles file or None, expected documents, vocabulary, tokens)
CORPORA = {
    "ap": ("ap/ap.dat", "ap/vocab.txt", None, 2246, 10473, 435838),
    "reuters": ("reuters/reuters.ldac", "reuters/reuters.tokens", "reuters/reuters.titles", 395, 4258, 84010),
}


def read_lines(path: Path) -> list[str]:
    with open(path, encoding="utf-8") as fh:
        return [line.rstrip("\n") for line in fh]


def parse_ldac(path: Path, vocab_size: int):
    """Parse an LDA-C file into ``(doc_sizes, word_ids, counts)`` (int64 arrays)."""
    sizes, ids, counts = [], [], []
    for lineno, line in enumerate(read_lines(path), start=1):
        tokens = line.split()
        if not tokens:
            continue
        n = int(tokens[0])
        pairs = tokens[1:]
        if len(pairs) != n:
            raise ValueError(f"{path}:{lineno}: header says {n} distinct words, found {len(pairs)} pairs")
        doc_ids = []
        for pair in pairs:
            key, sep, value = pair.partition(":")
            if not sep:
                raise ValueError(f"{path}:{lineno}: malformed pair {pair!r}")
            word, count = int(key), int(value)
            if not 0 <= word < vocab_size:
                raise ValueError(f"{path}:{lineno}: word id {word} outside 0..{vocab_size - 1}")
            if count <= 0:
                raise ValueError(f"{path}:{lineno}: non-positive count {count}")
            doc_ids.append(word)
            counts.append(count)
        if len(set(doc_ids)) != len(doc_ids):
            raise ValueError(f"{path}:{lineno}: repeated word id")
        ids.extend(doc_ids)
        sizes.append(n)
    return np.asarray(sizes), np.asarray(ids), np.asarray(counts)


def pack_text(lines: list[str]) -> np.ndarray:
    return np.frombuffer("\n".join(lines).encode("utf-8"), dtype=np.uint8)


def build(name: str, source: Path, output: Path) -> None:
    ldac, vocab_file, titles_file, num_docs, vocab_size, num_tokens = CORPORA[name]
    vocab = [w.strip() for w in read_lines(source / vocab_file)]
    while vocab and not vocab[-1]:
        vocab.pop()
    if len(vocab) != vocab_size:
        raise ValueError(f"{name}: vocabulary has {len(vocab)} words, expected {vocab_size}")
    sizes, ids, counts = parse_ldac(source / ldac, vocab_size)
    if len(sizes) != num_docs or counts.sum() != num_tokens:
        raise ValueError(f"{name}: {len(sizes)} documents / {counts.sum()} tokens, expected {num_docs} / {num_tokens}")
    for array in (sizes, ids, counts):
        if array.max() >= 2**16:
            raise ValueError(f"{name}: value {array.max()} does not fit uint16")
    out = {
        "doc_sizes": sizes.astype(np.uint16),
        "word_ids": ids.astype(np.uint16),
        "counts": counts.astype(np.uint16),
        "vocab": pack_text(vocab),
        "num_documents": np.int64(num_docs),
        "vocab_size": np.int64(vocab_size),
        "num_tokens": np.int64(num_tokens),
    }
    if titles_file is not None:
        titles = read_lines(source / titles_file)
        if len(titles) != num_docs:
            raise ValueError(f"{name}: {len(titles)} titles for {num_docs} documents")
        out["titles"] = pack_text(titles)
    np.savez_compressed(output, **out)
    with np.load(output) as back:
        for key, value in out.items():
            if not np.array_equal(back[key], value):
                raise RuntimeError(f"{name}: round trip of {key!r} failed")
    print(
        f"{name}: {num_docs} documents, vocabulary {vocab_size}, {num_tokens} tokens, {len(ids)} (document, word) "
        f"pairs; longest document {int(np.add.reduceat(counts, np.r_[0, np.cumsum(sizes)[:-1]]).max())} tokens; "
        f"wrote {output} ({output.stat().st_size} bytes)"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", nargs="?", default=str(DEFAULT_SOURCE), help="the shared data folder")
    parser.add_argument("-o", "--output-dir", default=str(OUTPUT_DIR))
    args = parser.parse_args(argv)
    for name in CORPORA:
        build(name, Path(args.source), Path(args.output_dir) / f"{name}.npz")
    return 0


if __name__ == "__main__":
    sys.exit(main())
