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
as a :class:`ReplayResult` as soon as it has them; the verdicts are judged here.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from warmcache.errors import DecodeRecompileError, WarmcacheError, error_line
from warmcache.manifest import Manifest, load_manifest
from warmcache.plan import PlannedShape, plan_manifest
from warmcache.registry import Registry
from warmcache.statuses import DONE_STATUSES
from warmcache.units import format_count
from warmcache.warmup import distributed
from warmcache.warmup.child import Launch, run_children, sigterm_as_interrupt
from warmcache.warmup.progress import Progress

if TYPE_CHECKING:
    from warmcache.warmup.worker import Worker


class Verdict(StrEnum):
    """What one spec's replay proves (reported by verify, never stored: rows keep their :class:`~warmcache.statuses.Status`)."""

    VERIFIED = "verified"
    """Loaded from the cache: no backend compile, no new entry. The row becomes ``verified``."""
    RECOMPILED = "recompiled"
    """The replay compiled: production would too. The row goes back to ``failed``."""
    REPLAY_ONLY = "replay-only"
    """The backend keeps no persistent cache, so there is nothing to prove; the row stays ``compiled``."""
    REPLAY_FAILED = "replay-failed"
    """The replay raised or never ran: it proves nothing either way; the row is kept."""

    @property
    def failed(self) -> bool:
        return self in (Verdict.RECOMPILED, Verdict.REPLAY_FAILED)


@dataclass(frozen=True, slots=True)
class ReplayRequest:
    """What the replay process is asked: replay these specs of the manifest, each once."""

    manifest: str
    identities: tuple[str, ...]
    cache_dir: str | None
    registry_url: str | None


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """What one spec's replay measured (the replay process's message), or why it could not."""

    identity: str
    seconds: float = 0.0
    graphs: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    new_entries: tuple[str, ...] = ()
    persistent_cache: bool = False
    error: str | None = None
    """The replay raised: it proves nothing either way."""
    recompiled: str | None = None
    """A decode step after the first compiled again: no cache can make that shape warm."""
    precompiled_error: str | None = None
    """The row's precompiled artifact failed its proof."""


@dataclass(frozen=True, slots=True)
class SpecVerdict:
    identity: str
    description: str
    verdict: Verdict
    graphs: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    new_entries: tuple[str, ...] = ()
    reason: str | None = None
    seconds: float = 0.0

    @property
    def failed(self) -> bool:
        return self.verdict.failed

    def message(self) -> str:
        """The progress line's text: the verdict and why, or what the replay measured."""
        if self.reason and self.verdict != Verdict.REPLAY_ONLY:
            return f"{self.verdict}: {self.reason}"
        measured = f"{self.cache_misses} cache misses, {self.cache_hits} hits, {format_count(self.graphs, 'graph')} traced in {self.seconds:.1f}s"
        return f"{self.verdict} ({measured})"

    def as_json(self) -> dict[str, Any]:
        return {
            "identity": self.identity,
            "spec": self.description,
            "verdict": self.verdict,
            "graphs_traced": self.graphs,
            "cache_hits": self.cache_hits,
            "cache_misses": self.cache_misses,
            "new_entries": list(self.new_entries),
            "reason": self.reason,
        }


