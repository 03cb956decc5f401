"""Render the teaching notebooks for the documentation site.

The notebooks in ``notebooks/`` are stored without outputs (pytest executes them with ``--nbmake``). The site
shows executed copies instead, kept in ``docs/rendered/notebooks/``: this script executes each source notebook
the way nbmake does (the venv's ``python3`` kernel, ``notebooks/`` as the working directory, a per-cell
timeout) and writes the executed copy, outputs and figures included, at full length: without the smoke mode
that ``notebooks/conftest.py`` switches on for pytest (``PPL_SGMCMC_SMOKE_TEST``, taken out of the kernel's
environment here). Run it after editing a notebook::

    .venv/bin/python docs/render_notebooks.py 03_logistic_regression_a9a    # one or more notebooks
    .venv/bin/python docs/render_notebooks.py                               # all of them
    .venv/bin/python docs/render_notebooks.py --stale                       # those whose copy is stale
    .venv/bin/python docs/render_notebooks.py --check                       # only list the stale copies

Each rendered copy records in its metadata (``metadata.ppl_sgmcmc``) the hash of its source notebook's cells
(:func:`source_hash`) and the date; ``docs/hooks.py`` uses a copy only while that hash matches the source,
and ``tests/test_docs.py`` fails when a copy is stale. Volatile metadata (timings, widget state, the
kernel's version) is not saved, so re-rendering an unchanged notebook gives a small diff.
"""

import argparse
import datetime
import hashlib
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
RENDERED = ROOT / "docs" / "rendered" / "notebooks"
METADATA_KEY = "ppl_sgmcmc"
COMMAND = ".venv/bin/python docs/render_notebooks.py"
# the environment variable that puts the notebooks in smoke mode (short runs) under pytest: never set when rendering
SMOKE_TEST = "PPL_SGMCMC_SMOKE_TEST"

# the resolution of the figures (matplotlib's figure.dpi and savefig.dpi, through a matplotlibrc that MATPLOTLIBRC
# points to in the kernel's environment); None: matplotlib's default, 100
DPI = None


def cell_source(cell):
    """A cell's source as one string (a notebook's JSON may store it as a list of lines)."""
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def source_hash(notebook):
    """SHA-256 of a notebook's cells: their types and sources, not their outputs or metadata.

    ``notebook`` is the notebook's JSON (a dict, as ``json.load`` or ``nbformat.read`` gives it) or its path.
    """
    if isinstance(notebook, (str, Path)):
        notebook = json.loads(Path(notebook).read_text(encoding="utf-8"))
    cells = [[cell["cell_type"], cell_source(cell)] for cell in notebook["cells"]]
    return hashlib.sha256(json.dumps(cells, ensure_ascii=False).encode("utf-8")).hexdigest()


def rendered_path(source):
    """Where the rendered copy of ``notebooks/<name>.ipynb`` lives."""
    return RENDERED / Path(source).name


def recorded_hash(rendered):
    """The source hash a rendered copy recorded, or ``None`` when it has none (or does not parse)."""
    try:
        metadata = json.loads(Path(rendered).read_text(encoding="utf-8"))["metadata"]
    except (OSError, ValueError, KeyError):
        return None
    return metadata.get(METADATA_KEY, {}).get("source_sha256")


def is_current(source):
    """Whether ``notebooks/<name>.ipynb`` has a rendered copy made from its current cells."""
    rendered = rendered_path(source)
    return rendered.is_file() and recorded_hash(rendered) == source_hash(source)


def _relative_paths(text):
    """Output text without this checkout's absolute path (warnings name the files they come from)."""
    return text.replace(str(ROOT) + os.sep, "")


def _clean(notebook, name, source_metadata, digest):
    """Strip what changes from one rendering to the next; keep the outputs."""
    for cell in notebook.cells:
        for key in ("execution", "ExecuteTime", "collapsed", "scrolled"):
            cell.metadata.pop(key, None)
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream":
                output["text"] = _relative_paths(output["text"])
            elif output.get("output_type") == "error":
                output["traceback"] = [_relative_paths(line) for line in output["traceback"]]
            elif "text/plain" in output.get("data", {}):
                output["data"]["text/plain"] = _relative_paths(output["data"]["text/plain"])
    # the source's metadata (kernelspec, language) rather than what the kernel reports (its exact version)
    notebook.metadata = type(notebook.metadata)(json.loads(json.dumps(source_metadata)))
    notebook.metadata[METADATA_KEY] = {
        "source": f"notebooks/{name}",
        "source_sha256": digest,
        "rendered": datetime.date.today().isoformat(),
        "command": COMMAND,
    }


