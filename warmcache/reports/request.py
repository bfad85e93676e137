"""Why one request's shape is (not) usable here: ``warmcache explain --model --batch --seq``, asked as ``check`` asks.

``check`` answers yes or no, with the nearest compiled shapes; a user who wants to
know *why* a shape is not usable used to write a manifest declaring it. Here the
registry's own rows of the requested shape say it: a row compiled under another
toolchain names what moved (``stale: torch 2.12 → 2.13``), a failed one its error,
a claimed or pending one that it is not done; with no row at all, the nearest
compiled shapes. No manifest, so no model config is read and nothing imports torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from warmcache.errors import UsageError
from warmcache.identity.fingerprint import current_toolchain
from warmcache.manifest.checker import close_match
from warmcache.registry.differences import Difference, describe, toolchain_differences
from warmcache.registry.records import ShapeRecord
from warmcache.registry.statuses import Status
from warmcache.registry.usability import effective_status
from warmcache.reports.explain import unfinished_reason
from warmcache.reports.query import CheckRequest, CheckResult, RequestChecker
from warmcache.shapes import format_pairs

if TYPE_CHECKING:
    from warmcache.registry.registry import Registry

#: Known model names an unknown-model error lists (a registry may hold hundreds).
KNOWN_NAMES_SHOWN = 10


def require_known_model(registry: Registry, model: str) -> None:
    """Refuse (exit 2) a model the registry has no row of, naming the nearest known names: a mistyped ``--model``
    is a malformed question, not a shape that is "not compiled"."""
    names = registry.model_names()
    if model in names:
        return
    if not names:
        raise UsageError(
            f"--model {model!r}: registry {registry.location.display} has no rows yet (run warmcache warmup MANIFEST)"
        )
    close = close_match(model, tuple(names))
    hint = f"did you mean {close!r}? " if close else ""
    shown = names[:KNOWN_NAMES_SHOWN]
    more = f" and {len(names) - len(shown)} more" if len(names) > len(shown) else ""
    raise UsageError(
        f"--model {model!r}: no rows of this model in registry {registry.location.display}; {hint}"
        f"(models there: {', '.join(shown)}{more})"
    )


@dataclass(frozen=True, slots=True)
class RequestExplanation:
    """Why a requested shape is not usable here, in the form ``explain MANIFEST`` gives a declared one."""

    family: str
    """The family of the row explained, or the model and workload asked (``tiny-qwen3/generate``)."""
    workload: str
    batch_size: int
    seq_len: int
    status: str
    reason: str
    differences: tuple[Difference, ...] = ()

    def line(self) -> str:
        return f"{self.family} batch={self.batch_size} seq={self.seq_len}: {self.reason}"

    def as_json(self, model: str) -> dict[str, Any]:
        return {
            "model": model,
            "workload": self.workload,
            "batch_size": self.batch_size,
            "seq_len": self.seq_len,
            "status": self.status,
            "reason": self.reason,
            "differences": [d.as_json() for d in self.differences],
        }


def _row_reason(record: ShapeRecord) -> tuple[str, tuple[Difference, ...]]:
    """Why a row is not usable here (``""``: it is), and what differs when it is stale."""
    status = effective_status(record)
    if status == Status.STALE:
        here = current_toolchain(record.device, record.backend, record.mode).as_dict()
        differences = toolchain_differences(record.toolchain, here)
        return f"stale: {describe(differences)}", tuple(differences)
    return unfinished_reason(status, record) or "", ()


def _in_request(record: ShapeRecord, request: CheckRequest) -> bool:
    """A row of exactly the requested shape, in a family the request allows."""
    return (
        record.batch_size == request.batch_size
        and record.seq_len == request.seq_len
        and (request.dtype is None or record.dtype == request.dtype)
        and (request.max_cache_len is None or record.max_cache_len == request.max_cache_len)
    )


def explain_request(
    records: Sequence[ShapeRecord], model: str, workload: str, request: CheckRequest
) -> tuple[CheckResult, list[RequestExplanation]]:
    """``check``'s decision over the model's rows, and why the request is not usable (empty when it is).

    Each row of exactly the requested shape that is not usable says why; with none, the
    shape is missing and the nearest compiled shapes are named (as ``check`` ranks them).
    """
    result = RequestChecker(records, model=model, workload=workload).check(request)
    if result.ok:
        return result, []
    explained = []
    for record in records:
        if _in_request(record, request):
            reason, differences = _row_reason(record)
            if reason:
                explained.append(
                    RequestExplanation(
                        record.family.describe(),
                        workload,
                        request.batch_size,
                        request.seq_len,
                        effective_status(record),
                        reason,
                        differences,
                    )
                )
    if explained:
        return result, explained
    asked = f"no row for batch={request.batch_size} seq={request.seq_len}"
    if result.reason:
        why = f"missing: {asked}; {result.reason}"
    else:
        why = f"missing: {asked}; nearest compiled {format_pairs(result.decision.nearest)}"
    return result, [
        RequestExplanation(f"{model}/{workload}", workload, request.batch_size, request.seq_len, Status.MISSING, why)
    ]
