"""The notebooks run as tests (nbmake) in the slow tier only: each runs its chains for minutes of CPU, for the
reader's figures; the kernels they use are tested in ``tests/`` (the quick tier: ``pytest -m "not slow"``)."""

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.suffix == ".ipynb" and item.path.resolve().parent == HERE:
            item.add_marker(pytest.mark.slow)
