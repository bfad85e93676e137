"""Object storage behind one small interface: ``s3://bucket/prefix`` and ``file:///path``.

Push, pull, ``store ls|gc`` and the remote Neuron cache scan speak only this
interface, so the S3 and file-system stores behave alike: every write of a key is
atomic (S3 PUTs are; a file is written beside its key and renamed into place), so a
reader sees a whole object or none, and keys are plain ``/``-separated names under
the store's prefix.

S3 goes through boto3, the AWS SDK: it brings the standard credential chain
(environment, ``~/.aws``, SSO, instance and pod roles) and region settings,
``AWS_ENDPOINT_URL_S3`` for S3-compatible servers (MinIO, R2, ...), retries with
exponential backoff (``standard`` mode; ``AWS_MAX_ATTEMPTS`` overrides our 5), and
parallel multipart transfers; none of that is ours to reimplement. A failure that
survives the retries becomes one :class:`~warmcache.errors.StoreError` line naming
the store and the cause.
"""

from __future__ import annotations

import base64
import hashlib
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote, urlparse

from warmcache.errors import CacheError, StoreError, UsageError, first_line, shown
from warmcache.store.deadline import Deadline

#: Default attempts per request (botocore ``standard`` retry mode, exponential backoff with jitter).
DEFAULT_ATTEMPTS = 5
#: Files above this size go up and down in parallel parts.
MULTIPART_BYTES = 64 * 1024 * 1024
_BLOCK = 1 << 20
#: Temporary files of the file store start with this; ``store gc`` removes old ones.
FILE_TEMP_PREFIX = ".warmcache-tmp-"


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


def open_store(url: str, endpoint_url: str | None = None) -> ObjectStore:
    """The store a URL names: ``s3://bucket[/prefix]`` or ``file:///path``."""
    _refuse_dropped_parts(url)
    parsed = urlparse(url)
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise UsageError(f"store URL {url!r}: name the bucket (s3://bucket/prefix)")
        return S3Store(parsed.netloc, parsed.path.strip("/"), endpoint_url)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost") or not parsed.path.startswith("/"):
            raise UsageError(f"store URL {shown(url)}: a file store is file:///absolute/path")
        return FileStore(Path(unquote(parsed.path)))
    raise UsageError(
        f"store URL {url!r}: unsupported scheme (use s3://bucket/prefix, file:///path or oci://host/repository:tag)"
    )


def _refuse_dropped_parts(url: str) -> None:
    """What URL parsing would silently drop (a ``?query``, a ``#fragment``, control characters such as a newline,
    which ``urlparse`` strips) would make the store another one than the text names: refused instead."""
    if any(ord(c) < 32 or c == "\x7f" for c in url):
        raise UsageError(f"store URL {shown(url)}: holds a control character (a newline?); refused")
    for mark, part in (("?", "query"), ("#", "fragment")):
        if mark in url:
            raise UsageError(f"store URL {shown(url)}: a {part} ({mark}...) is not part of a store location; refused")


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
        return _hash_blocks(self.blocks(key)) if self.stat(key) is not None else None

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
                for block in iter(lambda: source.read(_BLOCK), b""):
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
                yield from iter(lambda: handle.read(_BLOCK), b"")
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


