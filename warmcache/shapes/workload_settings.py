"""The settings that change a family's compiled graphs, as typed values: each default is stated here, once.

The manifest parser builds them, :class:`warmcache.shapes.ShapeFamily` carries them, and
warmup and the runtime guard read their fields (a generate family's ``max_cache_len`` is
an ``int``, never narrowed back from ``None``). The registry keeps them as one JSON object,
:meth:`GenerateSettings.stored`, with ``max_cache_len`` in a column of its own; the shape hash
covers that same object, so it is exactly what rows have always held and no identity moves.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Literal

from warmcache.errors import RegistryError, shown

Workload = Literal["generate", "train"]
SettingValue = bool | int | float | str | None


@dataclass(frozen=True, slots=True)
class GenerateSettings:
    """A generate family's settings: ``max_cache_len`` is the static cache length the decode step is compiled for."""

    workload: ClassVar[Workload] = "generate"

    max_cache_len: int
    num_beams: int = 1
    num_return_sequences: int = 1
    do_sample: bool = False
    prefill_chunk_size: int | None = None
    cache_implementation: str = "static"

    def stored(self) -> dict[str, SettingValue]:
        """The registry's ``settings`` object: every field but ``max_cache_len``, which has a column of its own."""
        return _stored(self)


@dataclass(frozen=True, slots=True)
class TrainSettings:
    """A train family's settings (``bf16`` mixed precision, gradient checkpointing): both change the compiled graphs."""

    workload: ClassVar[Workload] = "train"

    bf16: bool = False
    gradient_checkpointing: bool = False

    def stored(self) -> dict[str, SettingValue]:
        """The registry's ``settings`` object."""
        return _stored(self)


WorkloadSettings = GenerateSettings | TrainSettings


#: Each settings type's stored keys, sorted as rows have always held them (read for every row: computed once).
_STORED_NAMES: dict[type, tuple[str, ...]] = {
    cls: tuple(sorted(f.name for f in fields(cls) if f.name != "max_cache_len"))
    for cls in (GenerateSettings, TrainSettings)
}


def _stored(settings: WorkloadSettings) -> dict[str, SettingValue]:
    return {name: getattr(settings, name) for name in _STORED_NAMES[type(settings)]}


def from_stored(workload: str, stored: Mapping[str, Any], max_cache_len: int | None, where: str) -> WorkloadSettings:
    """A registry row's settings object (and ``max_cache_len`` column) as values; ``where`` names the row in errors."""
    cls = GenerateSettings if workload == "generate" else TrainSettings
    unknown = sorted(set(stored).difference(_STORED_NAMES[cls]))
    if unknown:
        raise RegistryError(f"{where}: settings key {shown(unknown[0])} is not a {workload} setting")
    if cls is TrainSettings:
        return TrainSettings(**stored)
    if max_cache_len is None:
        raise RegistryError(f"{where}: a generate row without max_cache_len")
    return GenerateSettings(max_cache_len, **stored)
