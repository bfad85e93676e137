"""Which compile-cache folders a cache command looks at, and in which layout.

One precedence rule for the folder, shared with warmup (:func:`warmcache.targets.resolve_cache_dir`):
``--cache-dir``, then ``$WARMCACHE_CACHE_DIR``, then the manifest's ``[cache] dir``,
then each compiler's own setting or default (Inductor: ``$TORCHINDUCTOR_CACHE_DIR``
or ``/tmp/torchinductor_<user>``; Neuron: ``NEURON_CC_FLAGS --cache_dir``, then a
local ``NEURON_COMPILE_CACHE_URL``, then ``/var/tmp/neuron-compile-cache``; the
native backend's ``TORCH_NEURONX_NEFF_CACHE_DIR``). A remote (``s3://``) cache is
refused with a clear error: it cannot be scanned or pruned from here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import get_args

from warmcache.cache.layout import CacheFlavor
from warmcache.errors import UsageError
from warmcache.manifest import Manifest
from warmcache.targets import CACHE_DIR_ENV, InductorTarget, NeuronTarget, Target, resolve_cache_dir, target_for

FLAVORS: tuple[str, ...] = get_args(CacheFlavor)

#: Which cache layout holds artifacts of each registry artifact kind prefix.
_KIND_FLAVOR = (("inductor-", "inductor"), ("neuron-module", "neuron"), ("neuron-neff", "neuron-native"))


@dataclass(frozen=True, slots=True)
class CacheLocation:
    """A cache root, its layout, and why this folder was chosen (shown to the user)."""

    root: Path
    flavor: CacheFlavor
    source: str


def flavor_of_kind(kind: str) -> CacheFlavor | None:
    """The layout an artifact of ``kind`` lives in (``None`` for a kind warmcache does not know)."""
    for prefix, flavor in _KIND_FLAVOR:
        if kind.startswith(prefix):
            return flavor  # type: ignore[return-value]
    return None


def detect_flavor(root: Path) -> CacheFlavor:
    """Guess a folder's layout from what it holds; Inductor when it holds nothing telling."""
    try:
        children = list(root.iterdir())
    except OSError:
        return "inductor"
    names = {c.name for c in children}
    if any(n.startswith("neuronxcc-") for n in names):
        return "neuron"
    if names & {"fxgraph", "aotautograd", "triton"}:
        return "inductor"
    if any(c.suffix == ".neff" or (c.is_dir() and any(c.glob("*.neff"))) for c in children):
        return "neuron-native"
    return "inductor"


def locate_caches(cache_dir: str | None, manifest: Manifest | None = None, flavor: str | None = None) -> list[CacheLocation]:
    """The cache folders to inspect, deduplicated, in a stable order."""
    if flavor is not None and flavor not in FLAVORS:
        raise UsageError(f"--flavor: unknown layout {flavor!r} (allowed: {', '.join(FLAVORS)})")
    chosen = cache_dir or os.environ.get(CACHE_DIR_ENV) or (manifest.cache_dir if manifest else None)
    if chosen:
        source = "--cache-dir" if cache_dir else (f"${CACHE_DIR_ENV}" if os.environ.get(CACHE_DIR_ENV) else f"{manifest.path} [cache] dir")  # type: ignore[union-attr]
        root = Path(chosen).expanduser().resolve()
        return [CacheLocation(root, flavor or detect_flavor(root), source)]  # type: ignore[arg-type]
    targets: list[Target] = (
        [target_for(m) for m in manifest.models]
        if manifest
        else [InductorTarget("cpu", "inductor"), NeuronTarget("neuron", "neuron")]
    )
    out: dict[Path, CacheLocation] = {}
    for target in targets:
        target_flavor = target.cache_flavor
        if target_flavor is None or (flavor is not None and target_flavor != flavor):
            continue
        root, _ = resolve_cache_dir(target, None, None)
        out.setdefault(root, CacheLocation(root, target_flavor, f"{target.describe()} default"))
    return list(out.values())
