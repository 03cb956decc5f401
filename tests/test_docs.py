"""The documentation site and the notebooks.

* Every public name of the documented modules has a docstring.
* The site (``docs/mkdocs.yml``) builds with ``mkdocs build --strict`` (warnings are errors: broken links,
  unresolved references, docstrings that do not parse), and its API reference documents every public name.
* The notebooks are stored without outputs (pytest runs them: ``--nbmake`` in ``pyproject.toml``).
* The site shows executed copies of the notebooks (``docs/rendered/notebooks/``, written by
  ``docs/render_notebooks.py``): every notebook has one, made from its current cells, with outputs and figures.
"""

import importlib
import importlib.util
import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "docs" / "mkdocs.yml"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _load_render_script():
    spec = importlib.util.spec_from_file_location("render_notebooks", ROOT / "docs" / "render_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RENDER = _load_render_script()  # docs/render_notebooks.py

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


def _render_command(notebook):
    return f"`{RENDER.COMMAND} {notebook.stem}`"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[n.name for n in NOTEBOOKS])
def test_notebooks_have_an_up_to_date_rendered_copy(notebook):
    rendered = RENDER.rendered_path(notebook)
    where = rendered.relative_to(ROOT)
    assert rendered.is_file(), f"{notebook.name} has no rendered copy ({where}) for the site: {_render_command(notebook)}"
    assert RENDER.recorded_hash(rendered) == RENDER.source_hash(notebook), (
        f"{where} is stale: notebooks/{notebook.name} changed since it was rendered (the site shows it without "
        f"outputs until then); re-render it: {_render_command(notebook)}"
    )


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[n.name for n in NOTEBOOKS])
def test_rendered_copies_have_outputs_and_figures(notebook):
    rendered = RENDER.rendered_path(notebook)
    if not rendered.is_file():
        pytest.skip("no rendered copy (test_notebooks_have_an_up_to_date_rendered_copy reports it)")
    code = [c for c in json.loads(rendered.read_text())["cells"] if c["cell_type"] == "code"]
    where = rendered.relative_to(ROOT)
    not_run = [i for i, c in enumerate(code) if RENDER.cell_source(c).strip() and c["execution_count"] is None]
    assert not not_run, f"{where}: code cells {not_run} were not executed; re-render it: {_render_command(notebook)}"
    outputs = [o for c in code for o in c["outputs"]]
    assert outputs, f"{where} has no outputs; re-render it: {_render_command(notebook)}"
    errors = [o.get("ename") for o in outputs if o["output_type"] == "error"]
    assert not errors, f"{where} has errors in its outputs: {errors}"
    plots = any("matplotlib" in RENDER.cell_source(c) for c in code)
    if plots:
        figures = [o for o in outputs if any(k.startswith("image/") for k in o.get("data", {}))]
        assert figures, f"{where}: the notebook plots but its rendered copy has no figure; {_render_command(notebook)}"


def test_every_rendered_copy_has_a_source_notebook():
    sources = {n.name for n in NOTEBOOKS}
    orphans = [str(p.relative_to(ROOT)) for p in sorted(RENDER.RENDERED.glob("*.ipynb")) if p.name not in sources]
    assert not orphans, f"rendered copies of notebooks that are no longer in notebooks/: {orphans}; delete them"


@pytest.mark.slow
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
        page = site / "notebooks" / notebook.stem / "index.html"
        assert page.is_file(), f"{notebook.name} is not rendered"
        if RENDER.is_current(notebook):  # the page is the rendered copy, with its figures
            cells = json.loads(RENDER.rendered_path(notebook).read_text())["cells"]
            outputs = [o for c in cells if c["cell_type"] == "code" for o in c["outputs"]]
            figures = sum(any(k.startswith("image/") for k in o.get("data", {})) for o in outputs)
            shown = len(re.findall(r'<img\b[^>]*\bsrc="data:image/', page.read_text()))
            assert shown >= figures, f"{page.relative_to(site)} shows {shown} of the notebook's {figures} figures"
