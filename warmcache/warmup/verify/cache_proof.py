"""verify's proof that a decode through warmcache's static cache computes what the model computes, on every route.

Every route serves the decode step through :class:`warmcache.modeling.kv_cache.PositionTensorCache`:
keys at absolute positions, recurrent state written in place. A family whose layers use
their cache in a way that cache does not mirror (a position kept in Python, keys it rolls
or reads back itself, state in another slot) decodes other tokens than the model would, on
every route, compiled or not. Nothing else in verify sees that: an artifact's numeric
proof (:mod:`.agreement`) is calibrated by the model's eager decode, which runs the same
cache, and the Inductor route is proven by its cache hits. Measured: a tiny ``inkling_text``
with two ``hybrid`` layers passed plan, warmup and verify and served other greedy tokens
than transformers' eager ``generate()`` in 5 of 5 requests (``tests/support/warmcache_testkit/family_sweep.py``).

So verify decodes the bucket once more, eagerly, in a copy of the model at higher
precision (:func:`.reference.precise_copy`), and holds every step's logits to the same
copy's decode of the same tokens through transformers' own cache (the one ``generate()``
builds for the family when handed none). Both run the model's own code; only the cache
differs. Not a one-pass forward: for Zamba2 and Nemotron-H, transformers' own
incremental decode is 8-14 % from its forward over the same tokens, in float64, with
either cache (measured: warmcache's and transformers' decodes were identical there).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from warmcache.modeling.generation import generate_kwargs
from warmcache.warmup.verify.agreement import accumulation_floor, eager_decode_logits, figure
from warmcache.warmup.verify.distances import logit_scale
from warmcache.warmup.verify.model_traits import model_size
from warmcache.warmup.verify.reference import precise_copy, precise_defaults
from warmcache.warmup.workloads import bucket_prompt, pad_token_id

if TYPE_CHECKING:
    from transformers import CompileConfig, PreTrainedModel

    from warmcache.shapes import ShapeSpec

#: How many times the float32 accumulation floor (:func:`.agreement.accumulation_floor`: transformers keeps softmax
#: and rotary tables in float32 even in a float64 copy) the two decodes
#: may differ by. Measured on 20 tiny families: 0 (the same arithmetic; the caches differ only in which slots hold a
#: key), against other tokens altogether for the tiny ``inkling_text`` above.
CACHE_FACTOR = 10.0


def prove_cache_decode(model: PreTrainedModel, spec: ShapeSpec, config: CompileConfig) -> str | None:
    """``None`` when the bucket's greedy decode through warmcache's cache, in a higher-precision copy of ``model``,
    gives at every step the logits the copy's decode of the same tokens through transformers' own cache gives; else
    why not (one line)."""
    import torch

    settings = spec.family.generate
    ids, mask, new_tokens = bucket_prompt(model, spec, next(model.parameters()).device)
    precise = precise_copy(model)
    dtype = str(next(precise.parameters()).dtype).removeprefix("torch.")
    kwargs: dict[str, Any] = {
        **generate_kwargs(settings, max_new_tokens=new_tokens, config=config, model_config=model.config),
        "do_sample": False,
        "num_beams": 1,
        "num_return_sequences": 1,
    }
    with torch.no_grad(), precise_defaults(precise):
        decoded = precise.generate(  # type: ignore[operator]
            input_ids=ids,
            attention_mask=mask,
            pad_token_id=pad_token_id(model),
            min_new_tokens=new_tokens,
            output_logits=True,
            return_dict_in_generate=True,
            disable_compile=True,
            **kwargs,
        )
    generated = decoded.sequences[:, ids.shape[1] :]
    through_cache = torch.stack(decoded.logits, dim=1).float()
    own_cache = {name: value for name, value in kwargs.items() if name not in ("cache", "cache_implementation")}
    with precise_defaults(precise):
        transformers_decode = eager_decode_logits(
            precise, ids, mask, generated, pad_token_id=pad_token_id(model), **own_cache
        )
    difference = (through_cache.double() - transformers_decode.double()).pow(2).mean(-1).sqrt()
    distance = (difference / logit_scale(transformers_decode)).nan_to_num(nan=float("inf"))
    worst = float(distance.max())
    allowed = CACHE_FACTOR * accumulation_floor(*model_size(model))
    if worst <= allowed:
        return None
    row, step = divmod(int(distance.argmax()), distance.shape[1])
    return (
        f"the decode through warmcache's static cache is not the model's: {figure(worst)} from its decode of the same "
        f"tokens through transformers' own cache, in {dtype} (row {row + 1}, step {step + 1}; allowed "
        f"{figure(allowed)}); {type(model).__name__} keeps its cache in a way warmcache's does not mirror, so no "
        "route can serve it"
    )
