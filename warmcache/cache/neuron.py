"""What state a Neuron compile-cache entry is in, read from the files it holds.

A module folder ``neuronxcc-<ver>/MODULE_<hlo-hash>+<flags-hash>/`` is

- ``done``: ``model.neff`` and ``model.done`` are there;
- ``failed``: ``model.log`` without a NEFF: the compiler failed, and the cache
  replays that failure forever (until the entry is removed or
  ``--retry_failed_compilation`` is passed);
- ``incomplete``: anything else (a compile killed before it wrote ``model.done``);
- ``locked``: a ``*.lock`` file is present, whatever else is there.

A lock (``model.hlo_module.pb.lock``) may be live or left behind by a killed
compile, which makes every later compile of that graph wait on it forever. We
count it as *held* when a non-blocking ``flock`` probe fails (a live process holds
it), or when a Neuron compiler process (``neuronx-cc``, ``walrus_driver``) runs on
this host at all: the cache's lock may be a plain "file exists" lock that no
probe can see, and we cannot tell which module a running compiler works on.
An unheld lock is *stale* once it is older than a grace period, because ``flock``
and the process table do not see compiles on other hosts of a network file
system. The native backend's NEFF cache (``TORCH_NEURONX_NEFF_CACHE_DIR``) is
``done`` when an entry holds a NEFF.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from warmcache.cache.locks import lock_is_held
from warmcache.cache.noatime import open_quietly

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

    def as_json(self) -> dict[str, Any]:
        return {"path": self.path, "age_seconds": round(self.age_seconds, 1), "held": self.held}


@dataclass(frozen=True, slots=True)
class NeuronEntryFacts:
    """What the files of one Neuron entry say about it."""

    content_state: Literal["done", "failed", "incomplete"]
    compiler_version: str | None
    flags: tuple[str, ...] | None
    locks: tuple[LockInfo, ...]


#: Process names of the Neuron compiler (``/proc/<pid>/comm``, at most 15 characters).
NEURON_COMPILER_PROCESSES = frozenset({"neuronx-cc", "walrus_driver"})


def neuron_compiler_running() -> bool:
    """Whether a Neuron compiler process runs on this host (read from ``/proc``; ``False`` without it)."""
    for comm in Path("/proc").glob("[0-9]*/comm"):
        try:
            if comm.read_text().strip() in NEURON_COMPILER_PROCESSES:
                return True
        except OSError:
            continue  # the process ended while we looked
    return False


def find_locks(root: Path, entry: str, now: float, compiler_running: bool) -> tuple[LockInfo, ...]:
    folder = root / entry
    if not folder.is_dir():
        return ()
    out = []
    for lock in sorted(folder.rglob("*.lock")):
        if lock.is_symlink() or not lock.is_file():
            continue
        stat = lock.stat()
        held = compiler_running or lock_is_held(lock)
        out.append(LockInfo(lock.relative_to(root).as_posix(), max(0.0, now - stat.st_mtime), held, stat.st_size))
    return tuple(out)


def inspect_module(root: Path, entry: str, now: float, compiler_running: bool) -> NeuronEntryFacts:
    """Facts about ``neuronxcc-<ver>/MODULE_.../`` (``entry`` is relative to ``root``)."""
    folder = root / entry
    version_dir = entry.split("/", 1)[0]
    version = version_dir[len("neuronxcc-") :] if version_dir.startswith("neuronxcc-") else None
    names = {name for name in ("model.neff", "model.done", "model.log") if (folder / name).is_file()}
    return NeuronEntryFacts(
        module_state(names),
        version,
        _read_flags(folder / "compile_flags.json"),
        find_locks(root, entry, now, compiler_running),
    )


def module_state(names: Collection[str]) -> Literal["done", "failed", "incomplete"]:
    """A module folder's state from the names of the files directly in it (local or in S3)."""
    if "model.neff" in names and "model.done" in names:
        return "done"
    if "model.log" in names and "model.neff" not in names:
        return "failed"
    return "incomplete"


def inspect_native(root: Path, entry: str, now: float, compiler_running: bool) -> NeuronEntryFacts:
    """Facts about one top-level entry of the native backend's NEFF cache."""
    path = root / entry
    has_neff = path.suffix == ".neff" if path.is_file() else any(path.rglob("*.neff"))
    return NeuronEntryFacts(
        "done" if has_neff else "incomplete", None, None, find_locks(root, entry, now, compiler_running)
    )


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
