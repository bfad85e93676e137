"""Claim specs from the registry and run each under a lease and a file lock: one worker's loop.

The registry hands each spec to exactly one claimant under a lease; a heartbeat
renews it while the spec compiles, so a worker that dies stops renewing and its
spec is claimed again once the lease expires. The per-spec file lock in the cache
folder keeps two processes pointed at one cache from compiling the same spec at
once even if a lease expired under a long compile. Every claimant runs this loop:
a plain ``warmcache warmup``, each ``--jobs`` worker process, and rank 0 of a
torchrun (which tells the other ranks what it claimed through ``ranks``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from warmcache.errors import WarmcacheError, error_line
from warmcache.plan import PlannedShape
from warmcache.registry import Registry
from warmcache.registry.registry import worker_id
from warmcache.statuses import Status
from warmcache.targets import target_for
from warmcache.warmup import distributed
from warmcache.warmup.progress import Outcome, SpecOutcome
from warmcache.warmup.worker import SpecRun, Worker, lock_path

Report = Callable[[SpecOutcome], None]

#: How often a worker with nothing to claim looks again at specs other workers hold.
LEASE_POLL_SECONDS = 5.0
#: Interrupts a claim's release outlasts (Ctrl-C, then the parent's SIGTERM, then a spare).
_GIVE_BACK_TRIES = 3


def claim_loop(
    registry: Registry,
    worker: Worker,
    todo: Sequence[PlannedShape],
    lease_seconds: float,
    report: Report,
    ranks: distributed.Coordination = distributed.ALONE,
) -> None:
    """Claim and run specs among ``todo`` until every one is finished, here or elsewhere.

    When nothing is claimable but other workers still hold specs, wait: either they
    finish, or they died and their lease expires and the spec is claimed here. So a
    run that exits 0 means the manifest is warm, not "warm except what others were doing".
    """
    by_identity = {p.identity: p for p in todo}
    identities = list(by_identity)
    me = worker_id()
    while True:
        record = registry.claim(identities, me, lease_seconds)
        if record is not None:
            ranks.announce(record.identity)
            report(run_claimed(registry, worker, by_identity[record.identity], record.id, me, lease_seconds, ranks.agree))
            continue
        if not any(r.status in (Status.PENDING, Status.COMPILING) for r in registry.rows(identities=identities)):
            return
        ranks.wait()  # under torchrun: keeps the followers' collective shorter than one poll
        time.sleep(min(lease_seconds / 3, LEASE_POLL_SECONDS))


def run_claimed(
    registry: Registry,
    worker: Worker,
    planned: PlannedShape,
    row_id: int,
    me: str,
    lease_seconds: float,
    agree: Callable[[str | None], str | None] = distributed.ALONE.agree,
) -> SpecOutcome:
    """Compile one claimed spec under its heartbeat and file lock, and record the result.

    ``agree`` turns this process's error into the group's: under torchrun a spec
    that failed on any rank fails on all (the lease is still renewed meanwhile).
    """
    description = planned.spec.describe()
    start = time.perf_counter()
    # Until the final mark lands, any interruption (Ctrl-C, a registry error) gives the
    # claim back; releasing after a mark landed changes nothing (the row is no longer ours).
    try:
        with _Heartbeat(registry, row_id, me, lease_seconds):
            run, error = _run_locked(worker, planned)
            error = agree(error)
        if error is not None:
            registry.mark_failed(row_id, me, error)
            return SpecOutcome(planned.identity, description, Outcome.FAILED, time.perf_counter() - start, error=error)
        assert run is not None  # no rank failed, so this one ran the spec
        artifacts = run.artifacts()
        won = registry.mark_compiled(
            row_id,
            me,
            compile_seconds=run.seconds,
            graphs_compiled=run.graphs,
            artifacts=artifacts,
            cache_root=str(run.cache_root) if run.persistent_cache else None,
        )
    except BaseException:
        _give_back(registry, row_id, me)
        raise
    return SpecOutcome(
        planned.identity,
        description,
        Outcome.COMPILED if won else Outcome.LOST,
        run.seconds,
        graphs=run.graphs,
        padded_graphs=run.padded_graphs,
        artifacts=len(artifacts),
    )


def _give_back(registry: Registry, row_id: int, me: str) -> None:
    """Release the claim even if another interrupt lands meanwhile.

    Ctrl-C on a terminal reaches every ``--jobs`` worker and their parent at once,
    and the parent then SIGTERMs the workers: a second ``KeyboardInterrupt`` inside
    the release would leave the row ``compiling`` until its lease ran out.
    Releasing twice is harmless (the row is only ours once).
    """
    for _ in range(_GIVE_BACK_TRIES):
        try:
            registry.release(row_id, me)
            return
        except KeyboardInterrupt:
            continue


def _run_locked(worker: Worker, planned: PlannedShape) -> tuple[SpecRun | None, str | None]:
    """Run the spec under its per-spec file lock; an exception becomes the spec's error line."""
    try:
        root = worker.cache_root(target_for(planned.model))
        with _file_lock(lock_path(root, planned.identity)):
            return worker.run(planned), None
    except Exception as exc:
        return None, error_line(exc)


class _Heartbeat:
    """Renews a claim's lease every third of its length until the spec is done."""

    def __init__(self, registry: Registry, row_id: int, worker: str, lease_seconds: float) -> None:
        self._args = (registry, row_id, worker, lease_seconds)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"warmcache-lease-{row_id}", daemon=True)

    def _run(self) -> None:
        registry, row_id, worker, lease = self._args
        while not self._stop.wait(max(lease / 3, 0.2)):
            try:
                if not registry.renew_lease(row_id, worker, lease):
                    return  # claim lost: the result will not be recorded (mark_compiled says so)
            except WarmcacheError:
                continue  # a transient registry error (RegistryError): the lease still has two thirds left

    def __enter__(self) -> _Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    from filelock import FileLock

    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path)):
        yield
