"""Bind declared shapes to this machine: add the model and toolchain fingerprints.

A :class:`PlannedShape` is what the registry stores a row for. Its ``identity``
covers the declared shape, the model config and the toolchain, so an upgrade of
torch or a changed config yields a new identity and the old row reads as stale.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from warmcache.errors import ManifestError, UsageError
from warmcache.identity.fingerprint import Toolchain, current_toolchain, model_config_hash
from warmcache.manifest import Manifest, ModelSpec
from warmcache.shapes import ShapeSpec, short_hash


def shape_identity(
    shape_hash: str, config_hash: str, toolchain_hash: str, attn_implementation: str | None = None
) -> str:
    """A row's key: the declared shape, the model (config and attention implementation) and the toolchain.

    The attention implementation is a part only when the manifest declares one: an undeclared one adds nothing to the
    hash, so the identity of a model that does not choose one is the hash of shape, config and toolchain alone.
    """
    parts = {"shape": shape_hash, "config": config_hash, "toolchain": toolchain_hash}
    if attn_implementation is not None:
        parts["attn_implementation"] = attn_implementation
    return short_hash(parts, length=32)


@dataclass(frozen=True, slots=True)
class PlannedShape:
    """A declared shape of a model, fingerprinted for this machine's toolchain."""

    spec: ShapeSpec
    model: ModelSpec
    config_hash: str
    toolchain: Toolchain
    identity: str = field(init=False, repr=False, compare=False)
    """Hashed once, here: a fleet worker looks up each of its 10,000 specs by identity several times (24 µs a hash)."""

    def __post_init__(self) -> None:
        object.__setattr__(
            self,
            "identity",
            shape_identity(self.spec.shape_hash, self.config_hash, self.toolchain.hash, self.model.attn_implementation),
        )

    @property
    def shape_hash(self) -> str:
        return self.spec.shape_hash


#: Shapes planned between two calls of a plan's ``checkpoint`` (a few milliseconds).
CHECKPOINT_EVERY = 256


def plan_model(model: ModelSpec, checkpoint: Callable[[], None] | None = None) -> list[PlannedShape]:
    """The model's shapes, fingerprinted; ``checkpoint`` is called every few milliseconds and may raise to stop
    (the service abandons a plan that outlived its answer)."""
    config = model_config_hash(model.path, model.revision)
    toolchain = current_toolchain(model.device, model.backend, model.mode)
    planned: list[PlannedShape] = []
    for i, spec in enumerate(model.iter_specs()):
        if checkpoint is not None and i % CHECKPOINT_EVERY == 0:
            checkpoint()
        planned.append(PlannedShape(spec, model, config, toolchain))
    return planned


def plan_manifest(manifest: Manifest, model_name: str | None = None) -> list[PlannedShape]:
    """Every shape the manifest declares (optionally for one model), fingerprinted once per model.

    :param manifest: the loaded manifest (:func:`~warmcache.manifest.load_manifest`).
    :param model_name: plan only this ``[[model]]`` entry; ``None`` plans them all.
    :returns: one planned shape per declared spec, in the manifest's order, each with its compile identity.
    :raises ManifestError: a model's config cannot be read (the error names the manifest entry).
    """
    models = [manifest.model(model_name)] if model_name else list(manifest.models)
    planned: list[PlannedShape] = []
    for model in models:
        try:
            planned.extend(plan_model(model))
        except UsageError as exc:
            # The model's config is unreachable: name the manifest entry that points there.
            index = manifest.models.index(model)
            raise ManifestError(f"{manifest.path}: model {model.name!r}: model[{index}].path: {exc}") from None
    return planned
