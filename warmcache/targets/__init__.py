"""Compile targets: which device/backend a model compiles for and where its cache lives.

:func:`target_for` picks the target of a manifest model; :func:`resolve_cache_dir`
applies the one precedence rule for the cache folder: the folder resolved at the edge
(``--cache-dir``, then ``$WARMCACHE_CACHE_DIR``: :func:`warmcache.settings.resolve_cache_folder`),
then the manifest's ``[cache] dir``, then the target's own environment variable or default.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from warmcache.targets.base import Target, ToolchainFactors
from warmcache.targets.inductor import InductorTarget
from warmcache.targets.neuron import NeuronTarget

if TYPE_CHECKING:
    # Annotations only: a serving process resolves targets (toolchain checks) without parsing any manifest.
    from warmcache.manifest import Manifest, ModelSpec


def target_of(device: str, backend: str, mode: str = "default") -> Target:
    """The target that compiles for ``device``: Neuron on ``neuron``, Inductor (or its cache-less backends) on CPU
    and CUDA."""
    if device == "neuron":
        return NeuronTarget(device, backend, mode)
    return InductorTarget(device, backend, mode)


def target_for(model: ModelSpec) -> Target:
    return target_of(model.device, model.backend, model.mode)


def resolve_cache_dir(target: Target, cli_dir: str | Path | None, manifest: Manifest | None) -> tuple[Path, bool]:
    """The cache root for ``target`` and whether warmcache chose it (so the compiler must be pointed at it)."""
    # $WARMCACHE_CACHE_DIR is folded into cli_dir at the edge
    chosen = cli_dir or (manifest.cache_dir if manifest else None)
    if chosen:
        return Path(chosen).expanduser().resolve(), True
    return target.default_cache_dir(), False


__all__ = [
    "InductorTarget",
    "NeuronTarget",
    "Target",
    "ToolchainFactors",
    "resolve_cache_dir",
    "target_for",
    "target_of",
]
