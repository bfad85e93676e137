"""Where a relative path in a file points: that file's folder, whoever reads it and from wherever.

The one place such a path is anchored: a manifest's cache folder, folder store, signing
key and local model (:mod:`warmcache.manifest.parse`), its registry file
(:mod:`warmcache.settings`) and its trusted key files (:mod:`warmcache.trust`). A path
given on the command line anchors at the working folder (:meth:`Anchor.here`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Anchor:
    """The folder relative paths start from."""

    base: Path

    @classmethod
    def of(cls, file: Path) -> Anchor:
        """Relative paths in ``file`` mean paths from its folder, not from the reader's working folder."""
        return cls(file.resolve().parent)

    @classmethod
    def here(cls) -> Anchor:
        return cls(Path.cwd())

    def path(self, text: str) -> Path:
        """``text`` (``~`` expanded) from the anchor, absolute and resolved; an absolute ``text`` stays itself
        (resolved)."""
        return (self.base / os.path.expanduser(text)).resolve()
