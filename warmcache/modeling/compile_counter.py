"""Count what torch.compile did inside a region: graphs traced, Inductor cache hits and misses.

"No compile in production" means no backend compile: no new Dynamo graph once
buckets are loaded and no Inductor FX-graph cache miss. These counters are
process-global, so a region's count is the difference before/after.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import TracebackType


def _snapshot() -> tuple[int, int, int]:
    from torch._dynamo.utils import counters

    return (
        int(counters["stats"]["unique_graphs"]),
        int(counters["inductor"]["fxgraph_cache_hit"]),
        int(counters["inductor"]["fxgraph_cache_miss"]),
    )


@dataclass
class CompileCounter:
    """``with CompileCounter() as c: ...`` then read ``c.graphs``, ``c.cache_hits``, ``c.cache_misses``."""

    graphs: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    _start: tuple[int, int, int] = (0, 0, 0)

    def __enter__(self) -> CompileCounter:
        self._start = _snapshot()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.update()

    def update(self) -> None:
        """Refresh the counts so far (also usable inside the region)."""
        now = _snapshot()
        self.graphs, self.cache_hits, self.cache_misses = (n - s for n, s in zip(now, self._start))
