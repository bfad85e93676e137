"""Why a declared shape is not usable here, in one line naming each differing field.

A shape that reads ``stale`` says which part of its identity moved and from what to
what (``stale: inductor TORCHINDUCTOR_FREEZING unset → 1``, worded by
:mod:`warmcache.registry.differences`), a failed, compiling or pending one why it is
not done, and a ``missing`` one which compiled bucket of its family is nearest.
``warmcache explain``, ``plan --json`` and ``POST /v1/plan`` all word it here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from warmcache.errors import first_line
from warmcache.registry.differences import Difference, describe, record_differences
from warmcache.registry.records import ShapeRecord
from warmcache.registry.statuses import DONE_STATUSES, Status
from warmcache.shapes import BucketTable, ShapeSpec

if TYPE_CHECKING:
    from warmcache.identity.plan import PlannedShape
    from warmcache.registry.registry import PlanStatus, Registry


@dataclass(frozen=True, slots=True)
class Explanation:
    """A planned shape's status and, when it is not usable here, why."""

    status: PlanStatus
    reason: str | None
    differences: tuple[Difference, ...] = ()

    def as_json(self) -> dict[str, Any]:
        planned = self.status.planned
        return {
            "model": planned.model.name,
            "workload": planned.spec.workload,
            "batch_size": planned.spec.batch_size,
            "seq_len": planned.spec.seq_len,
            "status": self.status.status,
            "reason": self.reason,
            "differences": [d.as_json() for d in self.differences],
        }


def explain_plan(registry: Registry, planned: Sequence[PlannedShape]) -> list[Explanation]:
    """Every planned shape's status with its reason (``None`` for usable ones)."""
    statuses = registry.plan_status(planned)
    compiled: dict[str, list[ShapeRecord]] = {}
    for model in sorted({s.planned.model.name for s in statuses if s.status == Status.MISSING}):
        compiled[model] = registry.rows(model=model, statuses=list(DONE_STATUSES))
    return [_explain(s, compiled.get(s.planned.model.name, [])) for s in statuses]


def warmed_models(registry: Registry, planned: Sequence[PlannedShape]) -> set[str]:
    """The planned models with a compiled row under the config and toolchain planned now.

    Warmup refused any model warmcache cannot serve before compiling it, so these passed
    that check under this very config and toolchain: checking them again would import
    transformers and torch (10 s on 2 cores) to explain one missing bucket.
    """
    wanted = {(p.model.name, p.config_hash, p.toolchain.hash) for p in planned}
    return {
        r.model_name
        for name in sorted({name for name, _, _ in wanted})
        for r in registry.rows(model=name, statuses=list(DONE_STATUSES))
        if (r.model_name, r.config_hash, r.toolchain_hash) in wanted
    }


def _explain(status: PlanStatus, compiled: list[ShapeRecord]) -> Explanation:
    planned, record = status.planned, status.record
    if status.status in DONE_STATUSES:
        return Explanation(status, None)
    if status.status == Status.STALE and record is not None:
        differences = record_differences(
            record, planned.config_hash, planned.model.attn_implementation, planned.toolchain.as_dict()
        )
        return Explanation(status, f"stale: {describe(differences)}", tuple(differences))
    unfinished = unfinished_reason(status.status, record)
    if unfinished is not None:
        return Explanation(status, unfinished)
    return Explanation(status, _missing_reason(planned.spec, [r for r in compiled if _same_identity_parts(r, planned)]))


def unfinished_reason(status: str, record: ShapeRecord | None) -> str | None:
    """Why a row that is failed, compiling or pending is not usable yet (``None`` for any other status)."""
    if status == Status.FAILED and record is not None:
        return f"failed: {first_line(record.error) or 'no error recorded'} (attempts {record.attempts})"
    if status == Status.COMPILING and record is not None:
        return f"compiling: claimed by {record.claimed_by}"
    if status == Status.PENDING:
        return "pending: not compiled yet (run warmcache warmup)"
    return None


def _same_identity_parts(record: ShapeRecord, planned: PlannedShape) -> bool:
    """A row of the planned shape's family compiled for the same model and toolchain (usable to pad onto)."""
    return (
        record.family == planned.spec.family
        and record.config_hash == planned.config_hash
        and record.attn_implementation == planned.model.attn_implementation
        and record.toolchain_hash == planned.toolchain.hash
    )


def _missing_reason(spec: ShapeSpec, family_rows: list[ShapeRecord]) -> str:
    """``missing: no row for batch=8; nearest compiled batch=4`` (sizes equal to the request's are not repeated)."""
    asked = f"batch={spec.batch_size} seq={spec.seq_len}"
    if not family_rows:
        return f"missing: no row for {asked}; nothing of this family is compiled here yet"
    ((batch, length),) = BucketTable.from_pairs({(r.batch_size, r.seq_len) for r in family_rows}).nearest(
        spec.batch_size, spec.seq_len, count=1
    )
    sizes = [
        (name, want, got)
        for name, want, got in (("batch", spec.batch_size, batch), ("seq", spec.seq_len, length))
        if want != got
    ]
    return (
        f"missing: no row for {' '.join(f'{n}={w}' for n, w, _ in sizes)}; nearest compiled "
        f"{' '.join(f'{n}={g}' for n, _, g in sizes)}"
    )
