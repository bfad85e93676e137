"""A guard's link to ``warmcache serve``: its rows (a snapshot revalidated with its ETag) and its misses.

Standard library only (``urllib``), so a serving process needs no HTTP client package.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence

from warmcache.errors import UsageError
from warmcache.registry import ShapeRecord
from warmcache.registry.records import MissEvent
from warmcache.runtime.snapshot import decode_snapshot
from warmcache.settings_table import TOKEN, environment_value
from warmcache.trust import NOT_CONFIGURED, TrustedKeys


class SnapshotSource:
    """``load()`` returns the model's compiled rows from the service, re-downloading only when they changed.

    Each answer's signature is checked under ``trusted`` (when it has keys) before its rows
    replace the last verified ones; a ``304`` keeps rows that were verified when they came.
    """

    def __init__(
        self,
        service_url: str,
        model: str,
        workload: str,
        *,
        timeout: float = 5.0,
        trusted: TrustedKeys = NOT_CONFIGURED,
    ) -> None:
        query = urllib.parse.urlencode({"workload": workload})
        self.url = f"{service_url.rstrip('/')}/v1/guard/{urllib.parse.quote(model, safe='')}?{query}"
        self.timeout = timeout
        self.trusted = trusted
        self.etag: str | None = None
        self.downloads = 0
        """Full snapshots fetched (a ``304`` does not count): what a cheap refresh keeps at one."""
        self._records: list[ShapeRecord] = []

    def load(self) -> list[ShapeRecord]:
        request = urllib.request.Request(self.url, headers={"If-None-Match": self.etag} if self.etag else {})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                body = response.read()
                etag = response.headers.get("ETag")
        except urllib.error.HTTPError as exc:
            if exc.code == 304:
                return list(self._records)
            raise UsageError(f"{self.url}: {exc.code} {_error_message(exc)}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise UsageError(f"{self.url}: cannot reach warmcache serve: {getattr(exc, 'reason', exc)}") from None
        self._records = decode_snapshot(body, self.url, self.trusted).records
        self.etag = etag
        self.downloads += 1
        return list(self._records)


def _error_message(exc: urllib.error.HTTPError) -> str:
    try:
        return str(json.loads(exc.read())["error"]["message"])
    # a body nested deep enough makes json recurse out
    except (
        ValueError,
        KeyError,
        TypeError,
        OSError,
        RecursionError,
    ):
        return str(exc.reason)


class ServiceMisses:
    """Miss telemetry's sink for a guard built :meth:`~warmcache.runtime.guard.ShapeGuard.from_url`:
    ``POST /v1/misses`` with the bearer token in ``$WARMCACHE_TOKEN``. A refusal raises, so
    :class:`~warmcache.runtime.telemetry.MissTelemetry` keeps the counts and retries."""

    def __init__(self, service_url: str, *, timeout: float) -> None:
        self.url = f"{service_url.rstrip('/')}/v1/misses"
        self.timeout = timeout

    def record_misses(self, events: Sequence[MissEvent]) -> None:
        body = json.dumps({"misses": [_miss_json(e) for e in events]}).encode()
        token = environment_value(TOKEN)
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token.text if token else ''}"}
        request = urllib.request.Request(self.url, data=body, method="POST", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout):
                pass
        except urllib.error.HTTPError as exc:
            raise UsageError(f"{self.url}: {exc.code} {_error_message(exc)}") from None

    def close(self) -> None:
        """Nothing held between flushes (one request each)."""


def _miss_json(event: MissEvent) -> dict[str, object]:
    return {
        "model": event.model_name,
        "workload": event.workload,
        "dtype": event.dtype,
        "batch_size": event.batch_size,
        "seq_len": event.seq_len,
        "decision": event.decision,
        "padded_batch": event.padded_batch,
        "padded_seq": event.padded_seq,
        "count": event.count,
        "tp_size": event.tp_size,
        "fsdp_size": event.fsdp_size,
    }
