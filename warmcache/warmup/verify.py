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

The replay runs in a subprocess (``python -m warmcache.warmup.verify REQUEST
RESULT``) so that nothing of the warmup or of the caller's process (Dynamo's
in-memory caches, loaded kernels) can make a spec look warm.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from warmcache.errors import DecodeRecompileError, WarmcacheError, error_line
from warmcache.manifest import Manifest, load_manifest
from warmcache.plan import PlannedShape, plan_manifest
from warmcache.registry import Registry
from warmcache.statuses import DONE_STATUSES
from warmcache.warmup import distributed

if TYPE_CHECKING:
    from warmcache.warmup.worker import Worker

VERIFIED = "verified"
RECOMPILED = "recompiled"
REPLAY_ONLY = "replay-only"
REPLAY_FAILED = "replay-failed"
_STDERR_FD = 2


@dataclass(frozen=True, slots=True)
class SpecVerdict:
    identity: str
    description: str
    verdict: str
    graphs: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    new_entries: tuple[str, ...] = ()
    reason: str | None = None

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

    def count(self, verdict: str) -> int:
        return sum(1 for v in self.verdicts if v.verdict == verdict)

    @property
    def exit_code(self) -> int:
        """1 if anything recompiled, failed to replay, or was never compiled."""
        bad = self.count(RECOMPILED) + self.count(REPLAY_FAILED) + len(self.not_compiled)
        return 1 if bad else 0

    def as_json(self) -> dict[str, Any]:
        return {
            "ok": self.exit_code == 0,
            "verified": self.count(VERIFIED),
            "recompiled": self.count(RECOMPILED),
            "replay_failed": self.count(REPLAY_FAILED),
            "replay_only": self.count(REPLAY_ONLY),
            "not_compiled": self.not_compiled,
            "seconds": round(self.seconds, 3),
            "specs": [v.as_json() for v in self.verdicts],
        }

    def lines(self) -> list[str]:
        out = [f"{v.verdict}: {v.description}: {v.reason}" for v in self.verdicts if v.verdict in (RECOMPILED, REPLAY_FAILED)]
        out += [f"not compiled: {d} (run warmcache warmup first)" for d in self.not_compiled]
        if self.count(REPLAY_ONLY):
            out.append(
                f"{self.count(REPLAY_ONLY)} spec(s) use a backend with no persistent cache (eager/aot_eager): "
                "replayed without error, nothing on disk to verify; left as compiled"
            )
        out.append(
            f"verify: {self.count(VERIFIED)} verified, {self.count(RECOMPILED)} recompiled, "
            f"{self.count(REPLAY_FAILED)} failed to replay, {len(self.not_compiled)} not compiled in {self.seconds:.1f}s"
        )
        return out


def run_verify(manifest: Manifest, registry_url: str, cache_dir: str | None = None) -> VerifySummary:
    """Replay the manifest's compiled specs in a fresh process and record what it proves."""
    start = time.perf_counter()
    summary = VerifySummary()
    with Registry.open(registry_url) as registry:
        statuses = registry.plan_status(plan_manifest(manifest))
        summary.not_compiled = [s.planned.spec.describe() for s in statuses if s.status not in DONE_STATUSES]
        compiled = [s.planned for s in statuses if s.status in DONE_STATUSES]
        if compiled:
            # Sharded specs replay under a torchrun of their world size, as they were warmed.
            single, sharded = distributed.split_by_world_size(compiled)
            results: dict[str, dict[str, Any]] = {}
            for nproc, group in sorted({1: single, **sharded}.items()):
                if group:
                    results.update(_replay_in_fresh_process(manifest, [p.identity for p in group], cache_dir, nproc, registry_url))
            summary.verdicts = [judge(p.identity, p.spec.describe(), results.get(p.identity)) for p in compiled]
            registry.mark_verified([v.identity for v in summary.verdicts if v.verdict == VERIFIED])
            # Only a replay that compiled proves the cache wrong. A replay that crashed or
            # never ran (the subprocess died) proves nothing: report it, keep the row.
            for verdict in summary.verdicts:
                if verdict.verdict == RECOMPILED:
                    registry.mark_unverified([verdict.identity], f"verify: {verdict.reason}")
    summary.seconds = time.perf_counter() - start
    return summary