class S3Store:
    """A bucket and key prefix on AWS S3 or an S3-compatible server."""

    def __init__(self, bucket: str, prefix: str, endpoint_url: str | None = None) -> None:
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config
        from botocore.exceptions import BotoCoreError

        self.bucket = bucket
        self.prefix = f"{prefix}/" if prefix else ""
        self.url = f"s3://{bucket}/{prefix}".rstrip("/")
        self.endpoint_url = endpoint_url
        retries: dict[str, Any] = {"mode": "standard"}
        if not os.environ.get("AWS_MAX_ATTEMPTS"):
            retries["total_max_attempts"] = DEFAULT_ATTEMPTS
        # Socket-level limits; the request and command deadlines on top are :class:`Deadline`'s.
        config = Config(retries=retries, connect_timeout=5, read_timeout=20, max_pool_connections=32)
        self.deadline = Deadline(self.url)
        try:
            self.client = boto3.session.Session().client("s3", endpoint_url=endpoint_url, config=config)
        except (BotoCoreError, ValueError) as exc:  # a bad region or endpoint URL
            raise StoreError(f"{self.url}: cannot set up the S3 client ({first_line(exc)})") from None
        self.transfer = TransferConfig(
            multipart_threshold=MULTIPART_BYTES, multipart_chunksize=MULTIPART_BYTES // 4, max_concurrency=4
        )

    def _key(self, key: str) -> str:
        return self.prefix + key

    def _call(self, operation: str, key: str, nbytes: int = 0, **params: Any) -> Any:
        """One S3 request on this store's key, under the deadlines (:mod:`warmcache.store.deadline`)."""
        method = getattr(self.client, operation)
        return self.deadline.run(
            lambda: method(Bucket=self.bucket, Key=self._key(key), **params), f"{operation} {key}", nbytes
        )

    def size_of(self, key: str) -> int | None:
        found = self.stat(key)
        return found.size if found else None

    def stat(self, key: str) -> StoredObject | None:
        with self._errors(key, absent_ok=True):
            head = self._call("head_object", key)
            return StoredObject(key, int(head["ContentLength"]), head["LastModified"].timestamp())
        return None

    def sha256_of(self, key: str) -> str | None:
        with self._errors(key, absent_ok=True):
            checksum = self._call("head_object", key, ChecksumMode="ENABLED").get("ChecksumSHA256")
            # a whole-object checksum S3 computed on upload ("-N": per part, not comparable)
            if checksum and "-" not in checksum:
                return base64.b64decode(checksum).hex()
            # written without a checksum (another tool, an older warmcache): read it
            return _hash_blocks(self.blocks(key))
        return None

    def touch(self, key: str) -> None:
        with self._errors(key, absent_ok=True):  # taken by a gc since it was seen: the caller uploads it again
            source = {"Bucket": self.bucket, "Key": self._key(key)}
            self._call("copy_object", key, CopySource=source, MetadataDirective="REPLACE", ChecksumAlgorithm="SHA256")

    def read(self, key: str, max_bytes: int) -> bytes | None:
        with self._errors(key, absent_ok=True):
            response = self._call("get_object", key)
            if int(response["ContentLength"]) > max_bytes:
                response["Body"].close()
                raise StoreError(f"{self.url}/{key}: larger than {max_bytes} bytes; refused")
            return b"".join(self.deadline.blocks(response["Body"].iter_chunks(_BLOCK), f"reading {key}"))
        return None

    def write(self, key: str, data: bytes) -> None:
        with self._errors(key):
            self._call("put_object", key, len(data), Body=data, ChecksumAlgorithm="SHA256")

    def upload(self, path: Path, key: str, sha256: str, progress: Callable[[int], None] | None = None) -> None:
        with self._errors(key), path.open("rb") as source:
            reader = _HashingReader(source)  # read in order (not seekable), so the hash is of exactly what was sent
            extra = {"ChecksumAlgorithm": "SHA256"}

            def send() -> None:
                self.client.upload_fileobj(
                    reader, self.bucket, self._key(key), ExtraArgs=extra, Config=self.transfer, Callback=progress
                )

            self.deadline.run(send, f"uploading {key}", os.fstat(source.fileno()).st_size)
            if reader.digest.hexdigest() != sha256:
                self._call("delete_object", key)
                raise CacheError(changed_under_push(path, sha256))

    def blocks(self, key: str) -> Iterator[bytes]:
        with self._errors(key):
            body = self._call("get_object", key)["Body"]
            try:
                yield from self.deadline.blocks(body.iter_chunks(_BLOCK), f"downloading {key}")
            finally:
                body.close()

    def list(self, prefix: str) -> Iterator[StoredObject]:
        with self._errors(prefix):
            pages = iter(
                self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self._key(prefix))
            )
            done: dict[str, Any] = {}
            while (page := self.deadline.run(lambda: next(pages, done), f"listing {prefix}")) is not done:
                for item in page.get("Contents", ()):
                    yield StoredObject(
                        item["Key"][len(self.prefix) :], int(item["Size"]), item["LastModified"].timestamp()
                    )

    def delete(self, key: str) -> None:
        with self._errors(key):
            self._call("delete_object", key)

    def _errors(self, key: str, absent_ok: bool = False) -> _S3Errors:
        return _S3Errors(self, key, absent_ok)


