"""Telling a live lock from one a crash left behind, without waiting on it.

Both the Neuron compile cache and warmup's per-spec locks (``filelock``) lock
with ``flock`` and leave the file in place when released, so a lock file's
existence proves nothing; a non-blocking ``flock`` probe does: it fails exactly
while a live process holds the lock.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

from warmcache.cache.layout import LOCK_DIRNAME


def lock_is_held(path: Path) -> bool:
    """Whether a live process holds a ``flock`` on ``path`` (probed, never waited for)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        return exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def warmup_running(root: Path) -> bool:
    """Whether a warmup compiles into the cache at ``root`` right now (it holds a per-spec lock there)."""
    folder = root / LOCK_DIRNAME
    return folder.is_dir() and any(lock_is_held(lock) for lock in folder.glob("*.lock"))
