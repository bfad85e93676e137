"""An in-memory view of the registry, refreshed in the background: the hot path never queries the database.

The refresher loads every row and the miss totals every ``interval`` seconds (and on
demand), builds one :class:`~warmcache.reports.query.RequestChecker` per model and workload, and
swaps the whole :class:`RegistryState` at once, so a request sees either the old view or
the new one. Answers computed from a state (``/v1/check`` bodies, guard snapshots) are
memoised on that state and vanish with it.

A registry outage is recorded, not raised: :meth:`RegistryView.current` then refuses with
a 503 (every data endpoint does), ``/readyz`` reports it, and the next refresh retries.
PostgreSQL connects and statements are bounded (:meth:`RegistryLocation.bounded`), so a hung
database costs one refresh interval, never a hung worker.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sqlalchemy.exc import SQLAlchemyError

from warmcache.errors import WarmcacheError, first_line
from warmcache.registry import Registry, ShapeRecord
from warmcache.registry.models import utcnow
from warmcache.registry.statuses import DONE_STATUSES
from warmcache.reports.query import RequestChecker
from warmcache.service.http import ApiError, dumps
from warmcache.settings import RegistryLocation
from warmcache.trust import SigningKey

log = logging.getLogger("warmcache.service")

#: Seconds a PostgreSQL connect may take before the registry counts as down.
CONNECT_TIMEOUT_S = 3
#: Milliseconds one PostgreSQL statement may run (a locked table or a stuck server).
STATEMENT_TIMEOUT_MS = 5000
#: What a served guard snapshot names as its source (not the registry's URL: any reader may fetch one).
SNAPSHOT_SOURCE = "warmcache serve"
#: A reader's answer while the registry is down: the cause (which names its host, user or file) goes to the log only.
UNAVAILABLE = "registry unavailable (this server's log says why)"
#: Memoised answers per state; traffic beyond this many distinct requests is computed each time.
MEMO_LIMIT = 65536

T = TypeVar("T")


@dataclass(slots=True)
class RegistryState:
    """Everything the read endpoints answer from, as loaded at ``loaded_at``."""

    records: tuple[ShapeRecord, ...]
    misses: list[dict[str, Any]]
    loaded_at: dt.datetime
    checkers: dict[tuple[str, str], RequestChecker] = field(default_factory=dict)
    check_memo: dict[bytes, tuple[int, bytes]] = field(default_factory=dict)
    guard_memo: dict[tuple[str, str | None], tuple[str, bytes]] = field(default_factory=dict)

    @classmethod
    def load(cls, records: list[ShapeRecord], misses: list[dict[str, Any]]) -> RegistryState:
        grouped: dict[tuple[str, str], list[ShapeRecord]] = {}
        for record in records:
            grouped.setdefault((record.model_name, record.workload), []).append(record)
        checkers = {key: RequestChecker(rows, model=key[0], workload=key[1]) for key, rows in grouped.items()}
        return cls(tuple(records), misses, utcnow(), checkers)

    @property
    def models(self) -> list[str]:
        return sorted({r.model_name for r in self.records})

    def memoise(self, memo: dict[Any, T], key: Any, compute: Callable[[], T]) -> T:
        value = memo.get(key)
        if value is None:
            value = compute()
            if len(memo) < MEMO_LIMIT:
                memo[key] = value
        return value


class RegistryView:
    """The registry at ``location`` as a refreshed :class:`RegistryState`, plus a connection for the few direct
    queries."""

    def __init__(self, location: RegistryLocation, *, interval: float = 5.0) -> None:
        self.url = location.bounded(CONNECT_TIMEOUT_S, STATEMENT_TIMEOUT_MS)  # libpq waits forever by default
        self.display_url = location.display
        self.interval = interval
        self.state: RegistryState | None = None
        self.error: str | None = None
        self.errors = 0
        """Failed refreshes and failed direct queries since start (``warmcache_registry_errors_total``)."""
        self._registry: Registry | None = None
        self._open_lock = threading.Lock()
        self._refresh_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """First refresh in the background (a down registry must not stop the server from starting)."""
        self._thread = threading.Thread(target=self._run, name="warmcache-view-refresh", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(CONNECT_TIMEOUT_S + STATEMENT_TIMEOUT_MS / 1000)
        with self._open_lock:
            if self._registry is not None:
                self._registry.close()
                self._registry = None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.refresh()
            except ApiError:
                pass  # recorded in self.error by refresh()
            self._stop.wait(self.interval)

    # ------------------------------------------------------------ reading

    def refresh(self) -> RegistryState:
        """Load the registry now and swap the state; a failure is recorded and raised as a 503."""
        with self._refresh_lock:
            with self.query() as registry:
                # Artifacts too: a guard snapshot names the precompiled code (AOTInductor packages) prime() loads.
                records = registry.rows(with_artifacts=True)
                misses = registry.miss_summary()
            self.state = RegistryState.load(records, misses)
            if self.error is not None:
                log.warning("registry %s answers again", self.display_url)
            self.error = None
            return self.state

    def current(self) -> RegistryState:
        """The state to answer from, or a 503 while the registry is down (or not loaded yet)."""
        state = self.state
        if self.error is not None:
            raise ApiError(503, UNAVAILABLE)
        if state is None:
            raise ApiError(503, "registry not loaded yet")
        return state

    @contextmanager
    def query(self) -> Iterator[Registry]:
        """The shared registry connection; any database failure becomes a 503 (and is counted)."""
        try:
            yield self._open()
        except (WarmcacheError, SQLAlchemyError, OSError) as exc:
            self.errors += 1
            self.error = first_line(str(exc))
            log.warning("registry %s: %s", self.display_url, self.error)
            self._drop()
            raise ApiError(503, UNAVAILABLE) from None

    def _open(self) -> Registry:
        with self._open_lock:
            if self._registry is None:
                # serving reads: a missing registry is a 503, never a new one
                self._registry = Registry.open(self.url, create=False)
            return self._registry

    def _drop(self) -> None:
        with self._open_lock:
            if self._registry is not None:
                self._registry.close()
                self._registry = None


def guard_document(
    state: RegistryState, model: str, workload: str | None, signing_key: SigningKey | None = None
) -> tuple[str, bytes]:
    """``(etag, body)`` of the guard snapshot of ``model``: its compiled rows, as ``warmcache guard export`` writes them
    (signed with ``signing_key``, once per state).

    The ETag hashes the rows only (not the export time), so an unchanged registry answers
    ``304 Not Modified`` however often the view refreshes.
    """
    from warmcache.runtime.snapshot import snapshot_document

    def build() -> tuple[str, bytes]:
        rows = [
            r
            for r in state.records
            if r.model_name == model and (workload is None or r.workload == workload) and r.status in DONE_STATUSES
        ]
        if not rows:
            raise ApiError(404, f"model {model!r} has no compiled shapes", "model")  # any reader: never the registry
        document = snapshot_document(rows, SNAPSHOT_SOURCE, signing_key)  # any reader gets it: no path of this host
        etag = hashlib.sha256(dumps(document["records"])).hexdigest()[:32]
        return f'"{etag}"', dumps(document)

    return state.memoise(state.guard_memo, (model, workload), build)
