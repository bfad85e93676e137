"""The registry's tables, in SQLAlchemy 2.0's typed declarative style.

The schema changes only through Alembic revisions in ``migrations/``; these
classes describe the head revision and must match it (a test compares them).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    column,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.types import TypeDecorator

from warmcache.registry.statuses import STORED_STATUSES, Status

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
}


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class UTCDateTime(TypeDecorator[dt.datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite drops the zone)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Any) -> dt.datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("naive datetime given to the registry; use UTC-aware datetimes")
        return value.astimezone(dt.UTC) if value is not None else None

    def process_result_value(self, value: dt.datetime | None, dialect: Any) -> dt.datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=dt.UTC)
        return value


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class CompiledShape(Base):
    """One compiled shape: a declared shape × model config × toolchain."""

    __tablename__ = "compiled_shapes"
    __table_args__ = (
        Index("ix_compiled_shapes_family", "model_name", "workload", "dtype"),
        # The database refuses a status no query would recognise (migration 0003).
        CheckConstraint(column("status").in_([str(s) for s in STORED_STATUSES]), name="status"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    identity: Mapped[str] = mapped_column(String(64), unique=True)
    shape_hash: Mapped[str] = mapped_column(String(64), index=True)
    model_name: Mapped[str] = mapped_column(String(200))
    model_path: Mapped[str] = mapped_column(Text)
    model_revision: Mapped[str | None] = mapped_column(String(200))
    config_hash: Mapped[str] = mapped_column(String(64))
    #: The attention implementation the manifest declared (``None``: transformers' default); part of the identity
    #: (migration 0004).
    attn_implementation: Mapped[str | None] = mapped_column(String(64))
    toolchain_hash: Mapped[str] = mapped_column(String(64), index=True)
    toolchain: Mapped[dict[str, Any]] = mapped_column(JSON)
    workload: Mapped[str] = mapped_column(String(16))
    settings: Mapped[dict[str, Any]] = mapped_column(JSON)
    batch_size: Mapped[int] = mapped_column(Integer)
    seq_len: Mapped[int] = mapped_column(Integer)
    max_cache_len: Mapped[int | None] = mapped_column(Integer)
    dtype: Mapped[str] = mapped_column(String(16))
    device: Mapped[str] = mapped_column(String(16))
    backend: Mapped[str] = mapped_column(String(32))
    mode: Mapped[str] = mapped_column(String(32))
    tp_size: Mapped[int] = mapped_column(Integer, default=1)
    fsdp_size: Mapped[int] = mapped_column(Integer, default=1)
    status: Mapped[str] = mapped_column(String(16), index=True, default=Status.PENDING)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    claimed_by: Mapped[str | None] = mapped_column(String(200))
    lease_expires_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    host: Mapped[str | None] = mapped_column(String(200))
    #: The compile-cache folder the artifacts live in, as the compiling host saw it. A row
    #: proves nothing about another folder: doctor forgets rows only for their own cache.
    cache_root: Mapped[str | None] = mapped_column(Text)
    compile_seconds: Mapped[float | None] = mapped_column(Float)
    graphs_compiled: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow, onupdate=utcnow)
    compiled_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    verified_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())

    artifacts: Mapped[list[Artifact]] = relationship(
        back_populates="shape", cascade="all, delete-orphan", passive_deletes=True
    )


class Artifact(Base):
    """A compile-cache entry a compiled shape produced or used (Inductor key, NEFF module dir)."""

    __tablename__ = "artifacts"
    __table_args__ = (UniqueConstraint("shape_id", "kind", "path", name="uq_artifacts_shape_kind_path"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    shape_id: Mapped[int] = mapped_column(ForeignKey("compiled_shapes.id", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(String(32))
    path: Mapped[str] = mapped_column(Text)
    size_bytes: Mapped[int | None] = mapped_column(BigInteger)

    shape: Mapped[CompiledShape] = relationship(back_populates="artifacts")


class ShapeMiss(Base):
    """Requests the runtime guard padded or refused, aggregated per flush."""

    __tablename__ = "shape_misses"
    __table_args__ = (Index("ix_shape_misses_family", "model_name", "workload"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model_name: Mapped[str] = mapped_column(String(200))
    workload: Mapped[str] = mapped_column(String(16))
    dtype: Mapped[str] = mapped_column(String(16))
    tp_size: Mapped[int] = mapped_column(Integer, default=1)
    fsdp_size: Mapped[int] = mapped_column(Integer, default=1)
    batch_size: Mapped[int] = mapped_column(Integer)
    seq_len: Mapped[int] = mapped_column(Integer)
    decision: Mapped[str] = mapped_column(String(16))
    padded_batch: Mapped[int | None] = mapped_column(Integer)
    padded_seq: Mapped[int | None] = mapped_column(Integer)
    count: Mapped[int] = mapped_column(Integer, default=1)
    host: Mapped[str | None] = mapped_column(String(200))
    recorded_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)
