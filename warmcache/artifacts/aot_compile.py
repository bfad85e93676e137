"""The ``aot_compile`` route (``precompile = true``): a decode step compiled by Dynamo, saved, loaded as bytecode.

Warmup compiles the decode call it captured (:mod:`warmcache.artifacts.capture`) with
``torch.compile(...).aot_compile``. Dynamo's guards are dropped: an ``ID_MATCH`` guard
cannot be serialised (measured, torch 2.13), and the guard is warmcache's job anyway.
The registry row says which bucket the artifact is for, its header says the exact input
signature, and the runtime dispatcher (:mod:`warmcache.artifacts.dispatch`) never runs it
on anything else.

Loading imports no Dynamo tracing machinery beyond what deserialising needs and
compiles no frame: the loaded function is the bytecode Dynamo generated at
warmup, calling the compiled graph. Its proof is verify's numeric one alone.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar

from warmcache.artifacts.format import PRECOMPILED_DIR, Signature, read_checked, write_call_artifact
from warmcache.artifacts.route import PrecompiledRoute, SaveJob, SavePhase, Write, expected_fingerprint
from warmcache.errors import CacheError, UsageError, first_line
from warmcache.identity.code_digest import model_code_digest
from warmcache.targets.inductor import CACHE_ENV, PRECOMPILE_BACKENDS
from warmcache.targets.routes import PrecompileRoute

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from warmcache.artifacts.code_check import ModelCodeCheck
    from warmcache.registry import ShapeRecord


class AotCompileRoute(PrecompiledRoute):
    setting: ClassVar[PrecompileRoute] = PrecompileRoute.AOT_COMPILE
    kind: ClassVar[str] = PrecompileRoute.AOT_COMPILE.artifact_kind
    folder: ClassVar[str] = PRECOMPILED_DIR

    def writes(self, job: SaveJob) -> list[Write]:
        """One artifact: the decode graph (rows of one batch share it)."""

        def write() -> str:
            job.progress.enter(SavePhase.PRECOMPILING)
            compiled = precompile_decode(job.model, job.decode_kwargs, job.fields["backend"])
            return save_precompiled(job.root, compiled, job.decode_kwargs, job.fields, model_code_digest(job.model))

        return [((), write)]

    def load(
        self, root: Path, entry: str, record: ShapeRecord, model: Any, code: ModelCodeCheck
    ) -> tuple[Signature, Callable[..., Any]]:
        return load_decode(root, entry, record, code)


#: The route, as :data:`warmcache.artifacts.kinds.ROUTES` lists it.
AOT_COMPILE = AotCompileRoute()


def _drop_every_guard(guards: Any) -> list[bool]:
    return [False] * len(guards)


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
    root: Path,
    compiled: Any,
    decode_kwargs: dict[str, Any],
    fingerprint_fields: dict[str, Any],
    model_code: str | None = None,
) -> str:
    """Write the compiled function under ``root``, with the digest of the ``model_code`` it was traced from; returns
    its entry path ``precompiled/<sha256>``."""
    runtime_env = compiled._artifacts.runtime_env
    globals_ = compiled.fn.__globals__
    modules = {
        name: globals_[name].__name__
        for name in sorted(runtime_env.external_refs)
        if name not in runtime_env.import_sources and isinstance(globals_.get(name), ModuleType)
    }
    payload = type(compiled).serialize(compiled).serialized_data
    return write_call_artifact(
        root, decode_kwargs, fingerprint_fields, payload, module_globals=modules, model_code=model_code
    )


def load_decode(
    root: Path, entry: str, record: ShapeRecord, code: ModelCodeCheck
) -> tuple[Signature, Callable[..., Any]]:
    """Check, then deserialise one artifact; returns its input signature and the unbound function (model first)."""
    header, payload = read_checked(root, entry, expected_fingerprint(record), code)
    # An Inductor artifact finds its compiled C++ in the cache it was warmed into; with
    # another cache folder it rebuilds it (measured: 2.7 s load vs 16.8 s). Inductor
    # writes its default into the environment on first use, so "unset" cannot be told
    # from "chosen": the artifact's folder wins, as in the warmup that wrote it.
    os.environ[CACHE_ENV] = str(root)
    try:
        f_globals: dict[str, object] = {
            name: importlib.import_module(module) for name, module in header.module_globals.items()
        }
        from torch._dynamo.aot_compile import AOTCompiledFunction

        compiled = AOTCompiledFunction.deserialize(payload, f_globals)
    except Exception as exc:  # a foreign torch, a missing module: one line, never a half-loaded function
        raise CacheError(
            f"{root / entry}: precompiled artifact does not load ({type(exc).__name__}: {first_line(exc)})"
        ) from None
    # The guards were dropped at compile time; dispatch on the signature is the check.
    compiled.disable_guard_check()
    return header.fingerprint.signature, compiled
