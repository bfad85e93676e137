"""Which compile-cache folders a cache command looks at, and in which layout.

One precedence rule for the folder, shared with warmup (:func:`warmcache.targets.resolve_cache_dir`):
``--cache-dir``, then ``$WARMCACHE_CACHE_DIR``, then the manifest's ``[cache] dir``,
then each compiler's own setting or default (Inductor: ``$TORCHINDUCTOR_CACHE_DIR``
or ``/tmp/torchinductor_<user>``; Neuron: ``NEURON_CC_FLAGS --cache_dir``, then a
local ``NEURON_COMPILE_CACHE_URL``, then ``/var/tmp/neuron-compile-cache``; the
native backend's ``TORCH_NEURONX_NEFF_CACHE_DIR``). A remote (``s3://``) Neuron cache
is listed by ``cache scan``/``doctor`` through :mod:`warmcache.store.neuron_remote`
instead; it cannot be pruned from here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import get_args

from warmcache.cache.layout import CacheFlavor
from warmcache.errors import UsageError
from warmcache.manifest import Manifest, ModelSpec
from warmcache.settings import CACHE_DIR, CacheFolder
from warmcache.targets import InductorTarget, NeuronTarget, Target, resolve_cache_dir, target_for
from warmcache.targets.neuron import remote_cache_url

FLAVORS: tuple[str, ...] = get_args(CacheFlavor)

#: Which cache layout holds artifacts of each registry artifact kind prefix.
#: AOTInductor packages (``aotinductor/<sha256>``) live in the Inductor cache folder of the model that warmed them.
_KIND_FLAVOR = (
    ("inductor-", "inductor"),
    ("aotinductor", "inductor"),
    ("neuron-module", "neuron"),
    ("neuron-neff", "neuron-native"),
)


@dataclass(frozen=True, slots=True)
class CacheLocation:
    """A cache root, its layout, and why this folder was chosen (shown to the user)."""

    root: Path
    flavor: CacheFlavor
    source: str
    #: The compiler's own default folder, found rather than named: every process of this user compiles into it, so an
    #: entry no registry row names is not warmcache's orphan (``cache scan`` counts none, ``prune`` deletes none).
    shared: bool = False


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


def locate_caches(
    cache_dir: CacheFolder | None, manifest: Manifest | None = None, flavor: str | None = None
) -> list[CacheLocation]:
    """The cache folders to inspect, deduplicated, in a stable order.

    With a manifest, each model's target resolves its folder and knows its layout;
    without one, a folder given by flag or environment has its layout detected, and
    otherwise the Inductor and Neuron defaults are inspected.

    :param cache_dir: a folder named by ``--cache-dir`` or ``$WARMCACHE_CACHE_DIR`` (with where it came from), or
        ``None``.
    :param manifest: whose models' targets say which folders and layouts to look at.
    :param flavor: the layout (``inductor`` or ``neuron``) to assume instead of detecting it.
    :raises UsageError: ``flavor`` is not a known layout.
    """
    if flavor is not None and flavor not in FLAVORS:
        raise UsageError(f"--flavor: unknown layout {flavor!r} (allowed: {', '.join(FLAVORS)})")
    if manifest is None and cache_dir is not None:
        return [CacheLocation(cache_dir.path, flavor or detect_flavor(cache_dir.path), cache_dir.source)]  # type: ignore[arg-type]
    # Without a manifest the defaults are looked at; an s3:// Neuron cache is listed through the store instead.
    defaults: list[tuple[Target, CacheFlavor | None]] = [(InductorTarget("cpu", "inductor"), "inductor")]
    if not remote_cache_url():
        defaults.append((NeuronTarget("neuron", "neuron"), "neuron"))
    targets: list[tuple[Target, CacheFlavor | None]] = (
        [(target_for(m), _flavor_of_model(m)) for m in manifest.models] if manifest else defaults
    )
    out: dict[Path, CacheLocation] = {}
    for target, layout in targets:
        if layout is None or (manifest is None and flavor is not None and layout != flavor):
            continue  # eager/aot_eager keep no cache; without a manifest, --flavor picks the default to look at
        manifest_dir = manifest.cache_dir if manifest else None
        root, chosen = resolve_cache_dir(target, cache_dir.path if cache_dir else None, manifest_dir)
        source = _source(cache_dir, manifest) if chosen else f"{target.describe()} default"
        out.setdefault(root, CacheLocation(root, flavor or layout, source, shared=not chosen))  # type: ignore[arg-type]
    return list(out.values())


def _flavor_of_model(model: ModelSpec) -> CacheFlavor | None:
    """The layout of a model's cache folder; an eager/aot_eager model that precompiles keeps its artifacts in an
    Inductor-layout one."""
    flavor = target_for(model).cache_flavor
    return "inductor" if flavor is None and model.precompile.saves_artifacts else flavor


def _source(cache_dir: CacheFolder | None, manifest: Manifest | None) -> str:
    """Which setting chose the folder, for the user to see (the precedence itself is resolve_cache_dir's)."""
    return cache_dir.source if cache_dir else CACHE_DIR.sources(manifest.path if manifest else None)[2]


def single_location(manifest: Manifest, cache_dir: CacheFolder | None, model_name: str | None = None) -> CacheLocation:
    """The one cache folder of ``manifest``'s models (or of ``model_name``), for pack, push and pull.

    A bundle or a push describes one folder in one layout; a manifest whose models
    compile into several must be handled one model (or folder) at a time.
    """
    scope = dataclasses.replace(manifest, models=(manifest.model(model_name),)) if model_name else manifest
    locations = locate_caches(cache_dir, scope)
    if len(locations) != 1:
        roots = ", ".join(f"{loc.root} ({loc.flavor})" for loc in locations) or "none"
        raise UsageError(
            f"{manifest.path}: its models use {len(locations)} cache folders ({roots}); take one at a "
            "time with --model or --cache-dir"
        )
    return locations[0]
