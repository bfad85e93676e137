"""The Registry facade: open a database, add, claim, mark and query compiled shapes.

Every write is one short transaction, so an interrupted process never leaves a
half-written row: a claimed spec is either ``compiling`` under a lease (taken
again once the lease expires) or in its final state with its artifacts.
"""

from __future__ import annotations

import datetime as dt
import os
import socket
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, CursorResult, Engine, Executable, Select, and_, case, delete, func, or_, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import Session, selectinload

from warmcache.errors import RegistryError, RegistryUnavailableError, first_line
from warmcache.plan import PlannedShape
from warmcache.registry import schema
from warmcache.registry.engine import create_registry_engine, display_url
from warmcache.registry.models import Artifact, CompiledShape, ShapeMiss, utcnow
from warmcache.registry.records import ArtifactRef, MissEvent, ShapeRecord
from warmcache.settings import RegistryLocation
from warmcache.statuses import DONE_STATUSES, Status


def worker_id() -> str:
    """``host:pid``: who holds a claim, readable in ``warmcache status``."""
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True, slots=True)
class PlanStatus:
    """A planned shape with what the registry knows about it."""

    planned: PlannedShape
    status: str
    record: ShapeRecord | None


class Registry:
    """A connection to one registry database."""

    def __init__(self, engine: Engine, url: str) -> None:
        self.engine = engine
        self.url = url
        #: What "now" is for leases and timestamps; tests move it instead of sleeping.
        self.clock: Callable[[], dt.datetime] = utcnow

    @classmethod
    def open(cls, location: RegistryLocation | str, *, check_schema: bool = True, create: bool = True, hold_connections: bool = True) -> Registry:
        """Open a registry (a location resolved at the edge, or a library caller's URL); an empty database is initialised, an out-of-date one refused.

        ``create=False`` is for read paths (a guard, its telemetry): a missing or
        empty database is refused instead of created, and no schema is ever migrated.
        ``hold_connections=False`` (warmup workers) holds a PostgreSQL connection
        only while a transaction runs.
        """
        location = RegistryLocation.of(location)
        url = location.url
        if not create:
            _refuse_missing_sqlite_file(location)
        engine = create_registry_engine(location, hold_connections=hold_connections)
        try:
            if check_schema and not create and schema.is_empty(engine):
                raise RegistryError(f"registry {display_url(url)} holds no warmcache schema (nothing was ever compiled into it); check the URL")
            if check_schema:
                schema.ensure_current(engine, display_url(url))
        except DBAPIError as exc:
            engine.dispose()
            kind = RegistryUnavailableError if _unavailable(exc) else RegistryError
            raise kind(f"registry {display_url(url)}: cannot open: {first_line(exc.orig or exc)}") from None
        except BaseException:
            engine.dispose()
            raise
        registry = cls(engine, url)
        registry.holds_connections = hold_connections
        registry.drop_connections()  # the schema check's connection: a fleet's worker may wait a while before its first claim
        return registry

    #: ``False``: :meth:`drop_connections` closes idle connections (see ``Registry.open``).
    holds_connections = True

    def drop_connections(self) -> None:
        """Close the idle pooled connections, unless opened to hold them: the caller will not need one for a while."""
        if not self.holds_connections:
            self.engine.pool.dispose()

    @property
    def display_url(self) -> str:
        return display_url(self.url)

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
        """One transaction: committed on success, rolled back on any error."""
        session = Session(self.engine, expire_on_commit=False)
        try:
            with session.begin():
                yield session
        except DBAPIError as exc:
            # Any driver error (connection lost, not a database, permission denied) is the
            # registry's, reported in one line; callers never see a driver traceback.
            kind = RegistryUnavailableError if _unavailable(exc) else RegistryError
            raise kind(f"registry {self.display_url}: {first_line(exc.orig or exc)}") from None
        finally:
            session.close()

    # ---------------------------------------------------------------- writes

    def ensure_pending(self, planned: Sequence[PlannedShape]) -> int:
        """Insert a ``pending`` row for each planned shape that has none; return how many were new."""
        if not planned:
            return 0
        values = [pending_row_values(p) for p in planned]
        insert = pg_insert if self.dialect == "postgresql" else sqlite_insert
        inserted = 0
        with self.session() as session:
            for chunk in _chunks(values, 500):
                stmt = insert(CompiledShape).values(chunk).on_conflict_do_nothing(index_elements=["identity"])
                inserted += len(session.execute(stmt.returning(CompiledShape.id)).all())
        return inserted

    def claim(
        self,
        identities: Sequence[str],
        worker: str,
        lease_seconds: float,
        *,
        retry_failed: bool = False,
    ) -> ShapeRecord | None:
        """Take the first claimable row among ``identities``, in their order, for ``worker``; ``None`` if none is left.

        Claimable: ``pending``, ``compiling`` under an expired lease (its worker died),
        and with ``retry_failed`` also ``failed``. The final update re-checks the
        condition, so two claimers racing for one row cannot both win; PostgreSQL
        additionally skips rows another transaction has locked. The order is the
        caller's (a warmup passes its longest shapes first); a claimer working
        through thousands keeps its place with :class:`warmcache.warmup.claim_queue.ClaimQueue`.
        """
        if not identities:
            return None
        for chunk in _chunks(list(identities), _CLAIM_CHUNK):
            now = self.clock()
            claimable = _claimable(now, retry_failed)
            position = case({identity: i for i, identity in enumerate(chunk)}, value=CompiledShape.identity)
            candidate = select(CompiledShape.id).where(CompiledShape.identity.in_(chunk), claimable).order_by(position).limit(1)
            if self.dialect == "postgresql":
                candidate = candidate.with_for_update(skip_locked=True)
            # One statement: the candidate row is locked (PostgreSQL) or the database is
            # (SQLite's write transaction), and the update re-checks it is still claimable.
            claim = (
                update(CompiledShape)
                .where(CompiledShape.id == candidate.scalar_subquery(), claimable)
                .values(
                    status=Status.COMPILING,
                    claimed_by=worker,
                    lease_expires_at=now + dt.timedelta(seconds=lease_seconds),
                    attempts=CompiledShape.attempts + 1,
                    error=None,
                    updated_at=now,
                )
                .returning(CompiledShape)
                .execution_options(synchronize_session=False)
            )
            with self.session() as session:
                row = session.scalars(claim).first()
                if row is not None:
                    return ShapeRecord.from_row(row)
        return None

    def renew_lease(self, row_id: int, worker: str, lease_seconds: float) -> bool:
        """Extend a claim; ``False`` means the claim was lost (expired and taken over)."""
        now = self.clock()
        with self.session() as session:
            return bool(
                _rows_changed(
                    session,
                    update(CompiledShape)
                    .where(CompiledShape.id == row_id, CompiledShape.claimed_by == worker, CompiledShape.status == Status.COMPILING)
                    .values(lease_expires_at=now + dt.timedelta(seconds=lease_seconds), updated_at=now),
                )
            )

    def release(self, row_id: int, worker: str) -> None:
        """Give a claim back untouched (the worker is stopping, not failing)."""
        self._finish(row_id, worker, status=Status.PENDING)

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
                session.add_all(Artifact(shape_id=row_id, kind=a.kind, path=a.path, size_bytes=a.size_bytes) for a in set(artifacts))
            return won

    def mark_failed(self, row_id: int, worker: str, error: str, host: str | None = None) -> bool:
        return self._finish(row_id, worker, status=Status.FAILED, error=error, host=host or socket.gethostname())

    def mark_verified(self, identities: Iterable[str]) -> int:
        """Promote ``compiled`` rows that a fresh process replayed without compiling."""
        now = self.clock()
        return self._update_identities(
            identities,
            CompiledShape.status.in_(DONE_STATUSES),
            status=Status.VERIFIED,
            verified_at=now,
            updated_at=now,
        )

    def mark_unverified(self, identities: Iterable[str], reason: str) -> int:
        """Demote compiled rows whose replay compiled: the cache does not hold what the row claims."""
        return self._update_identities(
            identities,
            CompiledShape.status.in_(DONE_STATUSES),
            status=Status.FAILED,
            error=reason,
            verified_at=None,
            updated_at=self.clock(),
        )

    def requeue_failed(self, identities: Iterable[str]) -> int:
        """Turn failed rows back into ``pending`` (``--retry-failed``), without counting an attempt."""
        return self._update_identities(identities, CompiledShape.status == Status.FAILED, status=Status.PENDING, updated_at=self.clock())

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
                .where(CompiledShape.id == row_id, CompiledShape.claimed_by == worker, CompiledShape.status == Status.COMPILING)
                .values(claimed_by=None, lease_expires_at=None, updated_at=utcnow(), **values),
            )
        )

    # ---------------------------------------------------------------- reads

    def rows(
        self,
        *,
        model: str | None = None,
        workload: str | None = None,
        statuses: Sequence[str] | None = None,
        identities: Sequence[str] | None = None,
        shape_hashes: Sequence[str] | None = None,
        with_artifacts: bool = False,
    ) -> list[ShapeRecord]:
        """Registry rows matching every filter given, in a stable order."""
        query = _rows_query(model, workload, statuses)
        if with_artifacts:
            query = query.options(selectinload(CompiledShape.artifacts))
        keys = [(CompiledShape.identity, identities), (CompiledShape.shape_hash, shape_hashes)]
        with self.session() as session:
            if not any(values is not None for _, values in keys):
                return [ShapeRecord.from_row(r, with_artifacts) for r in session.scalars(query)]
            out: list[ShapeRecord] = []
            for column, values in keys:
                if values is None:
                    continue
                for chunk in _chunks(list(values), 2000):
                    out.extend(ShapeRecord.from_row(r, with_artifacts) for r in session.scalars(query.where(column.in_(chunk))))
            return out

    def iter_rows(self, *, model: str | None = None, workload: str | None = None) -> Iterator[ShapeRecord]:
        """:meth:`rows` one at a time, fetched in batches: a 100,000-row registry is listed without holding it all."""
        with self.session() as session:
            for row in session.scalars(_rows_query(model, workload, None).execution_options(yield_per=1000)):
                yield ShapeRecord.from_row(row)

    def done_artifact_paths(self, identities: Sequence[str]) -> dict[str, list[str]]:
        """``{identity: artifact paths}`` of the compiled/verified rows among ``identities``.

        Plain column reads, no ORM objects: ``pull`` asks this for thousands of shapes to
        decide, from the cache alone, which it can skip.
        """
        out: dict[str, list[str]] = {}
        query = select(CompiledShape.identity, Artifact.path).outerjoin(Artifact, Artifact.shape_id == CompiledShape.id).where(CompiledShape.status.in_(list(DONE_STATUSES)))
        with self.session() as session:
            for chunk in _chunks(list(identities), 2000):
                for identity, path in session.execute(query.where(CompiledShape.identity.in_(chunk))):
                    paths = out.setdefault(identity, [])
                    if path is not None:
                        paths.append(path)
        return out

    def plan_status(self, planned: Sequence[PlannedShape]) -> list[PlanStatus]:
        """Each planned shape's status: its own row's, ``stale`` if only other toolchains/configs have it, else ``missing``."""
        by_shape: dict[str, list[ShapeRecord]] = {}
        for record in self.rows(shape_hashes=sorted({p.shape_hash for p in planned})):
            by_shape.setdefault(record.shape_hash, []).append(record)
        out = []
        for p in planned:
            records = by_shape.get(p.shape_hash, [])
            own = next((r for r in records if r.identity == p.identity), None)
            if own is not None:
                out.append(PlanStatus(p, own.status, own))
            elif records:
                out.append(PlanStatus(p, Status.STALE, max(records, key=lambda r: r.updated_at)))
            else:
                out.append(PlanStatus(p, Status.MISSING, None))
        return out

    def record_misses(self, events: Sequence[MissEvent]) -> None:
        if not events:
            return
        for event in events:
            event.check_range()
        host = socket.gethostname()
        with self.session() as session:
            session.add_all(
                ShapeMiss(
                    model_name=e.model_name,
                    workload=e.workload,
                    dtype=e.dtype,
                    tp_size=e.tp_size,
                    fsdp_size=e.fsdp_size,
                    batch_size=e.batch_size,
                    seq_len=e.seq_len,
                    decision=e.decision,
                    padded_batch=e.padded_batch,
                    padded_seq=e.padded_seq,
                    count=e.count,
                    host=host,
                )
                for e in events
            )

    def miss_summary(self, model: str | None = None) -> list[dict[str, Any]]:
        """Recorded misses summed per (model, workload, dtype, shape, decision), most frequent first."""
        columns = (
            ShapeMiss.model_name,
            ShapeMiss.workload,
            ShapeMiss.dtype,
            ShapeMiss.batch_size,
            ShapeMiss.seq_len,
            ShapeMiss.decision,
            ShapeMiss.padded_batch,
            ShapeMiss.padded_seq,
        )
        total = func.sum(ShapeMiss.count).label("requests")  # not "count": a Row is a tuple, and tuple.count is a method
        query = select(*columns, total, func.max(ShapeMiss.recorded_at).label("last_seen")).group_by(*columns)
        if model is not None:
            query = query.where(ShapeMiss.model_name == model)
        with self.session() as session:
            result = session.execute(query.order_by(total.desc(), *columns)).all()
        return [
            {
                "model": r.model_name,
                "workload": r.workload,
                "dtype": r.dtype,
                "batch_size": r.batch_size,
                "seq_len": r.seq_len,
                "decision": r.decision,
                "padded_batch": r.padded_batch,
                "padded_seq": r.padded_seq,
                "count": int(r.requests),
                "last_seen": (r.last_seen.replace(tzinfo=dt.UTC) if r.last_seen.tzinfo is None else r.last_seen).isoformat(),
            }
            for r in result
        ]


