"""The decode call generate() makes, as the flat list of tensors an AOTInductor package takes.

generate() calls its compiled forward with ``input_ids``, ``position_ids``, the
attention mask (one tensor, or a dict of one per layer kind), the static cache and
a few Python scalars (see :mod:`warmcache.artifacts.capture`). An AOTInductor
package takes positional tensors only, so the cache is taken apart: each layer's
keys, values and write position (``cumulative_length``), and a recurrent layer's conv
and SSM states (``conv_states[i]``, ``recurrent_states[i]``), become plain inputs, which
the package updates in place. Warmup exports with this order and production feeds
it in the same order: both come from :func:`flatten`.

Imports neither torch nor transformers at module level: the runtime loads it in
processes that must stay free of the compiler.
"""

from __future__ import annotations

from typing import Any

#: The per-layer cache tensors of an attention layer, in the order they follow the other inputs.
LAYER_TENSORS = ("keys", "values", "cumulative_length")
#: The recurrent state a layer may hold beside (or instead of) them: dicts of one tensor per state index, as
#: transformers' ``LinearAttentionLayer`` keeps them (``None`` until the prefill allocates it).
STATE_KINDS = ("conv_states", "recurrent_states")
#: Keyword arguments whose value is a Python scalar baked into the exported step.
SCALAR_KEYS = ("logits_to_keep", "use_cache", "return_dict")


def flatten(kwargs: dict[str, Any]) -> tuple[list[str], list[Any]]:
    """``(names, tensors)`` of a decode call, in the package's input order.

    Layers without tensors (transformers' ``DummyLayer``) take no input; a mask dict
    entry that is ``None`` takes none either (the names say which are present).
    """
    names: list[str] = []
    tensors: list[Any] = []

    def add(name: str, value: Any) -> None:
        if value is not None:
            names.append(name)
            tensors.append(value)

    add("input_ids", kwargs["input_ids"])
    add("position_ids", kwargs.get("position_ids"))
    mask = kwargs.get("attention_mask")
    if isinstance(mask, dict):
        for kind in sorted(mask):
            add(f"attention_mask.{kind}", mask[kind])
    else:
        add("attention_mask", mask)
    for index, layer in enumerate(kwargs["cache"].layers):
        for part, tensor in layer_parts(layer):
            add(f"cache.layers[{index}].{part}", tensor)
    return names, tensors


def state_part(kind: str, index: int) -> str:
    """The name of state ``index`` of ``kind`` (one of :data:`STATE_KINDS`) among a layer's parts."""
    return f"{kind}[{index}]"


def state_parts(layer: Any) -> list[tuple[str, Any]]:
    """``(part, tensor)`` of every recurrent state ``layer`` holds (none for an attention layer)."""
    return [
        (state_part(kind, index), tensor)
        for kind in STATE_KINDS
        for index, tensor in sorted((getattr(layer, kind, None) or {}).items())
        if tensor is not None
    ]


def layer_parts(layer: Any) -> list[tuple[str, Any]]:
    """``(part, tensor)`` of every tensor a decode step reads and writes in ``layer``: keys, values and write
    position if it has them, then its recurrent states."""
    kv = [(part, getattr(layer, part)) for part in LAYER_TENSORS] if getattr(layer, "keys", None) is not None else []
    return kv + state_parts(layer)


def scalars(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The call's Python scalars the exported step fixed (a call with other values is not this step's)."""
    return {key: kwargs[key] for key in SCALAR_KEYS if key in kwargs}


def input_signature(names: list[str], tensors: list[Any]) -> list[tuple[str, tuple[int, ...], str]]:
    """``[(name, shape, dtype), ...]``: what the package was exported for, recorded in its header."""
    return [(name, tuple(int(d) for d in t.shape), str(t.dtype)) for name, t in zip(names, tensors)]
