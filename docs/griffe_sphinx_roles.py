"""A Griffe extension that turns the reStructuredText markup of ppl_sgmcmc's docstrings into the
Markdown that mkdocstrings renders.

The docstrings are written for Sphinx (``:param x:`` fields, ``:class:`~a.B``` roles, ``::`` literal
blocks). mkdocstrings' ``sphinx`` docstring style parses the fields; this extension handles the rest,
once the package is loaded:

* A role (outside literal blocks) whose target is in the package (``:class:`~ppl_sgmcmc.numpyro.kernel.SGMCMCKernel```, or a
  name in the scope of the docstring, ``:meth:`sample```) becomes an optional cross-reference: a link
  where the API reference documents the target, inline code where it does not (private modules).
  A target under ``ppl_sgmcmc`` that does not exist is logged as a warning, so that
  ``mkdocs build --strict`` fails on it. Other targets (``numpyro.infer.MCMC``) become inline code:
  the build runs offline, without other projects' inventories.
* Field lists (``:param x:``, ``:return:``, ...) move to the end of the docstring, where the
  ``sphinx`` parser expects them: in reStructuredText a field ends at the first unindented line, while
  the parser would take every later paragraph (an example, a note) into the last field.
* A paragraph ending in ``::`` and the indented block after it become a fenced code block (``pycon``
  for doctests, plain text for equations).

Used by ``docs/mkdocs.yml`` (``plugins.mkdocstrings.handlers.python.options.extensions``).
"""

from __future__ import annotations

import html
import re
import textwrap

import griffe

logger = griffe.get_logger(__name__)

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|obj|exc|data|const):`(?P<body>[^`]+)`")
TITLED = re.compile(r"^(?P<title>.*?)\s*<(?P<target>[^<>]+)>$")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


FIELD = re.compile(
    r"^:(?:param|parameter|arg|argument|key|keyword|type|raises?|except|exception"
    r"|var|ivar|cvar|vartype|returns?|rtype|yields?)\b"
)


def fields_last(text: str) -> str:
    """Move the field list items (with their indented continuation lines) after the other text."""
    lines = text.split("\n")
    body: list[str] = []
    fields: list[str] = []
    in_field = False
    for line in lines:
        if FIELD.match(line):
            in_field = True
        elif in_field and line.strip() and _indent(line) == 0:
            in_field = False
        (fields if in_field else body).append(line)
    if not fields:
        return text
    while body and not body[-1].strip():
        body.pop()
    while fields and not fields[-1].strip():
        fields.pop()
    return "\n".join(body + [""] + fields)


def literal_blocks(text: str) -> str:
    """Turn every ``paragraph::`` + indented block into ``paragraph:`` + a fenced code block."""
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.rstrip()
        if not stripped.endswith("::"):
            out.append(line)
            i += 1
            continue
        base = _indent(line)
        # the block: blank lines, then lines indented deeper than the paragraph
        j = i + 1
        while j < len(lines) and not lines[j].strip():
            j += 1
        if j == len(lines) or _indent(lines[j]) <= base:
            out.append(line)
            i += 1
            continue
        k = j
        while k < len(lines) and (not lines[k].strip() or _indent(lines[k]) > base):
            k += 1
        while k > j and not lines[k - 1].strip():
            k -= 1
        head = stripped[:-2].rstrip()
        # RST: "text::" reads "text:"; a lone "::" (or " ::") vanishes
        if head.strip():
            out.append(head + (":" if stripped[-3:-2] != " " else ""))
        code = textwrap.dedent("\n".join(lines[j:k]))
        language = "pycon" if code.lstrip().startswith(">>>") else "text"
        pad = " " * base
        out.append("")
        out.append(f"{pad}```{language}")
        out.extend(pad + c if c else "" for c in code.split("\n"))
        out.append(f"{pad}```")
        i = k
    return "\n".join(out)


class SphinxRoles(griffe.Extension):
    """Rewrite the docstrings of the packages in ``packages`` (default: ``ppl_sgmcmc``)."""

    def __init__(self, packages: list[str] | None = None) -> None:
        super().__init__()
        self.packages = set(packages or ["ppl_sgmcmc"])

    def on_package(self, *, pkg: griffe.Module, **kwargs) -> None:
        if pkg.name not in self.packages:
            return
        for obj in self._walk(pkg):
            if obj.docstring is not None:
                text = literal_blocks(fields_last(obj.docstring.value))
                obj.docstring.value = self._roles(text, obj, pkg)

    def _roles(self, text: str, obj, pkg: griffe.Module) -> str:
        """Convert the roles outside code blocks (a literal block shows its text as written)."""
        lines = text.split("\n")
        fenced = False
        for i, line in enumerate(lines):
            if line.lstrip().startswith("```"):
                fenced = not fenced
            elif not fenced:
                lines[i] = ROLE.sub(lambda m: self._role(m.group("body"), obj, pkg), line)
        return "\n".join(lines)

    def _walk(self, obj):
        yield obj
        for member in obj.members.values():
            if not member.is_alias:
                yield from self._walk(member)

    def _exists(self, path: str, pkg: griffe.Module) -> bool:
        if path == pkg.path:
            return True
        try:
            pkg[path[len(pkg.path) + 1 :]]
        except Exception:  # KeyError, or an alias that cannot be resolved
            return False
        return True

    def _resolve(self, target: str, obj, pkg: griffe.Module) -> tuple[str | None, bool]:
        """``(path, in_package)``: the absolute path of ``target`` seen from ``obj``'s docstring."""
        root = pkg.path
        if target == root or target.startswith(root + "."):
            return target, True
        head, dot, rest = target.partition(".")
        scope = obj
        while scope is not None:
            member = scope.members.get(head) if hasattr(scope, "members") else None
            if member is not None:
                path = member.target_path if member.is_alias else member.path
                path = path + dot + rest
                return (path, True) if path.startswith(root + ".") else (None, False)
            scope = scope.parent
        return None, False

    def _role(self, body: str, obj, pkg: griffe.Module) -> str:
        titled = TITLED.match(body)
        if titled:
            title, target = titled.group("title"), titled.group("target")
        else:
            target = body
            title = target.lstrip("~").rsplit(".", 1)[-1] if target.startswith("~") else target
        target = target.lstrip("~")
        path, in_package = self._resolve(target, obj, pkg)
        code = f"`{title}`"
        if path is None:
            return code
        if not self._exists(path, pkg):
            if in_package and target.startswith(pkg.path):
                logger.warning(f"{obj.path}: the docstring refers to `{target}`, which does not exist")
            return code
        return f'<autoref identifier="{path}" optional><code>{html.escape(title)}</code></autoref>'