def _refuse_missing_sqlite_file(location: RegistryLocation) -> None:
    """A read path must not create a SQLite file (connecting would)."""
    if location.sqlite_file is not None and not location.sqlite_file.is_file():
        raise RegistryError(f"registry {location.display} does not exist; check the URL (a read never creates a registry)")


def _unavailable(exc: DBAPIError) -> bool:
    """The database went away or refused a connection, as opposed to refusing the request itself."""
    return isinstance(exc, OperationalError) or exc.connection_invalidated


def _rows_changed(session: Session, statement: Executable) -> int:
    """The rows an UPDATE or DELETE matched (``Session.execute`` is typed as returning a plain ``Result``)."""
    result = session.execute(statement)
    assert isinstance(result, CursorResult)
    return result.rowcount


def _rows_query(model: str | None, workload: str | None, statuses: Sequence[str] | None) -> Select[CompiledShape]:
    """Rows matching the filters given, in :meth:`Registry.rows`' stable order."""
    conditions: list[ColumnElement[bool]] = []
    if model is not None:
        conditions.append(CompiledShape.model_name == model)
    if workload is not None:
        conditions.append(CompiledShape.workload == workload)
    if statuses is not None:
        conditions.append(CompiledShape.status.in_(list(statuses)))
    order = (CompiledShape.model_name, CompiledShape.workload, CompiledShape.batch_size, CompiledShape.seq_len, CompiledShape.id)
    return select(CompiledShape).where(*conditions).order_by(*order)


def _claimable(now: dt.datetime, retry_failed: bool) -> ColumnElement[bool]:
    options = [
        CompiledShape.status == Status.PENDING,
        and_(CompiledShape.status == Status.COMPILING, CompiledShape.lease_expires_at < now),
    ]
    if retry_failed:
        options.append(CompiledShape.status == Status.FAILED)
    return or_(*options)


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
        "settings": family.settings_dict(),
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


#: Identities one claim statement looks at, in the caller's order (a ``CASE`` ranks them).
_CLAIM_CHUNK = 128


def _chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


__all__ = ["MissEvent", "PlanStatus", "Registry", "worker_id"]
