"""Miss telemetry: note padded and refused requests in memory, flush them to the registry off the request path.

A request only appends one small tuple to a bounded ``deque`` (atomic under
the GIL, no lock, ~0.1 µs). A daemon thread drains the queue, aggregates it
per shape and every ``interval`` seconds writes the counts as one
:meth:`Registry.record_misses` batch. The database is a best-effort sink: when
it is down or hangs, the counts stay in memory (bounded) and the flush is
retried later. Nothing here can block or fail a request.

Bounds, so a flood of unique shapes or a long outage cannot exhaust memory:
the queue keeps the newest :data:`MAX_QUEUED` events, and aggregation keeps
:data:`MAX_KEYS` distinct shapes (events of shapes beyond that are counted in
``dropped`` instead of being sent).
"""

from __future__ import annotations

import atexit
import logging
import threading
from collections import deque
from collections.abc import Sequence
from typing import Protocol

from warmcache.registry.records import MissEvent
from warmcache.settings import RegistryLocation
from warmcache.shapes import Decision, ShapeFamily

log = logging.getLogger("warmcache.runtime")

#: Events waiting for the aggregating thread (the oldest are dropped beyond this).
MAX_QUEUED = 100_000
#: Distinct (shape, decision) keys kept in memory, pending or total.
MAX_KEYS = 10_000
#: Seconds a flush may wait for a PostgreSQL connection before it gives up until the next interval.
CONNECT_TIMEOUT_S = 5
#: Seconds a clean interpreter exit may spend on the last flush.
EXIT_FLUSH_TIMEOUT_S = 2.0

_MissKey = tuple[int, int, str, int | None, int | None]


