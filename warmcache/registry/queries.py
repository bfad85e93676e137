"""The Registry's row queries: rows by filter, one at a time, done shapes' artifact paths, a plan's status.

Read-only, each in one transaction; long lists of identities or shape hashes are
asked in chunks, so a statement never names more values than a database accepts.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from sqlalchemy import ColumnElement, Select, select
from sqlalchemy.orm import selectinload

from warmcache.identity.plan import PlannedShape
from warmcache.registry.models import Artifact, CompiledShape
from warmcache.registry.records import ShapeRecord
from warmcache.registry.statuses import DONE_STATUSES, Status
from warmcache.registry.transactional import Transactional, chunks


@dataclass(frozen=True, slots=True)
class PlanStatus:
    """A planned shape with what the registry knows about it."""

    planned: PlannedShape
    status: str
    record: ShapeRecord | None


@dataclass(frozen=True, slots=True)
class CompileTime:
    """One recorded compile time: what a fleet orders its claims by (longest first)."""

    shape_hash: str
    model: str
    workload: str
    seconds: float
    updated_at: dt.datetime


class RowQueries(Transactional):
    """The Registry's reads of compiled-shape rows (a base class of :class:`~warmcache.registry.registry.Registry`)."""

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
                for chunk in chunks(list(values), 2000):
                    out.extend(
                        ShapeRecord.from_row(r, with_artifacts) for r in session.scalars(query.where(column.in_(chunk)))
                    )
            return out

    def model_names(self) -> list[str]:
        """Every model name the registry has rows of, sorted: what a mistyped ``--model`` is matched against."""
        with self.session() as session:
            names = session.scalars(select(CompiledShape.model_name).distinct().order_by(CompiledShape.model_name))
            return list(names)

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
        query = (
            select(CompiledShape.identity, Artifact.path)
            .outerjoin(Artifact, Artifact.shape_id == CompiledShape.id)
            .where(CompiledShape.status.in_(list(DONE_STATUSES)))
        )
        with self.session() as session:
            for chunk in chunks(list(identities), 2000):
                for identity, path in session.execute(query.where(CompiledShape.identity.in_(chunk))):
                    paths = out.setdefault(identity, [])
                    if path is not None:
                        paths.append(path)
        return out

    def compile_times(self, models: Sequence[str]) -> list[CompileTime]:
        """Every recorded compile time of ``models``' rows, on any toolchain or config: plain column reads."""
        if not models:
            return []
        query = select(
            CompiledShape.shape_hash,
            CompiledShape.model_name,
            CompiledShape.workload,
            CompiledShape.compile_seconds,
            CompiledShape.updated_at,
        ).where(CompiledShape.model_name.in_(list(models)), CompiledShape.compile_seconds.is_not(None))
        with self.session() as session:
            return [
                CompileTime(shape, model, workload, seconds, updated)
                for shape, model, workload, seconds, updated in session.execute(query)
                if seconds is not None
            ]

    def unfinished(self, identities: Sequence[str]) -> set[str]:
        """Those of ``identities`` whose row is ``pending`` or ``compiling``.

        Asked by a fleet worker that reached the end of its list: then few rows of the
        whole registry are unfinished, so a long list is answered by reading those
        through the status index and matching them here. Asking about each of 10,000
        identities instead took 5 statements of 2,000 values per worker, from 256
        workers at once in a run's last seconds. A short list (a waiting worker's
        next look) is asked about directly, whatever else the registry holds.
        """
        wanted = set(identities)
        query = select(CompiledShape.identity).where(CompiledShape.status.in_([Status.PENDING, Status.COMPILING]))
        if len(wanted) <= _ASKED_ONE_BY_ONE:
            query = query.where(CompiledShape.identity.in_(sorted(wanted)))
        with self.session() as session:
            return {identity for identity in session.scalars(query) if identity in wanted}

    def plan_status(self, planned: Sequence[PlannedShape]) -> list[PlanStatus]:
        """Each planned shape's status: its own row's, ``stale`` if only other toolchains/configs have it, else
        ``missing``."""
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


def _rows_query(model: str | None, workload: str | None, statuses: Sequence[str] | None) -> Select[CompiledShape]:
    """Rows matching the filters given, in :meth:`Registry.rows`' stable order."""
    conditions: list[ColumnElement[bool]] = []
    if model is not None:
        conditions.append(CompiledShape.model_name == model)
    if workload is not None:
        conditions.append(CompiledShape.workload == workload)
    if statuses is not None:
        conditions.append(CompiledShape.status.in_(list(statuses)))
    order = (
        CompiledShape.model_name,
        CompiledShape.workload,
        CompiledShape.batch_size,
        CompiledShape.seq_len,
        CompiledShape.id,
    )
    return select(CompiledShape).where(*conditions).order_by(*order)


#: Identities :meth:`RowQueries.unfinished` names in its statement; a longer list is matched against the unfinished
#: rows.
_ASKED_ONE_BY_ONE = 2000
