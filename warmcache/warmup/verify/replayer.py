"""verify's fresh replay process: run each spec once, as warmup did, and measure what it compiled.

Started by the parent (:mod:`.parent`) through :mod:`warmcache.warmup.child`'s protocol
(``python -m warmcache.warmup``); each spec's :class:`ReplayResult` goes back as soon as
it is measured. Under torchrun every rank replays and rank 0 reports the merged result.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from warmcache.errors import DecodeRecompileError, error_line
from warmcache.identity.plan import PlannedShape, plan_manifest
from warmcache.manifest import load_manifest
from warmcache.registry import Registry
from warmcache.settings import RegistryLocation
from warmcache.warmup import distributed
from warmcache.warmup.phases import Phase, PhaseListener, SpecPhases
from warmcache.warmup.verify.messages import ReplayRequest, ReplayResult

if TYPE_CHECKING:
    from warmcache.warmup.worker import Worker


def replay(request: ReplayRequest, report: Callable[[ReplayResult], None], on_phase: PhaseListener) -> None:
    """The fresh process: run each spec once through the same Worker warmup used, and measure; ``on_phase`` is told
    each spec's phases."""
    from warmcache.warmup.worker import Worker

    manifest = load_manifest(request.manifest)
    by_identity = {p.identity: p for p in plan_manifest(manifest)}
    worker = Worker(manifest, request.cache_dir, precompile=False, on_phase=on_phase, replaying=True)
    ranks = distributed.in_torchrun()
    if ranks:
        distributed.init_process_group(by_identity[request.identities[0]].model.device)
    for identity in request.identities:
        planned = by_identity[identity]
        start = time.perf_counter()
        try:
            run = worker.run(planned)
            proof = _prove_decode(worker, planned, request.registry, SpecPhases(planned.spec.describe(), on_phase))
        except DecodeRecompileError as exc:
            result = ReplayResult(identity, time.perf_counter() - start, recompiled=exc.message)
        except Exception as exc:  # a replay that fails is a verdict, not a crash of verify
            result = ReplayResult(identity, time.perf_counter() - start, error=error_line(exc))
        else:
            result = ReplayResult.of_run(identity, time.perf_counter() - start, run, proof)
        if ranks:
            result = merge_ranks(distributed.gather_from_ranks(result))
        report(result)  # under torchrun, rank 0's reaches the parent (the others report nowhere)
    if ranks:
        distributed.shutdown()


def _prove_decode(
    worker: Worker, planned: PlannedShape, location: RegistryLocation | None, phases: SpecPhases
) -> str | None:
    """A generate spec's decode, proven after the traced replay: through warmcache's cache it computes the model (every
    route, :mod:`warmcache.warmup.verify.cache_proof`), and the row's precompiled artifact serves it (see
    :mod:`warmcache.warmup.verify.artifact_proof`)."""
    if planned.spec.workload != "generate":
        return None
    model, target = worker.model_for(planned)
    # A sharded model's higher-precision copy would be each rank's shard; a Neuron model's, not a model it runs.
    cache_provable = not distributed.in_torchrun() and model.device.type in ("cpu", "cuda")
    # The registry that lists the row's precompiled artifacts, when its route saves any.
    artifacts_in = location if planned.model.precompile.applies_to(planned.spec.workload) else None
    if cache_provable:
        from warmcache.warmup.verify.cache_proof import prove_cache_decode

        phases.enter(Phase.PROVING)
        unproven = prove_cache_decode(model, planned.spec, target.compile_config())
        if unproven:
            return unproven
    if artifacts_in is None:
        return None
    from warmcache.warmup.verify.artifact_proof import prove_artifacts

    phases.enter(Phase.PROVING_ARTIFACT)

    with Registry.open(artifacts_in) as registry:
        (record,) = registry.rows(identities=[planned.identity], with_artifacts=True)
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
        decode_error=next((f"rank {i}: {r.decode_error}" for i, r in enumerate(results) if r.decode_error), None),
    )
