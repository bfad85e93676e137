"""verify's exact half of an AOTInductor package's proof: the package computes the graph this model exports now.

A package runs the graph warmup exported; production binds the loaded model's weights
to it and never traces the model again. So a model whose code changed since warmup (a
patched transformers, a monkeypatched layer, another attention implementation) is
served the old computation. The numeric half (:mod:`.agreement`) sees that only when the
change moves the logits more than the dtype's rounding does: a 5 % change in one of
gemma-2-2b's layers moves its bfloat16 logits 0.55 %, as far as bfloat16 rounding alone
(docs/measurements/criterion.md). The digest sees any change, in every dtype: verify
exports the decode step of the model it was given, for the bucket's own call, and
compares the graph's digest with the one the package recorded
(:attr:`warmcache.warmup.aoti_export.ExportedDecode.graph_digest`). A packaged prefill is proven the
same way: the prefill warmup would export for the bucket's prompt (:func:`.aoti_export.export_prefill`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from warmcache.cache.artifact_format import read_checked
from warmcache.runtime.decode_dispatch import expected_fingerprint, package_entries
from warmcache.runtime.package_steps import PREFILL_STEP, package_step
from warmcache.warmup.aoti_export import export_decode, export_prefill
from warmcache.warmup.decode_writer import capture_decode_call

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from warmcache.registry import ShapeRecord


def prove_package_graphs(
    model: PreTrainedModel, record: ShapeRecord, root: Path, max_cache_len: int, generate_call: dict[str, Any]
) -> str | None:
    """``None`` when every AOTInductor package of the row recorded the digest of the graph this model exports for the
    bucket; else why not (one line).

    ``generate_call``: the bucket's ``generate()`` arguments (its prompt, a fresh static
    cache of ``max_cache_len``), run eagerly for one decode step to capture the exact call
    the package serves.
    """
    entries = package_entries(record)
    if not entries:
        return None
    expected = expected_fingerprint(record)
    recorded = {entry: read_checked(root, entry, expected)[0].aotinductor or {} for entry in entries}
    missing = [entry for entry, info in recorded.items() if "graph" not in info]
    if missing:
        return (
            f"AOTInductor package {missing[0]} records no graph digest (packaged by an earlier warmcache), so "
            "nothing proves it computes this model; warm it again (warmup --retry-failed)"
        )
    digests = _model_graph_digests(model, max_cache_len, generate_call, {package_step(i) for i in recorded.values()})
    for entry, info in recorded.items():
        digest = digests[package_step(info)]
        if info["graph"] != digest:
            return (
                f"AOTInductor package {entry} computes another graph than this model exports for the bucket "
                f"(graph sha256 {info['graph'][:12]}… at warmup, {digest[:12]}… now): the model's code changed "
                "since warmup (a patched or monkeypatched layer, other modeling code); warm it again (warmup "
                "--retry-failed)"
            )
    return None


def _model_graph_digests(
    model: PreTrainedModel, max_cache_len: int, generate_call: dict[str, Any], steps: set[str]
) -> dict[str, str]:
    """Export the model's decode step for the bucket's first one-token call (and its prefill for the bucket's prompt,
    if asked), as warmup did; ``{step: digest}``."""
    import torch
    from transformers import GenerationMixin

    assert isinstance(model, GenerationMixin), f"{type(model).__name__} cannot generate()"
    with capture_decode_call(model, eager=True) as decode_kwargs, torch.no_grad():
        model.generate(**{**generate_call, "max_new_tokens": 2, "min_new_tokens": 2})
    digests = {step: export_decode(model, decode_kwargs, max_cache_len).graph_digest for step in steps - {PREFILL_STEP}}
    if PREFILL_STEP in steps:
        seq_len = int(generate_call["input_ids"].shape[1])
        digests[PREFILL_STEP] = export_prefill(model, decode_kwargs, seq_len, max_cache_len).graph_digest
    return digests
