"""A static cache that compiles one decode graph per bucket: sliding-window layers and recurrent state included.

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

Recurrent state (LFM2's ``conv`` layers, the Mamba-2 and gated-delta ``linear_attention`` layers of
Granite-4.0-H, Bamba and Qwen3-Next, Falcon-H1's ``hybrid`` layers that run attention and Mamba side
by side) is fixed-size: a conv window of ``kernel`` inputs and an SSM state per layer, whatever the
position. transformers' ``LinearAttentionLayer`` allocates both at prefill and from then on writes
them in place (``copy_``): the decode step's graph reads and writes the same tensors at every
position, and no Python value in it changes from step to step (measured, transformers 5.24: one
decode graph per batch, aot_eager and Inductor, to a full cache). So those layers are transformers'
own, and a ``hybrid`` layer is its ``LinearAttentionAndStaticFullAttentionLayer`` (state beside
full-length keys with a tensor write position). :func:`hold` rebuilds any layer around given
tensors, as an exported decode step that takes the cache as plain inputs needs.

It subclasses ``StaticCache`` so transformers' ``isinstance(cache, StaticCache)``
checks (flash attention's padding path, export) treat it as the static cache it is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from transformers import PretrainedConfig, StaticCache
from transformers.cache_utils import (
    Cache,
    DummyLayer,
    LinearAttentionAndStaticFullAttentionLayer,
    LinearAttentionLayer,
    StaticLayer,
    get_layer_types_and_kwargs,
)

from warmcache.modeling.decode_inputs import STATE_KINDS, state_part

if TYPE_CHECKING:
    import torch

#: Layer kinds whose keys this cache stores at absolute positions (the mask does the rest).
FULL_LENGTH_KINDS = frozenset({"full_attention", "sliding_attention"})
#: Layer kinds that hold no cache at all (MoE/MLP-only layers, layers reusing another's KV).
EMPTY_KINDS = frozenset({"dummy"})
#: Layer kinds whose only cache is fixed-size recurrent state: a conv window, an SSM or linear-attention state.
RECURRENT_KINDS = frozenset({"conv", "linear_attention"})
#: Layer kinds holding recurrent state beside full-attention keys and values.
HYBRID_KINDS = frozenset({"hybrid"})
SUPPORTED_KINDS = FULL_LENGTH_KINDS | EMPTY_KINDS | RECURRENT_KINDS | HYBRID_KINDS


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
    return sorted({kind for kind in kinds if kind not in SUPPORTED_KINDS})


def has_recurrent_state(config: PretrainedConfig) -> bool:
    """Whether any decoder layer keeps recurrent state (whose prefill left padding may reach, see
    :mod:`warmcache.modeling.padding_probe`)."""
    kinds, _ = get_layer_types_and_kwargs(config.get_text_config(decoder=True))
    return any(kind in RECURRENT_KINDS | HYBRID_KINDS for kind in kinds)


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
            elif kind in RECURRENT_KINDS:
                layers.append(LinearAttentionLayer(**layer_kwargs))
            elif kind in HYBRID_KINDS:
                layers.append(LinearAttentionAndStaticFullAttentionLayer(max_cache_len=max_cache_len, **layer_kwargs))
            elif kind in EMPTY_KINDS:
                layers.append(DummyLayer())
            else:
                raise ValueError(
                    f"layer {index} is {kind!r}: warmcache's static cache holds only {sorted(SUPPORTED_KINDS)}"
                )
        # StaticCache.__init__ would build transformers' sliding layers; build the container directly.
        Cache.__init__(self, layers=layers)


def hold(layer: Any, parts: dict[str, torch.Tensor]) -> None:
    """Make ``layer`` hold ``parts`` (named as :func:`warmcache.modeling.decode_inputs.layer_parts` names them) as a
    decode step finds it after the prefill: what its lazy initialisation sets, around the given tensors.

    Without ``mark_static_address`` (export cannot trace it). A layer with recurrent state
    is marked as past its prefill (``has_previous_state``), so the model takes its one-token
    decode path, which updates the given tensors in place.
    """
    if "keys" in parts:
        keys, values = parts["keys"], parts["values"]
        layer.keys, layer.values, layer.cumulative_length = keys, values, parts["cumulative_length"]
        layer.device = keys.device
        layer.batch_size, layer.num_heads = keys.shape[:2]
        layer.k_head_dim, layer.v_head_dim = keys.shape[-1], values.shape[-1]
        layer.is_initialized = True
    for index in range(getattr(layer, "number_of_states", 0)):
        conv, recurrent = (parts.get(state_part(kind, index)) for kind in STATE_KINDS)
        if conv is not None:
            layer.conv_states[index], layer.conv_kernel_size[index] = conv, conv.shape[-1]
            layer.is_conv_states_initialized[index] = True
        if recurrent is not None:
            layer.recurrent_states[index] = recurrent
            layer.is_recurrent_states_initialized[index] = True
        held = conv if conv is not None else recurrent
        if held is not None:
            layer.device, layer.dtype = held.device, held.dtype
            layer.has_previous_state[index] = True
