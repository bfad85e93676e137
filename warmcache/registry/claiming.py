"""The Registry's claims: take rows under a lease, in the caller's order, and keep the lease alive.

A claim is one ``UPDATE … RETURNING`` whose subquery picks the first claimable
rows of the caller's list (``SELECT … FOR UPDATE SKIP LOCKED`` on PostgreSQL), so
two claimers racing for one row cannot both win and neither waits for the other.
"""

from __future__ import annotations

import datetime as dt
from abc import abstractmethod
from collections.abc import Callable, Sequence

from sqlalchemy import ColumnElement, Select, String, and_, any_, case, func, literal, or_, select, update
from sqlalchemy.dialects.postgresql import ARRAY

from warmcache.registry.models import CompiledShape
from warmcache.registry.records import ShapeRecord
from warmcache.registry.statuses import Status
from warmcache.registry.transactional import Transactional, chunks

#: Identities one SQLite claim statement looks at, in the caller's order (a ``CASE`` ranks them).
_CLAIM_CHUNK = 128


class ClaimRows(Transactional):
    """A part of the Registry: claims and their leases."""

    #: What "now" is for leases; tests move it instead of sleeping.
    clock: Callable[[], dt.datetime]

    @property
    @abstractmethod
    def dialect(self) -> str:
        """``sqlite`` or ``postgresql``: the claim's statement differs."""

    def claim(
        self, identities: Sequence[str], worker: str, lease_seconds: float, *, retry_failed: bool = False
    ) -> ShapeRecord | None:
        """Take the first claimable row among ``identities``, in their order, for ``worker``; ``None`` if none is
        left."""
        records = self.claim_batch(identities, worker, lease_seconds, 1, retry_failed=retry_failed)
        return records[0] if records else None

    def claim_batch(
        self,
        identities: Sequence[str],
        worker: str,
        lease_seconds: float,
        count: int,
        *,
        retry_failed: bool = False,
    ) -> list[ShapeRecord]:
        """Take the first ``count`` claimable rows among ``identities``, in their order, for ``worker``; ``[]`` if none
        is left.

        Claimable: ``pending``, ``compiling`` under an expired lease (its worker died),
        and with ``retry_failed`` also ``failed``. The final update re-checks the
        condition, so two claimers racing for one row cannot both win; PostgreSQL
        additionally skips rows another transaction has locked. The order is the
        caller's (a warmup passes its longest shapes first); a claimer working
        through thousands keeps its place with :class:`warmcache.warmup.claim_queue.ClaimQueue`,
        which asks for several specs at once when they are short.
        """
        if not identities:
            return []
        # SQLite binds each identity twice (the list and the order): a long list takes a few statements.
        for chunk in chunks(list(identities), _CLAIM_CHUNK if self.dialect == "sqlite" else len(identities)):
            now = self.clock()
            claimable = _claimable(now, retry_failed)
            candidates = _first_claimable(chunk, claimable, self.dialect).limit(count).scalar_subquery()
            # One statement: the candidate rows are locked (PostgreSQL) or the database is
            # (SQLite's write transaction), and the update re-checks they are still claimable.
            # PostgreSQL picks them once, as an array (``id = ANY(ARRAY(…))``, then the primary key):
            # ``id IN (…)`` is planned as a semi-join over a scan of the whole table, whose rows
            # a concurrent claim has moved on from, and it then claims nothing.
            picked = (
                CompiledShape.id == any_(func.array(candidates))
                if self.dialect == "postgresql"
                else CompiledShape.id.in_(candidates)
            )
            claim = (
                update(CompiledShape)
                .where(picked, claimable)
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
                rows = session.scalars(claim).all()
            if rows:
                position = {identity: i for i, identity in enumerate(chunk)}
                return sorted((ShapeRecord.from_row(row) for row in rows), key=lambda r: position[r.identity])
        return []

    def renew_lease(self, row_id: int, worker: str, lease_seconds: float) -> bool:
        """Extend a claim; ``False`` means the claim was lost (expired and taken over)."""
        return row_id in self.renew_leases([row_id], worker, lease_seconds)

    def renew_leases(self, row_ids: Sequence[int], worker: str, lease_seconds: float) -> set[int]:
        """Extend claims in one statement; the ids still held (the others were lost: expired and taken over)."""
        now = self.clock()
        with self.session() as session:
            renewed = session.scalars(
                update(CompiledShape)
                .where(
                    CompiledShape.id.in_(row_ids),
                    CompiledShape.claimed_by == worker,
                    CompiledShape.status == Status.COMPILING,
                )
                .values(lease_expires_at=now + dt.timedelta(seconds=lease_seconds), updated_at=now)
                .returning(CompiledShape.id)
                .execution_options(synchronize_session=False)
            )
            return set(renewed)


def _first_claimable(window: list[str], claimable: ColumnElement[bool], dialect: str) -> Select[int]:
    """The ids of the claimable rows among ``window``, in its order (the caller takes the first few).

    On PostgreSQL the window is one array parameter, walked in order through the
    identity index until enough claimable rows turn up (no sort, and a window of
    256 costs what one of 8 does); the rows are locked, skipping those other
    claimers hold. SQLite ranks an ``IN`` list with a ``CASE``.
    """
    if dialect == "postgresql":
        todo = (
            func.unnest(literal(window, ARRAY(String)))
            .table_valued("identity", with_ordinality="position")
            .render_derived()
        )
        joined = select(CompiledShape.id).join(todo, CompiledShape.identity == todo.c.identity).where(claimable)
        return joined.order_by(todo.c.position).with_for_update(of=CompiledShape, skip_locked=True)
    position = case({identity: i for i, identity in enumerate(window)}, value=CompiledShape.identity)
    return select(CompiledShape.id).where(CompiledShape.identity.in_(window), claimable).order_by(position)


def _claimable(now: dt.datetime, retry_failed: bool) -> ColumnElement[bool]:
    options = [
        CompiledShape.status == Status.PENDING,
        and_(CompiledShape.status == Status.COMPILING, CompiledShape.lease_expires_at < now),
    ]
    if retry_failed:
        options.append(CompiledShape.status == Status.FAILED)
    return or_(*options)
