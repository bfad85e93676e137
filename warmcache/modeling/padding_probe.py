"""Whether left padding reaches a model's recurrent state: asked once per loaded model before the guard pads for it.

An attention layer ignores a pad token through the mask. A layer with recurrent state (a conv
window, an SSM state) folds every position its prefill is given into that state; transformers
keeps pad tokens out by zeroing their hidden states before the layer's input projection
(``apply_mask_to_padding_states``). That holds only while the projection has no bias: a bias turns
the zeroed pad into a constant input that lands in the conv window and, through it, in every later
token. Measured at small width with random biases (transformers 5.24, float32), a left-padded row's
logits moved from its unpadded run's by 3.5e-2 of their RMS (LFM2 with ``conv_bias``) and 0.76-3.8
(Granite-4.0-H, Falcon-H1, Bamba, Jamba, Mamba, Mamba-2, Nemotron-H, Zamba2 with their in-projection
bias), against at most 2.8e-5 without it; the published configs of these families set no such bias.

The probe needs no tolerance: it prefills one row of pad tokens followed by one real token into a
:class:`~warmcache.modeling.kv_cache.PositionTensorCache` and reads each conv window. Every slot
that holds a pad position must be exactly zero (a zeroed input times the weights is zero in any
dtype); a nonzero slot is the pad reaching the state. In each of the ten families above the conv
windows told leaking from clean configs exactly as the logits did (pad slots 0.97-1.8 with the bias,
0.0 without). Every family tried keeps a conv window in front of its SSM; a layer whose state has
no conv window is not probed.
"""

from __future__ import annotations

import weakref
from typing import Any

#: Pad tokens in front of the probe's one real token: more than any conv window tried (LFM2 3, Mamba 4).
PROBE_PADDING = 8
_answers: weakref.WeakKeyDictionary[Any, str | None] = weakref.WeakKeyDictionary()


def padding_leak(model: Any) -> str | None:
    """Why left padding would change what ``model`` generates (one line), or ``None`` when it cannot.

    Memoised per model object: the guard asks before every padded batch, the probe runs once.
    """
    from warmcache.modeling.kv_cache import has_recurrent_state

    if model not in _answers:
        _answers[model] = _probe(model) if has_recurrent_state(model.config) else None
    return _answers[model]


def _probe(model: Any) -> str | None:
    import torch

    from warmcache.modeling.kv_cache import PositionTensorCache

    device = next(model.parameters()).device
    ids = torch.zeros((1, PROBE_PADDING + 1), dtype=torch.long, device=device)
    ids[0, -1] = _real_token(model)
    mask = torch.zeros_like(ids)
    mask[0, -1] = 1
    cache = PositionTensorCache(model.config, PROBE_PADDING + 1)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0), cache=cache)
    for index, layer in enumerate(cache.layers):
        for window in (getattr(layer, "conv_states", None) or {}).values():
            if window is not None and bool(window[..., :-1].ne(0).any()):
                return (
                    f"layer {index} of {type(model).__name__} keeps pad tokens in its conv state (a bias in the "
                    "projection into its state), so a left-padded row would generate other tokens than its "
                    "unpadded run"
                )
    return None


def _real_token(model: Any) -> int:
    """A token id that is not the pad id (its value is otherwise irrelevant: only the pad slots are read)."""
    pad = getattr(model.config, "pad_token_id", None)
    return 1 if pad != 1 else 2
