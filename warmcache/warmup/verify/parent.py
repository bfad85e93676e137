"""Prove a warm cache serves: replay every compiled spec in a fresh process, count compiles.

"No compile in production" means no *backend* compile: a fresh process always
traces with Dynamo (and ``fail_on_recompile`` raises even when the cache would
serve the call), so verify counts Inductor FX-graph cache misses and new cache
entries, not traces. Per target:

* Inductor: verified iff the replay had ``fxgraph_cache_miss == 0`` and wrote no
  new cache entry.
* Neuron: verified iff the replay wrote no new cache entry (no new NEFF).
* eager / aot_eager keep no persistent cache: there is nothing on disk a fresh
  process could load, so nothing to prove. Their replay still runs (it must not
  fail) and its Dynamo graph count is reported, but the rows stay ``compiled``
  rather than being promoted to ``verified``.

The replay runs in a child process (:mod:`warmcache.warmup.child`) so that
nothing of the warmup or of the caller's process (Dynamo's in-memory caches,
loaded kernels) can make a spec look warm. It reports each spec's measurements
as a :class:`~warmcache.warmup.verify.messages.ReplayResult` as soon as it has them
(:mod:`.replayer`); the verdicts are judged here, in the parent (:mod:`.verdicts`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from warmcache.errors import WarmcacheError
from warmcache.identity.plan import PlannedShape, plan_manifest
from warmcache.manifest import Manifest
from warmcache.registry import Registry
from warmcache.registry.statuses import DONE_STATUSES
from warmcache.settings import RegistryLocation
from warmcache.units import format_count
from warmcache.warmup import distributed
from warmcache.warmup.child import Launch, run_children, sigterm_as_interrupt
from warmcache.warmup.phases import PhaseListener, PhaseReport, routed
from warmcache.warmup.progress import Progress
from warmcache.warmup.verify.messages import ReplayRequest, ReplayResult
from warmcache.warmup.verify.verdicts import SpecVerdict, Verdict, VerifySummary, judge


def run_verify(
    manifest: Manifest,
    location: RegistryLocation,
    cache_dir: str | None = None,
    progress: Callable[[int], Progress[SpecVerdict]] | None = None,
) -> VerifySummary:
    """Replay the manifest's compiled specs in a fresh process and record what it proves.

    ``progress(total)`` is told each spec's phases as its replay runs, and its verdict as the replay finishes.

    :param manifest: the shapes to verify; those not compiled for this toolchain are listed as such.
    :param location: the registry the compiled rows are read from and the verdicts recorded in (never created).
    :param cache_dir: the compile cache the replays read (default: each target's own folder).
    :param progress: called once with the number of compiled specs; ``None`` shows nothing.
    :returns: a verdict per compiled spec; its ``exit_code`` is non-zero if any recompiled, was disproven or failed.
    """
    start = time.perf_counter()
    summary = VerifySummary()
    # Never creates one: a registry that is not there holds nothing compiled to verify.
    with Registry.open(location, create=False) as registry:
        statuses = registry.plan_status(plan_manifest(manifest))
        summary.not_compiled = [s.planned.spec.describe() for s in statuses if s.status not in DONE_STATUSES]
        compiled = [s.planned for s in statuses if s.status in DONE_STATUSES]
        if compiled:
            bar = progress(len(compiled)) if progress else None
            by_identity = {p.identity: p for p in compiled}
            verdicts: dict[str, SpecVerdict] = {}

            def record(result: ReplayResult) -> None:
                planned = by_identity.get(result.identity)
                if planned is not None:
                    verdicts[result.identity] = judge(result.identity, planned.spec.describe(), result)
                    if bar:
                        bar.advance(verdicts[result.identity])

            try:
                with sigterm_as_interrupt():  # a cancelled CI job stops the replay (a torchrun too), not just us
                    _replay_in_fresh_processes(
                        manifest, compiled, cache_dir, location, record, bar.phase if bar else None
                    )
            finally:
                if bar:
                    bar.close()
            summary.verdicts = [
                verdicts.get(p.identity) or judge(p.identity, p.spec.describe(), None) for p in compiled
            ]
            registry.mark_verified([v.identity for v in summary.verdicts if v.verdict == Verdict.VERIFIED])
            # A replay that compiled proves the cache wrong, a disproven artifact the artifact. A replay
            # that crashed or never ran (the process died) proves nothing: report it, keep the row.
            for verdict in summary.verdicts:
                if verdict.verdict.demotes:
                    registry.mark_unverified([verdict.identity], f"verify: {verdict.reason}")
    summary.seconds = time.perf_counter() - start
    return summary


def _replay_in_fresh_processes(
    manifest: Manifest,
    compiled: list[PlannedShape],
    cache_dir: str | None,
    location: RegistryLocation,
    record: Callable[[ReplayResult], None],
    on_phase: PhaseListener | None,
) -> None:
    """Replay ``compiled``: single-process specs in one fresh process, sharded ones under a torchrun of their world
    size, as they were warmed.

    A replay process that stops early (a crash, a torchrun that never formed)
    leaves its remaining specs ``replay-failed`` with its error as the reason, so
    the verdicts of every other replay are still recorded. Only when no replay
    reported anything is its error raised, with its own exit code.
    """
    replayed: set[str] = set()

    def receive(result: ReplayResult) -> None:
        replayed.add(result.identity)
        record(result)

    stopped: list[tuple[list[PlannedShape], WarmcacheError]] = []
    single, sharded = distributed.split_by_world_size(compiled)
    for nproc, group in sorted({1: single, **sharded}.items()):
        if not group:
            continue
        request = ReplayRequest(str(manifest.path), tuple(p.identity for p in group), cache_dir, location)
        launch = Launch(f"verify's replay ({format_count(nproc, 'rank')})", distributed.child_command(nproc), request)
        (ended,) = run_children([launch], [ReplayResult, PhaseReport], routed(receive, on_phase))
        if (error := ended.error()) is not None:
            stopped.append((group, error))
    if stopped and not replayed:
        raise stopped[0][1]
    for group, error in stopped:
        for planned in group:
            if planned.identity not in replayed:
                record(ReplayResult(planned.identity, error=f"the replay stopped before this spec: {error}"))
