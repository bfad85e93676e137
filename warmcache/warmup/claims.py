"""Claim specs from the registry and run each under a lease and a file lock: one worker's loop.

The registry hands each spec to exactly one claimant under a lease; a heartbeat
renews it while the spec compiles, so a worker that dies stops renewing and its
spec is claimed again once the lease expires. The per-spec file lock in the cache
folder keeps two processes pointed at one cache from compiling the same spec at
once even if a lease expired under a long compile. Every claimant runs this loop:
a plain ``warmcache warmup``, each ``--jobs`` worker process, and rank 0 of a
torchrun (which tells the other ranks what it claimed through ``ranks``).

Specs are claimed in the order given (the runner passes them longest first,
:mod:`warmcache.warmup.ordering`), short ones several at a time
(:class:`~warmcache.warmup.claim_queue.ClaimQueue`): a batch shares one heartbeat
and its results are recorded in one transaction, so a worker talks to the
registry about once per heartbeat interval however short its specs are. What runs a claimed spec is a
:class:`SpecRunner`: a :class:`~warmcache.warmup.worker.Worker` compiles it; the
fleet simulation (``tools/bench/bench_fleet.py --simulate``) sleeps instead, to measure
this loop, its leases and its registry traffic at hundreds of workers.
A registry that goes away for a while (restart, failover, dropped connections)
is waited for, up to one lease length, rather than losing a compile in hand.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Protocol

from warmcache.cache.layout import AOTINDUCTOR
from warmcache.errors import RegistryError, WarmcacheError, error_line
from warmcache.identity.plan import PlannedShape
from warmcache.registry import Registry
from warmcache.registry.patience import patiently
from warmcache.registry.records import ArtifactRef
from warmcache.registry.registry import worker_id
from warmcache.targets import Target, target_for
from warmcache.warmup import distributed
from warmcache.warmup.claim_queue import ClaimQueue
from warmcache.warmup.progress import Outcome, SpecOutcome
from warmcache.warmup.spec_lock import spec_lock
from warmcache.warmup.worker import SpecRun, lock_path

log = logging.getLogger(__name__)

Report = Callable[[SpecOutcome], None]

#: How soon a worker with nothing to claim first looks again at specs other workers hold; each
#: further look waits twice as long, up to ``LONGEST_POLL_SECONDS`` (and never more than a third of a lease).
LEASE_POLL_SECONDS = 5.0
LONGEST_POLL_SECONDS = 20.0
#: Expected compile seconds a worker claims at once when its specs are short: a fleet of N
#: workers then claims at most about N / 20 times a second, and a batch makes the tail at most that much longer.
BATCH_SECONDS = 20.0
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
    expected: Mapping[str, float] | None = None,
) -> None:
    """Claim and run specs among ``todo`` until every one is finished, here or elsewhere.

    When nothing is claimable but other workers still hold specs, wait: either they
    finish, or they died and their lease expires and the spec is claimed here. So a
    run that exits 0 means the manifest is warm, not "warm except what others were doing".
    Specs are claimed in ``todo``'s order; ``expected`` (seconds by identity, from
    :func:`warmcache.warmup.ordering.expected_seconds`) lets short ones be claimed
    several at a time, up to ``BATCH_SECONDS`` of expected work (and at most a third
    of a lease: one heartbeat's worth).
    """
    by_identity = {p.identity: p for p in todo}
    me = worker_id()
    batch_seconds = min(BATCH_SECONDS, lease_seconds / 3)
    queue = ClaimQueue(registry, list(by_identity), me, lease_seconds, expected, batch_seconds)
    looks = 0
    while True:
        records = patiently(queue.claim, lease_seconds)
        if records:
            looks = 0
            registry.drop_connections()  # none held while it compiles
            claimed = [(by_identity[r.identity], r.id) for r in records]
            log.debug(
                "claim taken by %s: %s",
                me,
                ", ".join(f"row {row_id} ({planned.spec.describe()})" for planned, row_id in claimed),
            )
            outcomes = run_claimed(registry, worker, claimed, me, lease_seconds, ranks, cut_seconds=2 * batch_seconds)
            queue.observe({o.identity: o.seconds for o in outcomes})
            for outcome in outcomes:
                report(outcome)
            continue
        if not patiently(queue.narrow, lease_seconds):
            log.debug("nothing left to claim: every spec is finished")
            return
        registry.drop_connections()
        ranks.wait()  # under torchrun: keeps the followers' collective shorter than one poll
        wait = _poll_wait(looks, lease_seconds)
        log.debug("nothing claimable now, other workers hold the rest: looking again in %.1f s", wait)
        time.sleep(wait)
        looks += 1


def _poll_wait(looks: int, lease_seconds: float) -> float:
    """How long a worker with nothing to claim waits before its next look, after ``looks`` empty ones.

    Doubling from ``LEASE_POLL_SECONDS`` and jittered: the specs still held elsewhere
    become claimable only when a worker dies (its lease runs out) or gives a claim
    back, and a fleet's hosts reach the end of their lists within seconds of each
    other; 256 hosts looking every 5 s were most of the registry's load in a run's
    last seconds.
    """
    longest = min(lease_seconds / 3, LONGEST_POLL_SECONDS)
    return min(longest, LEASE_POLL_SECONDS * 2 ** min(looks, 8)) * random.uniform(0.5, 1.0)


def run_claimed(
    registry: Registry,
    worker: SpecRunner,
    claimed: Sequence[tuple[PlannedShape, int]],
    me: str,
    lease_seconds: float,
    ranks: distributed.Coordination = distributed.ALONE,
    cut_seconds: float = math.inf,
) -> list[SpecOutcome]:
    """Compile claimed specs (``(spec, row id)``, in order) under one heartbeat, each under its file lock; record the
    results together.

    Under torchrun each spec is announced to the other ranks before it runs, and
    ``ranks.agree`` turns this process's error into the group's: a spec that failed
    on any rank fails on all (the lease is still renewed meanwhile). The results
    are recorded in one transaction once the last spec is done, within the lease
    (after that, another worker may have claimed a spec again). A batch that runs
    past ``cut_seconds`` (and at most half a lease: its specs took longer than
    expected) starts no more: the specs it has not started go back to the registry
    for any worker to take. A spec whose claim the heartbeat lost (the registry was
    gone for longer than the lease) is not started: another worker has it. If the
    batch is interrupted, what already ran is still recorded and the rest given back.
    """
    cut = min(lease_seconds / 2, cut_seconds)
    started = time.monotonic()
    ran: list[_Ran] = []
    done = 0
    heartbeat = _LeaseRenewer(registry, [row_id for _, row_id in claimed], me, lease_seconds)
    try:
        with heartbeat:
            for planned, row_id in claimed:
                if done and time.monotonic() - started > cut:
                    log.debug("batch ran past %.1f s: %d unstarted claim(s) go back", cut, len(claimed) - done)
                    break
                done += 1
                if not heartbeat.holds(row_id):
                    log.warning(
                        "skip %s: its claim (row %d) ran out before it started; another worker has it",
                        planned.spec.describe(),
                        row_id,
                    )
                    continue
                ranks.announce(planned.identity)
                start = time.perf_counter()
                run, error = _run_locked(worker, planned, heartbeat, row_id)
                error = ranks.agree(error)
                ran.append(
                    _Ran(
                        planned,
                        row_id,
                        run,
                        error,
                        time.perf_counter() - start,
                        run.artifacts() if run and error is None else [],
                    )
                )
        unstarted = [row_id for _, row_id in claimed[done:]]
        return patiently(lambda: _record(registry, ran, me, unstarted=unstarted), lease_seconds)
    except BaseException:
        recorded = {r.row_id for r in ran}
        _give_back(registry, ran, [row_id for _, row_id in claimed if row_id not in recorded], me)
        raise


@dataclass(frozen=True)
class _Ran:
    """One claimed spec that ran here: what to record for it (its artifacts listed as soon as it finished)."""

    planned: PlannedShape
    row_id: int
    run: SpecRun | None
    error: str | None
    seconds: float
    artifacts: list[ArtifactRef]


def _record(
    registry: Registry, ran: Sequence[_Ran], me: str, *, unstarted: Sequence[int] = (), given_back: Sequence[int] = ()
) -> list[SpecOutcome]:
    """Record each result and give back the other claims, in one transaction; each spec's outcome.

    An unstarted claim goes back as if never taken (its attempt is not counted);
    one given back after an interrupt keeps its attempt.
    """
    with registry.together():
        outcomes = [_mark(registry, result, me) for result in ran]
        for row_id in unstarted:
            registry.release(row_id, me, started=False)
        for row_id in given_back:
            registry.release(row_id, me)
    return outcomes


def _mark(registry: Registry, result: _Ran, me: str) -> SpecOutcome:
    description = result.planned.spec.describe()
    if result.error is not None:
        registry.mark_failed(result.row_id, me, result.error)
        return SpecOutcome(result.planned.identity, description, Outcome.FAILED, result.seconds, error=result.error)
    run, artifacts = result.run, result.artifacts
    assert run is not None  # no rank failed, so this one ran the spec
    won = registry.mark_compiled(
        result.row_id,
        me,
        compile_seconds=run.seconds,
        graphs_compiled=run.graphs,
        artifacts=artifacts,
        cache_root=str(run.cache_root) if run.persistent_cache else None,
    )
    return SpecOutcome(
        result.planned.identity,
        description,
        Outcome.COMPILED if won else Outcome.LOST,
        run.seconds,
        graphs=run.graphs,
        padded_graphs=run.padded_graphs,
        artifacts=len(artifacts),
        diskless_backend=None if run.persistent_cache else result.planned.model.backend,
        exported=any(artifact.kind == AOTINDUCTOR for artifact in artifacts),
    )


def _give_back(registry: Registry, ran: Sequence[_Ran], rest: Sequence[int], me: str) -> None:
    """Record what ran and release the other claims, even if another interrupt lands meanwhile.

    Ctrl-C on a terminal reaches every ``--jobs`` worker and their parent at once,
    and the parent then SIGTERMs the workers: a second ``KeyboardInterrupt`` inside
    the release would leave rows ``compiling`` until their lease ran out.
    Recording or releasing twice is harmless (a row is only ours once). A registry
    that cannot be reached is left alone: the claims' lease runs out and they are
    claimed again.
    """
    for _ in range(_GIVE_BACK_TRIES):
        try:
            _record(registry, ran, me, given_back=rest)
            return
        except KeyboardInterrupt:
            log.debug("interrupted while giving back claims; trying again")
            continue
        except RegistryError as exc:
            log.warning(
                "could not give back claims %s (%s): their lease runs out and they are claimed again",
                list(rest),
                error_line(exc),
            )
            return


def _run_locked(
    worker: SpecRunner, planned: PlannedShape, heartbeat: _LeaseRenewer, row_id: int
) -> tuple[SpecRun | None, str | None]:
    """Run the spec under its per-spec file lock (waited for while the claim lasts); an exception becomes the spec's
    error line."""
    try:
        root = worker.cache_root(target_for(planned.model))
        with heartbeat.waiting(row_id) as deadline, spec_lock(lock_path(root, planned.identity), deadline):
            heartbeat.started(row_id)
            return worker.run(planned), None
    except Exception as exc:
        log.debug("spec %s failed", planned.spec.describe(), exc_info=True)
        return None, error_line(exc)


class _Lease(NamedTuple):
    """What a heartbeat renews with: the registry, the worker the claims belong to, and the lease's length."""

    registry: Registry
    worker: str
    seconds: float


class _LeaseRenewer:
    """Renews claims' leases, in one statement, every third of their length until their specs are done.

    A claim whose spec waits for its cache lock is not renewed meanwhile: work that cannot
    start must not keep a row ``compiling`` (its wait ends before the claim runs out).
    """

    def __init__(self, registry: Registry, row_ids: Sequence[int], worker: str, lease_seconds: float) -> None:
        self._lease = _Lease(registry, worker, lease_seconds)
        self._held = frozenset(row_ids)
        self._waiting: frozenset[int] = frozenset()
        #: When the claims were last renewed (claimed, at first): each runs out a lease after it, by the registry's
        #: clock.
        self._renewed_at = time.monotonic()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"warmcache-lease-{row_ids[0]}", daemon=True)

    def holds(self, row_id: int) -> bool:
        """Whether the claim is still this worker's (not lost to an expired lease)."""
        return row_id in self._held

    @contextmanager
    def waiting(self, row_id: int) -> Iterator[float]:
        """Leave ``row_id``'s claim unrenewed until :meth:`started`; yields when its wait must end
        (``time.monotonic()``): a tenth of a lease (at most 10 s) before the claim runs out, so that giving up is
        still this worker's to record."""
        lease = self._lease.seconds
        self._waiting |= {row_id}
        try:
            yield self._renewed_at + lease - min(lease / 10, 10.0)
        finally:
            self.started(row_id)

    def started(self, row_id: int) -> None:
        """The spec is under way (or gave up): renew its claim again, at once if a renewal went by while it waited
        (its lease may be nearly out; a lock taken at once costs no extra statement)."""
        if row_id in self._waiting:
            self._waiting -= {row_id}
            if time.monotonic() - self._renewed_at >= self._lease.seconds / 3:
                self._wake.set()

    def _run(self) -> None:
        registry, worker, lease = self._lease
        while self._held and not self._stop.is_set():
            self._wake.wait(max(lease / 3, 0.2))
            self._wake.clear()
            if self._stop.is_set():
                return
            waiting = self._waiting
            try:
                # A lost claim's spec is not started, and its result is not recorded (mark_compiled says so).
                due = sorted(self._held - waiting)
                renewed = registry.renew_leases(due, worker, lease) if due else set()
                self._held = frozenset(renewed) | (self._held & waiting)
                self._renewed_at = time.monotonic() if not waiting else self._renewed_at
                log.debug("lease renewed for rows %s (%s)", sorted(renewed), worker)
                if lost := set(due) - set(renewed):
                    log.warning(
                        "lost the claim on rows %s: their lease ran out before it was renewed, and another "
                        "worker may hold them",
                        sorted(lost),
                    )
            except WarmcacheError as exc:
                # A transient registry error (RegistryError): the leases still have two thirds left; the next beat
                # retries.
                log.warning(
                    "could not renew leases for rows %s, retrying at the next heartbeat: %s",
                    sorted(self._held - waiting),
                    error_line(exc),
                )
                continue
            finally:
                registry.drop_connections()

    def __enter__(self) -> _LeaseRenewer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join()
