"""What an open endpoint may say about a failure: what went wrong, never where on the server's disk.

A failed shape's error text is the compiler's own (``… found in directory
/srv/models/x``, a traceback's ``File "/opt/venv/…"``), and ``/``, ``/v1/shapes`` and
``/v1/status`` answer anyone. Before such text leaves in an open answer, the paths a row
names are replaced by their role (``<model path>``, ``<cache dir>``) and any other
absolute path by ``<path>``. Token holders' answers (``POST /v1/plan``) keep the detail.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

#: A row's fields that hold a path on the registry host, and the role an open answer names instead.
PATH_ROLES = {"model_path": "<model path>", "cache_root": "<cache dir>"}
#: What any other absolute path becomes.
SOME_PATH = "<path>"

# Where a path ends: at a blank, a quote, a separator a sentence puts after it, or a bracket.
_PATH_CHARS = r"[^\s'\"`,;:()\[\]{}<>]"
_PATH_CHARS_BUT_SLASH = r"[^\s'\"`,;:()\[\]{}<>/]"
# An absolute path (or one under ``~``) that is not part of a URL (``http://h/x``), a relative path or a role.
_ANY_PATH = re.compile(rf"(?<![\w.~/:<>-])~?/{_PATH_CHARS}*")


def known_paths(model_paths: Iterable[str | None], cache_roots: Iterable[str | None] = ()) -> dict[str, str]:
    """Each absolute path among ``model_paths`` and ``cache_roots`` (a row's :data:`PATH_ROLES` fields), with its
    role."""
    known: dict[str, str] = {}
    for paths, role in ((model_paths, PATH_ROLES["model_path"]), (cache_roots, PATH_ROLES["cache_root"])):
        for path in paths:
            if path and path.startswith(("/", "~/")) and path.rstrip("/"):
                known.setdefault(path.rstrip("/"), role)
    return known


def without_paths(text: str, known: Mapping[str, str]) -> str:
    """``text`` with each of the ``known`` paths (longest first) replaced by its role, then every other absolute path by
    :data:`SOME_PATH`: safe to show any reader."""
    for path in sorted(known, key=len, reverse=True):
        # only the whole path, or a path below it: /srv/models/x is not the start of /srv/models/x2
        text = re.sub(re.escape(path) + f"(?!{_PATH_CHARS_BUT_SLASH})", known[path], text)
    return _ANY_PATH.sub(SOME_PATH, text)


def reader_error(text: str | None, model_path: str | None, cache_root: str | None) -> str | None:
    """A row's recorded error as an open answer shows it, its own paths named by role (``None`` stays ``None``)."""
    return None if text is None else without_paths(text, known_paths([model_path], [cache_root]))
