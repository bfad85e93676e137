"""The per-spec cache lock: held while a spec compiles, waited for with a deadline, its holder named.

Two processes pointed at one cache folder must not compile one spec at once, even
when a lease expired under a long compile, so each spec compiles under a file lock
in the cache folder. A holder that stops (SIGSTOP, a debugger, a hung network file
system) keeps that lock while its lease runs out; the worker that reclaims the spec
then waits on it. That wait ends before the waiter's own claim would run out (its
heartbeat does not renew a claim whose spec is waiting, see ``claims._LeaseRenewer``),
and the error names the holder from the note every holder leaves beside the lock:
``host ... pid ... since ...``.
"""

from __future__ import annotations

import datetime as dt
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

#: Beside ``<identity>.lock``: who holds it (the lock file itself is only ever locked, never written).
HOLDER_SUFFIX = ".holder"


@contextmanager
def spec_lock(path: Path, deadline: float) -> Iterator[None]:
    """Hold the lock at ``path``, waiting for it until ``deadline`` (``time.monotonic()``) at most.

    Raises :class:`TimeoutError` naming the holder when the deadline passes first.
    """
    from filelock import FileLock, Timeout

    path.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    lock = FileLock(str(path), timeout=max(0.0, deadline - start))
    try:
        lock.acquire()
    except Timeout:
        raise TimeoutError(
            f"{path}: cache lock held by {holder_of(path)}; gave up after "
            f"{time.monotonic() - start:.1f}s, before this worker's claim ran out "
            f"(is that process stopped or hung? let it finish or end it, then rerun warmup with --retry-failed)"
        ) from None
    try:
        _write_holder(path)
        yield
    finally:
        lock.release()


def holder_of(path: Path) -> str:
    """The note the lock's holder left, or why there is none (a holder from before notes, or one that has just taken
    it)."""
    try:
        return (path.parent / (path.name + HOLDER_SUFFIX)).read_text(encoding="utf-8").strip()[
            :200
        ] or "an unknown process (empty holder note)"
    except (OSError, UnicodeDecodeError):
        return "an unknown process (no holder note)"


def _write_holder(path: Path) -> None:
    """Say who holds the lock, atomically (a waiter never reads half a note); a note that cannot be written only
    costs the name."""
    note = path.parent / (path.name + HOLDER_SUFFIX)
    partial = note.with_name(f".{note.name}.{os.getpid()}")
    since = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    try:
        partial.write_text(f"host {socket.gethostname()} pid {os.getpid()} since {since}\n", encoding="utf-8")
        partial.replace(note)
    except OSError:
        partial.unlink(missing_ok=True)
