"""The registry API warmcache needs: manifests, blobs, tags, deletes (URLs built by oras's ``Container``).

Requests travel through :mod:`.transport` (a registry's authentication on a session that bounds
every answer and checks every redirect). What a service needs beyond that, this module adds:

- **Deadlines.** Every request runs under :class:`~warmcache.store.deadline.Deadline`
  (60 s plus 1 s per MiB moved, never past the command's ``--timeout``), and the socket
  gets 5 s to connect and 20 s per read: a registry that is down or stalls is one
  :class:`~warmcache.errors.StoreError` line naming the URL, never a hang. Retries are
  ours: 5 attempts, 0.2 s doubling, only on connection errors, 429 and 5xx.
- **Streaming, cut at the declared size.** Blobs go up from a file and come down in 1 MiB
  blocks (oras's monolithic upload reads a whole file into memory: a Neuron layer can be
  gigabytes); a blob that sends more than its descriptor's size is refused at that byte,
  and a block that misses its deadline shuts the socket, so nothing waits on a trickle.
- **Bounded listings.** ``tags/list`` is followed for at most :data:`MAX_TAG_PAGES` pages.
- **Digests checked before they are sent**: a digest is ``sha256:`` and 64 hex digits, so a
  hostile index cannot change a request's path.
- **One-line failures** naming the URL and never a credential: unreachable, access
  denied, not found, or the registry's own error code and message.
- **Byte-exact manifests.** A manifest is sent as the bytes whose sha256 is its digest
  (oras re-serialises JSON, which would change the digest a signature or a pod names).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import oras.container
import requests

from warmcache.errors import StoreError, first_line
from warmcache.store.deadline import Deadline, shut_down
from warmcache.store.oci.credentials import docker_config_path
from warmcache.store.oci.reference import is_digest
from warmcache.store.oci.transport import ChallengeUnanswered, RegistryTransport, read_bounded
from warmcache.store_location import OciReference

MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
#: Attempts per request on a refused connection, 429 or 5xx (as the S3 store's botocore ``standard`` mode).
ATTEMPTS = 5
FIRST_BACKOFF_SECONDS = 0.2
BLOCK = 1 << 20
#: Tags per page when listing (the registry may send fewer and a ``Link`` to the next page).
TAGS_PAGE = 1000
#: Pages of ``tags/list`` followed at most: 100,000 tags at full pages; a registry linking on forever is refused.
MAX_TAG_PAGES = 100
#: An error body is read this far for its message, no further.
MAX_ERROR_BYTES = 64 * 1024

# oras logs through the standard logging module; its lines (retries, "requires a token") would
# reach stderr beside ours. Every failure it meets surfaces here as one StoreError instead.
logging.getLogger("oras.logger").addHandler(logging.NullHandler())
logging.getLogger("oras.logger").propagate = False

log = logging.getLogger(__name__)


class RegistryClient:
    """One repository on one registry, as the store needs it; every failure is one :class:`StoreError` naming
    ``where``."""

    def __init__(self, reference: OciReference) -> None:
        self.reference = reference
        self.where = reference.repository_url
        self.deadline = Deadline(reference.url)
        # finds this host's credentials (inline, or through a credential helper)
        self._transport = RegistryTransport(reference)
        self._container = oras.container.Container(f"{reference.repository}:{reference.tag}", registry=reference.host)
        self._base = f"{self._transport.prefix}://"

    # ------------------------------------------------------------ manifests and tags

    def manifest(self, ref: str) -> tuple[str, bytes] | None:
        """``(digest, bytes)`` of the manifest a tag or digest names (its body bounded by the session), or ``None``
        when there is none."""
        if ref.startswith("sha256:"):
            self._checked(ref)
        response = self._request(
            "GET",
            self._container.manifest_url(ref),
            f"reading manifest {ref}",
            headers={"Accept": MANIFEST_MEDIA_TYPE},
            absent_ok=True,
        )
        if response is None:
            return None
        data = response.content
        return f"sha256:{hashlib.sha256(data).hexdigest()}", data

    def put_manifest(self, ref: str, data: bytes) -> str:
        """Store ``data`` (exactly these bytes) as the manifest of tag ``ref``; its digest."""
        self._request(
            "PUT",
            self._container.manifest_url(ref),
            f"writing manifest {ref}",
            headers={"Content-Type": MANIFEST_MEDIA_TYPE},
            data=data,
        )
        return f"sha256:{hashlib.sha256(data).hexdigest()}"

    def tags(self) -> list[str]:
        """Every tag of the repository (none for a repository that does not exist yet)."""
        found: list[str] = []
        url = f"{self._container.tags_url()}?n={TAGS_PAGE}"
        for _ in range(MAX_TAG_PAGES):
            response = self._request("GET", url, "listing tags", absent_ok=True)
            if response is None:
                return found
            try:
                tags = response.json().get("tags") or []
            except (ValueError, AttributeError):
                raise StoreError(f"{self.where}: listing tags: the registry's answer is not a tag list") from None
            found += [tag for tag in tags if isinstance(tag, str)]
            link = response.links.get("next", {}).get("url")
            if not link:
                return found
            following = urljoin(f"{self._base}{self.reference.host}/", link)
            if not following.startswith(f"{self._base}{self.reference.host}/"):
                raise StoreError(
                    f"{self.where}: listing tags: the next page is on another host ({following[:80]}); refused"
                )
            url = following[len(self._base) :]
        raise StoreError(
            f"{self.where}: listing tags: the registry links on past {MAX_TAG_PAGES} pages ({len(found)} tags); refused"
        )

    def delete_manifest(self, digest: str) -> None:
        """Remove a manifest by digest (absent is fine); the registry drops every tag that pointed at it."""
        self._delete(self._container.manifest_url(self._checked(digest)), f"deleting manifest {digest[:19]}")

    # ------------------------------------------------------------ blobs

    def blob_size(self, digest: str) -> int | None:
        """The blob's size in this repository, or ``None`` when it is not there."""
        response = self._request(
            "HEAD", self._container.get_blob_url(self._checked(digest)), f"checking blob {digest[:19]}", absent_ok=True
        )
        return int(response.headers.get("Content-Length", -1)) if response is not None else None

    def upload(self, path: Path, digest: str, size: int, progress: Callable[[int], None] | None = None) -> None:
        """Upload a file as the blob ``digest`` (the registry checks the digest and refuses other bytes)."""

        def send() -> None:
            with path.open("rb") as source:
                self._put_blob(digest, _Upload(source, size, progress), size)

        self._retried(send, f"uploading blob {digest[:19]}", size)

    def upload_bytes(self, data: bytes) -> str:
        """Upload a small blob held in memory (a config); its digest."""
        digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
        if self.blob_size(digest) != len(data):
            self._retried(lambda: self._put_blob(digest, data, len(data)), f"uploading blob {digest[:19]}", len(data))
        return digest

    def blocks(self, digest: str, size: int) -> Iterator[bytes]:
        """The blob's bytes in blocks of at most 1 MiB, each under the deadline, cut at ``size`` (what its descriptor
        declares: more is refused); :class:`StoreError` if it is not there."""
        what = f"downloading blob {digest[:19]}"
        response = self._request("GET", self._container.get_blob_url(self._checked(digest)), what, stream=True)
        assert response is not None
        declared = response.headers.get("Content-Length", "")
        received = 0
        try:
            if declared.isdigit() and int(declared) > size:
                raise StoreError(
                    f"{self.where}: blob {digest[:19]} is sent as {declared} bytes, more than its declared {size}; "
                    "refused"
                )
            for block in self.deadline.blocks(response.iter_content(BLOCK), what, lambda: shut_down(response.raw)):
                received += len(block)
                if received > size:
                    raise StoreError(f"{self.where}: blob {digest[:19]} runs past its declared {size} bytes; refused")
                yield block
        except requests.RequestException as exc:
            raise StoreError(f"{self.where}: {what}: connection lost ({first_line(exc)})") from None
        finally:
            if received > size:
                shut_down(response.raw)
            response.close()

    def read_blob(self, digest: str, size: int, max_bytes: int) -> bytes:
        """A small blob of ``size`` bytes, whole (refused above ``max_bytes`` before it is read), checked against its
        digest."""
        if size > max_bytes:
            raise StoreError(f"{self.where}: blob {digest[:19]} is {size} bytes, more than {max_bytes}; refused")
        data = b"".join(self.blocks(digest, size))
        if f"sha256:{hashlib.sha256(data).hexdigest()}" != digest:
            raise StoreError(f"{self.where}: blob {digest[:19]} does not hash to its digest; refused")
        return bytes(data)

    def delete_blob(self, digest: str) -> None:
        """Unlink a blob from this repository (absent is fine)."""
        self._delete(self._container.get_blob_url(self._checked(digest)), f"deleting blob {digest[:19]}")

    def _delete(self, url: str, doing: str) -> None:
        """A DELETE a registry may answer with "not there": what is gone is what was asked for."""
        self._request("DELETE", url, doing, absent_ok=True)

    def _put_blob(self, digest: str, body: Any, size: int) -> None:
        """One upload session: POST for a location, then one PUT of the whole body with its digest."""
        started = self._once(
            "POST", self._container.upload_blob_url(), f"starting upload of {digest[:19]}", {"Content-Length": "0"}
        )
        assert started is not None  # only a 404 is None, and only when absent_ok
        location = started.headers.get("Location", "")
        if not location:
            raise StoreError(f"{self.where}: the registry started an upload without a Location header")
        url = urljoin(f"{self._base}{self.reference.host}/", location)
        url += ("&" if "?" in url else "?") + f"digest={digest}"
        self._once(
            "PUT",
            url[len(self._base) :],
            f"uploading blob {digest[:19]}",
            {"Content-Type": "application/octet-stream", "Content-Length": str(size)},
            data=body,
        )

    # ------------------------------------------------------------ requests, retries and errors

    def _request(
        self,
        method: str,
        url: str,
        what: str,
        headers: dict[str, str] | None = None,
        data: Any = None,
        stream: bool = False,
        absent_ok: bool = False,
    ) -> requests.Response | None:
        """One API call with retries: the response, or ``None`` for a 404 when ``absent_ok``."""
        return self._retried(
            lambda: self._once(method, url, what, headers or {}, data, stream, absent_ok),
            what,
            len(data) if isinstance(data, bytes) else 0,
        )

    def _once(
        self,
        method: str,
        url: str,
        what: str,
        headers: dict[str, str],
        data: Any = None,
        stream: bool = False,
        absent_ok: bool = False,
    ) -> requests.Response | None:
        try:
            response = self._transport.request_once(f"{self._base}{url}", method, headers, data, stream)
        except ChallengeUnanswered as exc:
            raise StoreError(
                f"{self.where}: {what}: {self._denied('no usable credentials')} ({first_line(exc)})"
            ) from None
        status = response.status_code
        if status < 300:
            return response
        if stream:  # an error's body, read for its message only so far (one past the bound reads as empty)
            with contextlib.suppress(StoreError):
                read_bounded(response, MAX_ERROR_BYTES, self.where)
        if status == 404 and absent_ok:
            response.close()
            return None
        if status in (401, 403):
            raise StoreError(f"{self.where}: {what}: {self._denied(f'access denied (HTTP {status})')}")
        if status == 429 or status >= 500:
            raise _Retryable(f"HTTP {status} {_registry_error(response)}")
        raise StoreError(f"{self.where}: {what}: HTTP {status} {_registry_error(response)}")

    def _retried(self, call: Callable[[], Any], what: str, nbytes: int = 0) -> Any:
        """``call()`` under the deadline, again after a connection error, 429 or 5xx (0.2 s, doubling), at most
        :data:`ATTEMPTS` times."""
        for attempt in range(1, ATTEMPTS + 1):
            try:
                return self.deadline.run(call, what, nbytes)
            except (_Retryable, requests.ConnectionError, requests.Timeout) as exc:
                if attempt == ATTEMPTS:
                    reason = (
                        "cannot reach the registry"
                        if isinstance(exc, requests.ConnectionError)
                        else "the registry keeps failing"
                    )
                    raise StoreError(
                        f"{self.where}: {what}: {reason} at {self._base}{self.reference.host} after {ATTEMPTS} "
                        f"attempts ({first_line(str(exc))})"
                    ) from None
                wait = FIRST_BACKOFF_SECONDS * 2 ** (attempt - 1)
                log.debug(
                    "%s: %s: attempt %d of %d failed (%s); trying again in %.1f s",
                    self.where,
                    what,
                    attempt,
                    ATTEMPTS,
                    first_line(str(exc)),
                    wait,
                )
                time.sleep(wait)
            except requests.RequestException as exc:
                raise StoreError(f"{self.where}: {what}: {type(exc).__name__}: {first_line(exc)}") from None
        raise AssertionError("unreachable")

    def _checked(self, digest: str) -> str:
        """``digest``, refused unless ``sha256:`` and 64 hex digits (it becomes part of a request's path)."""
        if not is_digest(digest):
            raise StoreError(f"{self.where}: {digest[:80]!r} is not a sha256 digest; refused")
        return digest

    def _denied(self, reason: str) -> str:
        return (
            f"{reason}: check the credentials for {self.reference.host} in {docker_config_path()} "
            "(docker login, or a credential helper)"
        )


class _Retryable(Exception):
    """A transient answer (429, 5xx): worth another attempt."""


class _Upload:
    """A file sent as a request body in blocks, with its length known (so it goes as one PUT, not chunked) and
    progress reported."""

    def __init__(self, source: Any, size: int, progress: Callable[[int], None] | None) -> None:
        self.source, self.size, self.progress = source, size, progress

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator[bytes]:
        return iter(lambda: self.read(BLOCK), b"")

    def read(self, amount: int = -1) -> bytes:
        block: bytes = self.source.read(amount)
        if block and self.progress:
            self.progress(len(block))
        return block


def _registry_error(response: requests.Response) -> str:
    """The registry's own error code and message (distribution spec ``errors`` body), or the HTTP reason."""
    try:
        errors = response.json().get("errors") or []
        first = errors[0]
        return f"{first.get('code', '')}: {first_line(str(first.get('message', '')))}".strip(": ")
    except (ValueError, AttributeError, IndexError, TypeError):
        return response.reason or ""
