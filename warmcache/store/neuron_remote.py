"""The Neuron compiler's own S3 cache (``NEURON_COMPILE_CACHE_URL=s3://...``), listed through the store code.

Neuron teams keep their NEFF cache in S3; ``cache scan`` and ``cache doctor`` list
and classify its module folders (``neuronxcc-<ver>/MODULE_<hlo>+<flags>/``) with the
same rule as a local cache (:func:`warmcache.cache.neuron.module_state`), from one
paginated listing and without downloading anything. A lock object cannot be
probed remotely, so a locked entry only reports the lock's age: whether a
compiler still holds it is for its owner to say.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from warmcache.cache.neuron import EntryState, module_state
from warmcache.jsonable import fields_json
from warmcache.store.objects import ObjectStore, StoredObject


@dataclass(frozen=True, slots=True)
class RemoteEntry:
    """One module folder of a remote Neuron cache."""

    path: str
    state: EntryState
    size_bytes: int
    compiler_version: str | None
    #: Lock objects in it, with their age in seconds.
    locks: tuple[tuple[str, float], ...]

    def as_json(self) -> dict[str, Any]:
        return {
            **fields_json(self, leave_out={"locks"}),
            "locks": [{"path": path, "age_seconds": round(age, 1)} for path, age in self.locks],
        }


@dataclass(frozen=True, slots=True)
class RemoteCacheInfo:
    url: str
    entries: tuple[RemoteEntry, ...]

    @property
    def states(self) -> Counter[str]:
        return Counter(e.state for e in self.entries)

    def as_json(self) -> dict[str, Any]:
        return {
            "root": self.url,
            "flavor": "neuron",
            "remote": True,
            "entry_count": len(self.entries),
            "size_bytes": sum(e.size_bytes for e in self.entries),
            "states": dict(sorted(self.states.items())),
            "entries": [e.as_json() for e in self.entries],
        }


def scan_remote_neuron(store: ObjectStore, now: float | None = None) -> RemoteCacheInfo:
    """Group the store's objects into module folders and classify each."""
    now = time.time() if now is None else now
    modules: dict[str, list[StoredObject]] = {}
    for item in store.list(""):
        parts = item.key.split("/")
        if len(parts) >= 3 and parts[0].startswith("neuronxcc-") and parts[1].startswith("MODULE_"):
            modules.setdefault("/".join(parts[:2]), []).append(item)
    entries = []
    for path, items in sorted(modules.items()):
        names = {item.key[len(path) + 1 :] for item in items}
        locks = tuple((item.key, max(0.0, now - item.modified)) for item in items if item.key.endswith(".lock"))
        entries.append(
            RemoteEntry(
                path,
                "locked" if locks else module_state(names),
                sum(i.size for i in items),
                path.split("/")[0][len("neuronxcc-") :],
                locks,
            )
        )
    return RemoteCacheInfo(store.url, tuple(entries))
