"""A static KV cache that compiles one decode graph per bucket, sliding-window layers included.

transformers' own static cache (``cache_implementation="static"``) gives sliding
layers a ``StaticSlidingWindowLayer`` of ``sliding_window`` slots that tracks how
full it is in a Python int (``cumulative_length_int``). Dynamo guards on that
int, so every decode position is a new graph until the recompile limit, after
which the step silently runs eagerly (transformers issue 44609, declined
upstream). Mistral/Qwen2 with a window, Gemma-2/3 and Cohere-2 all hit it.

:class:`PositionTensorCache` keeps every attention layer, sliding or not, as a
``StaticLayer`` of ``max_cache_len`` slots whose write position is a tensor
(``cumulative_length``), so the decode step's graph does not depend on the
position. Sliding layers stay marked ``is_sliding``: the model builds their
sliding-window mask from absolute positions (``kv_offset`` 0, ``kv_length``
``max_cache_len``), so a token attends to the same keys as with transformers'
rolling cache, and greedy tokens equal transformers' eager generation beyond
the window (tested per architecture in ``tests/test_architectures.py``).

The price is memory: a sliding layer holds ``max_cache_len`` slots instead of
``sliding_window``. A rolling buffer with a tensor position would save it but
needs a mask of its own per layer; full-length layers need only transformers'
public ``Cache`` API (a ``Cache`` object passed to ``generate(cache=...)``), no
patch of its internals.

It subclasses ``StaticCache`` so transformers' ``isinstance(cache, StaticCache)``
checks (flash attention's padding path, export) treat it as the static cache it is.
"""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig, StaticCache
from transformers.cache_utils import Cache, DummyLayer, StaticLayer, get_layer_types_and_kwargs

#: Layer kinds whose keys this cache stores at absolute positions (the mask does the rest).
FULL_LENGTH_KINDS = frozenset({"full_attention", "sliding_attention"})
#: Layer kinds that hold no cache at all (MoE/MLP-only layers, layers reusing another's KV).
EMPTY_KINDS = frozenset({"dummy"})


class SlidingLayerAtAbsolutePositions(StaticLayer):
    """A sliding-window layer stored like a full one: ``max_cache_len`` slots, tensor write position.

    ``is_sliding`` makes the model build this layer's mask with its sliding window;
    ``get_mask_sizes`` (inherited) reports the whole cache at offset 0, which is
    what makes that mask position-independent in shape.
    """

    is_sliding = True

    def __init__(self, max_cache_len: int, sliding_window: int, **kwargs: Any) -> None:
        super().__init__(max_cache_len=max_cache_len)
        self.sliding_window = sliding_window


def unsupported_layer_kinds(config: PretrainedConfig) -> list[str]:
    """The decoder's layer kinds :class:`PositionTensorCache` cannot hold (empty: supported)."""
    kinds, _ = get_layer_types_and_kwargs(config.get_text_config(decoder=True))
    return sorted({kind for kind in kinds if kind not in FULL_LENGTH_KINDS | EMPTY_KINDS})


class PositionTensorCache(StaticCache):
    """One ``StaticLayer``-style layer per decoder layer, every write position a tensor."""

    def __init__(self, config: PretrainedConfig, max_cache_len: int) -> None:
        kinds, per_layer = get_layer_types_and_kwargs(config.get_text_config(decoder=True))
        layers: list[Any] = []
        for index, (kind, layer_kwargs) in enumerate(zip(kinds, per_layer)):
            if kind == "full_attention":
                layers.append(StaticLayer(max_cache_len=max_cache_len))
            elif kind == "sliding_attention":
                layers.append(SlidingLayerAtAbsolutePositions(max_cache_len=max_cache_len, **layer_kwargs))
            elif kind in EMPTY_KINDS:
                layers.append(DummyLayer())
            else:
                raise ValueError(
                    f"layer {index} is {kind!r}: warmcache's static cache holds only {sorted(FULL_LENGTH_KINDS)}"
                )
        # StaticCache.__init__ would build transformers' sliding layers; build the container directly.
        Cache.__init__(self, layers=layers)
