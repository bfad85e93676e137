"""What a warmup run is asked to do, plans to do, and did: plain data, shared by the runner and its torchrun ranks.

Kept apart from the runner so that :mod:`warmcache.warmup.distributed` (which the
runner uses) can name these types without importing the runner back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from warmcache.errors import ExitCode, UsageError
from warmcache.identity.plan import PlannedShape
from warmcache.registry.registry import PlanStatus
from warmcache.registry.statuses import DONE_STATUSES, Status
from warmcache.settings import RegistryLocation
from warmcache.warmup.progress import Outcome, SpecOutcome


@dataclass(frozen=True, slots=True)
class Shard:
    """``--shard I/N``: the I-th (1-based) of N disjoint, deterministic slices of a manifest."""

    index: int
    count: int

    @classmethod
    def parse(cls, text: str) -> Shard:
        try:
            index, count = (int(part) for part in text.split("/"))
        except ValueError:
            raise UsageError(f"--shard {text!r}: expected I/N, e.g. 1/4") from None
        if count < 1 or not 1 <= index <= count:
            raise UsageError(f"--shard {text!r}: need 1 <= I <= N")
        return cls(index, count)

    def select(self, planned: Sequence[PlannedShape]) -> list[PlannedShape]:
        """Every N-th spec in identity order: stable across machines and manifest edits elsewhere."""
        ordered = sorted(planned, key=lambda p: p.identity)
        return [p for i, p in enumerate(ordered) if i % self.count == self.index - 1]


@dataclass(frozen=True, slots=True)
class WarmupOptions:
    registry: RegistryLocation
    cache_dir: str | None = None
    lease_seconds: float | None = None
    jobs: int = 1
    shard: Shard | None = None
    retry_failed: bool = False
    dry_run: bool = False


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """What one ``--jobs`` worker process is asked: claim and run these specs of the manifest until none is left."""

    manifest: str
    registry: RegistryLocation
    cache_dir: str | None
    identities: tuple[str, ...]
    lease_seconds: float
    expected_seconds: tuple[float | None, ...]
    """Each identity's expected compile seconds (``None``: unknown), for claiming short specs several at a time."""


@dataclass(frozen=True, slots=True)
class WarmupRequest:
    """What a torchrun child is asked: warm the manifest's models of its world size, as ``warmcache warmup`` would."""

    manifest: str
    registry: RegistryLocation
    cache_dir: str | None
    lease_seconds: float | None
    shard: str | None
    retry_failed: bool

    @classmethod
    def of(cls, manifest: str, options: WarmupOptions) -> WarmupRequest:
        shard = f"{options.shard.index}/{options.shard.count}" if options.shard else None
        return cls(manifest, options.registry, options.cache_dir, options.lease_seconds, shard, options.retry_failed)

    def options(self) -> WarmupOptions:
        shard = Shard.parse(self.shard) if self.shard else None
        return WarmupOptions(
            self.registry, self.cache_dir, self.lease_seconds, shard=shard, retry_failed=self.retry_failed
        )


@dataclass(frozen=True, slots=True)
class WarmupPlan:
    """What a run will do with each planned spec."""

    statuses: list[PlanStatus]
    retry_failed: bool
    #: ``{identity: why}`` of done rows warmed again: they lack the files their model's precompile route saves
    #: (:mod:`warmcache.warmup.route_gaps`).
    rewarm: dict[str, str] = field(default_factory=dict)

    @property
    def done(self) -> list[PlanStatus]:
        return [s for s in self.statuses if s.status in DONE_STATUSES and s.planned.identity not in self.rewarm]

    @property
    def failed_kept(self) -> list[PlanStatus]:
        """Failed earlier and not retried this run."""
        return [] if self.retry_failed else [s for s in self.statuses if s.status == Status.FAILED]

    @property
    def todo(self) -> list[PlannedShape]:
        skip = set(DONE_STATUSES) | (set() if self.retry_failed else {Status.FAILED})
        return [s.planned for s in self.statuses if s.status not in skip or s.planned.identity in self.rewarm]

    def action(self, status: PlanStatus) -> str:
        if status.planned.identity in self.rewarm:
            return f"compile ({status.status}, {self.rewarm[status.planned.identity]})"
        if status.status in DONE_STATUSES:
            return f"skip ({status.status})"
        if status.status == Status.FAILED and not self.retry_failed:
            return "skip (failed; --retry-failed to retry)"
        return "compile"


@dataclass
class WarmupSummary:
    plan: WarmupPlan
    dry_run: bool
    outcomes: list[SpecOutcome] = field(default_factory=list)
    seconds: float = 0.0
    #: Specs of this run left failed (or unfinished) by other workers while it waited.
    unfinished: list[str] = field(default_factory=list)

    @property
    def failed(self) -> list[SpecOutcome]:
        return [o for o in self.outcomes if o.failed]

    @property
    def exit_code(self) -> int:
        """Non-zero while any planned spec is failed: the manifest is not fully warm."""
        return ExitCode.NOT_DONE if self.failed or self.plan.failed_kept or self.unfinished else ExitCode.OK

    def count(self, status: Outcome) -> int:
        return sum(1 for o in self.outcomes if o.status == status)

    def as_json(self) -> dict[str, Any]:
        count = self.count
        out: dict[str, Any] = {
            "planned": len(self.plan.statuses),
            "already_compiled": len(self.plan.done),
            "failed_before": len(self.plan.failed_kept),
            "to_compile": len(self.plan.todo),
            "compiled": count(Outcome.COMPILED),
            "failed": count(Outcome.FAILED),
            "lost": count(Outcome.LOST),
            "unfinished_elsewhere": self.unfinished,
            "seconds": round(self.seconds, 3),
            "dry_run": self.dry_run,
            "ok": self.exit_code == 0,
            "specs": [o.as_json() for o in self.outcomes],
        }
        if self.dry_run:
            out["plan"] = [
                {
                    "spec": s.planned.spec.describe(),
                    "identity": s.planned.identity,
                    "status": s.status,
                    "action": self.plan.action(s),
                }
                for s in self.plan.statuses
            ]
        return out

    def lines(self) -> list[str]:
        data = self.as_json()
        if self.dry_run:
            rows = [f"{p['action']:<40} {p['spec']}" for p in data["plan"]]
            return rows + [
                f"dry run: {data['planned']} planned, {data['to_compile']} to compile, "
                f"{data['already_compiled']} already compiled"
            ]
        out = [
            f"warmup: {data['planned']} planned, {data['already_compiled']} already compiled, "
            f"{data['compiled']} compiled, {data['failed']} failed in {self.seconds:.1f}s"
        ]
        out += [f"failed: {o.description}: {o.error}" for o in self.failed]
        out += [f"not warm (another worker's): {line}" for line in self.unfinished]
        if self.plan.failed_kept:
            out.append(
                f"{len(self.plan.failed_kept)} spec(s) failed in an earlier run; rerun with "
                "--retry-failed to compile them again"
            )
        return out
