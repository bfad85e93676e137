"""Deadlines for a store's network operations: one per request, one per command.

botocore's timeouts bound each socket read, not a request: an endpoint that trickles
a byte every few seconds, or answers nothing while retries pile up, holds a call
for as long as it likes. So every S3 call (and every block of a download) runs in a
daemon thread the caller waits on for at most :data:`REQUEST_SECONDS` (a transfer
gets more in proportion to its size), and never past the command's own deadline
(``--timeout``, :data:`DEFAULT_COMMAND_SECONDS`). A call that misses it is one
:class:`~warmcache.errors.StoreError` line; its thread is abandoned and dies with
the process.

A download's thread is not merely abandoned: it sits in ``recv`` holding the
response's buffer lock, so the caller's ``close()`` of that response would wait for
it (a trickling server kept a pull 100 s past ``--timeout 20s``). A block that misses
its deadline therefore shuts the socket down first (:func:`shut_down`): the blocked
read returns at once and nothing waits on it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any, TypeVar

from warmcache.errors import StoreError

T = TypeVar("T")

#: One request (with botocore's retries), or one block of a download, must finish within this.
REQUEST_SECONDS = 60.0
#: A transfer gets this much longer per byte it moves: 1 MiB/s is the slowest link worth waiting for.
SECONDS_PER_BYTE = 1.0 / (1 << 20)
#: A whole push, pull or store command.
DEFAULT_COMMAND_SECONDS = 3 * 3600.0

#: The command deadline stores opened now get: ``(seconds allowed, monotonic start, where it was set)``.
command_timeout: ContextVar[tuple[float, float, str] | None] = ContextVar(
    "warmcache_store_command_timeout", default=None
)
#: What sets the command deadline when nothing did, as messages name it.
TIMEOUT_FLAG = "--timeout"


def set_command_timeout(seconds: float, source: str = TIMEOUT_FLAG) -> None:
    """Start the command's clock: stores opened from now on give up ``seconds`` from now; ``source`` (``--timeout``,
    ``$WARMCACHE_STORE_TIMEOUT``) is what the messages tell the user to change."""
    command_timeout.set((seconds, time.monotonic(), source))


class DeadlineMissed(StoreError):
    """A call or block that got no complete answer in time (its thread is left behind)."""


def shut_down(raw: Any) -> None:
    """Stop a urllib3 response's reads now, from any thread (``HTTPResponse.shutdown``: the socket's read side is
    shut, so a ``recv`` blocked in another thread returns); a response already released is left alone."""
    try:
        raw.shutdown()
    except (ValueError, RuntimeError, OSError):
        pass  # released, or never had a socket: nothing is reading it


class Deadline:
    """The command's deadline and the per-request limit, applied to calls made from any thread."""

    def __init__(self, where: str) -> None:
        seconds, start, self.source = command_timeout.get() or (DEFAULT_COMMAND_SECONDS, time.monotonic(), TIMEOUT_FLAG)
        self.where, self.seconds, self.ends = where, seconds, start + seconds
        self.request_seconds = REQUEST_SECONDS

    def run(self, call: Callable[[], T], what: str, nbytes: int = 0) -> T:
        """``call()``'s result or exception, or a :class:`StoreError` once its time is up."""
        remaining = self.ends - time.monotonic()
        limit = min(self.request_seconds + nbytes * SECONDS_PER_BYTE, remaining)
        if limit <= 0:
            raise StoreError(
                f"{self.where}: the command's deadline of {self.seconds:g} s passed before {what} "
                f"({self.source} to change it)"
            )
        outcome: list[T] = []
        failure: list[BaseException] = []

        def target() -> None:
            try:
                outcome.append(call())
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller
                failure.append(exc)

        worker = threading.Thread(target=target, name="warmcache-store-call", daemon=True)
        worker.start()
        worker.join(limit)
        if worker.is_alive():
            if limit >= remaining:
                raise DeadlineMissed(
                    f"{self.where}: the command's deadline of {self.seconds:g} s passed during {what} "
                    f"({self.source} to change it)"
                )
            raise DeadlineMissed(
                f"{self.where}: {what} got no complete answer within {limit:.0f} s (the per-request deadline; "
                f"{self.source} to change it)"
            )
        if failure:
            raise failure[0]
        return outcome[0]

    def blocks(self, chunks: Iterator[bytes], what: str, sever: Callable[[], None] | None = None) -> Iterator[bytes]:
        """``chunks``, each one fetched under the deadline (a server trickling bytes cannot hold a download);
        ``sever()`` (:func:`shut_down` of the response) is called when a block misses it, before the error rises."""
        done = object()
        while True:
            try:
                block = self.run(lambda: next(chunks, done), what)
            except DeadlineMissed:
                if sever is not None:
                    sever()
                raise
            if block is done:
                return
            assert isinstance(block, bytes)
            yield block
