"""Catch a compile that slips past the guard inside a region that must not compile.

Padding keeps requests on compiled buckets, but something else can still
trigger a compile (a generation setting the guard does not see, a cache entry
that was never shipped). The sentinel is the last line of defence: with the
strict policies it turns Dynamo's ``fail_on_recompile`` stance on, so the
compile raises instead of stalling the request for minutes; with ``warn`` it
lets the compile happen and records it, so it shows up in logs and telemetry.

Measured with torch 2.13: ``fail_on_recompile`` also fires on the *first* call
of a compiled function in a fresh process, even when the persistent cache would
serve it. Enter a strict sentinel only after every bucket has been loaded once
(:meth:`warmcache.runtime.guard.ShapeGuard.prime`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from warmcache.errors import UnseenShapeError, WarmcacheError
from warmcache.modeling.compile_counter import CompileCounter

log = logging.getLogger("warmcache.runtime")

#: How torch words the error ``fail_on_recompile`` raises (a plain RuntimeError).
_RECOMPILE_MESSAGE = "Detected recompile when torch.compile stance is 'fail_on_recompile'"


@dataclass
class SentinelReport:
    """What a guarded region compiled (always 0 graphs under a strict sentinel that did not raise)."""

    label: str
    graphs: int = 0
    cache_misses: int = 0


@contextmanager
def fail_on_recompile(error: Callable[[str], WarmcacheError]) -> Iterator[None]:
    """Dynamo's ``fail_on_recompile`` stance; a compile raises ``error(guard failures)`` instead.

    The guard failures are torch's own words for what changed (for example
    ``cache.layers[0].cumulative_length_int == 32``), so the error names the guard.
    """
    import torch

    try:
        with torch.compiler.set_stance("fail_on_recompile"):
            yield
    except RuntimeError as exc:
        if not str(exc).startswith(_RECOMPILE_MESSAGE):
            raise
        raise error(str(exc).split("triggered by the following guard failure(s):", 1)[-1]) from None


@contextmanager
def recompile_sentinel(policy: str, label: str = "guarded region") -> Iterator[SentinelReport]:
    """Fail (policies ``pad``/``refuse``) or record (policy ``warn``) any compile inside the block.

    ``label`` names the region (a shape, a training step) in the error or the log line.
    """
    report = SentinelReport(label)
    with CompileCounter() as counter:
        if policy == "warn":
            yield report
        else:
            with fail_on_recompile(
                lambda reason: UnseenShapeError(
                    f"{label}: torch.compile would recompile here (policy {policy}); {reason}"
                )
            ):
                yield report
    report.graphs, report.cache_misses = counter.graphs, counter.cache_misses
    if report.graphs or report.cache_misses:
        log.warning("%s compiled %d graph(s), %d Inductor cache miss(es)", label, report.graphs, report.cache_misses)
