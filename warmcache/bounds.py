"""The bounds every value from outside (a manifest, a bundle) must meet before it is used.

Python's parsers and the layers behind them each have a limit that turns a
hostile input into a traceback instead of a clear line: ``json`` and ``tomllib``
recurse once per nesting level (``RecursionError``), ``tomllib`` is quadratic in
the length of a dotted key, a registry ``Integer`` column holds 32 bits on
PostgreSQL (64 on SQLite), the file system refuses a name over 255 bytes. So
nesting is measured on the raw text before it is parsed, and integers and paths
are range-checked when they are validated, never when they are finally used.
"""

from __future__ import annotations

import re
from itertools import accumulate

#: No real manifest or bundle metadata nests deeper than a handful of levels.
MAX_NESTING = 64
#: Dotted-key parts in a whole TOML document (``a.b = 1`` has one; ``[[model.generate]]`` one):
#: a real manifest has a few per model. Each builds a table, so thousands of lines of
#: 60-part keys, each within the nesting bound, would still keep tomllib busy for seconds.
MAX_KEY_DOTS = 4096
#: Shapes one manifest may declare (batch sizes × lengths, summed over every grid of every model), checked before
#: any is built: each costs ~30 µs to plan and a registry row, and 300 × 300 grids of 50 models (4.5 million
#: shapes, from a 116 KB file) kept a planner busy for minutes. A real fleet declares thousands.
MAX_MANIFEST_SHAPES = 100_000
#: A model's ``config.json`` is input too: published ones are kilobytes (Phi-3.5's 48-entry rope lists included).
MAX_CONFIG_BYTES = 4 << 20
#: Registry counts (batch size, lengths, attempts) are ``Integer`` columns: 32-bit on PostgreSQL.
MAX_COUNT = 2**31 - 1
#: Byte sizes are ``BigInteger`` columns and torch sizes: int64.
MAX_BYTES = 2**63 - 1
#: Linux ``NAME_MAX`` (bytes of one path component) and ``PATH_MAX`` (bytes of a path, NUL excluded).
NAME_MAX = 255
PATH_MAX = 4095

# Possessive (``*+``) throughout: a repeated alternation (``(?:[^"\\]|\\.)*``) made ``re`` keep a backtracking
# entry per character, 118 bytes each, so one 4 MiB string in a capped answer took 475 MB to measure.
#: A JSON string, or a run of brackets outside one.
_JSON_STRING_OR_BRACKETS = re.compile(rb'"[^"\\]*+(?:\\.[^"\\]*+)*+"|[\[\]{}]++', re.DOTALL)
#: TOML strings (multi-line first) and comments: brackets and dots inside them do not nest.
_TOML_STRING_OR_COMMENT = re.compile(
    r'"""[\s\S]*?"""|\'\'\'[\s\S]*?\'\'\'|"[^"\\\n]*+(?:\\.[^"\\\n]*+)*+"|\'[^\'\n]*\'|#[^\n]*'
)
#: A dot that joins key parts (``a.b``), not one inside a number (``1.5``, a time's fraction).
_KEY_DOT = re.compile(r"(?<![0-9])\.|\.(?![0-9])")
_NOT_BRACKETS = bytes(set(range(256)) - set(b"[]{}"))


def json_nesting(data: bytes) -> int:
    """How deep the arrays and objects of a JSON document nest, measured without parsing it.

    Token by token, never a copy of the document: a million short strings made ``re.sub``
    build a million pieces (171 MB for a 4 MiB answer)."""
    depth = deepest = 0
    for token in _JSON_STRING_OR_BRACKETS.finditer(data):
        if data[token.start()] != ord('"'):  # a string is skipped uncopied
            run = token[0]
            deepest = max(deepest, _bracket_depth(run, depth))
            depth += 2 * (run.count(b"[") + run.count(b"{")) - len(run)
    return deepest


def toml_nesting(text: str) -> tuple[int, int]:
    """``(depth, dots)`` of a TOML document, measured without parsing it.

    ``depth``: how deep inline arrays and tables, or the parts of one dotted key, nest;
    ``dots``: how many dots join key parts in the whole document.
    """
    bare = _TOML_STRING_OR_COMMENT.sub('""', text)
    brackets = _bracket_depth(bare.encode("utf-8", "replace").translate(None, _NOT_BRACKETS))
    dots_per_line = [len(_KEY_DOT.findall(line)) for line in bare.splitlines()]
    return max(brackets, max(dots_per_line, default=-1) + 1), sum(dots_per_line)


def _bracket_depth(brackets: bytes, start: int = 0) -> int:
    """The deepest level ``brackets`` (nothing but ``[]{}``) reach from level ``start``."""
    return max(accumulate((1 if b in b"[{" else -1 for b in brackets), initial=start))


def path_problem(path: str) -> str | None:
    """Why the file system would refuse ``path`` (a NUL byte, a component or the whole too long), or ``None``."""
    if "\x00" in path:
        return "contains a NUL character"
    try:
        encoded = path.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone surrogate, which no file name can hold"
    if len(encoded) > PATH_MAX:
        return f"is {len(encoded)} bytes long, more than a path may be ({PATH_MAX})"
    longest = max(encoded.split(b"/"), key=len)
    if len(longest) > NAME_MAX:
        return f"has a component of {len(longest)} bytes, more than a file name may be ({NAME_MAX})"
    return None
