"""Export a bucket's decode step and compile it into an AOTInductor package, weights left out.

The step is the call generate() makes to its compiled forward (captured during
warmup's real generate(), see :func:`warmcache.artifacts.capture.capture_decode_call`),
with the static cache taken apart into plain tensor inputs
(:mod:`warmcache.modeling.decode_inputs`). Inside the step a
:class:`~warmcache.modeling.kv_cache.PositionTensorCache` is built around those tensors
(keys and values, and a recurrent layer's conv and SSM states), so
the model runs its own attention and mask code unchanged; the exported graph keeps
the cache's in-place updates, and AOTInductor writes them back into the caller's
tensors (measured, torch 2.13).

``aot_inductor.package_constants_in_so=False``: the package holds code, not weights.
Production binds the loaded model's own parameters to it (one copy of the weights
for every bucket, and a package of ~2 MB instead of the model's size).

This module imports the compiler: only warmup processes load it.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from warmcache.artifacts.aoti_loader import open_loader
from warmcache.artifacts.format import encode_tensor, named_tensors
from warmcache.artifacts.package_steps import DECODE_STEP, PREFILL_STEP
from warmcache.artifacts.prefill_inputs import prefill_example
from warmcache.artifacts.route import SILENT, Progress, SavePhase
from warmcache.errors import CacheError
from warmcache.modeling.decode_inputs import flatten, input_signature, scalars
from warmcache.modeling.kv_cache import PositionTensorCache, hold

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

#: Inductor options of every package: weights stay with the model that loads it.
INDUCTOR_CONFIGS = {"aot_inductor.package_constants_in_so": False}
#: Bytes of tensor constants a package may carry in its header: what a model computes from its config
#: (rotary frequencies), never weights.
MAX_COMPUTED_CONSTANT_BYTES = 1 << 20


def _step_module(
    model: PreTrainedModel, names: list[str], mask_kinds: list[str] | None, fixed: dict[str, Any], max_cache_len: int
) -> torch.nn.Module:
    """A module whose forward takes the flat decode tensors and returns the logits."""
    import torch

    class DecodeStep(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
            given = dict(zip(names, tensors))
            mask: Any = (
                {kind: given.get(f"attention_mask.{kind}") for kind in mask_kinds}
                if mask_kinds is not None
                else given.get("attention_mask")
            )
            cache = PositionTensorCache(self.model.config, max_cache_len)
            for index, layer in enumerate(cache.layers):
                prefix = f"cache.layers[{index}]."
                parts = {name.removeprefix(prefix): t for name, t in given.items() if name.startswith(prefix)}
                if parts:
                    hold(layer, parts)
            out = self.model(
                input_ids=given["input_ids"],
                position_ids=given.get("position_ids"),
                attention_mask=mask,
                cache=cache,
                **fixed,
            )
            return out.logits

    return DecodeStep().eval()


@dataclass(frozen=True)
class ExportedDecode:
    """One bucket's decode (or prefill) step as ``torch.export`` traced it from the loaded model."""

    names: list[str]
    tensors: list[torch.Tensor]
    mask_kinds: list[str] | None
    fixed: dict[str, Any]
    step: torch.nn.Module
    program: torch.export.ExportedProgram
    #: Tensors the model computes from its config and keeps as attributes (:func:`_constants_as_buffers`).
    computed: dict[str, torch.Tensor]

    @property
    def graph_digest(self) -> str:
        """sha256 of what the package computes, weights aside: every graph's code, which input binds which weight, and
        the computed constants' values.

        The package runs the graph warmup exported, whatever the model that binds its weights
        now computes; verify exports the model it is given again and compares digests
        (:mod:`warmcache.artifacts.aotinductor`). Names and code only: no object id,
        path or value that differs between two exports of the same model in two processes.
        """
        import torch

        digest = hashlib.sha256(str(self.program.graph_signature).encode())
        for name, module in self.program.graph_module.named_modules():
            if isinstance(module, torch.fx.GraphModule):
                digest.update(f"\0{name}\0{module.code}".encode())
        for fqn in sorted(self.computed):
            digest.update(f"\0{fqn}\0{encode_tensor(self.computed[fqn])}".encode())
        return digest.hexdigest()


