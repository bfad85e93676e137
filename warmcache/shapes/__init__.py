"""Compiled shapes: what one is (:mod:`~warmcache.shapes.spec`) and the typed settings of its workload.

The names the rest of warmcache uses are re-exported here; the workload settings are
imported from :mod:`warmcache.shapes.workload_settings`.
"""

from __future__ import annotations

from warmcache.shapes.spec import (
    DTYPE_ALIASES,
    WORKLOADS,
    BucketTable,
    Decision,
    ShapeFamily,
    ShapeSpec,
    canonical_json,
    format_pairs,
    short_hash,
)
from warmcache.shapes.workload_settings import Workload

__all__ = [
    "DTYPE_ALIASES",
    "WORKLOADS",
    "BucketTable",
    "Decision",
    "ShapeFamily",
    "ShapeSpec",
    "canonical_json",
    "format_pairs",
    "Workload",
    "short_hash",
]
