"""The import graph: the backend-neutral layer imports neither backend, neither backend imports the other, and
ArviZ is imported when it is used."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "ppl_sgmcmc"
BACKENDS = ("numpyro", "pyro")


def _imported_modules(path: Path) -> set[str]:
    """The absolute module names a source file imports (relative imports resolved against its package)."""
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def _layer(path: Path) -> str | None:
    """The backend a file of the package belongs to, or ``None`` for the backend-neutral layer."""
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if parts[0] in BACKENDS else None


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_file_imports_another_layers_backend(path):
    own = _layer(path)
    for name in _imported_modules(path):
        for backend in BACKENDS:
            if backend != own and name.startswith(f"ppl_sgmcmc.{backend}"):
                where = "the backend-neutral layer" if own is None else f"the {own} backend"
                pytest.fail(f"{path.relative_to(PACKAGE.parent)} ({where}) imports {name}: move what it needs to the "
                            "backend-neutral layer")


# ArviZ (with xarray and matplotlib: seconds to import) is loaded when a run's InferenceData is made, not with a backend
DEFERRED = ("arviz", "matplotlib", "xarray")


@pytest.mark.parametrize("backend,foreign", [("numpyro", ("ppl_sgmcmc.pyro", "torch", "pyro", *DEFERRED)),
                                             ("pyro", ("ppl_sgmcmc.numpyro", "numpyro", "jax", "optax", *DEFERRED))])
def test_importing_a_backend_loads_neither_the_other_nor_arviz(backend, foreign):
    code = (f"import sys, ppl_sgmcmc.{backend}; "
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {foreign!r} or m.startswith({foreign!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", f"importing ppl_sgmcmc.{backend} loaded {out.strip()}"
