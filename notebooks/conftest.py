"""The notebooks run as tests (nbmake) in smoke mode, and in the slow tier.

Every notebook reads ``PPL_SGMCMC_SMOKE_TEST`` in its first code cell; at ``"1"`` it shrinks its run lengths
(draws, chains, steps) and nothing else, so that every kernel, diagnostic and plot still runs: the test catches
a broken call in seconds rather than minutes, and leaves the results to the full-length runs (the kernels'
statistical tests are in ``tests/``). It is set here, at import, before nbmake starts a notebook's kernel,
which inherits this process's environment. ``PPL_SGMCMC_SMOKE_TEST=0 pytest notebooks/<name>.ipynb`` runs a
notebook at full length. The site's rendered copies are full-length runs: ``docs/render_notebooks.py`` takes
the variable out of the kernel's environment.

Even in smoke mode a notebook takes more than a few seconds (starting a kernel, importing JAX, compiling each
run), so the notebooks stay out of the quick tier (``pytest -m "not slow"``).
"""

import os
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
os.environ.setdefault("PPL_SGMCMC_SMOKE_TEST", "1")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.suffix == ".ipynb" and item.path.resolve().parent == HERE:
            item.add_marker(pytest.mark.slow)
