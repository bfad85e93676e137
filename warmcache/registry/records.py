"""Plain, frozen views of registry rows, safe to pass around after the session closes.

This module imports no SQLAlchemy (the ORM only for type checking): a guard built
from a snapshot file uses these records without loading the database layer.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import types
import typing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from warmcache.bounds import MAX_COUNT
from warmcache.errors import UsageError
from warmcache.shapes import ShapeFamily, ShapeSpec
from warmcache.shapes.workload_settings import from_stored

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

    def out_of_range(self) -> str | None:
        """The first count or size outside what an ``Integer`` column holds on both backends, or ``None``."""
        for name in ("batch_size", "seq_len", "padded_batch", "padded_seq", "count", "tp_size", "fsdp_size"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= MAX_COUNT:
                return name
        return None

    def check_range(self) -> None:
        """Refuse a count or size outside what the registry holds (checked before any write)."""
        name = self.out_of_range()
        if name is not None:
            raise UsageError(
                f"miss report {self.model_name}: {name} {getattr(self, name)} is outside what the "
                f"registry holds (0 to {MAX_COUNT}); refused"
            )


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
    attn_implementation: str | None
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
        values = {name: getattr(row, name) for name in COLUMNS}
        values["toolchain"], values["settings"] = dict(row.toolchain), dict(row.settings)  # detached copies
        return cls(**values, artifacts=tuple(ArtifactRef.from_row(a) for a in row.artifacts) if with_artifacts else ())

    @property
    def family(self) -> ShapeFamily:
        settings = from_stored(self.workload, self.settings, self.max_cache_len, f"registry row {self.identity}")
        return ShapeFamily(
            model=self.model_name, dtype=self.dtype, settings=settings, tp_size=self.tp_size, fsdp_size=self.fsdp_size
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


def _columns() -> dict[str, tuple[type, bool]]:
    """Each column of a row (every :class:`ShapeRecord` field but ``artifacts``): its Python type, and whether it may
    be ``None``."""
    hints = typing.get_type_hints(ShapeRecord)
    columns: dict[str, tuple[type, bool]] = {}
    for field in dataclasses.fields(ShapeRecord):
        if field.name == "artifacts":
            continue
        hint = hints[field.name]
        members = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
        (kind,) = [m for m in members if m is not type(None)]
        columns[field.name] = (typing.get_origin(kind) or kind, type(None) in members)
    return columns


#: Columns added after bundles and guard snapshots were first written, with the value a document
#: written before them means (NULL attention implementation: transformers' default, migration 0004).
ADDED_COLUMNS: dict[str, Any] = {"attn_implementation": None}

#: The registry row's columns, in order, derived from :class:`ShapeRecord`: what ``from_row`` copies,
#: what bundles carry and check (``shipping/bundle_rows.py``). The ORM model must match it (a test checks).
COLUMNS: dict[str, tuple[type, bool]] = _columns()
