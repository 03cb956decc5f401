"""MkDocs hooks of the documentation site (``hooks:`` in ``docs/mkdocs.yml``).

The teaching notebooks live in ``notebooks/`` at the repository root, stored without outputs, where pytest
(nbmake) executes them; their executed copies, with outputs and figures, are in ``docs/rendered/notebooks/``
(``docs/render_notebooks.py`` writes them). This hook adds each notebook to the site as
``notebooks/<name>.ipynb``, before mkdocs-jupyter turns ``.ipynb`` files into pages: the rendered copy when it
was made from the notebook's current cells, else the notebook itself, without outputs (logged at INFO level,
so that a stale copy does not fail ``mkdocs build --strict``).

It also silences one griffe warning that is not a documentation error: a kernel documents the options
it forwards to its base class through ``**kwargs`` (``temperature``, ``replace``, ...), and griffe,
not finding them in the kernel's own signature, reports "No matching parameter".
"""

import ast
import logging
import re
from pathlib import Path

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File
from render_notebooks import COMMAND, RENDERED, is_current, rendered_path  # docs/render_notebooks.py

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
PACKAGE = Path(__file__).resolve().parent.parent / "ppl_sgmcmc"
log = logging.getLogger("mkdocs.hooks.notebooks")


# the base classes whose keyword options the algorithms and the kernels forward through ``**kwargs``
_BASES = {"algorithms.py": "Algorithm", "pyro/kernel.py": "SGMCMCKernel"}


def _forwarded_options():
    """The keyword-only options of the bases' ``__init__``, read from their source (as griffe reads it): importing
    the package would import JAX, PyTorch and Pyro, a third of the strict build's time."""
    names = set()
    for path, base in _BASES.items():
        tree = ast.parse((PACKAGE / path).read_text(encoding="utf-8"))
        (init,) = [
            node
            for cls in tree.body
            if isinstance(cls, ast.ClassDef) and cls.name == base
            for node in cls.body
            if isinstance(node, ast.FunctionDef) and node.name == "__init__"
        ]
        names |= {arg.arg for arg in init.args.kwonlyargs}
    return names


class _ForwardedOptions(logging.Filter):
    pattern = re.compile(r"No matching parameter for '(\w+)'")

    def __init__(self):
        super().__init__()
        self.names = _forwarded_options()

    def filter(self, record):
        match = self.pattern.search(record.getMessage())
        return not (match and match.group(1) in self.names)


logging.getLogger("mkdocs.plugins.griffe").addFilter(_ForwardedOptions())


@event_priority(100)  # before mkdocs-jupyter's on_files
def on_files(files, config):
    for notebook in sorted(NOTEBOOKS.glob("*.ipynb")):
        if is_current(notebook):
            src_dir = RENDERED.parent  # docs/rendered/notebooks/<name>.ipynb
        else:
            src_dir = NOTEBOOKS.parent
            why = "is stale" if rendered_path(notebook).is_file() else "is missing"
            log.info(
                f"the rendered copy of notebooks/{notebook.name} {why}: the site shows the notebook without "
                f"outputs; render it with `{COMMAND} {notebook.stem}`"
            )
        files.append(
            File(
                f"notebooks/{notebook.name}",
                src_dir=str(src_dir),
                dest_dir=config["site_dir"],
                use_directory_urls=config["use_directory_urls"],
            )
        )
    # the figures benchmarks/RESULTS.md links as results/<name>.png (benchmarks.md includes that file)
    for figure in sorted((BENCHMARKS / "results").glob("*.png")):
        files.append(
            File(
                f"results/{figure.name}",
                src_dir=str(BENCHMARKS),
                dest_dir=config["site_dir"],
                use_directory_urls=config["use_directory_urls"],
            )
        )
    return files
