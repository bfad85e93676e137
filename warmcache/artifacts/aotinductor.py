"""The AOTInductor route (``precompile = "aotinductor"``): a bucket's decode step and prefill as weights-less packages.

**Save**: the captured decode call is exported and compiled into a package with no
weights (:mod:`warmcache.artifacts.aoti_export`), and the bucket's prompt too (a packaged
prefill, with which a process serves the bucket without transformers' modeling code,
:mod:`warmcache.runtime.mounted`; none when the decode's inputs need the model's code,
:mod:`warmcache.artifacts.prefill_inputs`). A CPU package's ``.so`` is also written
unpacked, and recorded beside the package (:meth:`AotInductorRoute.companions`).

**Load**: :mod:`warmcache.artifacts.aoti_loader`, with the C++ loader, no compiler.

**Prove** (verify's exact half, :meth:`AotInductorRoute.prove`): the package computes the
graph this model exports now. A package runs the graph warmup exported; production binds
the loaded model's weights to it and never traces the model again. So a model whose code
changed since warmup (a patched transformers, a monkeypatched layer, another attention
implementation) is served the old computation. The numeric half
(:mod:`warmcache.warmup.verify.agreement`) sees that only when the change moves the logits
more than the dtype's rounding does: a 5 % change in one of gemma-2-2b's layers moves its
bfloat16 logits 0.55 %, as far as bfloat16 rounding alone (docs/measurements/criterion.md).
The digest sees any change, in every dtype: verify exports the decode step of the model it
was given, for the bucket's own call, and compares the graph's digest with the one the
package recorded (:attr:`warmcache.artifacts.aoti_export.ExportedDecode.graph_digest`). A
packaged prefill is proven the same way: the prefill warmup would export for the bucket's
prompt (:func:`warmcache.artifacts.aoti_export.export_prefill`).

The export and the compiler are imported only when a package is saved or proven.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from warmcache.artifacts.aoti_loader import load_package
from warmcache.artifacts.capture import capture_decode_call
from warmcache.artifacts.format import (
    AOTINDUCTOR_DIR,
    AOTINDUCTOR_LIBRARY,
    Signature,
    encode_tensor,
    library_of,
    read_checked,
    write_call_artifact,
)
from warmcache.artifacts.package_steps import PREFILL_STEP, package_step
from warmcache.artifacts.route import PrecompiledRoute, SaveJob, Write, expected_fingerprint
from warmcache.identity.code_digest import model_code_digest
from warmcache.targets.routes import PrecompileRoute

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from warmcache.artifacts.aoti_export import ExportedDecode
    from warmcache.artifacts.code_check import ModelCodeCheck
    from warmcache.registry import ShapeRecord


class AotInductorRoute(PrecompiledRoute):
    setting: ClassVar[PrecompileRoute] = PrecompileRoute.AOTINDUCTOR
    kind: ClassVar[str] = PrecompileRoute.AOTINDUCTOR.artifact_kind
    folder: ClassVar[str] = AOTINDUCTOR_DIR
    #: Loaded means bound to the model's weights: nothing compiles on a first call.
    ready_when_loaded: ClassVar[bool] = True

    def writes(self, job: SaveJob) -> list[Write]:
        """The decode package (rows of one batch share it), then the prompt's packaged prefill (one per prompt
        length) unless the manifest's ``package_prefill`` is false."""
        decode: Write = ((), lambda: save_package(job))
        if not job.package_prefill:
            return [decode]
        prefill: Write = ((job.seq_len,), lambda: save_prefill_package(job))
        return [decode, prefill]

    def companions(self, root: Path, entry: str) -> dict[str, str]:
        """The package's unpacked ``.so``, which a start maps where it lies."""
        library = library_of(root, entry)
        return {library: AOTINDUCTOR_LIBRARY} if library is not None else {}

    def load(
        self, root: Path, entry: str, record: ShapeRecord, model: Any, code: ModelCodeCheck
    ) -> tuple[Signature, Callable[..., Any] | None]:
        """The decode step bound to the model's own tensors, or ``None`` for a prefill package (generate() runs its own
        prefill; :mod:`warmcache.runtime.mounted` runs this one)."""
        return load_package(root, entry, expected_fingerprint(record), model, code)

    def prove(
        self, model: PreTrainedModel, record: ShapeRecord, root: Path, max_cache_len: int, generate_call: dict[str, Any]
    ) -> str | None:
        """``None`` when every AOTInductor package of the row recorded the digest of the graph this model exports for
        the bucket; else why not (one line).

        ``generate_call``: the bucket's ``generate()`` arguments (its prompt, a fresh static
        cache of ``max_cache_len``), run eagerly for one decode step to capture the exact call
        the package serves.
        """
        entries = self.entries(record)
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
        exports = _model_exports(model, max_cache_len, generate_call, {package_step(i) for i in recorded.values()})
        for entry, info in recorded.items():
            exported = exports[package_step(info)]
            if info["graph"] != exported.graph_digest:
                return _another_graph(entry, info, exported)
        return None


