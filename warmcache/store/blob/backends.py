"""Which object store a location names (``s3://bucket/prefix``, :mod:`.s3`; ``file:///path``), and the file store.

Both speak :class:`~warmcache.store.objects.ObjectStore`; a file store is a folder (a local
disk, or NFS/FSx/EFS shared by hosts) whose every write lands by rename.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from warmcache.errors import CacheError, StoreError, UsageError, shown
from warmcache.store.blob.s3 import S3Store
from warmcache.store.objects import BLOCK, ObjectStore, StoredObject, changed_under_push, hash_blocks
from warmcache.store_location import StoreLocation

#: Temporary files of the file store start with this; ``store gc`` removes old ones.
FILE_TEMP_PREFIX = ".warmcache-tmp-"


def open_store(location: StoreLocation, endpoint_url: str | None = None) -> ObjectStore:
    """The object store a checked location names: ``s3://bucket[/prefix]`` or ``file:///path`` (an ``oci://``
    repository is :class:`~warmcache.store.oci.store.OciStore`'s)."""
    if location.scheme == "s3":
        parsed = urlparse(location.url)
        return S3Store(parsed.netloc, parsed.path.strip("/"), endpoint_url)
    if location.scheme == "file":
        return FileStore(location.folder)
    raise UsageError(f"{location.source} {shown(location.url)}: an OCI repository is not an object store")


class FileStore:
    """A folder as a store (a local disk, or NFS/FSx/EFS shared by hosts)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.url = root.as_uri()

    def _path(self, key: str) -> Path:
        return self.root / key

    def size_of(self, key: str) -> int | None:
        try:
            return self._path(key).stat().st_size
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreError(f"{self.url}/{key}: {exc.strerror or exc}") from None

    def stat(self, key: str) -> StoredObject | None:
        try:
            found = self._path(key).stat()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreError(f"{self.url}/{key}: {exc.strerror or exc}") from None
        return StoredObject(key, found.st_size, found.st_mtime)

    def sha256_of(self, key: str) -> str | None:
        return hash_blocks(self.blocks(key)) if self.stat(key) is not None else None

    def touch(self, key: str) -> None:
        try:
            os.utime(self._path(key))
        except FileNotFoundError:
            return  # taken by a gc since it was seen: the caller uploads it again
        except OSError as exc:
            raise StoreError(f"{self.url}/{key}: cannot refresh ({exc.strerror or exc})") from None

    def read(self, key: str, max_bytes: int) -> bytes | None:
        path = self._path(key)
        # a typo in the URL is not a store that lacks every index (a missing bucket is an error too)
        if not self.root.is_dir():
            raise StoreError(f"{self.url}: store folder does not exist")
        try:
            with path.open("rb") as handle:
                data = handle.read(max_bytes + 1)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreError(f"{self.url}/{key}: {exc.strerror or exc}") from None
        if len(data) > max_bytes:
            raise StoreError(f"{self.url}/{key}: larger than {max_bytes} bytes; refused")
        return data

    def write(self, key: str, data: bytes) -> None:
        self._replace(key, lambda handle: handle.write(data))

    def upload(self, path: Path, key: str, sha256: str, progress: Callable[[int], None] | None = None) -> None:
        def copy(handle: Any) -> None:
            digest = hashlib.sha256()
            with path.open("rb") as source:
                for block in iter(lambda: source.read(BLOCK), b""):
                    digest.update(block)
                    handle.write(block)
                    if progress:
                        progress(len(block))
            if digest.hexdigest() != sha256:  # raised before the rename: nothing lands under the key
                raise CacheError(changed_under_push(path, sha256))

        self._replace(key, copy)

    def _replace(self, key: str, fill: Callable[[Any], object]) -> None:
        """Write beside the key, flush to disk, rename over it: readers never see half a file."""
        target = self._path(key)
        temp = target.with_name(f"{FILE_TEMP_PREFIX}{uuid.uuid4().hex}")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with temp.open("wb") as handle:
                fill(handle)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temp, target)
        except OSError as exc:
            raise StoreError(f"{self.url}/{key}: cannot write ({exc.strerror or exc})") from None
        finally:
            temp.unlink(missing_ok=True)

    def blocks(self, key: str) -> Iterator[bytes]:
        try:
            with self._path(key).open("rb") as handle:
                yield from iter(lambda: handle.read(BLOCK), b"")
        except FileNotFoundError:
            raise StoreError(f"{self.url}/{key}: not in the store") from None
        except OSError as exc:
            raise StoreError(f"{self.url}/{key}: {exc.strerror or exc}") from None

    def list(self, prefix: str) -> Iterator[StoredObject]:
        if not self.root.is_dir():
            raise StoreError(f"{self.url}: store folder does not exist")
        start = self.root / prefix.rsplit("/", 1)[0] if "/" in prefix else self.root
        for dirpath, _, filenames in os.walk(start):
            for name in filenames:
                path = Path(dirpath, name)
                key = path.relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    try:
                        stat = path.stat()
                    except FileNotFoundError:
                        continue  # renamed or deleted while we listed
                    yield StoredObject(key, stat.st_size, stat.st_mtime)

    def delete(self, key: str) -> None:
        try:
            self._path(key).unlink(missing_ok=True)
        except OSError as exc:
            raise StoreError(f"{self.url}/{key}: cannot delete ({exc.strerror or exc})") from None