def export_decode(model: PreTrainedModel, decode_kwargs: dict[str, Any], max_cache_len: int) -> ExportedDecode:
    """``torch.export`` the decode step of exactly these arguments (no compiler: seconds)."""
    names, tensors = flatten(decode_kwargs)
    mask = decode_kwargs.get("attention_mask")
    mask_kinds = sorted(mask) if isinstance(mask, dict) else None
    # Warmup captured inference tensors (generate() runs under inference_mode); export wants plain ones.
    example = [t.clone() for t in tensors]
    return _export_step(model, names, example, mask_kinds, scalars(decode_kwargs), max_cache_len)


def export_prefill(
    model: PreTrainedModel, decode_kwargs: dict[str, Any], seq_len: int, max_cache_len: int
) -> ExportedDecode:
    """``torch.export`` the bucket's prefill: the decode step's inputs with a ``seq_len`` prompt and an empty cache.

    See :func:`warmcache.artifacts.prefill_inputs.prefill_example`: the first token then comes from compiled code too,
    and a start needs no modeling code at all (:mod:`warmcache.runtime.mounted`).
    """
    names, tensors = flatten(decode_kwargs)
    mask = decode_kwargs.get("attention_mask")
    mask_kinds = sorted(mask) if isinstance(mask, dict) else None
    example, fixed = prefill_example(names, tensors, scalars(decode_kwargs), seq_len)
    return _export_step(model, names, example, mask_kinds, fixed, max_cache_len)


def _export_step(
    model: PreTrainedModel,
    names: list[str],
    example: list[torch.Tensor],
    mask_kinds: list[str] | None,
    fixed: dict[str, Any],
    max_cache_len: int,
) -> ExportedDecode:
    import torch

    step = _step_module(model, names, mask_kinds, fixed, max_cache_len)
    with torch.no_grad():
        program = torch.export.export(step, tuple(t.clone() for t in example), strict=False)
    computed = _constants_as_buffers(program)
    return ExportedDecode(names, example, mask_kinds, fixed, step, program, computed)


def package_decode(
    model: PreTrainedModel, decode_kwargs: dict[str, Any], max_cache_len: int, phases: Progress = SILENT
) -> tuple[bytes, dict[str, Any]]:
    """Export and package the decode step of exactly these arguments (see :func:`package_exported`)."""
    phases.enter(SavePhase.EXPORTING)
    exported = export_decode(model, decode_kwargs, max_cache_len)
    refuse_carried_state(model, exported, decode_kwargs)
    return package_exported(exported, DECODE_STEP, phases)


def refuse_carried_state(model: PreTrainedModel, exported: ExportedDecode, decode_kwargs: dict[str, Any]) -> None:
    """Refuse (:class:`CacheError`) a decode step that carries by value a tensor the model changes as it decodes.

    A tensor the forward keeps as a plain attribute travels in the package at its value now
    (:func:`_constants_as_buffers`): right for one the model derives from its config (Phi-3.5's
    ``long_inv_freq``), wrong for state it keeps between calls outside the Cache object (RecurrentGemma's
    ``conv1d_state``), which the package would hold at warmup's value for every request. The two look alike at
    export, so the model runs this decode call once more, eagerly, on a copy of its inputs: a carried tensor it
    then holds at another value is state. The attributes are put back as they were.
    """
    holders = {fqn: held for fqn in exported.computed if (held := _holder(exported.step, fqn)) is not None}
    if not holders:
        return
    import copy

    import torch

    with torch.inference_mode():  # the captured inputs are inference tensors, which the decode writes into
        kept = {fqn: (getattr(module, name), getattr(module, name).clone()) for fqn, (module, name) in holders.items()}
        try:
            model(**copy.deepcopy(decode_kwargs))
            moved = sorted(
                fqn for fqn, (module, name) in holders.items() if not _same(getattr(module, name), kept[fqn][1])
            )
        finally:
            for fqn, (module, name) in holders.items():
                tensor, value = kept[fqn]
                tensor.copy_(value)  # undo an in-place update as well as a new value
                setattr(module, name, tensor)
    if moved:
        more = f" (and {len(moved) - 1} more)" if len(moved) > 1 else ""
        raise CacheError(
            f"aotinductor package: the decode step reads {moved[0]}{more}, a tensor the model keeps on its modules and "
            "changes at every step (state outside the Cache object); a package would carry its value at warmup into "
            "every request: serve this model through torch.compile (precompile = false)"
        )


