"""Compile targets: which device/backend a model compiles for and where its cache lives.

Each target says which devices it compiles for, which backends, and which precompile routes it can build
(:class:`~warmcache.targets.base.Target`); the manifest asks it, so adding a device means adding a target here.
:func:`target_of` picks the target of a device; :func:`resolve_cache_dir`
applies the one precedence rule for the cache folder: the folder resolved at the edge
(``--cache-dir``, then ``$WARMCACHE_CACHE_DIR``: :func:`warmcache.settings.resolve_cache_folder`),
then the manifest's ``[cache] dir``, then the target's own environment variable or default.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from warmcache.targets.base import Target, ToolchainFactors
from warmcache.targets.inductor import InductorTarget
from warmcache.targets.neuron import NeuronTarget
from warmcache.targets.routes import PrecompileRoute

#: The target class of each device it compiles for, in the order messages list them.
TARGET_CLASSES: dict[str, type[Target]] = {
    device: cls for cls in (NeuronTarget, InductorTarget) for device in cls.DEVICES
}
DEVICES = tuple(TARGET_CLASSES)
#: Every target's other names for its devices (``gpu`` -> ``cuda``).
DEVICE_ALIASES = {alias: device for cls in TARGET_CLASSES.values() for alias, device in cls.DEVICE_ALIASES.items()}
#: Every backend some target compiles with.
BACKENDS = tuple(dict.fromkeys(backend for cls in TARGET_CLASSES.values() for backend in cls.BACKENDS))


class CompiledFor(Protocol):
    """What a target is picked by: a manifest model (or anything else) that names device, backend and mode."""

    @property
    def device(self) -> str: ...
    @property
    def backend(self) -> str: ...
    @property
    def mode(self) -> str: ...


def target_of(device: str, backend: str, mode: str = "default") -> Target:
    """The target that compiles for ``device``: Neuron on ``neuron``, Inductor (or its cache-less backends) on CPU
    and CUDA."""
    return TARGET_CLASSES[device](device, backend, mode)


def target_for(model: CompiledFor) -> Target:
    return target_of(model.device, model.backend, model.mode)


def resolve_cache_dir(target: Target, cli_dir: str | Path | None, manifest_dir: str | Path | None) -> tuple[Path, bool]:
    """The cache root for ``target`` and whether warmcache chose it (so the compiler must be pointed at it);
    ``manifest_dir`` is the manifest's ``[cache] dir``."""
    # $WARMCACHE_CACHE_DIR is folded into cli_dir at the edge
    chosen = cli_dir or manifest_dir
    if chosen:
        return Path(chosen).expanduser().resolve(), True
    return target.default_cache_dir(), False


__all__ = [
    "BACKENDS",
    "DEVICES",
    "DEVICE_ALIASES",
    "TARGET_CLASSES",
    "CompiledFor",
    "InductorTarget",
    "NeuronTarget",
    "PrecompileRoute",
    "Target",
    "ToolchainFactors",
    "resolve_cache_dir",
    "target_for",
    "target_of",
]
