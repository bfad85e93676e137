"""Why a declared shape is not usable here, in one line naming each differing field.

A row's identity hashes its parts (declared shape, model config, attention
implementation, toolchain); the row keeps the parts themselves, so a shape that
reads ``stale`` can say which part moved and from what to what
(``stale: inductor TORCHINDUCTOR_FREEZING unset → 1``), and a ``missing`` one
which compiled bucket of its family is nearest. ``warmcache explain``, ``plan
--json``, ``POST /v1/plan`` and the runtime guard all word it here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from warmcache.errors import first_line
from warmcache.identity.fingerprint import current_toolchain
from warmcache.jsonable import FieldsJson
from warmcache.registry.records import ShapeRecord
from warmcache.registry.statuses import DONE_STATUSES, Status
from warmcache.shapes import BucketTable, ShapeSpec

if TYPE_CHECKING:
    from warmcache.identity.plan import PlannedShape
    from warmcache.registry.registry import PlanStatus, Registry

UNSET = "unset"


@dataclass(frozen=True, slots=True)
class Difference(FieldsJson):
    """One fingerprint part whose recorded value differs from this machine's."""

    field: str
    recorded: str
    current: str

    def __str__(self) -> str:
        return f"{self.field} {self.recorded} → {self.current}"


def _env_group(name: str) -> str:
    """``inductor``, ``dynamo``, ``compile`` or ``neuron``: who reads a compiler variable."""
    for prefix, group in (("TORCHINDUCTOR_", "inductor"), ("TORCHDYNAMO_", "dynamo"), ("TORCH_COMPILE_", "compile")):
        if name.startswith(prefix):
            return group
    return "neuron"


def _flatten(toolchain: dict[str, Any]) -> dict[str, str | None]:
    """The toolchain's parts under the names ``explain`` shows them by."""
    out: dict[str, str | None] = {}
    for key, value in toolchain.items():
        if key == "packages":
            out.update({name: version for name, version in value.items()})
        elif key == "compile_env":
            out.update({f"{_env_group(name)} {name}": setting for name, setting in value.items()})
        elif key == "neuron_cc_flags":
            out["neuron NEURON_CC_FLAGS"] = value or None
        elif key == "cuda_driver":
            out["cuda driver"] = value
        else:
            out[key] = value
    return out


def toolchain_differences(recorded: dict[str, Any], current: dict[str, Any]) -> list[Difference]:
    """Each part of two toolchains' fingerprints that differs (a part one of them lacks reads ``unset``)."""
    before, after = _flatten(recorded), _flatten(current)
    return [
        Difference(name, str(before.get(name) or UNSET), str(after.get(name) or UNSET))
        for name in sorted(before.keys() | after.keys(), key=lambda n: (n.count(" "), n))
        if (before.get(name) or None) != (after.get(name) or None)
    ]


def record_differences(
    record: ShapeRecord, config_hash: str, attn_implementation: str | None, toolchain: dict[str, Any]
) -> list[Difference]:
    """What separates a row from the identity this machine would give its shape."""
    out = []
    if record.config_hash != config_hash:
        out.append(Difference("model config_hash", record.config_hash, config_hash))
    if record.attn_implementation != attn_implementation:
        out.append(
            Difference("model attn_implementation", record.attn_implementation or UNSET, attn_implementation or UNSET)
        )
    return out + toolchain_differences(record.toolchain, toolchain)


def stale_differences(records: Sequence[ShapeRecord]) -> list[Difference]:
    """Why rows compiled elsewhere are not usable here: their toolchain against this machine's (the most recent
    row's)."""
    if not records:
        return []
    latest = max(records, key=lambda r: r.updated_at)
    return toolchain_differences(
        latest.toolchain, current_toolchain(latest.device, latest.backend, latest.mode).as_dict()
    )


def describe(differences: Sequence[Difference]) -> str:
    return ", ".join(str(d) for d in differences) or "identity differs"


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
