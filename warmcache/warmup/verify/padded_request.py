"""verify proves the masks production sends: a left-padded request of the bucket through its precompiled artifact too.

``generate()`` drops an all-ones attention mask before the first forward (nothing to mask,
faster mask building), so an unpadded request and a padded one of the same bucket reach the
model with and without a mask. For most families the decode call is the same either way
(transformers builds the mask dict from the cache position); BLOOM's is not: it builds its
ALiBi bias from the key length when there is no mask and from the mask when there is one, so
its decode call carries the mask only when the batch is padded (measured, tiny configs:
bloom differs; llama, gpt2, falcon do not). A precompiled artifact serves exactly the call
it was captured from, which warmup captures from the unpadded request; verify proved only
that call, and production's first padded request then fell to ``torch.compile`` and was
refused (a small BLOOM on the AOTInductor route: warmup and verify passed, the guard's
16-token ragged request was refused).

So after the unpadded proof, verify decodes the bucket's prompt with its first row left-padded
(the padded form warmup runs on the compile routes) through the installed artifacts, for the
few steps that reach the steady decode call: a call no artifact serves fails the spec, naming
what differs, before anything compiles; one that is served is judged against the model's own
eager decode like the unpadded one. A model whose recurrent state would keep pad tokens is not
asked: the guard refuses padded batches for it (:mod:`warmcache.modeling.padding_probe`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from warmcache.artifacts.format import Signature, decode_signature
from warmcache.artifacts.kinds import routes_of
from warmcache.modeling.generation import DECODE_TOKENS, generate_kwargs
from warmcache.runtime.padding import left_padded
from warmcache.warmup.verify.agreement import eager_decode_logits, judge_decode
from warmcache.warmup.workloads import bucket_prompt, pad_token_id

if TYPE_CHECKING:
    import torch
    from transformers import CompileConfig, PreTrainedModel

    from warmcache.artifacts.dispatch import PrecompiledDecoder
    from warmcache.registry import ShapeRecord
    from warmcache.shapes import ShapeSpec
    from warmcache.shapes.workload_settings import GenerateSettings


class _Unserved(Exception):
    """A decode call no artifact serves, raised where the ``torch.compile`` fallback would have compiled it."""

    def __init__(self, signature: Signature) -> None:
        super().__init__("unserved decode call")
        self.signature = signature


def _refuse(*args: Any, **kwargs: Any) -> Any:
    raise _Unserved(decode_signature(kwargs))


def prove_padded_request(
    model: PreTrainedModel, decoder: PrecompiledDecoder, record: ShapeRecord, spec: ShapeSpec, config: CompileConfig
) -> str | None:
    """``None`` when the row's artifacts, installed as ``decoder`` (the unpadded proof's), serve a left-padded request
    of the bucket as the model does (or the bucket has no room for padding, or the guard pads nothing for this model);
    else why not (one line)."""
    from warmcache.modeling.padding_probe import padding_leak

    if spec.seq_len < 2 or padding_leak(model) is not None:
        return None
    prompt = bucket_prompt(model, spec, next(model.parameters()).device)
    # An aot_compile artifact's process compiles what no artifact serves, from the cache warmup filled with both
    # requests (the replay proved them, and prime runs both); a process served by AOTInductor packages compiles nothing.
    compiles_the_rest = not all(route.ready_when_loaded for route in routes_of(record))
    return serve_padded_request(
        model, decoder, spec.family.generate, config, prompt.ids, prompt.new_tokens, compiles_the_rest
    )


def serve_padded_request(
    model: PreTrainedModel,
    decoder: PrecompiledDecoder,
    settings: GenerateSettings,
    config: CompileConfig,
    prompt: torch.Tensor,
    room: int,
    compiles_the_rest: bool = False,
) -> str | None:
    """Decode ``prompt`` (the bucket's, unpadded) with its first row left-padded, through ``decoder`` (the model's
    compiled call for ``config``), for the steps that reach the steady decode call (at most ``room``); ``None`` when
    every call was served and the tokens agree with the model's eager decode, or a call was not served but
    ``compiles_the_rest`` (production compiles it from the warmed cache); else why not (one line)."""
    import torch
    from transformers import GenerationMixin

    assert isinstance(model, GenerationMixin), f"{type(model).__name__} cannot generate()"
    pad_id = pad_token_id(model)
    ids, mask = left_padded(prompt, torch.ones_like(prompt), pad_id)
    new_tokens = min(DECODE_TOKENS, room)
    decoder.fallback = lambda: _refuse  # verify compiles nothing to find out
    try:
        with torch.no_grad():
            served = model.generate(
                input_ids=ids,
                attention_mask=mask,
                pad_token_id=pad_id,
                min_new_tokens=new_tokens,
                output_logits=True,
                return_dict_in_generate=True,
                **generate_kwargs(settings, max_new_tokens=new_tokens, config=config, model_config=model.config),
            )
    except _Unserved as unserved:
        return None if compiles_the_rest else _unserved_message(unserved.signature, set(decoder.by_signature))
    generated = served.sequences[:, ids.shape[1] :]
    eager_kwargs = generate_kwargs(settings, max_new_tokens=new_tokens, config=config, model_config=model.config)
    eager = eager_decode_logits(model, ids, mask, generated, pad_token_id=pad_id, **eager_kwargs)
    agreement = judge_decode(model, ids, mask, generated, eager, torch.stack(served.logits, dim=1))
    return None if agreement.agrees else f"precompiled artifact, left-padded request: {agreement.describe()}"


def _unserved_message(padded: Signature, served: set[Signature]) -> str:
    """Why production's padded requests would compile: the inputs the padded decode call has that the served one lacks,
    and the other way round."""
    names = {name for name, _, _ in padded}
    nearest = min(served, key=lambda s: len(names ^ {n for n, _, _ in s}), default=())
    theirs = {name for name, _, _ in nearest}
    parts = [f"has {', '.join(sorted(names - theirs))}" if names - theirs else ""]
    parts.append(f"lacks {', '.join(sorted(theirs - names))}" if theirs - names else "")
    differs = " and ".join(p for p in parts if p) or "differs in an input's shape, dtype or value"
    return (
        "precompiled artifact does not serve a left-padded request of the bucket: its decode call "
        f"{differs} beside the unpadded request's (generate() drops an all-ones attention mask, and this model's "
        "decode depends on whether it has one), so every padded request in production would compile and the guard "
        "would refuse it; serve this model through the compile cache (no precompile), whose warmup compiles both"
    )
