"""``POST /v1/misses``: validate a batch of miss reports from guards in other processes.

Every problem is reported at once, each naming its key path (``misses[3].batch_size``),
and nothing is written unless the whole batch is valid.
"""

from __future__ import annotations

from typing import Any

from warmcache.bounds import MAX_COUNT
from warmcache.errors import shown
from warmcache.registry.records import MissEvent
from warmcache.service.http import ApiError, json_body
from warmcache.shapes import WORKLOADS

#: Miss reports per request: a guard flushes aggregated counts, so real batches are small.
MAX_EVENTS = 10_000
DECISIONS = ("pad", "refuse", "warn", "clip", "truncate")
_REQUIRED_TEXT = ("model", "workload", "dtype", "decision")
_REQUIRED_INT = ("batch_size", "seq_len")
_OPTIONAL_INT = ("padded_batch", "padded_seq")
_DEFAULT_ONE = ("count", "tp_size", "fsdp_size")


def parse_misses(body: bytes) -> list[MissEvent]:
    document = json_body(body)
    items = document.get("misses") if isinstance(document, dict) else None
    if not isinstance(items, list):
        raise ApiError(400, "body must be an object with a list under 'misses'", "misses")
    if len(items) > MAX_EVENTS:
        raise ApiError(413, f"{len(items)} miss reports exceed the limit of {MAX_EVENTS} per request", "misses")
    problems: list[tuple[str, str]] = []
    events = [event for i, item in enumerate(items) if (event := _event(f"misses[{i}]", item, problems)) is not None]
    if problems:
        raise ApiError(400, "; ".join(f"{where}: {what}" for where, what in problems), problems[0][0])
    return events


def _event(where: str, item: Any, problems: list[tuple[str, str]]) -> MissEvent | None:
    if not isinstance(item, dict):
        problems.append((where, "must be an object"))
        return None
    before = len(problems)
    unknown = sorted(set(item) - {*_REQUIRED_TEXT, *_REQUIRED_INT, *_OPTIONAL_INT, *_DEFAULT_ONE})
    if unknown:
        problems.append(
            (f"{where}.{unknown[0]}", f"unknown key (expected {', '.join((*_REQUIRED_TEXT, *_REQUIRED_INT))}, ...)")
        )
    for key in _REQUIRED_TEXT:
        if not isinstance(item.get(key), str) or not item[key]:
            problems.append((f"{where}.{key}", f"expected a non-empty string, got {item.get(key)!r}"))
    if item.get("workload") not in WORKLOADS and isinstance(item.get("workload"), str):
        problems.append((f"{where}.workload", f"must be one of {', '.join(WORKLOADS)}"))
    if isinstance(item.get("decision"), str) and item["decision"] not in DECISIONS:
        problems.append((f"{where}.decision", f"must be one of {', '.join(DECISIONS)}"))
    for key in (*_REQUIRED_INT, *_OPTIONAL_INT, *_DEFAULT_ONE):
        value = item.get(key, 1 if key in _DEFAULT_ONE else None)
        if value is None and key in _OPTIONAL_INT:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_COUNT:
            problems.append(
                (
                    f"{where}.{key}",
                    f"expected an integer from 1 to {MAX_COUNT} (what the registry holds), got {shown(value)}",
                )
            )
    if len(problems) > before:
        return None
    return MissEvent(
        item["model"],
        item["workload"],
        item["dtype"],
        item["batch_size"],
        item["seq_len"],
        item["decision"],
        padded_batch=item.get("padded_batch"),
        padded_seq=item.get("padded_seq"),
        count=item.get("count", 1),
        tp_size=item.get("tp_size", 1),
        fsdp_size=item.get("fsdp_size", 1),
    )
