"""Read-side questions about the registry: what ``warmcache shapes`` lists, and can a request run.

Which rows are usable on this machine is the registry's rule
(:mod:`warmcache.registry.usability`); this module words and decides with it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from warmcache.registry.differences import describe, stale_differences
from warmcache.registry.records import ShapeRecord
from warmcache.registry.statuses import Status
from warmcache.registry.usability import bucket_tables, effective_status, stale_records, usable_records
from warmcache.shapes import BucketTable, Decision, ShapeFamily, format_pairs
from warmcache.targets import target_of

if TYPE_CHECKING:
    from warmcache.registry.registry import PlanStatus, Registry


def shapes_summary(listed: Sequence[tuple[ShapeRecord, str]]) -> list[str]:
    """``warmcache shapes``'s closing lines: the count by (effective) status, then why rows read ``compiled``.

    Right after ``warmcache verify``, ``8 compiled, 4 verified`` reads like a verify that
    missed 8 shapes; the line after it says which of them verify cannot prove (nothing
    on disk) and which it has not proven yet.
    """
    counts = Counter(status for _, status in listed)
    lines = [f"{len(listed)} shapes: " + (", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "none")]
    compiled = [r for r, status in listed if status == Status.COMPILED]
    # No cache folder recorded (no precompiled artifact either) and a backend that keeps none: nothing to prove.
    diskless = [
        r for r in compiled if r.cache_root is None and target_of(r.device, r.backend, r.mode).cache_flavor is None
    ]
    if diskless:
        backends = " and ".join(sorted({r.backend for r in diskless}))
        lines.append(
            f"{len(diskless)} of the compiled ran on {backends}, which keeps no compile cache on disk: verify "
            "replays them but has nothing to prove, so they stay compiled"
        )
    if len(compiled) > len(diskless):
        lines.append(
            f"{len(compiled) - len(diskless)} compiled not proven yet: warmcache verify MANIFEST replays them in a "
            "fresh process and marks them verified"
        )
    return lines


@dataclass(frozen=True, slots=True)
class CheckRequest:
    """One request to decide, as ``warmcache check`` and ``GET /v1/check`` take it: its shape, and which compiled
    families may serve it."""

    batch_size: int
    seq_len: int
    #: Padding does not count: the exact shape must be compiled.
    exact: bool = False
    #: Only families of this dtype.
    dtype: str | None = None
    #: Only families compiled for this cache length.
    max_cache_len: int | None = None


@dataclass(frozen=True, slots=True)
class CheckResult:
    """Whether a request of ``(batch, seq)`` can run without compiling, and how."""

    decision: Decision
    family: ShapeFamily | None
    #: Why nothing was usable, when that is the reason for refusing (rows stale, pending, failed).
    reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.decision.runnable

    def message(self) -> str:
        d = self.decision
        where = self.family.describe() if self.family else ""
        if d.kind == "exact":
            return f"ok: batch={d.batch_size} seq={d.seq_len} is compiled exactly ({where})"
        if d.kind == "pad":
            assert d.target is not None
            return (
                f"ok: batch={d.batch_size} seq={d.seq_len} pads to compiled batch={d.target[0]} "
                f"seq={d.target[1]} ({where})"
            )
        if self.reason:
            return f"not compiled: batch={d.batch_size} seq={d.seq_len}: {self.reason}"
        return (
            f"not compiled: batch={d.batch_size} seq={d.seq_len} fits no compiled shape; nearest: "
            f"{format_pairs(d.nearest)}"
        )

    def as_json(self) -> dict[str, Any]:
        d = self.decision
        return {
            "ok": self.ok,
            "decision": d.kind,
            "batch_size": d.batch_size,
            "seq_len": d.seq_len,
            "target": {"batch_size": d.target[0], "seq_len": d.target[1]} if d.target else None,
            "nearest": [{"batch_size": b, "seq_len": s} for b, s in d.nearest],
            "reason": self.reason,
            "family": None
            if self.family is None
            else {
                "model": self.family.model,
                "workload": self.family.workload,
                "dtype": self.family.dtype,
                "max_cache_len": self.family.max_cache_len,
                "tp_size": self.family.tp_size,
                "fsdp_size": self.family.fsdp_size,
                "settings": self.family.settings.stored(),
            },
        }


class RequestChecker:
    """The decision of :func:`check_request` over rows already loaded (one model and workload).

    The usable rows' bucket tables are built once, so a long-lived caller (``warmcache
    serve``) answers each request with a few bisects and no database access.
    """

    def __init__(self, records: Sequence[ShapeRecord], *, model: str, workload: str) -> None:
        self.model = model
        self.workload = workload
        self.records = list(records)
        self._tables = bucket_tables(usable_records(self.records))

    def check(self, request: CheckRequest) -> CheckResult:
        """Decide a request against every usable compiled family of the model; the least padding wins."""
        batch_size, seq_len = request.batch_size, request.seq_len
        tables = {
            family: table
            for family, table in self._tables.items()
            if (request.dtype is None or family.dtype == request.dtype)
            and (request.max_cache_len is None or family.max_cache_len == request.max_cache_len)
        }
        best: CheckResult | None = None
        nearest: list[tuple[int, int]] = []
        for family, table in tables.items():
            decision = table.decide(batch_size, seq_len)
            if decision.kind == "pad" and request.exact:
                decision = Decision("refuse", batch_size, seq_len, nearest=table.nearest(batch_size, seq_len))
            if decision.runnable:
                cost = _padded_tokens(decision)
                if best is None or cost < _padded_tokens(best.decision):
                    best = CheckResult(decision, family)
            else:
                nearest.extend(decision.nearest)
        if best is not None:
            return best
        if not tables:
            counts = Counter(effective_status(r) for r in self.records)
            found = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
            stale = stale_records(self.records)
            why = f"; stale: {describe(stale_differences(stale))}" if stale else ""
            reason = f"no usable compiled {self.workload} shape on this machine (registry rows: {found}){why}"
            return CheckResult(Decision("refuse", batch_size, seq_len), None, reason=reason)
        ranked = BucketTable.from_pairs(set(nearest)).nearest(batch_size, seq_len)
        return CheckResult(Decision("refuse", batch_size, seq_len, nearest=ranked), None)


def check_request(registry: Registry, model: str, workload: str, request: CheckRequest) -> CheckResult:
    """Decide a request against the registry's rows of ``model`` (see :class:`RequestChecker`)."""
    records = registry.rows(model=model, workload=workload)
    if not records:
        # A deployment gate asks "can this run without compiling?": with no rows the answer is no.
        reason = f"model {model!r} has no {workload} shapes in registry {registry.location.display}"
        return CheckResult(Decision("refuse", request.batch_size, request.seq_len), None, reason=reason)
    return RequestChecker(records, model=model, workload=workload).check(request)


