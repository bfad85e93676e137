"""``s3://bucket/prefix``: an object store on AWS S3 or an S3-compatible server, through boto3.

boto3, the AWS SDK, brings the standard credential chain (environment, ``~/.aws``, SSO,
instance and pod roles) and region settings, ``AWS_ENDPOINT_URL_S3`` for S3-compatible
servers (MinIO, R2, ...), retries with exponential backoff (``standard`` mode;
``AWS_MAX_ATTEMPTS`` overrides our 5), and parallel multipart transfers; none of that
is ours to reimplement. Every call runs under :class:`~warmcache.store.deadline.Deadline`
(a download's every block too, its socket shut when one misses), and a failure that
survives the retries becomes one :class:`~warmcache.errors.StoreError` line naming
the store and the cause.
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from warmcache.errors import CacheError, StoreError, first_line
from warmcache.store.deadline import Deadline, shut_down
from warmcache.store.objects import BLOCK, StoredObject, changed_under_push, hash_blocks

#: Default attempts per request (botocore ``standard`` retry mode, exponential backoff with jitter).
DEFAULT_ATTEMPTS = 5
#: Files above this size go up and down in parallel parts.
MULTIPART_BYTES = 64 * 1024 * 1024


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
            return hash_blocks(self.blocks(key))
        return None

    def touch(self, key: str) -> None:
        with self._errors(key, absent_ok=True):  # taken by a gc since it was seen: the caller uploads it again
            source = {"Bucket": self.bucket, "Key": self._key(key)}
            self._call("copy_object", key, CopySource=source, MetadataDirective="REPLACE", ChecksumAlgorithm="SHA256")

    def read(self, key: str, max_bytes: int) -> bytes | None:
        with self._errors(key, absent_ok=True):
            response = self._call("get_object", key)
            body = response["Body"]
            if int(response["ContentLength"]) > max_bytes:
                body.close()
                raise StoreError(f"{self.url}/{key}: larger than {max_bytes} bytes; refused")
            try:
                return b"".join(
                    self.deadline.blocks(body.iter_chunks(BLOCK), f"reading {key}", lambda: shut_down(body._raw_stream))
                )
            finally:
                body.close()
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
                yield from self.deadline.blocks(
                    body.iter_chunks(BLOCK), f"downloading {key}", lambda: shut_down(body._raw_stream)
                )
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
