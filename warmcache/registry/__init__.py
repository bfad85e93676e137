"""The registry of compiled shapes: typed ORM, schema revisions and the Registry facade.

The plain records load eagerly; the database layer (SQLAlchemy, Alembic) loads on
first use of ``Registry`` and friends, so code that only reads records (a guard
built from a snapshot) never imports it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from warmcache.registry.records import ArtifactRef, MissEvent, ShapeRecord

if TYPE_CHECKING:
    from warmcache.registry.registry import PlanStatus, Registry, worker_id

_LAZY = {"PlanStatus", "Registry", "worker_id"}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'warmcache.registry' has no attribute {name!r}")
    return getattr(importlib.import_module("warmcache.registry.registry"), name)


__all__ = ["ArtifactRef", "MissEvent", "PlanStatus", "Registry", "ShapeRecord", "worker_id"]
