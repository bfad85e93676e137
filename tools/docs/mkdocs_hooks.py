"""MkDocs hooks (``hooks:`` in mkdocs.yml) that keep the documentation true to the repository.

- Every repository path a page names (``warmcache/...``, ``tools/...``, ``tests/...``,
  ``examples/...``, ``migrations/...``; globs such as ``tools/bench/bench_*.py`` match at least one
  file) must exist, and every dotted module name (``warmcache.runtime.snapshot.verify_snapshot``)
  must resolve to a module file that mentions the name after it. A miss is a warning naming the
  page and the path, so ``mkdocs build --strict`` fails on it. ``tests/test_docs.py`` runs the
  same check over README.md and every page without MkDocs.
- Docstrings are written for Sphinx: mkdocstrings leaves their cross-reference roles as text
  (``:class:`~warmcache.errors.WarmcacheError``` renders as ``:class:`` before the code
  ``~warmcache.errors.WarmcacheError``). Each becomes the name Sphinx would show (``~`` keeps the
  last part, a leading ``.`` is dropped), and a name inside the package a cross-reference that
  autorefs links where the site renders that object and leaves as plain code where it does not.
  A relative name (``:meth:`prime```) is looked up as Sphinx looks: in the object whose docstring
  holds it and its parents, then as the one object on the page whose path ends with it.
- A table cell's code span writes a pipe as ``\\|`` (GitHub would end the cell at a bare one);
  Python-Markdown keeps pipes inside code spans in their cell but shows the backslash, so the
  site gets the bare pipe.
- ``::: warmcache.NAME`` (mkdocstrings) may name any public name of ``warmcache/__init__.py``.
  The names it serves lazily (its ``_LAZY`` table, which static analysis cannot follow) are
  rewritten to the module that table names, so pages never spell an internal module path.

This file imports nothing from MkDocs or warmcache: the test imports it in the plain test
environment, and the checks read files only.
"""

from __future__ import annotations

import ast
import bisect
import logging
import re
from collections.abc import Collection
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "warmcache"

#: A repository path: one of these top-level folders, then at least one more character. Not
#: part of a longer path or URL (``~/.cache/warmcache/...``, ``oci://host/warmcache/x``,
#: ``.warmcache/models``); a trailing sentence full stop is not part of it.
PATH_RE = re.compile(r"(?<![\w./:@~$-])((?:warmcache|tools|tests|examples|migrations)/[\w.*/-]*[\w*/])")
#: A dotted name inside the package: ``warmcache.modeling.kv_cache.PositionTensorCache``.
DOTTED_RE = re.compile(r"(?<![\w./:@~$-])(warmcache(?:\.[A-Za-z_]\w*)+)")

#: A code span (one or more backticks, the same number closing it).
CODE_SPAN_RE = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)")

#: A Sphinx cross-reference role mkdocstrings rendered as text in front of its code span, and the span's text.
SPHINX_ROLE_RE = re.compile(r":(?:py:)?(?:attr|class|data|exc|func|meth|mod|obj):<code>([^<]*)</code>")
#: A role's ``title <target>`` form, as the rendered HTML escapes it.
EXPLICIT_TITLE_RE = re.compile(r"(.*?)\s*&lt;(.+)&gt;")
#: An object's anchor on an API page: mkdocstrings gives each object's heading its dotted path as id.
OBJECT_ID_RE = re.compile(rf'\bid="({PACKAGE}(?:\.\w+)+)"')

log = logging.getLogger("mkdocs.plugins.warmcache_docs")


def _exists(path: str, root: Path) -> bool:
    """Whether ``path`` (relative to ``root``; a glob when it holds ``*``) names at least one file or folder."""
    if "*" in path:
        return any(root.glob(path.rstrip("/")))
    return (root / path).exists()


def _module_source(parts: list[str], root: Path) -> tuple[Path, list[str]] | None:
    """The file of the longest module prefix of ``parts`` (``["warmcache", ...]``) and the names after it."""
    folder = root / parts[0]
    if not (folder / "__init__.py").is_file():
        return None
    for i in range(1, len(parts)):
        if (folder / parts[i] / "__init__.py").is_file():
            folder = folder / parts[i]
        elif (folder / f"{parts[i]}.py").is_file():
            return folder / f"{parts[i]}.py", parts[i + 1 :]
        else:
            return folder / "__init__.py", parts[i:]
    return folder / "__init__.py", []


def _dotted_exists(name: str, root: Path) -> bool:
    """Whether ``name`` resolves: its module prefix is a file, and that file mentions the first name after it."""
    found = _module_source(name.split("."), root)
    if found is None:
        return False
    source, rest = found
    if not rest:
        return True
    return re.search(rf"\b{re.escape(rest[0])}\b", source.read_text(encoding="utf-8")) is not None


