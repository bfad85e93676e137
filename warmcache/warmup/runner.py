"""The warmup runner: plan, skip what is warm, claim the rest, compile, record.

Order of work, and why:

1. Plan the manifest and ask the registry, in one query, what is already
   compiled for this toolchain. That is the whole run for a warm manifest: no
   torch import, no model load (re-running a warm 1,000-spec manifest is the
   common case in a deployment pipeline and must cost well under 2 s).
2. Insert ``pending`` rows for the rest, then let one or more workers **claim**
   rows from the registry under a lease, renewed by a heartbeat while the spec compiles (:mod:`warmcache.warmup.claims`;
   ``--jobs`` workers and torchrun children are child processes, :mod:`warmcache.warmup.child`). A worker that dies
   stops renewing; its spec is claimed again once the lease expires.
3. Each claimed spec also runs under a file lock in the cache folder, so two
   processes pointed at one cache never compile the same spec at once even if
   a lease expired under a long compile.
4. A spec that fails is recorded as ``failed`` with its error and the run goes
   on; Ctrl-C or SIGTERM gives the claim back (``pending``) untouched.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence

from warmcache.errors import UsageError
from warmcache.identity.plan import PlannedShape, plan_manifest
from warmcache.identity.support import check_supported
from warmcache.manifest import Manifest, ModelSpec, load_manifest
from warmcache.registry import Registry
from warmcache.registry.statuses import DONE_STATUSES, Status
from warmcache.targets import target_for
from warmcache.warmup import distributed
from warmcache.warmup.child import Launch, raise_first_error, run_children, sigterm_as_interrupt
from warmcache.warmup.claims import Report, claim_loop
from warmcache.warmup.ordering import expected_seconds, longest_first
from warmcache.warmup.phases import PhaseListener, PhaseReport, routed
from warmcache.warmup.progress import Outcome, Progress, SpecOutcome
from warmcache.warmup.route_gaps import missing_route_files
from warmcache.warmup.summary import ClaimRequest, Shard, WarmupOptions, WarmupPlan, WarmupRequest, WarmupSummary
from warmcache.warmup.worker import Worker

log = logging.getLogger(__name__)


def plan_warmup(
    manifest: Manifest, registry: Registry, *, shard: Shard | None = None, retry_failed: bool = False
) -> WarmupPlan:
    """One registry query decides every spec's fate; nothing heavy is imported."""
    planned = plan_manifest(manifest)
    if shard is not None:
        # Shard before narrowing to this launch, so a torchrun child slices the same list as its parent.
        planned = shard.select(planned)
    statuses = registry.plan_status(distributed.for_this_launch(planned))
    return WarmupPlan(statuses, retry_failed, missing_route_files(registry, statuses))


def run_warmup(
    manifest: Manifest,
    options: WarmupOptions,
    progress: Callable[[int], Progress[SpecOutcome]],
    on_compiled: Callable[[str], None] | None = None,
) -> WarmupSummary:
    """Warm every spec the manifest declares that is not yet compiled for this toolchain.

    ``on_compiled(identity)`` runs in this process as soon as each spec is recorded
    compiled (``warmup --push`` publishes it to the store there and then).

    Under torchrun every rank calls this: rank 0 runs the warmup and the other
    ranks run each spec it claims (:mod:`warmcache.warmup.distributed`); their
    summary is empty, rank 0 speaks for the group. Outside torchrun, models that
    need several ranks are warmed by a torchrun this launches.

    :param manifest: the shapes to warm.
    :param options: where the registry and the cache are, how many jobs, which shard, and whether to retry failed
        specs or only plan (``dry_run``).
    :param progress: called once with the number of specs to warm; what it returns is told each spec's phases and
        outcome (:class:`~warmcache.warmup.progress.Progress`).
    :param on_compiled: called with each spec's identity as soon as it is recorded compiled.
    :returns: the outcome of every planned spec; its ``exit_code`` is non-zero while any is not compiled.
    """
    if not distributed.in_torchrun():
        return _warm(manifest, options, progress, on_compiled)
    with distributed.rank_group(manifest, options) as leads:
        return _warm(manifest, options, progress, on_compiled) if leads else distributed.follow(manifest, options)