class MissTelemetry:
    """Aggregate misses of one shape family; flush them to ``sink`` (or only keep them, when ``None``): see
    :func:`open_sink`."""

    def __init__(self, family: ShapeFamily, sink: RegistryLocation | str | None, *, interval: float = 10.0) -> None:
        self.family = family
        self.sink = sink
        self.interval = interval
        self.flushed = 0
        self.failed_flushes = 0
        self.dropped = 0
        self._queue: deque[_MissKey] = deque(maxlen=MAX_QUEUED)
        self._pending: dict[_MissKey, int] = {}
        self._totals: dict[_MissKey, int] = {}
        self._lock = threading.Lock()  # guards _pending/_totals; never taken on the request path
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._registry: MissSink | None = None

    def record(self, decision: Decision, kind: str | None = None) -> None:
        """Note one non-exact decision; ``kind`` overrides ``decision.kind`` (``warn``, ``clip``, ``truncate``)."""
        target = decision.target or (None, None)
        self._queue.append((decision.batch_size, decision.seq_len, kind or decision.kind, target[0], target[1]))
        if self._thread is None:
            self._start()

    def totals(self) -> list[MissEvent]:
        """Every miss this process has seen (flushed or not), aggregated per shape."""
        with self._lock:
            self._drain()
            return [self._event(key, count) for key, count in self._totals.items()]

    def flush(self) -> bool:
        """Write pending misses now (from the calling thread); ``False`` if the registry refused them."""
        with self._lock:
            self._drain()
            if self.sink is None or not self._pending:
                return True
            pending, self._pending = self._pending, {}
            recordable = self._recordable(pending)
            if not recordable:
                return True
        pending = {key: pending[key] for key in recordable}
        events = list(recordable.values())
        try:
            if self._registry is None:
                self._registry = open_sink(self.sink)
            self._registry.record_misses(events)
        except Exception as exc:  # noqa: BLE001 - telemetry must survive any database failure
            self.failed_flushes += 1
            self._drop_registry()
            log.warning("miss telemetry: registry unavailable, keeping %d miss key(s) for later: %s", len(events), exc)
            with self._lock:
                for key, count in pending.items():
                    _add(self._pending, key, count)
            return False
        self.flushed += sum(pending.values())
        return True

    def close(self, timeout: float = 5.0) -> None:
        """Stop the flusher after one last flush; waits at most ``timeout`` seconds (a hung database is abandoned).

        Misses recorded after the flusher ended (``record()`` after an earlier
        ``close()``) have nobody left to drain them, so when no flusher is alive
        a one-shot one writes them: a thread, so that the same ``timeout`` bounds
        a hung database here too.
        """
        self._stopping = True
        self._wake.set()
        with self._lock:
            thread = self._thread
            if (thread is None or not thread.is_alive()) and self.sink is not None and self._queue:
                # _stopping is set, so _run skips its loop and only does the final flush.
                thread = self._thread = threading.Thread(target=self._run, name="warmcache-miss-telemetry", daemon=True)
                thread.start()
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                return  # the flusher is stuck in the database; it is a daemon and dies with the process
        self._drop_registry()

    def _drain(self) -> None:
        """Move queued events into the aggregates (caller holds ``_lock``)."""
        queue = self._queue
        while queue:
            key = queue.popleft()
            _add(self._totals, key, 1)
            if not _add(self._pending, key, 1):
                self.dropped += 1

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
        if self.sink is not None:
            # A daemon thread dies with the interpreter: flush the last interval's misses on a clean exit.
            atexit.register(self.close, EXIT_FLUSH_TIMEOUT_S)

    def _run(self) -> None:
        while not self._stopping:
            self._wake.wait(self.interval)
            self._wake.clear()
            self.flush()
        # close() may have set _stopping while the flush above was writing: misses queued
        # meanwhile would otherwise never reach the registry.
        self.flush()

    def _recordable(self, pending: dict[_MissKey, int]) -> dict[_MissKey, MissEvent]:
        """Each pending miss as the event to write, less (counted in ``dropped``) those the registry cannot hold, e.g. a
        refused request of batch 2**40.

        The registry refuses a whole batch that holds one of them; kept pending, that
        one request would fail every later flush and no miss would ever be recorded.
        """
        events = {key: self._event(key, count) for key, count in pending.items()}
        kept = {key: event for key, event in events.items() if event.out_of_range() is None}
        if len(kept) < len(events):
            unrecordable = sum(pending[key] for key in events if key not in kept)
            self.dropped += unrecordable
            log.warning("miss telemetry: dropped %d miss(es) whose sizes the registry cannot hold", unrecordable)
        return kept

    def _event(self, key: _MissKey, count: int) -> MissEvent:
        batch, seq, decision, padded_batch, padded_seq = key
        f = self.family
        return MissEvent(
            f.model,
            f.workload,
            f.dtype,
            batch,
            seq,
            decision,
            padded_batch=padded_batch,
            padded_seq=padded_seq,
            count=count,
            tp_size=f.tp_size,
            fsdp_size=f.fsdp_size,
        )


def _add(counts: dict[_MissKey, int], key: _MissKey, count: int) -> bool:
    """Add to a bounded counter; ``False`` when the key is new and the counter is full."""
    if key not in counts and len(counts) >= MAX_KEYS:
        return False
    counts[key] = counts.get(key, 0) + count
    return True


class MissSink(Protocol):
    """Where flushed misses go: a registry, or ``warmcache serve``
    (:class:`~warmcache.runtime.remote.ServiceMisses`)."""

    def record_misses(self, events: Sequence[MissEvent]) -> None: ...

    def close(self) -> None: ...


def open_sink(sink: RegistryLocation | str) -> MissSink:
    """The registry ``sink`` names, or the service when it is an ``http(s)://`` URL (its ``POST /v1/misses``).

    A text ``sink`` that is not a service URL is a library caller's registry URL, parsed here (its one edge).
    """
    if isinstance(sink, str) and sink.startswith(("http://", "https://")):
        from warmcache.runtime.remote import ServiceMisses

        return ServiceMisses(sink, timeout=CONNECT_TIMEOUT_S)
    from warmcache.registry.registry import Registry  # the database layer loads on the first flush

    # Never creates or migrates a schema: a typo in the URL must not grow a new registry.
    # A PostgreSQL connect is bounded: libpq waits forever by default.
    return Registry.open(RegistryLocation.of(sink).bounded(CONNECT_TIMEOUT_S), create=False)