def render(source, timeout, dpi=DPI):
    """Execute ``source`` and write its rendered copy; return the seconds it took."""
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(source, as_version=4)
    source_metadata = json.loads(json.dumps(notebook.metadata))
    digest = source_hash(notebook)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None

    with tempfile.TemporaryDirectory() as mplconfig:
        Path(mplconfig, "matplotlibrc").write_text(f"figure.dpi: {dpi}\nsavefig.dpi: {dpi}\n" if dpi else "")
        # the notebooks expect what nbmake gives them: notebooks/ as the working directory (they put its parent
        # on sys.path); the repository root on PYTHONPATH as well, as pytest's `pythonpath = ["."]`
        pythonpath = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
        backend = "module://matplotlib_inline.backend_inline"
        env = dict(os.environ, PYTHONPATH=pythonpath, MATPLOTLIBRC=mplconfig, MPLBACKEND=backend)
        env.pop(SMOKE_TEST, None)  # the site shows full-length runs, even when this runs under pytest
        client = NotebookClient(
            notebook,
            timeout=timeout,
            kernel_name="python3",
            allow_errors=False,
            record_timing=False,
            store_widget_state=False,
            resources={"metadata": {"path": str(source.parent)}},
        )
        start = time.perf_counter()
        client.execute(cwd=str(source.parent), env=env)
        seconds = time.perf_counter() - start

    _clean(notebook, source.name, source_metadata, digest)
    nbformat.validate(notebook)

    target = rendered_path(source)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".ipynb.partial")
    nbformat.write(notebook, str(partial))
    partial.replace(target)
    return seconds


def _sources(names):
    if not names:
        return sorted(NOTEBOOKS.glob("*.ipynb"))
    sources = []
    for name in names:
        path = NOTEBOOKS / Path(name).name
        if path.suffix != ".ipynb":
            path = path.with_name(path.name + ".ipynb")
        if not path.is_file():
            raise SystemExit(f"no notebook {path.relative_to(ROOT)}")
        sources.append(path)
    return sources


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="notebooks to render (01_from_nuts_to_sgmcmc[.ipynb]); default: all")
    parser.add_argument("--timeout", type=int, default=900, help="seconds a cell may run (default: 900)")
    parser.add_argument("--dpi", type=int, default=DPI, help=f"resolution of the figures (default: {DPI or 100})")
    parser.add_argument("--check", action="store_true", help="only list the notebooks whose rendered copy is stale")
    parser.add_argument("--stale", action="store_true", help="render only the notebooks whose rendered copy is stale")
    args = parser.parse_args(argv)

    sources = _sources(args.names)
    if args.check or args.stale:
        stale = [s for s in sources if not is_current(s)]
        for s in stale:
            print(f"stale: {s.relative_to(ROOT)}")
        orphans = sorted({p.name for p in RENDERED.glob("*.ipynb")} - {p.name for p in NOTEBOOKS.glob("*.ipynb")})
        for name in orphans:
            print(f"no source notebook: {(RENDERED / name).relative_to(ROOT)}")
        if args.check:
            return 1 if stale or orphans else 0
        sources = stale

    from nbclient.exceptions import CellExecutionError, CellTimeoutError

    failed = []
    for source in sources:
        print(f"rendering {source.relative_to(ROOT)} ...", flush=True)
        try:
            seconds = render(source, args.timeout, args.dpi)
        except (CellExecutionError, CellTimeoutError) as error:
            plain = re.sub(r"\x1b\[[0-9;]*m", "", str(error))  # without the traceback's colours
            print(f"FAILED {source.name}:\n{plain}", file=sys.stderr, flush=True)
            failed.append(source.name)
            continue
        target = rendered_path(source)
        size = target.stat().st_size / 1024
        print(f"  {target.relative_to(ROOT)}: {seconds:.0f} s, {size:.0f} KiB", flush=True)
    if failed:
        print("failed: " + ", ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