def missing_references(text: str, root: Path = ROOT) -> list[str]:
    """Every repository path and dotted module name in ``text`` that does not exist under ``root``, once each."""
    missing: list[str] = []
    for match in PATH_RE.finditer(text):
        path = match.group(1)
        if not _exists(path, root) and path not in missing:
            missing.append(path)
    for match in DOTTED_RE.finditer(text):
        name = match.group(1).rstrip(".")
        if not _dotted_exists(name, root) and name not in missing:
            missing.append(name)
    return missing


def lazy_public_names(root: Path = ROOT) -> dict[str, str]:
    """``warmcache/__init__.py``'s ``_LAZY`` table (public name -> module), read without importing it."""
    tree = ast.parse((root / PACKAGE / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.AnnAssign | ast.Assign):
            targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
            if any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in targets) and node.value is not None:
                value = ast.literal_eval(node.value)
                return {str(k): str(v) for k, v in value.items()}
    return {}


def resolve_lazy_directives(markdown: str, root: Path = ROOT) -> str:
    """``::: warmcache.NAME`` for a lazily served NAME, rewritten to ``::: <its module>.NAME`` for mkdocstrings."""
    lazy = lazy_public_names(root)

    def rewrite(match: re.Match[str]) -> str:
        name = match.group(2)
        return f"{match.group(1)}{lazy[name]}.{name}" if name in lazy else match.group(0)

    return re.sub(rf"^(:::[ \t]+){PACKAGE}\.(\w+)[ \t]*$", rewrite, markdown, flags=re.MULTILINE)


def unescape_table_pipes(markdown: str) -> str:
    """``\\|`` inside the code spans of table rows, written as the bare ``|`` Python-Markdown's tables want there."""

    def in_code(match: re.Match[str]) -> str:
        return match.group(0).replace("\\|", "|")

    return "\n".join(
        CODE_SPAN_RE.sub(in_code, line) if line.lstrip().startswith("|") else line for line in markdown.split("\n")
    )


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    """MkDocs hook: warn about every path or module the page names that does not exist, then resolve lazy names and
    unescape table pipes."""
    for name in missing_references(markdown):
        log.warning("docs/%s names %s, which does not exist in the repository", page.file.src_uri, name)
    return unescape_table_pipes(resolve_lazy_directives(markdown))


def sphinx_reference(content: str, context: str = "", page_ids: Collection[str] = ()) -> str:
    """The HTML for one Sphinx role's content (``~a.b.C``, ``.b.C``, ``a.b.C`` or ``title <a.b.C>``): the name Sphinx
    shows, as code, wrapped in an optional autorefs cross-reference when the target is a path inside the package or a
    relative name found from ``context`` (the object whose docstring holds it) among ``page_ids``: a link where the
    site renders the object, the code alone where it does not, never a warning."""
    explicit = EXPLICIT_TITLE_RE.fullmatch(content)
    if explicit:
        title, target = explicit.group(1), explicit.group(2).lstrip("~")
    else:
        target = content.lstrip("~")
        title = content.lstrip(".")
        if title.startswith("~"):
            title = title[1:].rsplit(".", 1)[-1]
    code = f"<code>{title}</code>"
    found = target if target.startswith(f"{PACKAGE}.") else relative_target(target.lstrip("."), context, page_ids)
    return code if found is None else f'<autoref identifier="{found}" optional>{code}</autoref>'


def relative_target(name: str, context: str, page_ids: Collection[str]) -> str | None:
    """The page's object a relative ``name`` means: ``name`` inside ``context`` or its nearest parent that has it,
    else the one object whose path ends with it; ``None`` when neither finds exactly one."""
    parts = context.split(".") if context else []
    for end in range(len(parts), 0, -1):
        candidate = ".".join([*parts[:end], name])
        if candidate in page_ids:
            return candidate
    ending = [i for i in page_ids if i.endswith(f".{name}")]
    return ending[0] if len(ending) == 1 else None


def on_page_content(html: str, **kwargs: Any) -> str:
    """MkDocs hook: the Sphinx roles the API page's docstrings leave in front of code spans, made cross-references
    (autorefs resolves them after every page is built); a relative one is read in the object whose heading precedes
    it."""
    anchors = [(m.start(), m.group(1)) for m in OBJECT_ID_RE.finditer(html)]
    starts = [start for start, _ in anchors]
    page_ids = {anchor for _, anchor in anchors}

    def reference(match: re.Match[str]) -> str:
        before = bisect.bisect(starts, match.start())
        context = anchors[before - 1][1] if before else ""
        return sphinx_reference(match.group(1), context, page_ids)

    return SPHINX_ROLE_RE.sub(reference, html)