def _warm(
    manifest: Manifest,
    options: WarmupOptions,
    progress: Callable[[int], Progress[SpecOutcome]],
    on_compiled: Callable[[str], None] | None,
) -> WarmupSummary:
    start = time.perf_counter()
    with Registry.open(options.registry, hold_connections=False) as registry:
        plan = plan_warmup(manifest, registry, shard=options.shard, retry_failed=options.retry_failed)
        summary = WarmupSummary(plan, options.dry_run)
        todo = plan.todo
        log.debug(
            "plan: %d spec(s), %d to warm; skip %d already compiled for this toolchain",
            len(plan.statuses),
            len(todo),
            len(plan.statuses) - len(todo),
        )
        if options.dry_run or not todo:
            summary.seconds = time.perf_counter() - start
            return summary
        # Before anything is claimed: a model warmcache cannot serve fails here, with the reason.
        # Only with work to do, so a re-run of a warm manifest still imports no torch.
        check_supported(manifest, {p.model.name: p.model for p in todo}.values())
        worker = Worker(manifest, options.cache_dir)
        _prepare_targets(worker, {p.model.name: p.model for p in todo}.values())
        registry.ensure_pending(todo)
        if options.retry_failed:
            registry.requeue_failed([s.planned.identity for s in plan.statuses if s.status == Status.FAILED])
        for why, count in sorted(Counter(plan.rewarm.values()).items()):
            log.warning("warming %d compiled spec(s) again: %s", count, why)
        registry.requeue_done(plan.rewarm)
        lease = options.lease_seconds or manifest.lease_seconds
        here, sharded = distributed.split_by_world_size(todo)
        expected = expected_seconds(registry, here)
        here = longest_first(here, expected)
        bar = progress(len(todo))
        worker.on_phase = bar.phase  # the specs this process runs show their phases on the bar
        report = _collecting(summary.outcomes, bar.advance, on_compiled)
        try:
            with sigterm_as_interrupt():
                if here and options.jobs > 1:
                    _run_jobs(manifest, options, here, lease, expected, routed(report, bar.phase))
                elif here:
                    claim_loop(registry, worker, here, lease, report, distributed.coordination(), expected)
                for nproc in sorted(sharded):
                    _warm_under_torchrun(manifest, options, nproc, routed(report, bar.phase))
        finally:
            bar.close()
        summary.unfinished = _unfinished_elsewhere(registry, plan.todo, summary.outcomes)
        for line in summary.unfinished:
            log.warning("not compiled by another worker: %s", line)
    summary.seconds = time.perf_counter() - start
    return summary


def _prepare_targets(worker: Worker, models: Iterable[ModelSpec]) -> None:
    """Check each target and create its cache folder before claiming anything.

    A missing toolchain or an unusable cache folder is the user's error, reported
    once; found inside a spec it would be recorded as every claimed spec's failure.
    """
    for model in models:
        target = target_for(model)
        target.check_available()
        try:
            worker.cache_root(target)
        except OSError as exc:
            raise UsageError(f"model {model.name!r}: cache folder unusable: {exc}") from None


def _unfinished_elsewhere(
    registry: Registry, todo: Sequence[PlannedShape], outcomes: Sequence[SpecOutcome]
) -> list[str]:
    """Specs of this run that are not compiled now, though no outcome here says so.

    A run waits for specs other workers hold; if one of them failed it there, this
    run must not exit 0 claiming the manifest is warm.
    """
    reported = {o.identity for o in outcomes if o.failed}
    described = {p.identity: p.spec.describe() for p in todo}
    return [
        f"{described[r.identity]}: {r.status}" + (f" ({r.error})" if r.error else "")
        for r in registry.rows(identities=list(described))
        if r.status not in DONE_STATUSES and r.identity not in reported
    ]


