"""verify's proof of a spec's precompiled artifact, run in verify's fresh replay process.

After the replay ran the spec (through ``torch.compile``, or eagerly for an
AOTInductor model), each route the row recorded files of gives its exact proof first
(:meth:`warmcache.artifacts.route.PrecompiledRoute.prove`: an AOTInductor package's graph
must be the one the model exports now, in every dtype). Then the artifact the row recorded
is loaded (sha256 and fingerprint checked first), installed as the model's compiled
call, and the spec's ``generate()`` runs through it to the cache's end: it must trace
no Dynamo frame, and every step's logits and token must be as close to the
higher-precision reference on the same tokens as the model's own eager decode is,
within a factor (:mod:`.agreement`: near-ties of bfloat16 may go either way, wrong
weights, wrong cache writes or a wrong bucket may not).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from warmcache.artifacts.dispatch import install
from warmcache.artifacts.kinds import routes_of
from warmcache.errors import first_line
from warmcache.modeling.compile_counter import CompileCounter
from warmcache.modeling.generation import generate_kwargs
from warmcache.warmup.verify.agreement import eager_decode_logits, judge_decode
from warmcache.warmup.verify.padded_request import prove_padded_request
from warmcache.warmup.workloads import bucket_prompt, pad_token_id

if TYPE_CHECKING:
    from transformers import CompileConfig, PreTrainedModel

    from warmcache.registry import ShapeRecord
    from warmcache.shapes import ShapeSpec
    from warmcache.shapes.workload_settings import GenerateSettings


def prove_artifacts(
    model: PreTrainedModel, record: ShapeRecord, spec: ShapeSpec, config: CompileConfig, root: Path
) -> str | None:
    """``None`` when the row's artifact in the cache ``root`` serves the spec to the cache's end as the model does;
    else why not (one line)."""
    try:
        return _prove_artifacts(model, record, spec, config, root)
    finally:
        model.__dict__.pop("get_compiled_call", None)  # back to the traced path for the next spec


def _prove_artifacts(
    model: PreTrainedModel, record: ShapeRecord, spec: ShapeSpec, config: CompileConfig, root: Path
) -> str | None:
    """:func:`prove_artifacts`, leaving the row's artifacts installed as the model's compiled call: loaded once, they
    serve the unpadded request and then the padded one."""
    import torch
    from transformers import GenerationMixin

    assert isinstance(model, GenerationMixin), f"{type(model).__name__} cannot generate()"

    routes = routes_of(record)
    if not routes:
        return None
    settings = spec.family.generate
    ids, mask, new_tokens = bucket_prompt(model, spec, next(model.parameters()).device)
    call = {"input_ids": ids, "attention_mask": mask, "pad_token_id": pad_token_id(model)}
    try:
        capture: dict[str, Any] = generate_kwargs(
            settings, max_new_tokens=new_tokens, config=config, model_config=model.config
        )
        for route in routes:
            unproven = route.prove(model, record, root, settings.max_cache_len, {**capture, **call})
            if unproven:
                return unproven
        decoder, _ = install(model, config, [record], root_override=root, strict=True)
        kwargs: dict[str, Any] = generate_kwargs(
            settings, max_new_tokens=new_tokens, config=config, model_config=model.config
        )
        with CompileCounter() as counter, torch.no_grad():
            served = model.generate(
                **call,
                min_new_tokens=new_tokens,
                output_logits=True,
                return_dict_in_generate=True,
                **kwargs,
            )
    except Exception as exc:
        return f"precompiled artifact: {type(exc).__name__}: {first_line(exc)}"
    if counter.graphs or not decoder.calls:
        return (
            f"precompiled artifact did not serve the decode step ({counter.graphs} Dynamo graphs "
            f"traced, {decoder.calls} artifact calls)"
        )
    generated = served.sequences[:, ids.shape[1] :]
    eager_kwargs = generate_kwargs(settings, max_new_tokens=new_tokens, config=config, model_config=model.config)
    eager = eager_decode_logits(model, ids, mask, generated, pad_token_id=pad_token_id(model), **eager_kwargs)
    agreement = judge_decode(model, ids, mask, generated, eager, torch.stack(served.logits, dim=1))
    if not agreement.agrees:
        return f"precompiled artifact {agreement.describe()}"
    unserved = prove_padded_request(model, decoder, record, spec, config)  # the masks production sends, padded too
    if unserved:
        return unserved
    return prove_packaged_prefill(model, record, root, ids, mask, new_tokens, settings, config)


def prove_packaged_prefill(
    model: PreTrainedModel,
    record: ShapeRecord,
    root: Path,
    ids: Any,
    mask: Any,
    new_tokens: int,
    settings: GenerateSettings,
    config: CompileConfig,
) -> str | None:
    """``None`` when the row has no packaged prefill, or when its prefill and decode packages, bound as a start from the
    mount binds them (:mod:`warmcache.runtime.mounted`: by the checkpoint names their headers record, buffers carried
    by value), decode the bucket's prompt to the cache's end as the model does; else why not (one line)."""
    import torch

    from warmcache.runtime.decode_loop import PackagedSteps
    from warmcache.runtime.mounted import bind_package_steps

    try:
        steps = bind_package_steps(root, record, model.state_dict(), str(next(model.parameters()).device.type))
        if steps is None:
            return None
        logits: list[torch.Tensor] = []
        out = PackagedSteps(*steps).generate(
            ids, mask, new_tokens, pad_token_id=pad_token_id(model) or 0, on_logits=logits.append
        )
    except Exception as exc:
        return f"packaged prefill: {type(exc).__name__}: {first_line(exc)}"
    generated = out[:, ids.shape[1] :]
    # A fresh cache: the served call's own is full.
    eager_kwargs = generate_kwargs(settings, max_new_tokens=new_tokens, config=config, model_config=model.config)
    eager = eager_decode_logits(model, ids, mask, generated, pad_token_id=pad_token_id(model), **eager_kwargs)
    agreement = judge_decode(model, ids, mask, generated, eager, torch.stack(logits, dim=1))
    return None if agreement.agrees else f"packaged prefill and decode {agreement.describe()}"
