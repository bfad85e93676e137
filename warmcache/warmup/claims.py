"""Claim specs from the registry and run each under a lease and a file lock: one worker's loop.

The registry hands each spec to exactly one claimant under a lease; a heartbeat
renews it while the spec compiles, so a worker that dies stops renewing and its
spec is claimed again once the lease expires. The per-spec file lock in the cache
folder keeps two processes pointed at one cache from compiling the same spec at
once even if a lease expired under a long compile. Every claimant runs this loop:
a plain ``warmcache warmup``, each ``--jobs`` worker process, and rank 0 of a
torchrun (which tells the other ranks what it claimed through ``ranks``).

Specs are claimed in the order given (the runner passes them longest first,
:mod:`warmcache.warmup.ordering`). What runs a claimed spec is a
:class:`SpecRunner`: a :class:`~warmcache.warmup.worker.Worker` compiles it; the
fleet simulation (``tools/bench_fleet.py --simulate``) sleeps instead, to measure
this loop, its leases and its registry traffic at hundreds of workers.
A registry that goes away for a while (restart, failover, dropped connections)
is waited for, up to one lease length, rather than losing a compile in hand.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

from warmcache.errors import RegistryError, WarmcacheError, error_line
from warmcache.plan import PlannedShape
from warmcache.registry import Registry
from warmcache.registry.patience import patiently
from warmcache.registry.registry import worker_id
from warmcache.targets import Target, target_for
from warmcache.warmup import distributed
from warmcache.warmup.claim_queue import ClaimQueue
from warmcache.warmup.progress import Outcome, SpecOutcome
from warmcache.warmup.worker import SpecRun, lock_path

Report = Callable[[SpecOutcome], None]

#: How often a worker with nothing to claim looks again at specs other workers hold.
LEASE_POLL_SECONDS = 5.0
#: Interrupts a claim's release outlasts (Ctrl-C, then the parent's SIGTERM, then a spare).
_GIVE_BACK_TRIES = 3


class SpecRunner(Protocol):
    """Runs one claimed spec: the compile seam of the claim loop."""

    def cache_root(self, target: Target) -> Path:
        """The folder the spec's per-spec file lock lives in."""
        ...

    def run(self, planned: PlannedShape) -> SpecRun:
        """Run the spec (compile it) and say what that did."""
        ...


def claim_loop(
    registry: Registry,
    worker: SpecRunner,
    todo: Sequence[PlannedShape],
    lease_seconds: float,
    report: Report,
    ranks: distributed.Coordination = distributed.ALONE,
) -> None:
    """Claim and run specs among ``todo`` until every one is finished, here or elsewhere.

    When nothing is claimable but other workers still hold specs, wait: either they
    finish, or they died and their lease expires and the spec is claimed here. So a
    run that exits 0 means the manifest is warm, not "warm except what others were doing".
    Specs are claimed in ``todo``'s order.
    """
    by_identity = {p.identity: p for p in todo}
    me = worker_id()
    queue = ClaimQueue(registry, list(by_identity), me, lease_seconds)
    while True:
        record = patiently(queue.claim, lease_seconds)
        if record is not None:
            registry.drop_connections()  # none held while it compiles
            ranks.announce(record.identity)
            report(run_claimed(registry, worker, by_identity[record.identity], record.id, me, lease_seconds, ranks.agree))
            continue
        if not patiently(queue.narrow, lease_seconds):
            return
        registry.drop_connections()
        ranks.wait()  # under torchrun: keeps the followers' collective shorter than one poll
        time.sleep(min(lease_seconds / 3, LEASE_POLL_SECONDS))


def run_claimed(
    registry: Registry,
    worker: SpecRunner,
    planned: PlannedShape,
    row_id: int,
    me: str,
    lease_seconds: float,
    agree: Callable[[str | None], str | None] = distributed.ALONE.agree,
) -> SpecOutcome:
    """Compile one claimed spec under its heartbeat and file lock, and record the result.

    ``agree`` turns this process's error into the group's: under torchrun a spec
    that failed on any rank fails on all (the lease is still renewed meanwhile).
    The result is recorded as soon as the registry takes it, within the lease
    (after that, another worker may have claimed the spec again).
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
            patiently(lambda: registry.mark_failed(row_id, me, error), lease_seconds)
            return SpecOutcome(planned.identity, description, Outcome.FAILED, time.perf_counter() - start, error=error)
        assert run is not None  # no rank failed, so this one ran the spec
        artifacts = run.artifacts()
        won = patiently(
            lambda: registry.mark_compiled(
                row_id,
                me,
                compile_seconds=run.seconds,
                graphs_compiled=run.graphs,
                artifacts=artifacts,
                cache_root=str(run.cache_root) if run.persistent_cache else None,
            ),
            lease_seconds,
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
    Releasing twice is harmless (the row is only ours once). A registry that cannot
    be reached is left alone: the claim's lease runs out and it is claimed again.
    """
    for _ in range(_GIVE_BACK_TRIES):
        try:
            registry.release(row_id, me)
            return
        except KeyboardInterrupt:
            continue
        except RegistryError:
            return


def _run_locked(worker: SpecRunner, planned: PlannedShape) -> tuple[SpecRun | None, str | None]:
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
            finally:
                registry.drop_connections()

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
