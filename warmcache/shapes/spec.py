"""What a compiled shape is, and the bucket arithmetic over sets of them.

A :class:`ShapeSpec` is one declared shape of one model's workload, independent of
the machine: the registry adds the model's config hash and the toolchain hash to
form a row's identity (see :mod:`warmcache.identity.plan`). A :class:`ShapeFamily` groups
shapes that only differ by ``(batch, length)``; within one family a request can be
padded from one shape to another, so that is the unit a :class:`BucketTable`
answers for.
"""

from __future__ import annotations

import bisect
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Literal

from warmcache.errors import UsageError
from warmcache.shapes.workload_settings import GenerateSettings, TrainSettings, Workload, WorkloadSettings

WORKLOADS: tuple[Workload, ...] = ("generate", "train")

#: Canonical dtype names, and the spellings the manifest accepts for them.
DTYPE_ALIASES: dict[str, str] = {
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
}


def canonical_json(value: Any) -> str:
    """JSON that is byte-identical for equal values, whatever the key order."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def short_hash(value: Any, length: int = 20) -> str:
    """A stable hex digest of any JSON-able value (80 bits by default)."""
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()[:length]


@dataclass(frozen=True, slots=True)
class ShapeFamily:
    """Everything about a compiled shape except ``(batch, length)``.

    Two shapes of one family differ only in sizes a request can be padded across;
    shapes of different families never substitute for each other.
    """

    model: str
    dtype: str
    settings: WorkloadSettings
    tp_size: int = 1
    fsdp_size: int = 1

    @property
    def workload(self) -> Workload:
        return self.settings.workload

    @property
    def max_cache_len(self) -> int | None:
        """The registry's column: a generate family's cache length, ``None`` for train."""
        return self.settings.max_cache_len if isinstance(self.settings, GenerateSettings) else None

    @property
    def generate(self) -> GenerateSettings:
        """This family's generate settings; asking a train family for them is the caller's mistake, said once here."""
        if not isinstance(self.settings, GenerateSettings):
            raise UsageError(f"{self.describe()}: not a generate family (no max_cache_len)")
        return self.settings

    @property
    def train(self) -> TrainSettings:
        """This family's train settings; asking a generate family for them is the caller's mistake."""
        if not isinstance(self.settings, TrainSettings):
            raise UsageError(f"{self.describe()}: not a train family")
        return self.settings

    def describe(self) -> str:
        parts = [f"{self.model}/{self.workload}", self.dtype]
        if self.max_cache_len is not None:
            parts.append(f"max_cache_len={self.max_cache_len}")
        if self.tp_size != 1 or self.fsdp_size != 1:
            parts.append(f"tp={self.tp_size},fsdp={self.fsdp_size}")
        return " ".join(parts)


@dataclass(frozen=True, slots=True)
class ShapeSpec:
    """One declared shape: a family plus the batch size and sequence length.

    ``seq_len`` is the prompt length for ``generate`` and the training length for
    ``train``.
    """

    family: ShapeFamily
    batch_size: int
    seq_len: int

    @property
    def model(self) -> str:
        return self.family.model

    @property
    def workload(self) -> Workload:
        return self.family.workload

    @property
    def shape_hash(self) -> str:
        """Hash of the declared shape alone (no model config, no toolchain)."""
        f = self.family
        return short_hash(
            {
                "model": f.model,
                "workload": f.workload,
                "dtype": f.dtype,
                "max_cache_len": f.max_cache_len,
                "tp_size": f.tp_size,
                "fsdp_size": f.fsdp_size,
                "settings": f.settings.stored(),
                "batch_size": self.batch_size,
                "seq_len": self.seq_len,
            }
        )

    def describe(self) -> str:
        return f"{self.family.describe()} batch={self.batch_size} seq={self.seq_len}"


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do with a request of ``(batch, length)`` within one family."""

    kind: Literal["exact", "pad", "refuse"]
    batch_size: int
    seq_len: int
    target: tuple[int, int] | None = None
    nearest: tuple[tuple[int, int], ...] = ()

    @property
    def runnable(self) -> bool:
        return self.kind != "refuse"