def shape_json(record: ShapeRecord) -> dict[str, Any]:
    """A row as ``warmcache shapes --json`` (and ``GET /v1/shapes``) show it: its effective and stored status."""
    return {**record.as_json(), "status": effective_status(record), "stored_status": record.status}


def plan_json(status: PlanStatus, reason: str | None = None) -> dict[str, Any]:
    """A planned shape as ``warmcache plan --json`` (and ``POST /v1/plan``) show it; ``reason``: why it is not usable
    (see :mod:`warmcache.reports.explain`)."""
    planned, family = status.planned, status.planned.spec.family
    record = status.record
    return {
        "model": planned.model.name,
        "workload": planned.spec.workload,
        "batch_size": planned.spec.batch_size,
        "seq_len": planned.spec.seq_len,
        "max_cache_len": family.max_cache_len,
        "dtype": family.dtype,
        "tp_size": family.tp_size,
        "fsdp_size": family.fsdp_size,
        "settings": family.settings.stored(),
        "device": planned.model.device,
        "backend": planned.model.backend,
        "status": status.status,
        "reason": reason,
        "identity": planned.identity,
        "compile_seconds": record.compile_seconds if record and status.status != Status.STALE else None,
    }


def _padded_tokens(decision: Decision) -> int:
    target = decision.target or (decision.batch_size, decision.seq_len)
    return target[0] * target[1]
