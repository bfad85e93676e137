"""The validated manifest as values, each field saying where it lives in the TOML.

A field's TOML place is its name unless its metadata says otherwise (``toml("cache.dir")``,
or :data:`NOT_IN_TOML`); :func:`allowed_keys` reads the places back, so the keys a table
accepts are stated once, here, next to the value they fill.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from warmcache.errors import ManifestError, shown
from warmcache.settings import RegistryLocation
from warmcache.shapes import ShapeFamily, ShapeSpec
from warmcache.shapes.workload_settings import GenerateSettings, TrainSettings, WorkloadSettings
from warmcache.store_location import StoreLocation
from warmcache.targets.routes import PrecompileRoute
from warmcache.trust import TrustedKeys

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
CACHE_IMPLEMENTATIONS = ("static", "hybrid")
DEFAULT_LEASE_SECONDS = 600

_TOML = "toml"
_INLINE = "inline"
#: The metadata of a field the manifest does not spell (it comes from the file itself).
NOT_IN_TOML: dict[str, Any] = {_TOML: None}


def toml(place: str) -> dict[str, Any]:
    """The metadata of a field whose TOML key is not its name: ``"cache.dir"`` is ``[cache] dir``."""
    return {_TOML: place}


def inline(cls: type) -> dict[str, Any]:
    """The metadata of a field holding a ``cls`` whose own fields are keys of this same table."""
    return {_INLINE: cls}


def allowed_keys(cls: type, table: str = "") -> tuple[str, ...]:
    """The keys ``table`` (a dotted path inside ``cls``'s own table) accepts, in field order, from the fields' TOML
    places."""
    prefix = f"{table}." if table else ""
    keys: dict[str, None] = {}
    for item in fields(cls):
        inner = item.metadata.get(_INLINE)
        places = allowed_keys(inner) if inner else (item.metadata.get(_TOML, item.name),)
        for place in places:
            if place is not None and place.startswith(prefix):
                keys.setdefault(place.removeprefix(prefix).split(".")[0])
    return tuple(keys)


@dataclass(frozen=True, slots=True)
class GenerateWorkload:
    """One ``[[model.generate]]`` table: a grid of prompt shapes and its graph-changing settings (keys of the same
    table)."""

    batch_sizes: tuple[int, ...]
    prompt_lengths: tuple[int, ...]
    settings: GenerateSettings = field(metadata=inline(GenerateSettings))


@dataclass(frozen=True, slots=True)
class TrainWorkload:
    """One ``[[model.train]]`` table: a grid of training shapes and its graph-changing settings (keys of the same
    table)."""

    batch_sizes: tuple[int, ...]
    seq_lengths: tuple[int, ...]
    settings: TrainSettings = field(metadata=inline(TrainSettings))


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """One ``[[model]]`` entry, with paths resolved against the manifest's folder."""

    name: str
    path: str
    revision: str | None = None
    dtype: str = "float32"
    device: str = "cpu"
    backend: str = "inductor"
    mode: str = "default"
    #: ``from_pretrained(attn_implementation=...)`` at every load (warmup, verify, the guard's check);
    #: ``None``: whatever transformers picks. Part of each shape's identity.
    attn_implementation: str | None = None
    #: Whether (and how) warmup also saves each generate bucket's decode step for production to load without
    #: tracing.
    precompile: PrecompileRoute = PrecompileRoute.NONE
    #: With ``precompile = "aotinductor"``: also package each prompt length's prefill, which a start from the mount
    #: (:func:`warmcache.serve_from_mount`) needs; one more compile per prompt length. ``False`` where production serves
    #: only through ``ShapeGuard.generate`` over a transformers model, whose ``generate()`` runs its own prefill.
    package_prefill: bool = True
    tp_size: int = field(default=1, metadata=toml("distributed.tp_size"))
    fsdp_size: int = field(default=1, metadata=toml("distributed.fsdp_size"))
    generate: tuple[GenerateWorkload, ...] = ()
    train: tuple[TrainWorkload, ...] = ()

    @property
    def is_local(self) -> bool:
        return Path(self.path).is_dir()

    @property
    def world_size(self) -> int:
        return self.tp_size * self.fsdp_size

    def family(self, settings: WorkloadSettings) -> ShapeFamily:
        return ShapeFamily(
            model=self.name, dtype=self.dtype, settings=settings, tp_size=self.tp_size, fsdp_size=self.fsdp_size
        )

    def grids(self) -> list[tuple[str, WorkloadSettings, tuple[int, ...], tuple[int, ...]]]:
        """``(table, settings, batch sizes, lengths)`` of each declared grid: ``generate[i]`` (prompt lengths), then
        ``train[i]`` (sequence lengths)."""
        grids: list[tuple[str, WorkloadSettings, tuple[int, ...], tuple[int, ...]]] = [
            (f"generate[{i}]", gen.settings, gen.batch_sizes, gen.prompt_lengths) for i, gen in enumerate(self.generate)
        ]
        return grids + [
            (f"train[{i}]", train.settings, train.batch_sizes, train.seq_lengths) for i, train in enumerate(self.train)
        ]

    def iter_specs(self) -> Iterator[ShapeSpec]:
        """Every declared shape of this model, deduplicated, in a stable order, one at a time (a planner can stop
        between two)."""
        seen: set[str] = set()
        for _, settings, batch_sizes, lengths in self.grids():
            family = self.family(settings)
            for b in batch_sizes:
                for length in lengths:
                    spec = ShapeSpec(family, b, length)
                    if spec.shape_hash not in seen:
                        seen.add(spec.shape_hash)
                        yield spec

    def specs(self) -> list[ShapeSpec]:
        """Every declared shape of this model, deduplicated, in a stable order."""
        return list(self.iter_specs())


@dataclass(frozen=True, slots=True)
class StoreSettings:
    """The ``[store]`` table: where compiled caches are published and fetched (see :mod:`warmcache.store`)."""

    url: StoreLocation | None = None
    #: An S3-compatible server (MinIO, R2, ...); AWS itself needs none.
    endpoint_url: str | None = None
    #: ``warmcache warmup`` publishes each shape as soon as it is compiled.
    push: bool = False
    max_pull_bytes: int | None = field(default=None, metadata=toml("max_pull_size"))
    #: The private key that signs every index this host pushes (``warmcache keys generate``).
    sign_key: Path | None = None


@dataclass(frozen=True, slots=True)
class Manifest:
    """A validated manifest file."""

    path: Path = field(metadata=NOT_IN_TOML)
    # normalised (relative paths against the manifest's folder)
    registry: RegistryLocation | None = field(default=None, metadata=toml("registry.url"))
    lease_seconds: int = field(default=DEFAULT_LEASE_SECONDS, metadata=toml("registry.lease_seconds"))
    cache_dir: Path | None = field(default=None, metadata=toml("cache.dir"))
    store: StoreSettings = field(default_factory=lambda: StoreSettings())
    trusted_keys: TrustedKeys = field(default=TrustedKeys(), metadata=toml("trust.keys"))
    models: tuple[ModelSpec, ...] = field(kw_only=True, metadata=toml("model"))

    def model(self, name: str) -> ModelSpec:
        for model in self.models:
            if model.name == name:
                return model
        raise ManifestError(
            f"{self.path}: no model named {shown(name)} (known: {', '.join(m.name for m in self.models)})"
        )

    def specs(self) -> list[ShapeSpec]:
        return [spec for model in self.models for spec in model.specs()]
