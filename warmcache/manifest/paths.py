"""Where a manifest's relative paths point: its own folder, whoever reads it and from wherever.

Every path the manifest names (the cache folder, a folder store, the signing key, a local
model) is anchored by :meth:`Anchor.path`; the registry URL and the trusted key files are
anchored by their own parsers (:mod:`warmcache.dburl`, :mod:`warmcache.trust`), which the
command line shares, given :attr:`Anchor.base`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Anchor:
    """The folder of the manifest: relative paths in it mean paths from there, not from the caller's working folder."""

    base: Path

    @classmethod
    def of(cls, file: Path) -> Anchor:
        return cls(file.resolve().parent)

    def path(self, text: str) -> Path:
        """``text`` (``~`` expanded) from the manifest's folder, absolute and resolved; an absolute ``text`` stays itself."""
        return (self.base / os.path.expanduser(text)).resolve()

    def model_path(self, text: str) -> str:
        """A local model folder anchored like any path; anything else is a hub id and stays as written."""
        if os.path.isabs(os.path.expanduser(text)) or text.startswith((".", "~")) or os.path.exists(self.base / os.path.expanduser(text)):
            return str(self.path(text))
        return text
