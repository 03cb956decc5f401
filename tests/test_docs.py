"""The documentation site and the notebooks.

* Every public name of the documented modules has a docstring.
* The site (``docs/mkdocs.yml``) builds with ``mkdocs build --strict`` (warnings are errors: broken links,
  unresolved references, docstrings that do not parse), and its API reference documents every public name.
* The notebooks are stored without outputs (pytest runs them: ``--nbmake`` in ``pyproject.toml``).
"""

import importlib
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "docs" / "mkdocs.yml"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

# module -> the API reference page that documents it
API_PAGES = {
    "ppl_sgmcmc.numpyro": "api/numpyro/index.html",
    "ppl_sgmcmc.pyro": "api/pyro/index.html",
    "ppl_sgmcmc.importance": "api/importance/index.html",
    "ppl_sgmcmc.rules": "api/rules/index.html",
    "ppl_sgmcmc.schedules": "api/schedules/index.html",
}


def _own_members(module):
    """The public functions and classes a submodule defines itself (not those it imports)."""
    return [
        name
        for name, obj in vars(module).items()
        if not name.startswith("_")
        and (inspect.isfunction(obj) or inspect.isclass(obj))
        and obj.__module__ == module.__name__
    ]


def public_api():
    """``(identifier, object, page)`` for every public name of the documented modules; a submodule listed in
    ``__all__`` (``ppl_sgmcmc.rules.sgld``) contributes its own functions and classes too."""
    entries = []
    for module_name, page in API_PAGES.items():
        module = importlib.import_module(module_name)
        for name in module.__all__:
            obj = getattr(module, name)
            entries.append((f"{module_name}.{name}", obj, page))
            if inspect.ismodule(obj):
                entries += [(f"{module_name}.{name}.{member}", getattr(obj, member), page) for member in _own_members(obj)]
    return entries


PUBLIC_API = public_api()


def _is_ours(obj):
    return (getattr(obj, "__name__", "") if inspect.ismodule(obj) else getattr(obj, "__module__", "")).startswith(
        "ppl_sgmcmc"
    )


@pytest.mark.parametrize("identifier, obj", [(i, o) for i, o, _ in PUBLIC_API], ids=[i for i, _, _ in PUBLIC_API])
def test_public_api_has_docstrings(identifier, obj):
    assert (inspect.getdoc(obj) or "").strip(), f"{identifier} has no docstring"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[n.name for n in NOTEBOOKS])
def test_notebooks_are_stored_without_outputs(notebook):
    cells = json.loads(notebook.read_text())["cells"]
    dirty = [i for i, c in enumerate(cells) if c["cell_type"] == "code" and (c["outputs"] or c["execution_count"])]
    assert not dirty, f"{notebook.name}: cells {dirty} have outputs; clear them (e.g. `jupyter nbconvert --clear-output`)"


def test_site_builds_in_strict_mode_and_documents_the_public_api(tmp_path):
    for package in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python", "mkdocs_jupyter"):
        reason = f"the documentation tools are not installed (`pip install -e '.[docs]'`): no {package}"
        pytest.importorskip(package, reason=reason)
    site = tmp_path / "site"
    # the notebooks are not executed here: pytest runs them through nbmake
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", PPL_SGMCMC_DOCS_EXECUTE="false")
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(CONFIG), "--site-dir", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    log = build.stdout + build.stderr
    problems = [line for line in log.splitlines() if line.startswith(("WARNING", "ERROR", "Aborted"))]
    assert build.returncode == 0, "mkdocs build --strict failed:\n" + "\n".join(problems or log.splitlines()[-40:])

    missing = []
    for identifier, obj, page in PUBLIC_API:
        html = (site / page).read_text()
        # our objects get an anchor of their own; re-exports of other packages are named in the page's text
        if (f'id="{identifier}"' if _is_ours(obj) else identifier) not in html:
            missing.append(f"{identifier} (on {page})")
    assert not missing, "not in the API reference: " + ", ".join(missing)

    for notebook in NOTEBOOKS:
        assert (site / "notebooks" / notebook.stem / "index.html").is_file(), f"{notebook.name} is not rendered"
