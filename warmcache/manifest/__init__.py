"""TOML manifest → validated models and their expanded :class:`~warmcache.shapes.ShapeSpec` list.

:func:`loads` (text from anywhere) and :func:`load_manifest` (a file) are the front door
(:mod:`.load`); :mod:`.parse` validates with the :mod:`.checker`, against the values of
:mod:`.schema`, anchoring relative paths with :class:`warmcache.anchor.Anchor`. The names here are those
the rest of warmcache uses; the tables' constants stay in :mod:`.schema`.
"""

from warmcache.manifest.load import load_manifest, loads
from warmcache.manifest.schema import (
    GenerateWorkload,
    Manifest,
    ModelSpec,
    StoreSettings,
    TrainWorkload,
)

__all__ = [
    "GenerateWorkload",
    "Manifest",
    "ModelSpec",
    "StoreSettings",
    "TrainWorkload",
    "load_manifest",
    "loads",
]