def _collecting(into: list[SpecOutcome], then: Report, on_compiled: Callable[[str], None] | None = None) -> Report:
    def report(outcome: SpecOutcome) -> None:
        into.append(outcome)
        then(outcome)
        log.debug(
            "%s: %s in %.1f s%s",
            outcome.description,
            outcome.status,
            outcome.seconds,
            f" ({outcome.error})" if outcome.error else "",
        )
        if on_compiled is not None and outcome.status == Outcome.COMPILED:
            on_compiled(outcome.identity)

    return report


# ------------------------------------------------------------------ child processes


def _run_jobs(
    manifest: Manifest,
    options: WarmupOptions,
    todo: Sequence[PlannedShape],
    lease: float,
    expected: Mapping[str, float],
    receive: Callable[[SpecOutcome | PhaseReport], None],
) -> None:
    """N worker processes, each claiming from the registry; their phases arrive as they run, their outcomes as they
    finish."""
    identities = tuple(p.identity for p in todo)
    request = ClaimRequest(
        str(manifest.path),
        options.registry,
        options.cache_dir,
        identities,
        lease,
        tuple(expected.get(i) for i in identities),
    )
    # N jobs each using every core thrash on a small host (measured with tools/bench/bench_fleet.py:
    # 2 workers at full thread count ran 1.2-2x slower than 1); split the cores, as torchrun does.
    # Set before torch is imported in the fresh process; a user's own setting wins.
    env = {"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // options.jobs)), **os.environ}
    launches = [
        Launch(f"warmup worker {i}", distributed.child_command(1), request, env) for i in range(1, options.jobs + 1)
    ]
    # A worker that stopped abnormally held at most one batch of specs: they are claimed again once its lease expires.
    raise_first_error(run_children(launches, [SpecOutcome, PhaseReport], receive))


def _warm_under_torchrun(
    manifest: Manifest, options: WarmupOptions, nproc: int, receive: Callable[[SpecOutcome | PhaseReport], None]
) -> None:
    """Warm the manifest's ``nproc``-rank models in a torchrun child; its rank 0 reports each phase and each outcome."""
    models = ", ".join(sorted({m.name for m in manifest.models if m.world_size == nproc}))
    launch = Launch(
        f"torchrun warmup of {models} ({nproc} ranks)",
        distributed.child_command(nproc),
        WarmupRequest.of(str(manifest.path), options),
    )
    raise_first_error(run_children([launch], [SpecOutcome, PhaseReport], receive))


def claim_as_worker(request: ClaimRequest, report: Report, on_phase: PhaseListener) -> None:
    """The ``--jobs`` worker process: claim and run the request's specs, reporting each phase and each outcome."""
    with sigterm_as_interrupt():
        manifest = load_manifest(request.manifest)
        planned = {p.identity: p for p in plan_manifest(manifest)}
        todo = [planned[identity] for identity in request.identities if identity in planned]  # in the parent's order
        with Registry.open(request.registry, hold_connections=False) as registry:
            expected = {i: s for i, s in zip(request.identities, request.expected_seconds) if s is not None}
            claim_loop(
                registry,
                Worker(manifest, request.cache_dir, on_phase=on_phase),
                todo,
                request.lease_seconds,
                report,
                expected=expected,
            )


class _Forward:
    """The progress of a torchrun child: each outcome and phase goes to the parent, which renders it."""

    def __init__(self, report: Report, on_phase: PhaseListener) -> None:
        self.advance = report
        self.phase = on_phase

    def close(self) -> None:
        pass


def warm_as_torchrun_child(request: WarmupRequest, report: Report, on_phase: PhaseListener) -> None:
    """One rank of the torchrun a warmup launched for its sharded models; rank 0's ``report`` and phases reach the
    parent."""
    run_warmup(load_manifest(request.manifest), request.options(), lambda total: _Forward(report, on_phase))
