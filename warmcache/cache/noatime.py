"""Reading cache files without resetting their LRU clock.

``cache prune --max-size`` and ``--older-than`` judge an entry by when it was last
used, and the only trace a cache hit leaves is the files' access time. Scanning
(``compile_flags.json``) and packing (sha256 of every file) must not count as a
use, or every scan would make the whole cache look fresh. ``O_NOATIME`` (Linux;
allowed to the file's owner) reads without updating atime; elsewhere we fall back
to a plain read.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

_NOATIME = getattr(os, "O_NOATIME", 0)


def open_quietly(path: Path) -> BinaryIO:
    """``open(path, "rb")`` that leaves the access time alone where the OS allows it."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOATIME)
    except PermissionError:
        if not _NOATIME:
            raise
        fd = os.open(path, os.O_RDONLY)
    return os.fdopen(fd, "rb")
