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
    identities = [p.identity for p in planned]
    with Registry.open(url) as registry:
        registry.ensure_pending(planned)
        # Claimed in batches and recorded in one transaction: a claim at a time, each its own commit, took 28 s for
        # 1000 shapes (each claim scans the list from its start).
        with registry.together():
            while rows := registry.claim_batch(identities, worker, 60, len(identities)):
                for row in rows:
                    registry.mark_compiled(row.id, worker, compile_seconds=compile_seconds, graphs_compiled=1)