@dataclass(slots=True)
class BucketTable:
    """The compiled ``(batch, length)`` pairs of one family, answering in microseconds.

    A request fits a bucket when both its batch and its length are no larger. The
    chosen bucket is the smallest batch that has any fitting length, then the
    smallest such length: on a full grid that is also the bucket with the fewest
    padded tokens. Decisions are memoised because production traffic repeats.
    """

    _batches: list[int] = field(default_factory=list)
    _lengths: dict[int, list[int]] = field(default_factory=dict)
    _max_len_from: list[int] = field(default_factory=list)
    _memo: dict[tuple[int, int], Decision] = field(default_factory=dict)

    @classmethod
    def from_pairs(cls, pairs: list[tuple[int, int]] | set[tuple[int, int]]) -> BucketTable:
        lengths: dict[int, set[int]] = {}
        for batch, length in pairs:
            lengths.setdefault(batch, set()).add(length)
        table = cls()
        table._batches = sorted(lengths)
        table._lengths = {b: sorted(ls) for b, ls in lengths.items()}
        # _max_len_from[i]: the longest length any batch >= _batches[i] offers, so a
        # search can stop as soon as no larger batch could fit the request.
        running = 0
        suffix = [0] * len(table._batches)
        for i in range(len(table._batches) - 1, -1, -1):
            running = max(running, table._lengths[table._batches[i]][-1])
            suffix[i] = running
        table._max_len_from = suffix
        return table

    def __len__(self) -> int:
        return sum(len(v) for v in self._lengths.values())

    def pairs(self) -> list[tuple[int, int]]:
        return [(b, length) for b in self._batches for length in self._lengths[b]]

    def decide(self, batch_size: int, seq_len: int) -> Decision:
        key = (batch_size, seq_len)
        decision = self._memo.get(key)
        if decision is None:
            decision = self._decide(batch_size, seq_len)
            if len(self._memo) < 65536:
                self._memo[key] = decision
        return decision

    def _decide(self, batch_size: int, seq_len: int) -> Decision:
        batches = self._batches
        i = bisect.bisect_left(batches, batch_size)
        while i < len(batches) and self._max_len_from[i] >= seq_len:
            lengths = self._lengths[batches[i]]
            j = bisect.bisect_left(lengths, seq_len)
            if j < len(lengths):
                target = (batches[i], lengths[j])
                kind: Literal["exact", "pad"] = "exact" if target == (batch_size, seq_len) else "pad"
                return Decision(kind, batch_size, seq_len, target=target)
            i += 1
        return Decision("refuse", batch_size, seq_len, nearest=self.nearest(batch_size, seq_len))

    def nearest(self, batch_size: int, seq_len: int, count: int = 3) -> tuple[tuple[int, int], ...]:
        """The compiled pairs closest to a request, for error messages (not the hot path).

        Ranked first by how many of the request's sizes a pair is smaller than (a larger size
        is what the request would pad to; a smaller one it cannot use), then by relative
        distance: for batch 8 seq 12, ``seq=16`` buckets come before ``seq=8`` ones.
        """

        def distance(pair: tuple[int, int]) -> tuple[int, float, tuple[int, int]]:
            b, length = pair
            too_small = (b < batch_size) + (length < seq_len)
            return (too_small, abs(b - batch_size) / max(batch_size, 1) + abs(length - seq_len) / max(seq_len, 1), pair)

        return tuple(sorted(self.pairs(), key=distance)[:count])


def format_pairs(pairs: tuple[tuple[int, int], ...] | list[tuple[int, int]]) -> str:
    return ", ".join(f"batch={b} seq={length}" for b, length in pairs) or "none"