@dataclass
class VerifySummary:
    verdicts: list[SpecVerdict] = field(default_factory=list)
    not_compiled: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def count(self, verdict: Verdict) -> int:
        return sum(1 for v in self.verdicts if v.verdict == verdict)

    @property
    def exit_code(self) -> int:
        """1 if anything recompiled, failed to replay, or was never compiled."""
        bad = sum(1 for v in self.verdicts if v.failed) + len(self.not_compiled)
        return 1 if bad else 0

    def as_json(self) -> dict[str, Any]:
        return {
            "ok": self.exit_code == 0,
            "verified": self.count(Verdict.VERIFIED),
            "recompiled": self.count(Verdict.RECOMPILED),
            "replay_failed": self.count(Verdict.REPLAY_FAILED),
            "replay_only": self.count(Verdict.REPLAY_ONLY),
            "not_compiled": self.not_compiled,
            "seconds": round(self.seconds, 3),
            "specs": [v.as_json() for v in self.verdicts],
        }

    def lines(self) -> list[str]:
        out = [f"{v.verdict}: {v.description}: {v.reason}" for v in self.verdicts if v.failed]
        out += [f"not compiled: {d} (run warmcache warmup first)" for d in self.not_compiled]
        if self.count(Verdict.REPLAY_ONLY):
            out.append(
                f"{self.count(Verdict.REPLAY_ONLY)} spec(s) use a backend with no persistent cache (eager/aot_eager): "
                "replayed without error, nothing on disk to verify; left as compiled"
            )
        out.append(
            f"verify: {self.count(Verdict.VERIFIED)} verified, {self.count(Verdict.RECOMPILED)} recompiled, "
            f"{self.count(Verdict.REPLAY_FAILED)} failed to replay, {len(self.not_compiled)} not compiled in {self.seconds:.1f}s"
        )
        return out


def run_verify(manifest: Manifest, registry_url: str, cache_dir: str | None = None, progress: Callable[[int], Progress[SpecVerdict]] | None = None) -> VerifySummary:
    """Replay the manifest's compiled specs in a fresh process and record what it proves.

    ``progress(total)`` is told each spec's verdict as its replay finishes.
    """
    start = time.perf_counter()
    summary = VerifySummary()
    with Registry.open(registry_url) as registry:
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
                    _replay_in_fresh_processes(manifest, compiled, cache_dir, registry_url, record)
            finally:
                if bar:
                    bar.close()
            summary.verdicts = [verdicts.get(p.identity) or judge(p.identity, p.spec.describe(), None) for p in compiled]
            registry.mark_verified([v.identity for v in summary.verdicts if v.verdict == Verdict.VERIFIED])
            # Only a replay that compiled proves the cache wrong. A replay that crashed or
            # never ran (the process died) proves nothing: report it, keep the row.
            for verdict in summary.verdicts:
                if verdict.verdict == Verdict.RECOMPILED:
                    registry.mark_unverified([verdict.identity], f"verify: {verdict.reason}")
    summary.seconds = time.perf_counter() - start
    return summary


def judge(identity: str, description: str, result: ReplayResult | None) -> SpecVerdict:
    """Turn one replay's measurements into a verdict."""
    if result is None:
        return SpecVerdict(identity, description, Verdict.REPLAY_FAILED, reason="the replay process stopped before this spec")
    if result.error:
        return SpecVerdict(identity, description, Verdict.REPLAY_FAILED, reason=result.error, seconds=result.seconds)
    if result.recompiled:
        return SpecVerdict(identity, description, Verdict.RECOMPILED, reason=result.recompiled, seconds=result.seconds)
    measured = functools.partial(
        SpecVerdict, identity, description, graphs=result.graphs, cache_hits=result.cache_hits, cache_misses=result.cache_misses, seconds=result.seconds
    )
    if result.precompiled_error:
        return measured(Verdict.REPLAY_FAILED, reason=result.precompiled_error)
    if not result.persistent_cache:
        return measured(Verdict.REPLAY_ONLY, reason="backend keeps no persistent cache")
    if result.cache_misses or result.new_entries:
        reason = f"{result.cache_misses} cache miss(es), {len(result.new_entries)} new cache entr(ies)"
        if result.new_entries:
            reason += f" (first: {result.new_entries[0]})"
        return measured(Verdict.RECOMPILED, new_entries=result.new_entries, reason=reason)
    return measured(Verdict.VERIFIED)


