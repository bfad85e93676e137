"""How one rank of a sharded model loads it: the ``DistributedConfig`` production uses.

Separate from :mod:`warmcache.warmup.distributed` (the torchrun coordination) so
the worker that loads models does not import the coordination layer above it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from warmcache.manifest import ModelSpec

if TYPE_CHECKING:
    from transformers.distributed import DistributedConfig


def distributed_config(model: ModelSpec) -> DistributedConfig | None:
    """The ``DistributedConfig`` production loads ``model`` with, or ``None`` for a single process."""
    if model.world_size == 1:
        return None
    from transformers.distributed import DistributedConfig

    return DistributedConfig(tp_size=model.tp_size, fsdp_size=model.fsdp_size)


def sharded_load_kwargs(model: ModelSpec, load_kwargs: dict[str, Any]) -> dict[str, Any]:
    """``from_pretrained`` arguments for one rank of a sharded model.

    A ``device_map`` would put every rank's shard on one device; with a
    ``distributed_config`` transformers binds each rank to its local device itself.
    """
    config = distributed_config(model)
    if config is None:
        return load_kwargs
    return {**{k: v for k, v in load_kwargs.items() if k != "device_map"}, "distributed_config": config}