def judge(identity: str, description: str, result: dict[str, Any] | None) -> SpecVerdict:
    """Turn one replay's measurements into a verdict."""
    if result is None:
        return SpecVerdict(identity, description, REPLAY_FAILED, reason="the replay process stopped before this spec")
    if result.get("error"):
        return SpecVerdict(identity, description, REPLAY_FAILED, reason=result["error"])
    if result.get("recompiled"):
        # The decode compiled again at a later position: no cache can make that shape warm.
        return SpecVerdict(identity, description, RECOMPILED, reason=result["recompiled"])
    graphs, hits, misses = (int(result[k]) for k in ("graphs", "cache_hits", "cache_misses"))
    measured = functools.partial(SpecVerdict, identity, description, graphs=graphs, cache_hits=hits, cache_misses=misses)
    if result.get("precompiled_error"):
        return measured(REPLAY_FAILED, reason=result["precompiled_error"])
    new_entries = tuple(result["new_entries"])
    if not result["persistent_cache"]:
        return measured(REPLAY_ONLY, reason="backend keeps no persistent cache")
    if misses or new_entries:
        reason = f"{misses} cache miss(es), {len(new_entries)} new cache entr(ies)"
        if new_entries:
            reason += f" (first: {new_entries[0]})"
        return measured(RECOMPILED, new_entries=new_entries, reason=reason)
    return measured(VERIFIED)


def _replay_in_fresh_process(manifest: Manifest, identities: list[str], cache_dir: str | None, nproc: int = 1, registry_url: str | None = None) -> dict[str, dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="warmcache-verify-") as tmp:
        request, result = Path(tmp) / "request.json", Path(tmp) / "result.json"
        request.write_text(json.dumps({"manifest": str(manifest.path), "identities": identities, "cache_dir": cache_dir, "registry_url": registry_url}))
        # The replay's progress (and anything libraries print) goes to our stderr file
        # descriptor, which works even where sys.stderr is not a real file.
        argv = [str(request), str(result)]
        module = "warmcache.warmup.verify"
        command = [sys.executable, "-m", module, *argv] if nproc == 1 else distributed.torchrun_command(argv, nproc, module=module)
        process = subprocess.run(command, stdout=_STDERR_FD, check=False)
        results: dict[str, dict[str, Any]] = json.loads(result.read_text()) if result.exists() else {}
        if not results and process.returncode:
            raise WarmcacheError(f"verify: the replay process exited with code {process.returncode} before replaying anything")
        return results


def replay(request_path: Path, result_path: Path) -> None:
    """The fresh process: run each spec once through the same Worker warmup used, and measure."""
    from warmcache.warmup.worker import Worker

    request = json.loads(request_path.read_text())
    manifest = load_manifest(request["manifest"])
    wanted = request["identities"]
    by_identity = {p.identity: p for p in plan_manifest(manifest)}
    worker = Worker(manifest, request["cache_dir"], precompile=False)
    ranks = distributed.in_torchrun()
    if ranks:
        distributed.init_process_group(by_identity[wanted[0]].model.device)
    results: dict[str, dict[str, Any]] = {}
    for index, identity in enumerate(wanted, 1):
        planned = by_identity[identity]
        try:
            run = worker.run(planned)
            proof = _prove_precompiled(worker, planned, request.get("registry_url"))
        except DecodeRecompileError as exc:
            results[identity] = {"recompiled": exc.message}
        except Exception as exc:  # a replay that fails is a verdict, not a crash of verify
            results[identity] = {"error": error_line(exc)}
        else:
            results[identity] = {
                "graphs": run.graphs,
                "cache_hits": run.cache_hits,
                "cache_misses": run.cache_misses,
                "new_entries": sorted(run.new_entries),
                "persistent_cache": run.persistent_cache,
                "precompiled_error": proof,
            }
        if ranks:
            results[identity] = merge_ranks(distributed.gather_from_ranks(results[identity]))
            if not distributed.is_registry_writer():
                continue  # rank 0 reports for the group
        outcome = results[identity]
        status = (
            outcome.get("error") or outcome.get("recompiled") or f"{outcome['cache_misses']} cache misses, {outcome['cache_hits']} hits, {outcome['graphs']} graphs traced"
        )
        if outcome.get("precompiled_error"):
            status += f"; {outcome['precompiled_error']}"
        print(f"[{index}/{len(wanted)}] replay {planned.spec.describe()}: {status}", file=sys.stderr, flush=True)
        # Written after every spec, so a crash still leaves the verdicts so far.
        result_path.write_text(json.dumps(results))
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


def merge_ranks(outcomes: list[dict[str, Any]]) -> dict[str, Any]:
    """One sharded spec's replay over all its ranks: any rank's error, and every rank's compiles."""
    for key in ("error", "recompiled"):
        for index, outcome in enumerate(outcomes):
            if outcome.get(key):
                return {key: f"rank {index}: {outcome[key]}"}
    return {
        "graphs": max(o["graphs"] for o in outcomes),
        "cache_hits": sum(o["cache_hits"] for o in outcomes),
        "cache_misses": sum(o["cache_misses"] for o in outcomes),
        "new_entries": sorted({e for o in outcomes for e in o["new_entries"]}),
        "persistent_cache": outcomes[0]["persistent_cache"],
    }


if __name__ == "__main__":
    replay(Path(sys.argv[1]), Path(sys.argv[2]))