def _replay_in_fresh_processes(manifest: Manifest, compiled: list[PlannedShape], cache_dir: str | None, registry_url: str, record: Callable[[ReplayResult], None]) -> None:
    """Replay ``compiled``: single-process specs in one fresh process, sharded ones under a torchrun of their world size, as they were warmed.

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
        request = ReplayRequest(str(manifest.path), tuple(p.identity for p in group), cache_dir, registry_url)
        (ended,) = run_children([Launch(f"verify's replay ({format_count(nproc, 'rank')})", distributed.child_command(nproc), request)], [ReplayResult], receive)
        if (error := ended.error()) is not None:
            stopped.append((group, error))
    if stopped and not replayed:
        raise stopped[0][1]
    for group, error in stopped:
        for planned in group:
            if planned.identity not in replayed:
                record(ReplayResult(planned.identity, error=f"the replay stopped before this spec: {error}"))


def replay(request: ReplayRequest, report: Callable[[ReplayResult], None]) -> None:
    """The fresh process: run each spec once through the same Worker warmup used, and measure."""
    from warmcache.warmup.worker import Worker

    manifest = load_manifest(request.manifest)
    by_identity = {p.identity: p for p in plan_manifest(manifest)}
    worker = Worker(manifest, request.cache_dir, precompile=False)
    ranks = distributed.in_torchrun()
    if ranks:
        distributed.init_process_group(by_identity[request.identities[0]].model.device)
    for identity in request.identities:
        planned = by_identity[identity]
        start = time.perf_counter()
        try:
            run = worker.run(planned)
            proof = _prove_precompiled(worker, planned, request.registry_url)
        except DecodeRecompileError as exc:
            result = ReplayResult(identity, time.perf_counter() - start, recompiled=exc.message)
        except Exception as exc:  # a replay that fails is a verdict, not a crash of verify
            result = ReplayResult(identity, time.perf_counter() - start, error=error_line(exc))
        else:
            result = ReplayResult(
                identity,
                time.perf_counter() - start,
                graphs=run.graphs,
                cache_hits=run.cache_hits,
                cache_misses=run.cache_misses,
                new_entries=tuple(sorted(run.new_entries)),
                persistent_cache=run.persistent_cache,
                precompiled_error=proof,
            )
        if ranks:
            result = merge_ranks(distributed.gather_from_ranks(result))
        report(result)  # under torchrun, rank 0's reaches the parent (the others report nowhere)
    if ranks:
        distributed.shutdown()


def _prove_precompiled(worker: Worker, planned: PlannedShape, registry_url: str | None) -> str | None:
    """The row's precompiled artifact, proven after the traced replay (see :mod:`warmcache.warmup.verify_precompiled`)."""
    if not (registry_url and planned.model.precompile and planned.spec.workload == "generate"):
        return None
    from warmcache.warmup.verify_precompiled import prove_artifacts

    with Registry.open(registry_url) as registry:
        (record,) = registry.rows(identities=[planned.identity], with_artifacts=True)
    model, target = worker.model_for(planned)
    return prove_artifacts(model, record, planned.spec, target.compile_config(), worker.cache_root(target))


def merge_ranks(results: list[ReplayResult]) -> ReplayResult:
    """One sharded spec's replay over all its ranks: any rank's error, and every rank's compiles."""
    first = results[0]
    for index, result in enumerate(results):
        if result.error:
            return ReplayResult(first.identity, first.seconds, error=f"rank {index}: {result.error}")
    for index, result in enumerate(results):
        if result.recompiled:
            return ReplayResult(first.identity, first.seconds, recompiled=f"rank {index}: {result.recompiled}")
    return ReplayResult(
        first.identity,
        max(r.seconds for r in results),
        graphs=max(r.graphs for r in results),
        cache_hits=sum(r.cache_hits for r in results),
        cache_misses=sum(r.cache_misses for r in results),
        new_entries=tuple(sorted({e for r in results for e in r.new_entries})),
        persistent_cache=first.persistent_cache,
        precompiled_error=next((f"rank {i}: {r.precompiled_error}" for i, r in enumerate(results) if r.precompiled_error), None),
    )
