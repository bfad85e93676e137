"""TOML manifest → validated models and their expanded :class:`~warmcache.shapes.ShapeSpec` list.

:func:`loads` (text from anywhere) and :func:`load_manifest` (a file) are the front door
(:mod:`.load`); :mod:`.parse` validates with the :mod:`.checker`, against the values of
:mod:`.schema`, anchoring relative paths through :mod:`.paths`.
"""

from warmcache.manifest.load import MAX_MANIFEST_BYTES, load_manifest, loads
from warmcache.manifest.parse import parse_manifest
from warmcache.manifest.schema import (
    AOTINDUCTOR,
    BACKENDS,
    CACHE_IMPLEMENTATIONS,
    DEFAULT_BACKEND,
    DEFAULT_LEASE_SECONDS,
    DEVICES,
    MODES,
    PRECOMPILE_BACKENDS,
    GenerateWorkload,
    Manifest,
    ModelSpec,
    StoreSettings,
    TrainWorkload,
)

__all__ = [
    "AOTINDUCTOR",
    "BACKENDS",
    "CACHE_IMPLEMENTATIONS",
    "DEFAULT_BACKEND",
    "DEFAULT_LEASE_SECONDS",
    "DEVICES",
    "MAX_MANIFEST_BYTES",
    "MODES",
    "PRECOMPILE_BACKENDS",
    "GenerateWorkload",
    "Manifest",
    "ModelSpec",
    "StoreSettings",
    "TrainWorkload",
    "load_manifest",
    "loads",
    "parse_manifest",
]
