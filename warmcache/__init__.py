"""warmcache: compile once, never in production.

The public API. Importing it stays cheap (no torch, no transformers, no manifest
parser): every name but the errors is imported on first use through ``__getattr__``,
so a serving process that asks for ``ShapeGuard`` alone pays for none of the planning
side (manifest parsing, bucket suggestion, compile identities).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from warmcache.errors import (
    CacheError,
    ManifestError,
    RegistryError,
    SchemaOutOfDateError,
    TargetUnavailableError,
    UnseenShapeError,
    UsageError,
    WarmcacheError,
)

if TYPE_CHECKING:
    from warmcache.buckets import LengthDistribution, Traffic, suggest_buckets
    from warmcache.identity.plan import PlannedShape, plan_manifest
    from warmcache.manifest import Manifest, ModelSpec, load_manifest
    from warmcache.registry.records import ShapeRecord
    from warmcache.registry.registry import Registry
    from warmcache.shapes import BucketTable, Decision, ShapeFamily, ShapeSpec

#: Names served lazily: ``name -> module``.
_LAZY: dict[str, str] = {
    "LengthDistribution": "warmcache.buckets",
    "Traffic": "warmcache.buckets",
    "suggest_buckets": "warmcache.buckets",
    "PlannedShape": "warmcache.identity.plan",
    "plan_manifest": "warmcache.identity.plan",
    "Manifest": "warmcache.manifest",
    "ModelSpec": "warmcache.manifest",
    "load_manifest": "warmcache.manifest",
    "ShapeRecord": "warmcache.registry.records",
    "BucketTable": "warmcache.shapes",
    "Decision": "warmcache.shapes",
    "ShapeFamily": "warmcache.shapes",
    "ShapeSpec": "warmcache.shapes",
    "Registry": "warmcache.registry.registry",  # SQLAlchemy and Alembic load with it
    # These import torch when used.
    "WarmupOptions": "warmcache.warmup.runner",
    "run_warmup": "warmcache.warmup.runner",
    "run_verify": "warmcache.warmup.verify",
    "ShapeGuard": "warmcache.runtime.guard",
    "serve_from_mount": "warmcache.runtime.mounted",
    "MountedModel": "warmcache.runtime.mounted",
    "locate_caches": "warmcache.cache.locate",
    "scan_cache": "warmcache.cache.inventory",
    "pack_bundle": "warmcache.shipping.bundle",
    "unpack_bundle": "warmcache.shipping.unbundle",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'warmcache' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "BucketTable",
    "CacheError",
    "Decision",
    "LengthDistribution",
    "Manifest",
    "ManifestError",
    "ModelSpec",
    "PlannedShape",
    "Registry",
    "RegistryError",
    "SchemaOutOfDateError",
    "ShapeFamily",
    "ShapeRecord",
    "ShapeSpec",
    "TargetUnavailableError",
    "Traffic",
    "UnseenShapeError",
    "UsageError",
    "WarmcacheError",
    "load_manifest",
    "plan_manifest",
    "suggest_buckets",
    *_LAZY,
]
