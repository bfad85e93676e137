"""Dynamo's recompile budget: make room for every compiled bucket, and make running out loud.

Dynamo keeps at most ``torch._dynamo.config.recompile_limit`` graphs (8 by
default) per *code object* and silently runs eagerly past it. transformers
compiles every model's forward through one shared wrapper (``generate()``) and
accelerate compiles the whole module (``Trainer``), so all models and buckets in
a process draw on one budget. Measured: after a first tiny model's 8 decode
graphs, a second model's buckets silently ran eager, and so did a Trainer's.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

#: Buckets this process has made room for, over every guard.
_reserved = 0


def reserve_recompile_room(buckets: int) -> None:
    """Raise Dynamo's limits so that ``buckets`` more graphs fit next to those reserved before."""
    import torch

    global _reserved
    _reserved += buckets
    dynamo = torch._dynamo.config
    dynamo.recompile_limit = max(dynamo.recompile_limit, _reserved)
    dynamo.accumulated_recompile_limit = max(dynamo.accumulated_recompile_limit, 4 * _reserved)


@contextmanager
def loud_recompile_limit() -> Iterator[None]:
    """Inside the block, hitting the recompile limit raises instead of silently falling back to eager."""
    import torch

    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
        yield
