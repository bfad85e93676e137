"""ShapeGuard: keep production requests on compiled shapes, by padding them or refusing them.

The guard is built once from the registry (or a snapshot file) for one shape
family: one model, workload, dtype, parallelism and set of graph-changing
settings. Its decisions are a bisect over an in-memory
:class:`~warmcache.shapes.BucketTable` (memoised): no database access and no
torch on the hot path.

Policies:

``pad``
    Pad a request up to the smallest compiled bucket that fits. A request beyond
    every bucket is refused (:class:`~warmcache.errors.UnseenShapeError`), never
    silently compiled.
``refuse``
    Run only exactly compiled shapes; anything else is refused.
``warn``
    Pad when a bucket fits; otherwise let the request through unpadded (it will
    compile) and log and record it. For rollouts where a stall beats an error.

Padded, refused and warned requests are counted by :class:`MissTelemetry` and
flushed to the registry in the background (``warmcache misses`` shows them).
The torch-facing helpers (:meth:`fit`, :meth:`generate`, :meth:`prime`,
:meth:`collator`, :meth:`callback`, :meth:`sentinel`) import torch only when
called.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

from warmcache.artifacts.trust import ArtifactTrust
from warmcache.errors import UnseenShapeError, UsageError
from warmcache.registry.records import MissEvent, ShapeRecord
from warmcache.runtime.guard_rows import RowFilter, model_config_filter, select_family
from warmcache.runtime.guard_sources import (
    RowSource,
    SnapshotTrust,
    registry_source,
    service_source,
    snapshot_source,
)
from warmcache.runtime.guard_torch import TorchFacing
from warmcache.runtime.guarded import POLICIES, Policy
from warmcache.runtime.telemetry import MissTelemetry
from warmcache.settings import RegistryLocation
from warmcache.shapes import DTYPE_ALIASES, BucketTable, Decision, ShapeFamily, Workload, format_pairs

if TYPE_CHECKING:
    from warmcache.trust import TrustedKeys


class GuardOptions(TypedDict, total=False):
    """What selects the family and how the guard behaves, whatever the rows come from."""

    #: What a request no bucket holds exactly gets: ``pad`` (default), ``refuse`` or ``warn``.
    policy: Policy
    #: Keep only rows of this dtype (``float16``, ``bfloat16``, ...); needed when the model has rows of several.
    dtype: str | None
    #: Keep only rows compiled with this static cache length.
    max_cache_len: int | None
    #: Keep only rows of this compile backend (``inductor``, ``neuron``, ...).
    backend: str | None
    #: Seconds between flushes of the miss counts (default 10).
    telemetry_interval: float


log = logging.getLogger("warmcache.runtime")


class ShapeGuard(TorchFacing):
    """The compiled buckets of one shape family and the policy for everything else; the torch-facing helpers
    (:meth:`fit`, :meth:`generate`, :meth:`prime`, ...) come from :class:`~warmcache.runtime.guard_torch.TorchFacing`.
    """

    def __init__(
        self,
        load: Callable[[], list[ShapeRecord]],
        *,
        model: str,
        workload: Workload = "generate",
        policy: Policy = "pad",
        dtype: str | None = None,
        max_cache_len: int | None = None,
        backend: str | None = None,
        source: str,
        telemetry_url: RegistryLocation | str | None = None,
        telemetry_interval: float = 10.0,
        artifact_trust: ArtifactTrust | None = None,
    ) -> None:
        """Prefer :meth:`from_registry` and :meth:`from_snapshot`; ``load`` returns the candidate rows.

        ``artifact_trust`` says whether the rows may name code :meth:`prime` loads (default: rows from the registry)."""
        if policy not in POLICIES:
            raise UsageError(f"guard policy {policy!r} is not one of {', '.join(POLICIES)}")
        self.model_name = model
        self.workload: Workload = workload
        self.policy: Policy = policy
        self.source = source
        self.artifact_trust = artifact_trust or ArtifactTrust.registry(source)
        self.primed = False
        self._filters = RowFilter(DTYPE_ALIASES.get(dtype, dtype) if dtype else None, max_cache_len, backend)
        self._load = load
        self._config_hash: str | None = None
        self._attn_implementation: str | None = None
        self._records: list[ShapeRecord] = []
        #: The rows of the last load, so narrowing to one model config needs no second read of the registry.
        self._loaded: list[ShapeRecord] = []
        self._table = BucketTable()
        self.family = self._reload()
        self.telemetry = MissTelemetry(self.family, telemetry_url, interval=telemetry_interval)

    # ------------------------------------------------------------ construction

    @classmethod
    def from_registry(
        cls,
        registry_url: str,
        model: str,
        workload: Workload = "generate",
        *,
        telemetry: bool = True,
        **options: Unpack[GuardOptions],
    ) -> ShapeGuard:
        """A guard over the registry's usable rows; misses are flushed back to the same registry.

        :param registry_url: the registry's database URL (``sqlite:///...``, ``postgresql://...``).
        :param model: the manifest's model name.
        :param workload: ``generate`` or ``train``.
        :param telemetry: flush padded, refused and warned requests to the registry (``warmcache misses``).
        :param options: the policy and the filters that pick one family (:class:`GuardOptions`).
        :raises UsageError: no usable row, or several families that ``options`` do not tell apart.
        """
        location = RegistryLocation.of(registry_url)  # checked once, here at the library's edge
        telemetry_url = location if telemetry else None
        return cls._over(registry_source(location, model, workload), model, workload, telemetry_url, options)

    @classmethod
    def from_snapshot(
        cls,
        path: str | Path,
        model: str,
        workload: Workload = "generate",
        *,
        telemetry_url: str | None = None,
        trust: TrustedKeys | Sequence[str] | str | None = None,
        allow_unsigned: bool = False,
        **options: Unpack[GuardOptions],
    ) -> ShapeGuard:
        """A guard over an exported snapshot (a file, or a folder holding ``warmcache-guard.json`` beside its cache
        entries); misses go to ``telemetry_url`` if given, else stay in memory.

        ``trust`` (keys or ``.pub`` files; default ``$WARMCACHE_TRUSTED_KEYS``) checks the snapshot's
        signature: with keys, a snapshot unsigned, altered or signed by another key is refused. Without
        keys the rows still guard shapes, but :meth:`prime` loads none of the precompiled code they name
        unless ``allow_unsigned`` (see :mod:`warmcache.artifacts.trust`).

        :param path: the snapshot file, or the folder holding it (``warmcache guard export``).
        :param model: the model name the snapshot was exported for.
        :param workload: ``generate`` or ``train``.
        :param telemetry_url: a registry URL or ``warmcache serve`` address to send misses to.
        :param trust: the public keys the snapshot must be signed by.
        :param allow_unsigned: let :meth:`prime` load precompiled code that no trusted key vouches for.
        :param options: the policy and the filters that pick one family (:class:`GuardOptions`).
        :raises WarmcacheError: the snapshot is unreadable, badly signed, or holds no usable row for ``model``.
        """
        source = snapshot_source(path, model, workload, SnapshotTrust.of(trust, allow_unsigned))
        return cls._over(source, model, workload, telemetry_url, options)

    @classmethod
    def from_url(
        cls,
        service_url: str,
        model: str,
        workload: Workload = "generate",
        *,
        telemetry: bool = True,
        timeout: float = 5.0,
        trust: TrustedKeys | Sequence[str] | str | None = None,
        allow_unsigned: bool = False,
        **options: Unpack[GuardOptions],
    ) -> ShapeGuard:
        """A guard over ``warmcache serve``'s snapshot of the model (``GET /v1/guard/{model}``), for processes
        without database access. :meth:`refresh` sends the last ETag, so an unchanged registry costs one
        ``304`` and no parsing. Misses are posted to the service (``POST /v1/misses``, with the token in
        ``$WARMCACHE_TOKEN``) unless ``telemetry`` is false. ``trust`` and ``allow_unsigned`` as in
        :meth:`from_snapshot` (the service signs its answers with ``serve --sign``).

        :param service_url: ``warmcache serve``'s address (``http://host:8411``).
        :param model: the model name.
        :param workload: ``generate`` or ``train``.
        :param telemetry: post misses to the service.
        :param timeout: seconds each request to the service may take.
        :param trust: the public keys the service's answers must be signed by.
        :param allow_unsigned: let :meth:`prime` load precompiled code that no trusted key vouches for.
        :param options: the policy and the filters that pick one family (:class:`GuardOptions`).
        """
        trusted = SnapshotTrust.of(trust, allow_unsigned)
        source = service_source(service_url, model, workload, trusted, timeout=timeout)
        return cls._over(source, model, workload, service_url if telemetry else None, options)

    @classmethod
    def _over(
        cls,
        source: RowSource,
        model: str,
        workload: Workload,
        telemetry_url: RegistryLocation | str | None,
        options: GuardOptions,
    ) -> ShapeGuard:
        """The guard over ``source``'s rows: what every constructor above ends in."""
        return cls(
            source.load,
            model=model,
            workload=workload,
            source=source.name,
            telemetry_url=telemetry_url,
            artifact_trust=source.artifact_trust,
            **options,
        )

    def refresh(self) -> None:
        """Reload the rows (new buckets compiled since start-up become usable); the family must not change."""
        self._reload(expect=self.family)

    def _reload(self, expect: ShapeFamily | None = None, *, reuse: bool = False) -> ShapeFamily:
        if not reuse:
            self._loaded = self._load()
        rows, family, table = select_family(
            self._loaded,
            self._filters,
            config_hash=self._config_hash,
            attn_implementation=self._attn_implementation,
            source=self.source,
            wanted=f"model {self.model_name!r} {self.workload}",
        )
        if expect is not None and family != expect:
            # Checked before the swap: a refused refresh must leave the old table serving.
            raise UsageError(
                f"{self.source}: guard family changed on refresh from {expect.describe()} to {family.describe()}"
            )
        # Swap whole objects so a concurrent decide() sees either the old table or the new one.
        self._records, self._table = rows, table
        log.debug(
            "guard %r %s: %d usable rows of %s %s from %s",
            self.model_name,
            self.workload,
            len(rows),
            family.describe(),
            "kept" if reuse else "reloaded" if expect is not None else "loaded",
            self.source,
        )
        return family

    # ------------------------------------------------------------ facts

    @property
    def records(self) -> list[ShapeRecord]:
        return list(self._records)

    @property
    def buckets(self) -> list[tuple[int, int]]:
        """The compiled ``(batch, length)`` pairs, smallest first."""
        return self._table.pairs()

    @property
    def target(self) -> tuple[str, str, str]:
        """``(device, backend, mode)`` the buckets were compiled for."""
        r = self._records[0]
        return r.device, r.backend, r.mode

    def check_model_config(self, config: dict[str, Any], attn_implementation: str | None = None) -> None:
        """Refuse a model whose config or attention implementation differs from what the buckets were compiled for.

        Weights are graph inputs, so any checkpoint of the same config shares the
        graphs; a different config (layers, heads, vocabulary) or attention
        implementation (eager, sdpa, flash) would compile anew. Rows recorded
        without a declared implementation (transformers' default) accept any.
        When rows of several configs exist, the table narrows to this model's rows.

        :param config: the model's config as a dict (``model.config.to_dict()``).
        :param attn_implementation: the attention implementation the model was loaded with (``eager``, ``sdpa``, ...).
        :raises UsageError: no compiled row matches the config or the attention implementation.
        """
        self._config_hash, self._attn_implementation = model_config_filter(
            self._records, config, attn_implementation, source=self.source, wanted=f"model {self.model_name!r}"
        )
        self._reload(reuse=True)

    # ------------------------------------------------------------ the hot path

    def decide(self, batch_size: int, seq_len: int) -> Decision:
        """Where a request of ``(batch, length)`` runs: exact, padded to ``target``, or (``warn`` only) unguarded.

        Returns a ``refuse`` decision only under ``warn``: run unpadded, it will compile.

        :param batch_size: the request's rows.
        :param seq_len: its longest prompt, in tokens.
        :raises UnseenShapeError: the policy forbids running it (no bucket fits, or not exactly under ``refuse``).
        """
        decision = self._table.decide(batch_size, seq_len)
        if decision.kind == "exact":
            return decision
        if decision.kind == "pad" and self.policy != "refuse":
            self.telemetry.record(decision)
            return decision
        if self.policy == "warn":
            self.telemetry.record(decision, "warn")
            log.warning("%s", self.unseen_message(decision, "fits no compiled shape and will compile (policy warn)"))
            return decision
        self.telemetry.record(decision, "refuse")
        reason = "is not compiled exactly (policy refuse)" if decision.kind == "pad" else "fits no compiled shape"
        raise UnseenShapeError(self.unseen_message(decision, reason))

    def require_exact(self, batch_size: int, seq_len: int) -> Decision:
        """For shapes already fixed (a collated training batch): anything but an exact bucket is a miss.

        :param batch_size: the batch's rows.
        :param seq_len: its length, in tokens.
        :raises UnseenShapeError: the shape is not a compiled bucket, unless the policy is ``warn`` (then it is
            logged and recorded).
        """
        decision = self._table.decide(batch_size, seq_len)
        if decision.kind == "exact":
            return decision
        kind = "warn" if self.policy == "warn" else "refuse"
        self.telemetry.record(decision, kind)
        message = self.unseen_message(decision, f"is not a compiled bucket (policy {self.policy})")
        if kind == "refuse":
            raise UnseenShapeError(message)
        log.warning("%s", message)
        return decision

    def bucket(self, batch_size: int, seq_len: int) -> Decision:
        """The table's answer alone: no policy, no telemetry (for callers that apply their own, like the collator)."""
        return self._table.decide(batch_size, seq_len)

    def longest_length(self, batch_size: int) -> int | None:
        """The longest compiled length among buckets that hold ``batch_size`` rows (what to truncate to)."""
        return max((length for batch, length in self._table.pairs() if batch >= batch_size), default=None)

    def unseen_message(self, decision: Decision, reason: str) -> str:
        """``<family>: request batch=B seq=L <reason>; nearest compiled: ...`` (one line)."""
        nearest = decision.nearest or self._table.nearest(decision.batch_size, decision.seq_len)
        return (
            f"{self.family.describe()}: request batch={decision.batch_size} seq={decision.seq_len} "
            f"{reason}; nearest compiled: {format_pairs(nearest)}"
        )

    def misses(self) -> list[MissEvent]:
        """Every padded/refused/warned request this guard saw, aggregated per shape."""
        return self.telemetry.totals()

    def close(self, timeout: float = 5.0) -> None:
        """Flush telemetry (bounded by ``timeout``; a database outage is abandoned, not waited for)."""
        self.telemetry.close(timeout)

    def __enter__(self) -> ShapeGuard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