class _HashingReader:
    """A file's bytes read once, in order, hashed on the way (deliberately not seekable)."""

    def __init__(self, source: Any) -> None:
        self.source, self.digest = source, hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        block = self.source.read(size)
        self.digest.update(block)
        return bytes(block)


def changed_under_push(path: Path, sha256: str) -> str:
    return (
        f"{path}: changed while it was pushed (its bytes are no longer sha256 {sha256[:16]}…); "
        "nothing stored under that key, push refused"
    )


def _hash_blocks(blocks: Iterator[bytes]) -> str:
    digest = hashlib.sha256()
    for block in blocks:
        digest.update(block)
    return digest.hexdigest()


class _S3Errors:
    """Turns what botocore raises after its retries into one :class:`StoreError` line.

    With ``absent_ok``, a missing *object* (404 on a key) is swallowed so the caller
    returns ``None``; a missing *bucket* is always an error.
    """

    def __init__(self, store: S3Store, key: str, absent_ok: bool) -> None:
        self.store, self.key, self.absent_ok = store, key, absent_ok

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> bool:
        if exc is None or isinstance(exc, StoreError):
            return False
        from botocore.exceptions import (
            BotoCoreError,
            ClientError,
            EndpointConnectionError,
            NoCredentialsError,
        )

        where = f"{self.store.url}/{self.key}".rstrip("/")
        if isinstance(exc, ClientError):
            error = exc.response.get("Error", {})
            code = str(error.get("Code", ""))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code == "NoSuchBucket" or (code == "404" and self.key == ""):
                raise StoreError(f"{self.store.url}: bucket {self.store.bucket!r} does not exist{self._at()}") from None
            if self.absent_ok and (code in ("NoSuchKey", "404", "NotFound") or status == 404):
                return True
            if (
                code
                in (
                    "AccessDenied",
                    "InvalidAccessKeyId",
                    "SignatureDoesNotMatch",
                    "ExpiredToken",
                    "InvalidToken",
                    "403",
                )
                or status == 403
            ):
                raise StoreError(
                    f"{where}: access denied ({code}): check the AWS credentials and the bucket policy"
                ) from None
            if status == 404:
                raise StoreError(f"{where}: not in the store") from None
            raise StoreError(f"{where}: {code or status}: {first_line(error.get('Message') or exc)}") from None
        if isinstance(exc, NoCredentialsError):
            raise StoreError(
                f"{self.store.url}: no AWS credentials found (environment, ~/.aws, SSO or an instance/pod role)"
            ) from None
        if isinstance(exc, EndpointConnectionError):
            raise StoreError(
                f"{self.store.url}: cannot reach the S3 endpoint {exc.kwargs.get('endpoint_url', '')} "
                f"after retries ({first_line(exc)})"
            ) from None
        if isinstance(exc, BotoCoreError):
            raise StoreError(f"{where}: {first_line(exc)} (after retries)") from None
        # e.g. S3UploadFailedError wrapping a ClientError
        if type(exc).__module__.startswith(("urllib3", "s3transfer", "boto3")):
            if "NoSuchBucket" in str(exc):
                raise StoreError(f"{self.store.url}: bucket {self.store.bucket!r} does not exist{self._at()}") from None
            raise StoreError(f"{where}: {first_line(exc)}") from None
        return False

    def _at(self) -> str:
        return f" at {self.store.endpoint_url}" if self.store.endpoint_url else ""
