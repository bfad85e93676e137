"""The registry of compiled shapes: typed ORM, schema revisions and the Registry facade."""

from warmcache.registry.records import ArtifactRef, ShapeRecord
from warmcache.registry.registry import MissEvent, PlanStatus, Registry, worker_id

__all__ = ["ArtifactRef", "MissEvent", "PlanStatus", "Registry", "ShapeRecord", "worker_id"]
