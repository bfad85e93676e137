"""What separates a row's identity from the one this machine would give its shape, part by part.

A row's identity hashes its parts (declared shape, model config, attention
implementation, toolchain); the row keeps the parts themselves, so a row that reads
``stale`` can name which part moved and from what to what
(``inductor TORCHINDUCTOR_FREEZING unset → 1``). ``warmcache explain``, ``check``
and the runtime guard's refusals all word a difference the same way, from here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from warmcache.identity.fingerprint import current_toolchain
from warmcache.jsonable import FieldsJson
from warmcache.registry.records import ShapeRecord

#: How an identity part that one side lacks reads (an unset variable, no attention implementation).
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
    """The differences in one clause, as a refusal or ``explain`` line quotes them."""
    return ", ".join(str(d) for d in differences) or "identity differs"
