"""Plain, frozen views of registry rows, safe to pass around after the session closes.

This module imports no SQLAlchemy (the ORM only for type checking): a guard built
from a snapshot file uses these records without loading the database layer.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from warmcache.shapes import ShapeFamily, ShapeSpec

if TYPE_CHECKING:
    from warmcache.registry.models import Artifact, CompiledShape


@dataclass(frozen=True, slots=True)
class MissEvent:
    """One aggregated guard decision that was not an exact hit."""

    model_name: str
    workload: str
    dtype: str
    batch_size: int
    seq_len: int
    decision: str
    padded_batch: int | None = None
    padded_seq: int | None = None
    count: int = 1
    tp_size: int = 1
    fsdp_size: int = 1


@dataclass(frozen=True, slots=True)
class ArtifactRef:
    """A compile-cache entry, by kind and path relative to its cache root."""

    kind: str
    path: str
    size_bytes: int | None = None

    @classmethod
    def from_row(cls, row: Artifact) -> ArtifactRef:
        return cls(kind=row.kind, path=row.path, size_bytes=row.size_bytes)


@dataclass(frozen=True, slots=True)
class ShapeRecord:
    """One registry row, detached from the database."""

    id: int
    identity: str
    shape_hash: str
    model_name: str
    model_path: str
    model_revision: str | None
    config_hash: str
    toolchain_hash: str
    toolchain: dict[str, Any]
    workload: str
    settings: dict[str, Any]
    batch_size: int
    seq_len: int
    max_cache_len: int | None
    dtype: str
    device: str
    backend: str
    mode: str
    tp_size: int
    fsdp_size: int
    status: str
    attempts: int
    claimed_by: str | None
    lease_expires_at: dt.datetime | None
    host: str | None
    cache_root: str | None
    compile_seconds: float | None
    graphs_compiled: int | None
    error: str | None
    created_at: dt.datetime
    updated_at: dt.datetime
    compiled_at: dt.datetime | None
    verified_at: dt.datetime | None
    artifacts: tuple[ArtifactRef, ...] = ()

    @classmethod
    def from_row(cls, row: CompiledShape, with_artifacts: bool = False) -> ShapeRecord:
        return cls(
            id=row.id,
            identity=row.identity,
            shape_hash=row.shape_hash,
            model_name=row.model_name,
            model_path=row.model_path,
            model_revision=row.model_revision,
            config_hash=row.config_hash,
            toolchain_hash=row.toolchain_hash,
            toolchain=dict(row.toolchain),
            workload=row.workload,
            settings=dict(row.settings),
            batch_size=row.batch_size,
            seq_len=row.seq_len,
            max_cache_len=row.max_cache_len,
            dtype=row.dtype,
            device=row.device,
            backend=row.backend,
            mode=row.mode,
            tp_size=row.tp_size,
            fsdp_size=row.fsdp_size,
            status=row.status,
            attempts=row.attempts,
            claimed_by=row.claimed_by,
            lease_expires_at=row.lease_expires_at,
            host=row.host,
            cache_root=row.cache_root,
            compile_seconds=row.compile_seconds,
            graphs_compiled=row.graphs_compiled,
            error=row.error,
            created_at=row.created_at,
            updated_at=row.updated_at,
            compiled_at=row.compiled_at,
            verified_at=row.verified_at,
            artifacts=tuple(ArtifactRef.from_row(a) for a in row.artifacts) if with_artifacts else (),
        )

    @property
    def family(self) -> ShapeFamily:
        return ShapeFamily(
            model=self.model_name,
            workload=self.workload,  # type: ignore[arg-type]
            dtype=self.dtype,
            max_cache_len=self.max_cache_len,
            tp_size=self.tp_size,
            fsdp_size=self.fsdp_size,
            settings=tuple(sorted(self.settings.items())),
        )

    @property
    def spec(self) -> ShapeSpec:
        return ShapeSpec(self.family, self.batch_size, self.seq_len)

    def as_json(self) -> dict[str, Any]:
        """The row as JSON-able data for ``--json`` output."""
        out: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if isinstance(value, dt.datetime):
                value = value.isoformat()
            elif name == "artifacts":
                value = [{"kind": a.kind, "path": a.path, "size_bytes": a.size_bytes} for a in value]
            out[name] = value
        out["model"] = self.model_name
        return out
