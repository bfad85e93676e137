"""Hostile servers on loopback: an OCI registry and an S3 endpoint that answer the way an attacker or a broken
network would.

They are real HTTP servers (``http.server`` on a free 127.0.0.1 port): warmcache's client
talks to them over sockets exactly as to a real registry or S3, so what a test shows is
what a pull meets. Each serves real content (an image copied from a real registry, a
``file://`` store's objects) and a test replaces any answer with a :class:`Reply`: a body
sent a byte at a time (a trickle), one far past its declared size (sent from a repeated
block, never held whole), a redirect, a challenge, or crafted bytes.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"


@dataclass
class Reply:
    """One answer: ``body`` sent ``repeat`` times (a huge body from a small block), declared as ``length`` bytes
    (default: what is sent) or not at all (``chunked``), one byte every ``trickle`` seconds for at most
    ``trickle_for`` seconds when set."""

    body: bytes = b""
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    repeat: int = 1
    length: int | None = None
    chunked: bool = False
    trickle: float | None = None
    trickle_for: float = 30.0


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        path = self.path.split("?", 1)[0]
        self.server.seen.append((self.command, self.path, dict(self.headers)))
        reply = self.server.route(self.command, path, self.path, body)
        self.send_response(reply.status)
        for name, value in reply.headers.items():
            self.send_header(name, value)
        if reply.chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header(
                "Content-Length", str(reply.length if reply.length is not None else len(reply.body) * reply.repeat)
            )
        self.end_headers()
        if self.command == "HEAD":
            return
        try:
            if reply.trickle is None:
                for _ in range(reply.repeat):
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(reply.body), reply.body) if reply.chunked else reply.body)
                    self.server.sent += len(reply.body)
                if reply.chunked:
                    self.wfile.write(b"0\r\n\r\n")
                return
            ends = time.monotonic() + reply.trickle_for
            for byte in (reply.body * reply.repeat)[: int(reply.trickle_for / reply.trickle) + 1]:
                if time.monotonic() > ends or self.server.stopping.wait(reply.trickle):
                    break
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                self.server.sent += 1
            self.close_connection = True
        except OSError:
            self.close_connection = True  # the client gave up: what a trickle is for

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = do_PATCH = _answer


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, route: Callable[[str, str, str, bytes], Reply]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.route = route
        self.stopping = threading.Event()
        self.seen: list[tuple[str, str, dict[str, str]]] = []
        self.sent = 0


class LoopbackServer:
    """A threaded HTTP server on a free 127.0.0.1 port; :meth:`route` answers each request (subclasses say how)."""

    def __init__(self) -> None:
        self.server = _Server(self.route)
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        self.replies: dict[str, Reply] = {}

    @property
    def sent_bytes(self) -> int:
        """Body bytes written to clients so far (what a client let the server send before it hung up)."""
        return self.server.sent

    @sent_bytes.setter
    def sent_bytes(self, value: int) -> None:
        self.server.sent = value

    @property
    def seen(self) -> list[tuple[str, str, dict[str, str]]]:
        """Every request so far: ``(method, path with query, headers)``."""
        return self.server.seen

    def route(self, method: str, path: str, full_path: str, body: bytes) -> Reply:
        return self.replies.get(path) or Reply(b"not found", 404)

    @contextmanager
    def running(self) -> Iterator[LoopbackServer]:
        thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self.server.stopping.set()  # every trickle ends now
            self.server.shutdown()
            self.server.server_close()
            thread.join(5)


class HostileRegistry(LoopbackServer):
    """The read side of the OCI distribution API, serving what :meth:`put_blob`, :meth:`put_manifest` and
    :meth:`copy_tag` stored, each answer replaceable through ``replies[path]``."""

    def __init__(self) -> None:
        super().__init__()
        self.blobs: dict[str, bytes] = {}
        self.manifests: dict[tuple[str, str], bytes] = {}

    def url(self, repository: str, tag: str = "latest") -> str:
        return f"oci+http://{self.host}/{repository}:{tag}"

    def put_blob(self, data: bytes) -> dict[str, object]:
        """Store a blob; its descriptor (``digest``, ``size``)."""
        digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
        self.blobs[digest] = data
        return {"digest": digest, "size": len(data)}

    def put_manifest(self, repository: str, tag: str, data: bytes) -> str:
        digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
        self.manifests[(repository, tag)] = self.manifests[(repository, digest)] = data
        return digest

    def copy_tag(self, source_host: str, repository: str, tag: str, into: str | None = None) -> dict:
        """Copy ``repository:tag`` (manifest, config, layers) from a real registry on loopback; the manifest."""
        base = f"http://{source_host}/v2/{repository}"
        request = urllib.request.Request(f"{base}/manifests/{tag}", headers={"Accept": MANIFEST_TYPE})
        with urllib.request.urlopen(request, timeout=30) as answer:
            data = answer.read()
        manifest = json.loads(data)
        for descriptor in [manifest["config"], *manifest["layers"]]:
            with urllib.request.urlopen(f"{base}/blobs/{descriptor['digest']}", timeout=30) as answer:
                self.put_blob(answer.read())
        self.put_manifest(into or repository, tag, data)
        return manifest

    def blob_path(self, repository: str, digest: str) -> str:
        return f"/v2/{repository}/blobs/{digest}"

    def route(self, method: str, path: str, full_path: str, body: bytes) -> Reply:
        if path in self.replies:
            return self.replies[path]
        if path == "/v2/":
            return Reply(b"{}", headers={"Content-Type": "application/json"})
        found = re.fullmatch(r"/v2/(.+)/(manifests|blobs|tags)/(.+)", path)
        if found is None:
            return Reply(b"", 404)
        repository, kind, ref = found.groups()
        if kind == "manifests" and (repository, ref) in self.manifests:
            data = self.manifests[(repository, ref)]
            digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
            return Reply(data, headers={"Content-Type": MANIFEST_TYPE, "Docker-Content-Digest": digest})
        if kind == "blobs" and ref in self.blobs:
            return Reply(self.blobs[ref], headers={"Content-Type": "application/octet-stream"})
        if kind == "tags" and ref == "list":
            tags = sorted(tag for repo, tag in self.manifests if repo == repository and ":" not in tag)
            return Reply(json.dumps({"name": repository, "tags": tags}).encode())
        error = {"errors": [{"code": f"{kind.upper()}_UNKNOWN", "message": "unknown"}]}
        return Reply(json.dumps(error).encode(), 404, {"Content-Type": "application/json"})


class HostileS3(LoopbackServer):
    """S3's object reads (path style: ``GET|HEAD /BUCKET/KEY``) over a ``file://`` store's folder; keys for which
    ``trickle(key)`` is true are sent a byte every ``trickle_seconds``."""

    def __init__(self, bucket: str, folder: Path, trickle: Callable[[str], bool], trickle_seconds: float = 0.2):
        super().__init__()
        self.bucket, self.folder, self.trickle, self.trickle_seconds = bucket, folder, trickle, trickle_seconds

    def route(self, method: str, path: str, full_path: str, body: bytes) -> Reply:
        bucket, _, key = path.lstrip("/").partition("/")
        file = self.folder / key
        if bucket != self.bucket or not key or not file.is_file():
            error = f"<Error><Code>NoSuchKey</Code><Message>none</Message><Key>{key}</Key></Error>"
            return Reply(error.encode(), 404, {"Content-Type": "application/xml"})
        data = file.read_bytes()
        headers = {
            "ETag": f'"{hashlib.md5(data).hexdigest()}"',  # noqa: S324 - S3's ETag is an MD5
            "Last-Modified": formatdate(file.stat().st_mtime, usegmt=True),
            "Content-Type": "application/octet-stream",
        }
        return Reply(data, headers=headers, trickle=self.trickle_seconds if self.trickle(key) else None)
