"""What every object store shares: the listed object, the interface an S3 bucket and a folder both offer, and the
message for a file that changed while it was sent.

The object stores' push, pull, ``store ls|gc|check`` (:mod:`.blob`) and the remote Neuron cache
scan speak only :class:`ObjectStore`, so the S3 store (:mod:`.blob.s3`) and the file store
(:mod:`.blob.backends`) behave alike: every write of a key is atomic (S3 PUTs are; a file
is written beside its key and renamed into place), so a reader sees a whole object or
none, and keys are plain ``/``-separated names under the store's prefix.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

#: The block objects are read and written in.
BLOCK = 1 << 20


@dataclass(frozen=True, slots=True)
class StoredObject:
    """One listed object: its key (relative to the store's prefix), size and age."""

    key: str
    size: int
    modified: float


class ObjectStore(Protocol):
    """What warmcache needs from object storage; keys are relative to the store's prefix."""

    url: str

    def size_of(self, key: str) -> int | None:
        """The object's size, or ``None`` when there is none."""

    def stat(self, key: str) -> StoredObject | None:
        """The object's size and last write, or ``None`` when there is none."""

    def sha256_of(self, key: str) -> str | None:
        """The sha256 of what the store holds under ``key`` (S3's own checksum when it kept one), or ``None`` when
        there is none."""

    def touch(self, key: str) -> None:
        """Make the object's last write *now* without changing its bytes (``store gc`` spares young blobs); absent is
        fine (a ``store gc`` took it meanwhile: the push that touches it looks again and uploads it)."""

    def read(self, key: str, max_bytes: int) -> bytes | None:
        """The whole object (refused above ``max_bytes``), or ``None`` when there is none."""

    def write(self, key: str, data: bytes) -> None:
        """Create or replace the object atomically."""

    def upload(self, path: Path, key: str, sha256: str, progress: Callable[[int], None] | None = None) -> None:
        """Create or replace the object with a file's bytes (atomically); ``progress(bytes)`` as they go.

        The bytes are hashed as they are sent: if they are not ``sha256`` (the file changed
        since it was hashed) nothing stays under ``key`` and :class:`CacheError` names the file.
        """

    def blocks(self, key: str) -> Iterator[bytes]:
        """The object's bytes as a stream of blocks; :class:`StoreError` if it is gone."""

    def list(self, prefix: str) -> Iterator[StoredObject]:
        """Every object whose key starts with ``prefix``."""

    def delete(self, key: str) -> None:
        """Remove the object (absent is fine)."""


def changed_under_push(path: Path, sha256: str) -> str:
    return (
        f"{path}: changed while it was pushed (its bytes are no longer sha256 {sha256[:16]}…); "
        "nothing stored under that key, push refused"
    )


def hash_blocks(blocks: Iterator[bytes]) -> str:
    digest = hashlib.sha256()
    for block in blocks:
        digest.update(block)
    return digest.hexdigest()
