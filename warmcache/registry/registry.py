"""The Registry facade: open a database, add, claim and mark compiled shapes.

Every write is one short transaction, so an interrupted process never leaves a
half-written row: a claimed spec is either ``compiling`` under a lease (taken
again once the lease expires) or in its final state with its artifacts.

Its claims and reads are its base classes, each in a module of its own: claims and
their leases (:mod:`warmcache.registry.claiming`), the row queries
(:mod:`warmcache.registry.queries`) and the miss log (:mod:`warmcache.registry.misses`).
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import socket
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import ColumnElement, CursorResult, Engine, Executable, delete, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import Session

from warmcache.errors import RegistryError, RegistryUnavailableError, first_line
from warmcache.identity.plan import PlannedShape
from warmcache.registry import schema
from warmcache.registry.claiming import ClaimRows
from warmcache.registry.engine import create_registry_engine
from warmcache.registry.misses import MissLog
from warmcache.registry.models import Artifact, CompiledShape, utcnow
from warmcache.registry.queries import PlanStatus, RowQueries
from warmcache.registry.records import ArtifactRef, MissEvent
from warmcache.registry.statuses import DONE_STATUSES, Status
from warmcache.registry.transactional import chunks
from warmcache.settings import RegistryLocation

log = logging.getLogger(__name__)


def worker_id() -> str:
    """``host:pid``: who holds a claim, readable in ``warmcache status``."""
    return f"{socket.gethostname()}:{os.getpid()}"


class Registry(ClaimRows, RowQueries, MissLog):
    """A connection to one registry database."""

    def __init__(self, engine: Engine, location: RegistryLocation) -> None:
        self.engine = engine
        #: Where it is: shown as ``location.display`` (password hidden), the one way a registry URL is shown.
        self.location = location
        #: What "now" is for leases and timestamps; tests move it instead of sleeping.
        self.clock: Callable[[], dt.datetime] = utcnow
        self._together = threading.local()

    @classmethod
    def open(
        cls,
        location: RegistryLocation | str,
        *,
        check_schema: bool = True,
        create: bool = True,
        hold_connections: bool = True,
        read_only: bool = False,
    ) -> Registry:
        """Open a registry (a location resolved at the edge, or a library caller's URL); an empty database is
        initialised, an out-of-date one refused.

        ``create=False`` is for read paths (a guard, its telemetry): a missing or
        empty database is refused instead of created, and no schema is ever migrated;
        a SQLite file is checked through a read-only connection first, so one that is
        not a warmcache registry (an empty file, another application's database) is
        refused as it was, before the engine's ``PRAGMA journal_mode=WAL`` rewrites it.
        ``read_only=True`` (a query; implies ``create=False``) keeps reading a SQLite file
        that way to the end. ``hold_connections=False`` (warmup workers) holds a
        PostgreSQL connection only while a transaction runs.
        """
        location = RegistryLocation.of(location)  # the library's edge: a command's location arrives parsed
        create = create and not read_only
        log.debug(
            "opening registry %s (%s; create=%s, check_schema=%s, read_only=%s)",
            location.display,
            location.source,
            create,
            check_schema,
            read_only,
        )
        checked_read_only = not create and location.sqlite_file is not None
        if not create:
            _refuse_missing_sqlite_file(location)
        engine = _checked_engine(location, hold_connections, read_only or checked_read_only, check_schema, create)
        if checked_read_only and not read_only:  # a registry, checked without writing: now the writing engine
            engine.dispose()
            engine = create_registry_engine(location, hold_connections=hold_connections)
        registry = cls(engine, location)
        registry.holds_connections = hold_connections
        # the schema check's connection: a fleet's worker may wait a while before its first claim
        registry.drop_connections()
        return registry

    #: ``False``: :meth:`drop_connections` closes idle connections (see ``Registry.open``).
    holds_connections = True

    def drop_connections(self) -> None:
        """Close the idle pooled connections, unless opened to hold them: the caller will not need one for a while."""
        if not self.holds_connections:
            self.engine.pool.dispose()

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Registry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def session(self) -> Iterator[Session]:
        """One transaction: committed on success, rolled back on any error; inside :meth:`together`, that one."""
        shared: Session | None = getattr(self._together, "session", None)
        if shared is not None:
            yield shared
            return
        session = Session(self.engine, expire_on_commit=False)
        try:
            with session.begin():
                yield session
        except DBAPIError as exc:
            # Any driver error (connection lost, not a database, permission denied) is the
            # registry's, reported in one line; callers never see a driver traceback.
            kind = RegistryUnavailableError if _unavailable(exc) else RegistryError
            raise kind(f"registry {self.location.display}: {first_line(exc.orig or exc)}") from None
        finally:
            session.close()

    @contextmanager
    def together(self) -> Iterator[None]:
        """Make this thread's registry calls inside one transaction: a batch of claims is recorded with one commit,
        all or nothing."""
        with self.session() as session:
            self._together.session = session
            try:
                yield
            finally:
                self._together.session = None

    # ---------------------------------------------------------------- writes

    def ensure_pending(self, planned: Sequence[PlannedShape]) -> int:
        """Insert a ``pending`` row for each planned shape that has none; return how many were new."""
        if not planned:
            return 0
        values = [pending_row_values(p) for p in planned]
        insert = pg_insert if self.dialect == "postgresql" else sqlite_insert
        inserted = 0
        with self.session() as session:
            for chunk in chunks(values, 500):
                stmt = insert(CompiledShape).values(chunk).on_conflict_do_nothing(index_elements=["identity"])
                inserted += len(session.execute(stmt.returning(CompiledShape.id)).all())
            log.debug("pending rows: %d new of %d planned (the rest were already recorded)", inserted, len(values))
            if self.dialect == "postgresql" and inserted >= _ANALYZE_AFTER_INSERTING:
                # Fresh statistics, now: with the server's still saying "a few pending rows",
                # the planner answers each claim by scanning every pending row (autovacuum
                # would notice only a minute or more later, when a fleet is already claiming).
                # A role that does not own the table gets a warning from the server, not an error.
                session.execute(text("ANALYZE compiled_shapes"))
        return inserted

    def release(self, row_id: int, worker: str, *, started: bool = True) -> None:
        """Give a claim back untouched (the worker is stopping, not failing); one never ``started`` does not count as
        an attempt."""
        uncounted = {} if started else {"attempts": CompiledShape.attempts - 1}
        released = self._finish(row_id, worker, status=Status.PENDING, **uncounted)
        log.debug("row %d given back by %s (%s)", row_id, worker, "released" if released else "no longer its claim")

    def mark_compiled(
        self,
        row_id: int,
        worker: str,
        *,
        compile_seconds: float,
        graphs_compiled: int,
        artifacts: Iterable[ArtifactRef] = (),
        host: str | None = None,
        cache_root: str | None = None,
    ) -> bool:
        """Record a successful compile with its artifacts; ``False`` if the claim was lost."""
        now = self.clock()
        with self.session() as session:
            won = self._finish_in(
                session,
                row_id,
                worker,
                status=Status.COMPILED,
                compile_seconds=compile_seconds,
                graphs_compiled=graphs_compiled,
                host=host or socket.gethostname(),
                cache_root=cache_root,
                compiled_at=now,
                verified_at=None,
            )
            if won:
                session.execute(delete(Artifact).where(Artifact.shape_id == row_id))
                session.add_all(
                    Artifact(shape_id=row_id, kind=a.kind, path=a.path, size_bytes=a.size_bytes) for a in set(artifacts)
                )
                log.debug("row %d recorded compiled by %s", row_id, worker)
            else:
                log.warning(
                    "row %d compiled here but not recorded: the claim of %s was lost (its lease ran out)",
                    row_id,
                    worker,
                )
            return won

    def mark_failed(self, row_id: int, worker: str, error: str, host: str | None = None) -> bool:
        log.debug("row %d recorded failed by %s: %s", row_id, worker, error)
        return self._finish(row_id, worker, status=Status.FAILED, error=error, host=host or socket.gethostname())

    def mark_verified(self, identities: Iterable[str]) -> int:
        """Promote ``compiled`` rows that a fresh process replayed without compiling."""
        now = self.clock()
        return self._record_verdict(identities, now, status=Status.VERIFIED, verified_at=now)

    def mark_unverified(self, identities: Iterable[str], reason: str) -> int:
        """Demote compiled rows whose replay compiled or whose artifact was disproven: the cache does not hold what the
        row claims."""
        return self._record_verdict(identities, self.clock(), status=Status.FAILED, error=reason, verified_at=None)

    def _record_verdict(self, identities: Iterable[str], now: dt.datetime, **values: Any) -> int:
        """Verify's verdict on rows still compiled or verified (a row requeued or forgotten meanwhile keeps its
        state)."""
        return self._update_identities(identities, CompiledShape.status.in_(DONE_STATUSES), updated_at=now, **values)

    def requeue_failed(self, identities: Iterable[str]) -> int:
        """Turn failed rows back into ``pending`` (``--retry-failed``), without counting an attempt."""
        return self._update_identities(
            identities, CompiledShape.status == Status.FAILED, status=Status.PENDING, updated_at=self.clock()
        )

    def requeue_done(self, identities: Iterable[str]) -> int:
        """Turn compiled or verified rows back into ``pending``, without counting an attempt: a warmup warms them
        again (their model's precompile route was set after they were warmed, :mod:`warmcache.warmup.route_gaps`)."""
        return self._update_identities(
            identities, CompiledShape.status.in_(list(DONE_STATUSES)), status=Status.PENDING, updated_at=self.clock()
        )

    def _update_identities(self, identities: Iterable[str], condition: ColumnElement[bool], **values: Any) -> int:
        ids = list(identities)
        if not ids:
            return 0
        query = update(CompiledShape).where(CompiledShape.identity.in_(ids), condition)
        with self.session() as session:
            return _rows_changed(session, query.values(**values))

    def forget(self, row_ids: Iterable[int]) -> int:
        """Delete rows (and their artifacts): those shapes read as ``missing`` again."""
        ids = list(row_ids)
        if not ids:
            return 0
        with self.session() as session:
            session.execute(delete(Artifact).where(Artifact.shape_id.in_(ids)))
            return _rows_changed(session, delete(CompiledShape).where(CompiledShape.id.in_(ids)))

    def _finish(self, row_id: int, worker: str, **values: Any) -> bool:
        with self.session() as session:
            return self._finish_in(session, row_id, worker, **values)

    @staticmethod
    def _finish_in(session: Session, row_id: int, worker: str, **values: Any) -> bool:
        return bool(
            _rows_changed(
                session,
                update(CompiledShape)
                .where(
                    CompiledShape.id == row_id,
                    CompiledShape.claimed_by == worker,
                    CompiledShape.status == Status.COMPILING,
                )
                .values(claimed_by=None, lease_expires_at=None, updated_at=utcnow(), **values),
            )
        )


def _checked_engine(
    location: RegistryLocation, hold_connections: bool, read_only: bool, check_schema: bool, create: bool
) -> Engine:
    """An engine for ``location`` whose schema is checked (and, with ``create``, initialised): see
    :meth:`Registry.open`."""
    shown = location.display
    engine = create_registry_engine(location, hold_connections=hold_connections, read_only=read_only)
    try:
        if location.is_postgresql:
            schema.require_search_path(engine, shown)
        if check_schema and not create and schema.is_empty(engine):
            raise RegistryError(
                f"registry {shown} holds no warmcache schema (nothing was ever compiled into it); "
                f"{_how_to_create(location)}"
            )
        if check_schema:
            schema.ensure_current(engine, shown)
    except DBAPIError as exc:
        engine.dispose()
        kind = RegistryUnavailableError if _unavailable(exc) else RegistryError
        raise kind(f"registry {shown}: cannot open: {first_line(exc.orig or exc)}") from None
    except BaseException:
        engine.dispose()
        raise
    return engine


def _refuse_missing_sqlite_file(location: RegistryLocation) -> None:
    """A read path must not create a SQLite file (connecting would), nor its folder."""
    file = location.sqlite_file
    if file is not None and not file.is_file():
        if file.is_dir():
            raise RegistryError(f"registry {location.display} is a folder, not a registry file; check the URL")
        raise RegistryError(
            f"registry {location.display} does not exist (a read never creates one); check the URL, "
            f"or {_how_to_create(location)}"
        )


def _how_to_create(location: RegistryLocation) -> str:
    """The commands that make a registry, for a read that found none."""
    return f"create it with: warmcache db upgrade --db {location.display} (or a warmcache warmup)"


def _unavailable(exc: DBAPIError) -> bool:
    """The database went away or refused a connection, as opposed to refusing the request itself."""
    return isinstance(exc, OperationalError) or exc.connection_invalidated


def _rows_changed(session: Session, statement: Executable) -> int:
    """The rows an UPDATE or DELETE matched (``Session.execute`` is typed as returning a plain ``Result``)."""
    result = session.execute(statement)
    assert isinstance(result, CursorResult)
    return result.rowcount


def pending_row_values(p: PlannedShape) -> dict[str, Any]:
    """The column values of a new ``pending`` row for ``p``: what ``ensure_pending`` inserts."""
    spec, model, family = p.spec, p.model, p.spec.family
    now = utcnow()
    return {
        "identity": p.identity,
        "shape_hash": p.shape_hash,
        "model_name": model.name,
        "model_path": model.path,
        "model_revision": model.revision,
        "config_hash": p.config_hash,
        "attn_implementation": model.attn_implementation,
        "toolchain_hash": p.toolchain.hash,
        "toolchain": p.toolchain.as_dict(),
        "workload": family.workload,
        "settings": family.settings.stored(),
        "batch_size": spec.batch_size,
        "seq_len": spec.seq_len,
        "max_cache_len": family.max_cache_len,
        "dtype": family.dtype,
        "device": model.device,
        "backend": model.backend,
        "mode": model.mode,
        "tp_size": family.tp_size,
        "fsdp_size": family.fsdp_size,
        "status": Status.PENDING,
        "attempts": 0,
        "created_at": now,
        "updated_at": now,
    }


#: New rows after which ``ensure_pending`` refreshes PostgreSQL's statistics (autovacuum's own threshold is 50 + 10 %).
_ANALYZE_AFTER_INSERTING = 100


__all__ = ["MissEvent", "PlanStatus", "Registry", "worker_id"]