def _another_graph(entry: str, info: dict[str, Any], exported: ExportedDecode) -> str:
    """Why package ``entry`` (header ``info``) is not the graph ``exported`` from the model now: a tensor it carries by
    value that the model has since changed, or else the model's code.

    A tensor the forward keeps as a plain attribute travels in the package at its value at warmup
    (:func:`~warmcache.artifacts.aoti_export.constant_header`): right for one the model derives from its config
    (Phi-3.5's ``long_inv_freq``), wrong for state it keeps between calls outside the Cache object (RecurrentGemma's
    ``conv1d_state`` and ``recurrent_states``), which the package would then hold at warmup's prompt's value for every
    request. The two differ in that a state's value is another one when verify exports the model again.
    """
    carried = info.get("computed_constants") or {}
    moved = sorted(
        fqn
        for fqn, value in carried.items()
        if fqn in exported.computed and encode_tensor(exported.computed[fqn]) != value
    )
    if moved:
        more = f" (and {len(moved) - 1} more)" if len(moved) > 1 else ""
        return (
            f"AOTInductor package {entry} carries {moved[0]}{more} at its value at warmup, and the model now holds "
            "another: the model keeps that tensor on its modules between calls (state outside the Cache object), so "
            "a package would serve every request with warmup's; serve this model through torch.compile "
            "(precompile = false)"
        )
    return (
        f"AOTInductor package {entry} computes another graph than this model exports for the bucket "
        f"(graph sha256 {info['graph'][:12]}… at warmup, {exported.graph_digest[:12]}… now): the model's code "
        "changed since warmup (a patched or monkeypatched layer, other modeling code); warm it again (warmup "
        "--retry-failed)"
    )


#: The route, as :data:`warmcache.artifacts.kinds.ROUTES` lists it.
AOTINDUCTOR = AotInductorRoute()


def save_package(job: SaveJob) -> str:
    """Export and package the decode step (weights left out) under ``job.root``; returns ``aotinductor/<sha256>``."""
    from warmcache.artifacts.aoti_export import package_decode

    payload, package_header = package_decode(job.model, job.decode_kwargs, job.fields["max_cache_len"], job.progress)
    return _write_package(job, job.decode_kwargs, payload, package_header)


def save_prefill_package(job: SaveJob) -> str | None:
    """Export and package the bucket's prefill (:func:`warmcache.artifacts.aoti_export.export_prefill`) under
    ``job.root``; returns ``aotinductor/<sha256>``, or ``None`` when the decode's inputs need the model's code
    (:func:`warmcache.artifacts.prefill_inputs.prefill_unsupported`)."""
    from warmcache.artifacts.aoti_export import package_prefill
    from warmcache.artifacts.prefill_inputs import prefill_example, prefill_unsupported
    from warmcache.modeling.decode_inputs import flatten

    names, tensors = flatten(job.decode_kwargs)
    if prefill_unsupported(names) or _slides(job.model.config.get_text_config(decoder=True)):
        return None
    payload, package_header = package_prefill(
        job.model, job.decode_kwargs, job.seq_len, job.fields["max_cache_len"], job.progress
    )
    example, _ = prefill_example(names, tensors, {}, job.seq_len)
    return _write_package(job, dict(zip(names, example)), payload, package_header)


def _write_package(job: SaveJob, call: dict[str, Any], payload: bytes, package_header: dict[str, Any]) -> str:
    """A package under ``job.root`` as ``aotinductor/<sha256>``, its header naming the ``call`` it serves and the
    digest of the model code it was exported from."""
    model_code = model_code_digest(job.model)
    return write_call_artifact(
        job.root, call, job.fields, payload, aotinductor=package_header, model_code=model_code, folder=AOTINDUCTOR_DIR
    )


def _slides(config: Any) -> bool:
    """Whether any layer attends through a sliding window, whose mask (one tensor for every layer where all slide) the
    model's own code builds: the mounted decode loop builds full-attention masks only."""
    kinds = getattr(config, "layer_types", None)
    if kinds:
        return any(kind != "full_attention" for kind in kinds)
    return (
        getattr(config, "sliding_window", None) is not None and getattr(config, "use_sliding_window", True) is not False
    )


def _model_exports(
    model: PreTrainedModel, max_cache_len: int, generate_call: dict[str, Any], steps: set[str]
) -> dict[str, ExportedDecode]:
    """Export the model's decode step for the bucket's first one-token call (and its prefill for the bucket's prompt,
    if asked), as warmup did; ``{step: export}``."""
    import torch
    from transformers import GenerationMixin

    from warmcache.artifacts.aoti_export import export_decode, export_prefill

    assert isinstance(model, GenerationMixin), f"{type(model).__name__} cannot generate()"
    with capture_decode_call(model, eager=True) as decode_kwargs, torch.no_grad():
        model.generate(**{**generate_call, "max_new_tokens": 2, "min_new_tokens": 2})
    exports = {step: export_decode(model, decode_kwargs, max_cache_len) for step in steps - {PREFILL_STEP}}
    if PREFILL_STEP in steps:
        seq_len = int(generate_call["input_ids"].shape[1])
        exports[PREFILL_STEP] = export_prefill(model, decode_kwargs, seq_len, max_cache_len)
    return exports
