"""Fill a registry as if a warmup had compiled every planned shape: for tests and benchmarks.

Rows go through the registry's real claim -> mark_compiled path (no torch involved), so
what a test or benchmark reads is what a warmup would have written.
"""

from __future__ import annotations

from collections.abc import Sequence

from warmcache.identity.plan import PlannedShape
from warmcache.registry import Registry


def mark_all_compiled(
    url: str, planned: Sequence[PlannedShape], *, worker: str = "test", compile_seconds: float = 0.5
) -> None:
    with Registry.open(url) as registry:
        registry.ensure_pending(planned)
        while (row := registry.claim([p.identity for p in planned], worker, 60)) is not None:
            registry.mark_compiled(row.id, worker, compile_seconds=compile_seconds, graphs_compiled=1)
