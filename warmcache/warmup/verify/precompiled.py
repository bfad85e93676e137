"""verify's proof of a spec's precompiled artifact, run in verify's fresh replay process.

After the replay ran the spec through ``torch.compile`` (the traced path), the
artifact the row recorded is loaded (sha256 and fingerprint checked first),
installed as the model's compiled call, and the same ``generate()`` runs
through it: it must trace no Dynamo frame and produce the traced path's tokens.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from warmcache.compile_counter import CompileCounter
from warmcache.errors import first_line
from warmcache.generation import generate_kwargs, max_new_tokens_that_fit
from warmcache.runtime.aotinductor import package_entries
from warmcache.runtime.precompiled import install, precompiled_entries
from warmcache.warmup.precompile import capture_decode_call
from warmcache.warmup.workloads import DECODE_TOKENS, pad_token_id, token_ids

if TYPE_CHECKING:
    from transformers import CompileConfig, PreTrainedModel

    from warmcache.registry import ShapeRecord
    from warmcache.shapes import ShapeSpec


def prove_artifacts(model: PreTrainedModel, record: ShapeRecord, spec: ShapeSpec, config: CompileConfig, root: Path) -> str | None:
    """``None`` when the row's artifact in the cache ``root`` serves the spec like the traced path; else why not (one line)."""
    import torch
    from transformers import GenerationMixin

    assert isinstance(model, GenerationMixin), f"{type(model).__name__} cannot generate()"

    if not precompiled_entries(record):
        return None
    settings = spec.family.generate
    new_tokens = min(DECODE_TOKENS, max_new_tokens_that_fit(spec.seq_len, settings.max_cache_len))
    ids = token_ids(model, spec.batch_size, spec.seq_len)

    def generate() -> list[list[int]]:
        # Built per call: each generate() fills a fresh cache object.
        kwargs: dict[str, Any] = generate_kwargs(settings, max_new_tokens=new_tokens, config=config, model_config=model.config)
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), min_new_tokens=new_tokens, pad_token_id=pad_token_id(model), **kwargs)
        return [list(map(int, row)) for row in out]

    # An AOTInductor row's production never traces: its reference is the eager decode (see the worker).
    reference: contextlib.AbstractContextManager[dict[str, Any]] = capture_decode_call(model, eager=True) if package_entries(record) else contextlib.nullcontext({})
    with reference:
        traced = generate()
    try:
        decoder, _ = install(model, config, [record], root_override=root, strict=True)
        with CompileCounter() as counter:
            served = generate()
    except Exception as exc:
        return f"precompiled artifact: {type(exc).__name__}: {first_line(exc)}"
    finally:
        model.__dict__.pop("get_compiled_call", None)  # back to the traced path for the next spec
    if counter.graphs or not decoder.calls:
        return f"precompiled artifact did not serve the decode step ({counter.graphs} Dynamo graphs traced, {decoder.calls} artifact calls)"
    if served != traced:
        return "precompiled artifact's tokens differ from the traced path's"
    return None
