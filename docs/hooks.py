"""MkDocs hooks of the documentation site (``hooks:`` in ``docs/mkdocs.yml``).

The teaching notebooks live in ``notebooks/`` at the repository root, where pytest (nbmake) executes
them; this hook adds them to the site as ``notebooks/<name>.ipynb``, before mkdocs-jupyter turns
``.ipynb`` files into pages.

It also silences one griffe warning that is not a documentation error: a kernel documents the options
it forwards to its base class through ``**kwargs`` (``temperature``, ``replace``, ...), and griffe,
not finding them in the kernel's own signature, reports "No matching parameter".
"""

import inspect
import logging
import re
from pathlib import Path

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def _forwarded_options():
    """The keyword options of the algorithms' and the kernels' base classes, which subclasses take through
    ``**kwargs``."""
    from ppl_sgmcmc.algorithms import Algorithm
    from ppl_sgmcmc.pyro import SGMCMCKernel as PyroSGMCMCKernel

    bases = [Algorithm, PyroSGMCMCKernel]
    names = set()
    for base in bases:
        names |= {
            p.name
            for p in inspect.signature(base.__init__).parameters.values()
            if p.kind is inspect.Parameter.KEYWORD_ONLY
        }
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
        files.append(
            File(
                f"notebooks/{notebook.name}",
                src_dir=str(NOTEBOOKS.parent),
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
