"""Compiled rows that lack the precompiled files their model's route now asks for: warmup warms them again.

A row's identity is its shape, model config, toolchain and attention implementation; the
manifest's ``precompile`` route is not part of it (the compile is the same either way). So
a model warmed with ``precompile = false`` and then switched to ``"aotinductor"`` (or
``true``) reads as compiled, and warmup used to skip it: production then found no package
and was told to warm it again, which did nothing. Warmup now warms such a row again (its
compile is a cache hit; the route's save is the new work), and says why in its plan.
"""

from __future__ import annotations

from collections.abc import Sequence

from warmcache.registry import Registry
from warmcache.registry.registry import PlanStatus
from warmcache.registry.statuses import DONE_STATUSES


def missing_route_files(registry: Registry, statuses: Sequence[PlanStatus]) -> dict[str, str]:
    """``{identity: why}`` of the done rows whose model's precompile route recorded no file of its kind on them."""
    wanted = {
        s.planned.identity: s.planned.model.precompile
        for s in statuses
        if s.status in DONE_STATUSES and s.planned.model.precompile.applies_to(s.planned.spec.workload)
    }
    if not wanted:
        return {}
    gaps = {}
    for record in registry.rows(identities=sorted(wanted), with_artifacts=True):
        route = wanted[record.identity]
        if not any(a.kind == route.artifact_kind for a in record.artifacts):
            gaps[record.identity] = (
                f"{record.model_name}: compiled without the {route.artifacts} its precompile route saves"
            )
    return gaps
