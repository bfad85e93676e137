"""Where a manifest's warmup stands: counts, claims in flight, failures, time left.

A fleet operator watching several hosts warm one manifest asks three things:
how far along is it, who is working on what right now (and is anyone stuck on a
dead lease), and what failed. The time left is an estimate from what was
already compiled: the remaining shapes times the median compile time recorded
for that model and workload, spread over the workers holding live claims.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from warmcache.errors import first_line
from warmcache.identity.plan import PlannedShape
from warmcache.registry import PlanStatus, Registry
from warmcache.registry.models import utcnow
from warmcache.registry.statuses import Status

#: Every status a planned shape can show, in lifecycle order.
STATUS_ORDER = (
    Status.MISSING,
    Status.STALE,
    Status.PENDING,
    Status.COMPILING,
    Status.COMPILED,
    Status.VERIFIED,
    Status.FAILED,
)
#: Statuses still waiting for a compile; ``failed`` waits only for ``--retry-failed``.
REMAINING = (Status.MISSING, Status.STALE, Status.PENDING, Status.COMPILING)


@dataclass(frozen=True, slots=True)
class Claim:
    """A shape some worker has claimed and not finished."""

    model: str
    workload: str
    batch_size: int
    seq_len: int
    claimed_by: str
    since: dt.datetime
    """When the claim was taken or last renewed (each renewal moves it)."""
    lease_expires_at: dt.datetime | None
    lease_expired: bool
    """The worker stopped renewing: it died or hangs, and another worker will take the shape over."""

    @property
    def host(self) -> str:
        return self.claimed_by.rpartition(":")[0] or self.claimed_by

    @property
    def pid(self) -> int | None:
        tail = self.claimed_by.rpartition(":")[2]
        return int(tail) if tail.isdigit() else None

    def as_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "workload": self.workload,
            "batch_size": self.batch_size,
            "seq_len": self.seq_len,
            "claimed_by": self.claimed_by,
            "host": self.host,
            "pid": self.pid,
            "since": self.since.isoformat(),
            "lease_expires_at": self.lease_expires_at.isoformat() if self.lease_expires_at else None,
            "lease_expired": self.lease_expired,
        }


@dataclass(frozen=True, slots=True)
class Failure:
    """A shape whose last compile failed, with the first line of its error."""

    model: str
    workload: str
    batch_size: int
    seq_len: int
    error: str
    attempts: int
    host: str | None

    def as_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True, slots=True)
class GroupStatus:
    """One model's workload within the manifest."""

    model: str
    workload: str
    counts: dict[str, int]
    claims: tuple[Claim, ...]
    failures: tuple[Failure, ...]
    median_compile_seconds: float | None
    """Median over this group's shapes that have a recorded compile time (``None``: none yet)."""
    reclaimed: int = 0
    """Shapes of this toolchain claimed more than once: a worker stopped holding one (its lease ran out) or a failure
    was retried."""

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def remaining(self) -> int:
        return sum(self.counts.get(status, 0) for status in REMAINING)

    @property
    def remaining_work_seconds(self) -> float | None:
        """Compile seconds still to spend on this group by one worker; ``None`` if nothing is known yet."""
        if not self.remaining:
            return 0.0
        if self.median_compile_seconds is None:
            return None
        return self.remaining * self.median_compile_seconds


@dataclass(frozen=True, slots=True)
class WarmupStatus:
    """A manifest's warmup, group by group, with the fleet-wide estimate of time left."""

    groups: tuple[GroupStatus, ...]
    live_workers: tuple[str, ...]
    """Workers (``host:pid``) holding an unexpired claim right now."""
    checked_at: dt.datetime

    @property
    def claims(self) -> list[Claim]:
        return [claim for group in self.groups for claim in group.claims]

    @property
    def failures(self) -> list[Failure]:
        return [failure for group in self.groups for failure in group.failures]

    def eta_seconds(self, group: GroupStatus | None = None) -> float | None:
        """Time left for one group (or all of them), with the live workers sharing the work.

        ``None`` when some remaining work has no recorded compile time to go by.
        """
        works = [g.remaining_work_seconds for g in ([group] if group else self.groups)]
        if any(w is None for w in works):
            return None
        return sum(w for w in works if w is not None) / max(1, len(self.live_workers))

    def as_json(self) -> dict[str, Any]:
        return {
            "checked_at": self.checked_at.isoformat(),
            "live_workers": list(self.live_workers),
            "eta_seconds": self.eta_seconds(),
            "groups": [
                {
                    "model": g.model,
                    "workload": g.workload,
                    "total": g.total,
                    "counts": {status: g.counts.get(status, 0) for status in STATUS_ORDER},
                    "remaining": g.remaining,
                    "median_compile_seconds": g.median_compile_seconds,
                    "reclaimed": g.reclaimed,
                    "eta_seconds": self.eta_seconds(g),
                    "claims": [c.as_json() for c in g.claims],
                    "failures": [f.as_json() for f in g.failures],
                }
                for g in self.groups
            ],
        }


def warmup_status(registry: Registry, planned: Sequence[PlannedShape], now: dt.datetime | None = None) -> WarmupStatus:
    """Summarise the registry's view of ``planned``, grouped by (model, workload) in manifest order."""
    now = now or utcnow()
    grouped: dict[tuple[str, str], list[PlanStatus]] = {}
    for status in registry.plan_status(planned):
        grouped.setdefault((status.planned.model.name, status.planned.spec.workload), []).append(status)
    groups = tuple(_group(model, workload, statuses, now) for (model, workload), statuses in grouped.items())
    live = sorted({c.claimed_by for g in groups for c in g.claims if not c.lease_expired})
    return WarmupStatus(groups=groups, live_workers=tuple(live), checked_at=now)


def _group(model: str, workload: str, statuses: list[PlanStatus], now: dt.datetime) -> GroupStatus:
    claims: list[Claim] = []
    failures: list[Failure] = []
    for s in statuses:
        record, spec = s.record, s.planned.spec
        if record is None:
            continue
        if s.status == Status.COMPILING and record.claimed_by:
            expires = record.lease_expires_at
            claims.append(
                Claim(
                    model,
                    workload,
                    spec.batch_size,
                    spec.seq_len,
                    record.claimed_by,
                    record.updated_at,
                    expires,
                    expires is not None and expires < now,
                )
            )
        elif s.status == Status.FAILED:
            failures.append(
                Failure(
                    model,
                    workload,
                    spec.batch_size,
                    spec.seq_len,
                    _error_summary(record.error),
                    record.attempts,
                    record.host,
                )
            )
    # Stale rows count too: an older toolchain's compile time is still the best guess for this one.
    seconds = [
        s.record.compile_seconds for s in statuses if s.record is not None and s.record.compile_seconds is not None
    ]
    return GroupStatus(
        model=model,
        workload=workload,
        counts=dict(Counter(s.status for s in statuses)),
        claims=tuple(claims),
        failures=tuple(failures),
        median_compile_seconds=statistics.median(seconds) if seconds else None,
        reclaimed=sum(
            1
            for s in statuses
            if s.record is not None and s.record.identity == s.planned.identity and s.record.attempts > 1
        ),
    )


def _error_summary(text: str | None) -> str:
    """The first line of a recorded error: what a status table has room for."""
    return first_line(text) or "(no error text recorded)"
