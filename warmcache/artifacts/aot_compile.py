"""Compile a bucket's decode step ahead of time and save it as one artifact production loads.

``generate()`` gets its decode callable from ``model.get_compiled_call(config)``
and calls it with exactly ``input_ids``, ``cache`` (the ``StaticCache``),
``position_ids``, ``attention_mask`` (a dict of prebuilt masks),
``logits_to_keep``, ``use_cache`` and ``return_dict``. Warmup captures those
arguments during its real ``generate()`` (:func:`capture_decode_call`) and
compiles the same call with ``aot_compile``. Dynamo's guards are dropped: an
``ID_MATCH`` guard cannot be serialised (measured, torch 2.13), and the guard
is warmcache's job anyway. The registry row says which bucket the artifact is
for, its header says the exact input signature, and the runtime dispatcher
(:mod:`warmcache.runtime.decode_dispatch`) never runs it on anything else.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from warmcache.cache.artifact_format import AOTINDUCTOR_DIR, Fingerprint, Header, decode_signature, write_artifact
from warmcache.errors import UsageError
from warmcache.targets import PrecompileRoute
from warmcache.targets.inductor import PRECOMPILE_BACKENDS
from warmcache.warmup.phases import NO_PHASES, SpecPhases

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def _drop_every_guard(guards: Any) -> list[bool]:
    return [False] * len(guards)


@contextlib.contextmanager
def capture_decode_call(model: PreTrainedModel, *, eager: bool = False) -> Iterator[dict[str, Any]]:
    """While inside, remember the keyword arguments of the first one-token call generate() makes to its compiled
    forward.

    ``eager``: serve that call with the model's own forward instead of compiling it
    (an AOTInductor model's reference path: its production never runs ``torch.compile``).
    """
    captured: dict[str, Any] = {}
    original = model.get_compiled_call

    def spying_get_compiled_call(compile_config: Any) -> Any:
        compiled = model.__call__ if eager else original(compile_config)

        def call(*args: Any, **kwargs: Any) -> Any:
            ids = kwargs.get("input_ids")
            if not captured and ids is not None and ids.shape[-1] == 1:
                captured.update(kwargs)
            return compiled(*args, **kwargs)

        return call

    model.get_compiled_call = spying_get_compiled_call  # type: ignore[method-assign]
    try:
        yield captured
    finally:
        del model.get_compiled_call  # the instance attribute; the class method shows through again


def precompile_decode(model: PreTrainedModel, decode_kwargs: dict[str, Any], backend: str) -> Any:
    """``aot_compile`` the decode step for exactly these arguments, guards dropped; returns the compiled function."""
    import torch

    backends = PRECOMPILE_BACKENDS[PrecompileRoute.AOT_COMPILE]
    if backend not in backends:
        raise UsageError(
            f"precompile: backend {backend!r} cannot be serialised by torch {torch.__version__} (use "
            f"one of {', '.join(backends)})"
        )
    compiled: Any = torch.compile(
        type(model).__call__,
        fullgraph=True,
        dynamic=False,
        backend=backend,
        options={"guard_filter_fn": _drop_every_guard},
    )
    # The captured cache holds inference tensors (warmup generates under inference_mode);
    # the graph is inference-only either way and runs under generate()'s no_grad too.
    with torch.inference_mode():
        return compiled.aot_compile(((model,), decode_kwargs))


def save_precompiled(
    root: Path, compiled: Any, decode_kwargs: dict[str, Any], fingerprint_fields: dict[str, Any]
) -> str:
    """Write the compiled function under ``root``; returns its entry path ``precompiled/<sha256>``."""
    runtime_env = compiled._artifacts.runtime_env
    globals_ = compiled.fn.__globals__
    modules = {
        name: globals_[name].__name__
        for name in sorted(runtime_env.external_refs)
        if name not in runtime_env.import_sources and isinstance(globals_.get(name), ModuleType)
    }
    fingerprint = Fingerprint(signature=decode_signature(decode_kwargs), **fingerprint_fields)
    payload = type(compiled).serialize(compiled).serialized_data
    return write_artifact(root, Header(fingerprint, modules), payload)


def save_package(
    root: Path,
    model: PreTrainedModel,
    decode_kwargs: dict[str, Any],
    fingerprint_fields: dict[str, Any],
    phases: SpecPhases = NO_PHASES,
) -> str:
    """Export and package the decode step (AOTInductor, weights left out) under ``root``; returns
    ``aotinductor/<sha256>``."""
    from warmcache.warmup.aoti_export import package_decode

    payload, package_header = package_decode(model, decode_kwargs, fingerprint_fields["max_cache_len"], phases)
    fingerprint = Fingerprint(signature=decode_signature(decode_kwargs), **fingerprint_fields)
    return write_artifact(root, Header(fingerprint, {}, package_header), payload, AOTINDUCTOR_DIR)


def save_prefill_package(
    root: Path,
    model: PreTrainedModel,
    decode_kwargs: dict[str, Any],
    seq_len: int,
    fingerprint_fields: dict[str, Any],
    phases: SpecPhases = NO_PHASES,
) -> str | None:
    """Export and package the bucket's prefill (:func:`warmcache.warmup.aoti_export.export_prefill`) under ``root``;
    returns ``aotinductor/<sha256>``, or ``None`` when the decode's inputs need the model's code
    (:func:`warmcache.warmup.prefill_inputs.prefill_unsupported`)."""
    from warmcache.modeling.decode_inputs import flatten
    from warmcache.warmup.aoti_export import package_prefill
    from warmcache.warmup.prefill_inputs import prefill_example, prefill_unsupported

    names, tensors = flatten(decode_kwargs)
    if prefill_unsupported(names) or _slides(model.config.get_text_config(decoder=True)):
        return None
    payload, package_header = package_prefill(
        model, decode_kwargs, seq_len, fingerprint_fields["max_cache_len"], phases
    )
    example, _ = prefill_example(names, tensors, {}, seq_len)
    fingerprint = Fingerprint(signature=decode_signature(dict(zip(names, example))), **fingerprint_fields)
    return write_artifact(root, Header(fingerprint, {}, package_header), payload, AOTINDUCTOR_DIR)


def _slides(config: Any) -> bool:
    """Whether any layer attends through a sliding window, whose mask (one tensor for every layer where all slide) the
    model's own code builds: the mounted decode loop builds full-attention masks only."""
    kinds = getattr(config, "layer_types", None)
    if kinds:
        return any(kind != "full_attention" for kind in kinds)
    return (
        getattr(config, "sliding_window", None) is not None and getattr(config, "use_sliding_window", True) is not False
    )
