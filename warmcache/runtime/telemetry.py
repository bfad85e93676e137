"""Miss telemetry: count padded and refused requests in memory, flush them to the registry off the request path.

A request only increments an in-memory counter under a lock (well under a
microsecond). A daemon thread flushes the aggregated counts every
``interval`` seconds as one :meth:`Registry.record_misses` batch. The database
is a best-effort sink: when it is down or hangs, the counts stay in memory
(bounded; the oldest keys are dropped first) and the flush is retried later.
Nothing here can block or fail a request.
"""

from __future__ import annotations

import logging
import threading
from warmcache.registry import Registry
from warmcache.registry.registry import MissEvent
from warmcache.shapes import Decision, ShapeFamily

log = logging.getLogger("warmcache.runtime")

#: Distinct (shape, decision) keys kept while the registry is unreachable.
MAX_PENDING_KEYS = 10_000

#: Seconds a flush may wait for a PostgreSQL connection before it gives up until the next interval.
CONNECT_TIMEOUT_S = 5

_MissKey = tuple[int, int, str, int | None, int | None]


class MissTelemetry:
    """Aggregate misses of one shape family; flush them to ``registry_url`` (or keep them, when ``None``)."""

    def __init__(self, family: ShapeFamily, registry_url: str | None, *, interval: float = 10.0) -> None:
        self.family = family
        self.registry_url = registry_url
        self.interval = interval
        self.flushed = 0
        self.failed_flushes = 0
        self._pending: dict[_MissKey, int] = {}
        self._totals: dict[_MissKey, int] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._registry: Registry | None = None

    def record(self, decision: Decision, kind: str | None = None) -> None:
        """Count one non-exact decision; ``kind`` overrides ``decision.kind`` (``warn``, ``truncate``)."""
        target = decision.target or (None, None)
        key = (decision.batch_size, decision.seq_len, kind or decision.kind, target[0], target[1])
        with self._lock:
            if key not in self._pending and len(self._pending) >= MAX_PENDING_KEYS:
                self._pending.pop(next(iter(self._pending)))
            self._pending[key] = self._pending.get(key, 0) + 1
            self._totals[key] = self._totals.get(key, 0) + 1
        if self.registry_url is not None and self._thread is None:
            self._start()

    def totals(self) -> list[MissEvent]:
        """Every miss this process has seen (flushed or not), for logs and tests."""
        with self._lock:
            return [self._event(key, count) for key, count in self._totals.items()]

    def flush(self) -> bool:
        """Write pending misses now (from the calling thread); ``False`` if the registry refused them."""
        with self._lock:
            pending, self._pending = self._pending, {}
        if not pending:
            return True
        if self.registry_url is None:
            return True
        events = [self._event(key, count) for key, count in pending.items()]
        try:
            if self._registry is None:
                self._registry = Registry.open(with_connect_timeout(self.registry_url, CONNECT_TIMEOUT_S))
            self._registry.record_misses(events)
        except Exception as exc:  # noqa: BLE001 - telemetry must survive any database failure
            self.failed_flushes += 1
            self._drop_registry()
            log.warning("miss telemetry: registry unavailable, keeping %d miss key(s) for later: %s", len(events), exc)
            with self._lock:
                for key, count in pending.items():
                    self._pending[key] = self._pending.get(key, 0) + count
            return False
        self.flushed += sum(pending.values())
        return True

    def close(self, timeout: float = 5.0) -> None:
        """Stop the flusher after one last flush; waits at most ``timeout`` seconds (a hung database is abandoned)."""
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                return  # the flusher is stuck in the database; it is a daemon and dies with the process
        self._drop_registry()

    def _drop_registry(self) -> None:
        if self._registry is not None:
            self._registry.close()
            self._registry = None

    def _start(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name="warmcache-miss-telemetry", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopping:
            self._wake.wait(self.interval)
            self._wake.clear()
            self.flush()

    def _event(self, key: _MissKey, count: int) -> MissEvent:
        batch, seq, decision, padded_batch, padded_seq = key
        f = self.family
        return MissEvent(
            f.model, f.workload, f.dtype, batch, seq, decision,
            padded_batch=padded_batch, padded_seq=padded_seq, count=count, tp_size=f.tp_size, fsdp_size=f.fsdp_size,
        )


def with_connect_timeout(url: str, seconds: int) -> str:
    """Bound how long a PostgreSQL connect may hang (libpq waits forever by default)."""
    if not url.startswith(("postgresql", "postgres:")) or "connect_timeout=" in url:
        return url
    return f"{url}{'&' if '?' in url else '?'}connect_timeout={seconds}"
