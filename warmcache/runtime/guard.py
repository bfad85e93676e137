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

from warmcache.cache.platform_mark import claim_for_target
from warmcache.errors import UnseenShapeError, UsageError
from warmcache.identity.fingerprint import config_hash
from warmcache.registry.records import MissEvent, ShapeRecord
from warmcache.runtime.artifact_trust import ArtifactTrust
from warmcache.runtime.guard_rows import RowFilter, select_family
from warmcache.runtime.guard_sources import (
    RowSource,
    SnapshotTrust,
    registry_source,
    service_source,
    snapshot_source,
)
from warmcache.runtime.guarded import POLICIES, Policy
from warmcache.runtime.telemetry import MissTelemetry
from warmcache.settings import RegistryLocation
from warmcache.shapes import DTYPE_ALIASES, BucketTable, Decision, ShapeFamily, Workload, format_pairs
from warmcache.targets import target_of

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from warmcache.runtime.padding import FittedBatch
    from warmcache.runtime.sentinel import SentinelReport
    from warmcache.runtime.serving import PrimeReport
    from warmcache.runtime.training import BucketCollator, GuardCallback
    from warmcache.trust import TrustedKeys


class GuardOptions(TypedDict, total=False):
    """What selects the family and how the guard behaves, whatever the rows come from."""

    policy: Policy
    dtype: str | None
    max_cache_len: int | None
    backend: str | None
    telemetry_interval: float


log = logging.getLogger("warmcache.runtime")


class ShapeGuard:
    """The compiled buckets of one shape family and the policy for everything else."""

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
        """A guard over the registry's usable rows; misses are flushed back to the same registry."""
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
        unless ``allow_unsigned`` (see :mod:`warmcache.runtime.artifact_trust`).
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
        :meth:`from_snapshot` (the service signs its answers with ``serve --sign``)."""
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
        """
        digest = config_hash(config)
        known = sorted({r.config_hash for r in self._records})
        if digest not in known:
            raise UsageError(
                f"{self.source}: model {self.model_name!r}: config_hash {digest} matches no compiled rows "
                f"(compiled for config_hash {', '.join(known)})"
            )
        declared = sorted(
            {
                r.attn_implementation
                for r in self._records
                if r.config_hash == digest and r.attn_implementation is not None
            }
        )
        if declared and attn_implementation not in declared:
            from warmcache.registry.differences import UNSET  # the error path alone needs it

            raise UsageError(
                f"{self.source}: model {self.model_name!r}: attn_implementation "
                f"{attn_implementation or UNSET!r} matches no compiled rows "
                f"(compiled with attn_implementation {', '.join(repr(a) for a in declared)}); load it "
                f"with attn_implementation={declared[0]!r}"
            )
        self._config_hash = digest
        self._attn_implementation = attn_implementation if declared else None
        self._reload(reuse=True)

    # ------------------------------------------------------------ the hot path

    def decide(self, batch_size: int, seq_len: int) -> Decision:
        """Where a request of ``(batch, length)`` runs: exact, padded to ``target``, or (``warn`` only) unguarded.

        Raises :class:`UnseenShapeError` when the policy forbids running it.
        Returns a ``refuse`` decision only under ``warn``: run unpadded, it will compile.
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

        A non-exact shape raises unless the policy is ``warn`` (then it is logged and recorded).
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

    # ------------------------------------------------------------ torch-facing helpers (lazy imports)

    def claim_compile_folder(self) -> None:
        """Refuse to compile where this process's Inductor cache holds another CPU platform's code.

        torch's FX graph key leaves out the vector ISA (:mod:`warmcache.cache.platform_mark`): tracing a
        bucket there, or compiling an unseen shape under ``warn``, would load kernels written for another
        vector width and give wrong numbers, which no policy accepts. The folder is torch's for this
        process (``$TORCHINDUCTOR_CACHE_DIR`` or its default), claimed as a warmup claims it.
        """
        target = target_of(*self.target)
        claim_for_target(target.default_cache_dir(), target)

    def fit(self, inputs: Any, pad_token_id: int | None = None) -> FittedBatch:
        """Left-pad a generate() batch to its bucket and add dummy rows; see :mod:`warmcache.runtime.padding`."""
        from warmcache.runtime.padding import fit_generate_inputs

        return fit_generate_inputs(self, inputs, pad_token_id)

    def generate(self, model: Any, /, **kwargs: Any) -> Any:
        """``model.generate`` on a compiled bucket: fit → generate → unpad; see :mod:`warmcache.runtime.serving`."""
        from warmcache.runtime.serving import guarded_generate

        return guarded_generate(self, model, **kwargs)

    def prime(self, model: Any, **kwargs: Any) -> PrimeReport:
        """Load every compiled bucket once, then run generate() under the strict sentinel; see
        :mod:`warmcache.runtime.serving`."""
        from warmcache.runtime.serving import prime

        return prime(self, model, **kwargs)

    def collator(self, tokenizer: Any, **kwargs: Any) -> BucketCollator:
        """A training data collator that keeps every batch on a compiled bucket."""
        from warmcache.runtime.training import BucketCollator

        return BucketCollator(self, tokenizer, **kwargs)

    def callback(self) -> GuardCallback:
        """A Trainer callback that checks every batch's shape before its step and counts compiles per step."""
        from warmcache.runtime.training import GuardCallback

        return GuardCallback(self)

    def sentinel(self, label: str = "guarded region") -> AbstractContextManager[SentinelReport]:
        """Fail (``pad``/``refuse``) or record (``warn``) any compile inside the block."""
        from warmcache.runtime.sentinel import recompile_sentinel

        return recompile_sentinel(self.policy, label)