def _holder(step: torch.nn.Module, fqn: str) -> tuple[torch.nn.Module, str] | None:
    """The module holding the carried tensor ``fqn`` as a tensor attribute, and the attribute's name; ``None`` for a
    constant no module holds (a tensor literal the forward makes at every call, lifted as ``lifted_tensor_0``)."""
    import torch

    path, _, name = fqn.rpartition(".")
    try:
        module = step.get_submodule(path)
    except AttributeError:
        return None
    return (module, name) if isinstance(getattr(module, name, None), torch.Tensor) else None


def _same(tensor: Any, value: torch.Tensor) -> bool:
    import torch

    return isinstance(tensor, torch.Tensor) and tensor.shape == value.shape and bool(torch.equal(tensor, value))


def package_prefill(
    model: PreTrainedModel,
    decode_kwargs: dict[str, Any],
    seq_len: int,
    max_cache_len: int,
    phases: Progress = SILENT,
) -> tuple[bytes, dict[str, Any]]:
    """Export and package the bucket's prefill (see :func:`export_prefill` and :func:`package_exported`)."""
    phases.enter(SavePhase.EXPORTING_PREFILL)
    return package_exported(export_prefill(model, decode_kwargs, seq_len, max_cache_len), PREFILL_STEP, phases)


def package_exported(exported: ExportedDecode, step_kind: str, phases: Progress) -> tuple[bytes, dict[str, Any]]:
    """Compile an exported step into a weights-less package.

    Returns the package bytes and the header fields production checks before
    loading it: the input signature, the mask layout, the fixed scalars, the
    constants (``{fqn: [shape, dtype]}``) to bind, and the CPU capability the
    code was generated for; the graph's digest, which verify checks; which step it is
    (``decode`` or ``prefill``); and what a process without the model object needs to bind
    the constants from the checkpoint's files (:func:`checkpoint_bindings`).
    """
    import torch

    with torch.no_grad(), tempfile.TemporaryDirectory(prefix="warmcache-aoti-") as work:
        path = Path(work) / "decode.pt2"
        phases.enter(SavePhase.PACKAGING)
        with warnings.catch_warnings():
            # torch 2.13's Inductor deep-copies every graph it compiles (torch/_dynamo/repro/after_aot.py), and
            # copying an exported graph rebuilds its pytree LeafSpec, a class torch itself deprecated: its
            # FutureWarning names no call of ours and nothing we could change.
            warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)`", category=FutureWarning)
            torch._inductor.aoti_compile_and_package(
                exported.program, package_path=str(path), inductor_configs=INDUCTOR_CONFIGS
            )
        payload = path.read_bytes()
        # The package's own list: tied weights appear once, folded buffers not at all.
        listed = open_loader(path).get_constant_fqns()
    computed = exported.computed
    constants = constant_header(exported.step, listed, computed)
    header = {
        "step": step_kind,
        "inputs": input_signature(exported.names, exported.tensors),
        "mask_kinds": exported.mask_kinds,
        "scalars": exported.fixed,
        "constants": constants,
        "computed_constants": {fqn: encode_tensor(computed[fqn]) for fqn in sorted(set(listed) & set(computed))},
        "device": str(exported.tensors[0].device.type),
        "cpu_capability": cpu_capability(),
        "graph": exported.graph_digest,
        **checkpoint_bindings(exported.step, constants),
    }
    return payload, header


def _constants_as_buffers(program: torch.export.ExportedProgram) -> dict[str, torch.Tensor]:
    """The tensors the model's forward computes and keeps as plain attributes, re-declared as non-persistent buffers.

    Export lifts such a tensor (Phi-3.5's longrope ``long_inv_freq``, made on the first
    forward) as a constant; AOTInductor's own re-trace would then list it as an
    anonymous ``_tensor_constant0`` whose origin is lost. As a buffer it keeps its
    name, and its value, which the model derives from its config and no checkpoint
    holds, travels in the package header (:func:`encode_tensor`). Returns
    ``{fqn: value}`` of those re-declared.
    """
    from torch.export.graph_signature import InputKind

    computed: dict[str, torch.Tensor] = {}
    for spec in program.graph_signature.input_specs:
        if spec.kind == InputKind.CONSTANT_TENSOR and spec.target is not None:
            spec.kind, spec.persistent = InputKind.BUFFER, False
            computed[spec.target] = program.constants[spec.target]
    return computed


def constant_header(
    step: torch.nn.Module, listed: list[str], computed: dict[str, torch.Tensor]
) -> dict[str, list[Any]]:
    """``{fqn: [shape, dtype]}`` of every weight the package lists, each found among the step's parameters and buffers.

    A listed constant the step computes (``computed``) is not bound from the model
    but carried by value; its size is bounded, as a header is read whole.
    """
    own = named_tensors(step)
    missing = sorted(set(listed) - set(own) - set(computed))
    if missing:
        raise CacheError(
            f"aotinductor package: constant {missing[0]} is not a parameter or buffer of the loaded model"
            + (f" (nor {len(missing) - 1} more)" if len(missing) > 1 else "")
        )
    carried = sorted(set(listed) & set(computed) - set(own))
    size = sum(computed[fqn].numel() * computed[fqn].element_size() for fqn in carried)
    if size > MAX_COMPUTED_CONSTANT_BYTES:
        raise CacheError(
            f"aotinductor package: the decode step computes {size} bytes of tensor constants that are not "
            f"parameters or buffers (first: {carried[0]}); a package carries at most {MAX_COMPUTED_CONSTANT_BYTES}"
        )
    return {fqn: [list(own[fqn].shape), str(own[fqn].dtype)] for fqn in sorted(set(listed) - set(carried))}


def checkpoint_bindings(step: torch.nn.Module, constants: dict[str, list[Any]]) -> dict[str, Any]:
    """What binds each constant in a process that has the checkpoint's files but no model object.

    ``checkpoint_names``: ``{fqn: [state_dict names]}``, every name the tensor has in the model (a tied
    ``lm_head.weight`` is saved once, as ``model.embed_tokens.weight``); ``buffers``: the values of the
    non-persistent buffers among the constants (a rotary embedding's ``inv_freq``), which no checkpoint holds
    and the model computes from its config: small, carried by value like the computed constants.
    """
    model = step.get_submodule("model")
    persistent = set(model.state_dict())
    names_of: dict[tuple[Any, ...], list[str]] = {}
    for name, tensor in named_tensors(model).items():
        names_of.setdefault(_same_tensor(tensor), []).append(name)
    own = named_tensors(step)
    checkpoint_names: dict[str, list[str]] = {}
    buffers: dict[str, list[Any]] = {}
    for fqn in constants:
        names = [n for n in names_of.get(_same_tensor(own[fqn]), []) if n in persistent]
        if names:
            checkpoint_names[fqn] = names
        else:
            buffers[fqn] = encode_tensor(own[fqn])
    size = sum(len(value[2]) for value in buffers.values()) * 3 // 4
    if size > MAX_COMPUTED_CONSTANT_BYTES:
        raise CacheError(
            f"aotinductor package: {size} bytes of non-persistent buffers (first: {sorted(buffers)[0]}); a package "
            f"carries at most {MAX_COMPUTED_CONSTANT_BYTES}"
        )
    return {"checkpoint_names": checkpoint_names, "buffers": buffers}


def _same_tensor(tensor: torch.Tensor) -> tuple[Any, ...]:
    """What two names of one tensor (tied weights) have in common: the memory they view, and how."""
    return (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape), tensor.stride())


def cpu_capability() -> str:
    """The vector ISA Inductor generates CPU code for: ``ATEN_CPU_CAPABILITY`` if set, else this CPU's best."""
    import torch

    return (os.environ.get("ATEN_CPU_CAPABILITY") or torch.backends.cpu.get_cpu_capability()).upper()
