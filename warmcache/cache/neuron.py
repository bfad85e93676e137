"""What state a Neuron compile-cache entry is in, read from the files it holds.

A module folder ``neuronxcc-<ver>/MODULE_<hlo-hash>+<flags-hash>/`` is

- ``done``: ``model.neff`` and ``model.done`` are there;
- ``failed``: ``model.log`` without a NEFF: the compiler failed, and the cache
  replays that failure forever (until the entry is removed or
  ``--retry_failed_compilation`` is passed);
- ``incomplete``: anything else (a compile killed before it wrote ``model.done``);
- ``locked``: a ``*.lock`` file is present, whatever else is there.

A lock is *held* when a live process holds an ``fcntl`` lock on the file: the
Neuron cache takes its locks with ``filelock``, which uses ``flock`` and leaves the
file behind on release or crash, so the file's existence proves nothing. We probe
with a non-blocking ``flock``. A lock nobody holds is *stale* once it is older than
a grace period: ``flock`` does not see holders on other hosts of a network file
system, and a lock only just created may not be taken yet. The native backend's
NEFF cache (``TORCH_NEURONX_NEFF_CACHE_DIR``) is ``done`` when an entry holds a NEFF.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from warmcache.cache.quiet import open_quietly

EntryState = Literal["done", "failed", "incomplete", "locked"]

#: Default grace period before an unheld lock or an incomplete entry counts as left behind.
DEFAULT_GRACE_SECONDS = 600.0


@dataclass(frozen=True, slots=True)
class LockInfo:
    """One ``*.lock`` file inside an entry."""

    path: str
    age_seconds: float
    held: bool
    size_bytes: int

    def is_stale(self, grace_seconds: float) -> bool:
        return not self.held and self.age_seconds >= grace_seconds


@dataclass(frozen=True, slots=True)
class NeuronEntryFacts:
    """What the files of one Neuron entry say about it."""

    content_state: Literal["done", "failed", "incomplete"]
    compiler_version: str | None
    flags: tuple[str, ...] | None
    locks: tuple[LockInfo, ...]


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


def find_locks(root: Path, entry: str, now: float | None = None) -> tuple[LockInfo, ...]:
    now = time.time() if now is None else now
    folder = root / entry
    if not folder.is_dir():
        return ()
    out = []
    for lock in sorted(folder.rglob("*.lock")):
        if lock.is_symlink() or not lock.is_file():
            continue
        stat = lock.stat()
        out.append(LockInfo(lock.relative_to(root).as_posix(), max(0.0, now - stat.st_mtime), lock_is_held(lock), stat.st_size))
    return tuple(out)


def inspect_module(root: Path, entry: str, now: float | None = None) -> NeuronEntryFacts:
    """Facts about ``neuronxcc-<ver>/MODULE_.../`` (``entry`` is relative to ``root``)."""
    folder = root / entry
    version_dir = entry.split("/", 1)[0]
    version = version_dir[len("neuronxcc-") :] if version_dir.startswith("neuronxcc-") else None
    has_neff = (folder / "model.neff").is_file()
    if has_neff and (folder / "model.done").is_file():
        state: Literal["done", "failed", "incomplete"] = "done"
    elif (folder / "model.log").is_file() and not has_neff:
        state = "failed"
    else:
        state = "incomplete"
    return NeuronEntryFacts(state, version, _read_flags(folder / "compile_flags.json"), find_locks(root, entry, now))


def inspect_native(root: Path, entry: str, now: float | None = None) -> NeuronEntryFacts:
    """Facts about one top-level entry of the native backend's NEFF cache."""
    path = root / entry
    has_neff = path.suffix == ".neff" if path.is_file() else any(path.rglob("*.neff"))
    return NeuronEntryFacts("done" if has_neff else "incomplete", None, None, find_locks(root, entry, now))


def _read_flags(path: Path) -> tuple[str, ...] | None:
    """``compile_flags.json`` as a tuple of flags; ``None`` when absent or unreadable."""
    try:
        with open_quietly(path) as handle:
            data = json.loads(handle.read().decode("utf-8"))
    except (OSError, ValueError):
        return None
    if isinstance(data, list):
        return tuple(str(f) for f in data)
    if isinstance(data, str):
        return tuple(data.split())
    if isinstance(data, dict):
        return tuple(f"{k}={v}" for k, v in sorted(data.items()))
    return None
