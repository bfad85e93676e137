"""Serve decode steps from precompiled artifacts: load them checked, dispatch each call to its own.

The artifacts were compiled with Dynamo's guards dropped, so a loaded function
would run on whatever it is handed. The registry is the guard instead: each
artifact is loaded only for the rows that recorded it (after its sha256 and
header fingerprint matched them, see :mod:`warmcache.cache.artifact_format`), and
:class:`PrecompiledDecoder` runs it only on a call whose exact input signature
(every tensor's shape and dtype, every scalar's value) is the one it was
compiled for. Any other call goes to the ``torch.compile`` path it replaced,
where the guard's policy and recompile sentinel apply as before.

Loading imports no Dynamo tracing machinery beyond what deserialising needs and
compiles no frame: the loaded function is the bytecode Dynamo generated at
warmup, calling the compiled graph.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from warmcache.cache.artifact_format import ROW_FINGERPRINT, Signature, decode_signature, read_checked
from warmcache.cache.layout import AOTINDUCTOR, INDUCTOR_PRECOMPILED
from warmcache.errors import CacheError, TrustError, first_line
from warmcache.runtime.aoti_loader import PackagedDecodeStep, load_package
from warmcache.runtime.artifact_trust import ArtifactTrust
from warmcache.targets.inductor import CACHE_ENV

if TYPE_CHECKING:
    from warmcache.registry import ShapeRecord

log = logging.getLogger("warmcache.runtime")


def expected_fingerprint(record: ShapeRecord) -> dict[str, Any]:
    """The fingerprint fields a row fixes (every :class:`Fingerprint` field but the call's signature, each a column of
    the row under the same name), to compare with an artifact's header before loading it."""
    return {name: getattr(record, name) for name in ROW_FINGERPRINT}


def precompiled_entries(record: ShapeRecord) -> list[str]:
    """The row's decode artifacts of either route: ``aot_compile`` artifacts and AOTInductor packages."""
    return [a.path for a in record.artifacts if a.kind in (INDUCTOR_PRECOMPILED, AOTINDUCTOR)]


def package_entries(record: ShapeRecord) -> list[str]:
    """The row's AOTInductor packages: verify proves their graphs (:mod:`warmcache.warmup.verify.package_graph`)."""
    return [a.path for a in record.artifacts if a.kind == AOTINDUCTOR]


def load_any(root: Path, entry: str, record: ShapeRecord, model: Any) -> tuple[Signature, Callable[..., Any] | None]:
    """Check and load one artifact of either route (told apart by its folder, as ``cache scan`` tells them); ``None``
    for an AOTInductor prefill package, which generate() does not call (:mod:`warmcache.runtime.mounted` does)."""
    from warmcache.cache.layout import entry_of

    found = entry_of("inductor", entry)
    if found is not None and found[0] == AOTINDUCTOR:
        return load_package(root, entry, expected_fingerprint(record), model)
    return load_decode(root, entry, record)


def load_decode(root: Path, entry: str, record: ShapeRecord) -> tuple[Signature, Callable[..., Any]]:
    """Check, then deserialise one artifact; returns its input signature and the unbound function (model first)."""
    header, payload = read_checked(root, entry, expected_fingerprint(record))
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


@dataclass
class PrecompiledDecoder:
    """The model's compiled call: an artifact for each known signature, the torch.compile path for the rest.

    ``fallback`` makes the ``torch.compile`` call only when first needed: creating it
    imports Inductor's compiler (measured: most of a loaded machine's 45 s start-up),
    which a process served wholly by artifacts never needs.
    """

    model: Any
    fallback: Callable[[], Callable[..., Any]]
    by_signature: dict[Signature, Callable[..., Any]] = field(default_factory=dict)
    calls: int = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        function = self.by_signature.get(decode_signature(kwargs)) if not args else None
        if function is None:
            return self.fallback()(*args, **kwargs)
        self.calls += 1
        return function(self.model, **kwargs)


@dataclass
class LoadReport:
    """Which buckets got an artifact, and the one-line errors of those that did not (policy ``warn``)."""

    loaded: dict[str, Signature] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    #: Batch sizes an AOTInductor package serves: loaded and bound, nothing left to warm by running it.
    package_batches: set[int] = field(default_factory=set)


def install(
    model: Any,
    compile_config: Any,
    records: Iterable[ShapeRecord],
    *,
    root_override: Path | None,
    strict: bool,
    trust: ArtifactTrust | None = None,
) -> tuple[PrecompiledDecoder, LoadReport]:
    """Load the rows' artifacts and make them the model's compiled call for ``compile_config``.

    ``trust`` (default: rows read from the registry) decides, before any file is read, whether the rows may name code at
    all and which folder it loads from; its refusals (and an artifact whose bytes differ from its recorded sha256) raise
    :class:`TrustError` whatever ``strict`` says. ``strict``: a missing or foreign artifact raises :class:`CacheError`;
    otherwise it is logged (one line) and its bucket keeps the ``torch.compile`` path.
    """
    records = list(records)
    trust = trust or ArtifactTrust.registry("registry")
    if any(precompiled_entries(r) for r in records):
        trust.require_trusted_rows()
    original = type(model).get_compiled_call.__get__(model)
    decoder = PrecompiledDecoder(model, fallback=lambda: original(compile_config))
    report = LoadReport()
    for record in records:
        root = trust.root(record, root_override)
        for entry in precompiled_entries(record):
            if entry in report.loaded:
                if isinstance(decoder.by_signature[report.loaded[entry]], PackagedDecodeStep):
                    report.package_batches.add(record.batch_size)
                continue
            try:
                if root is None:
                    raise CacheError(
                        f"row {record.identity}: precompiled artifact {entry} has no cache folder recorded; pass "
                        "cache_dir="
                    )
                trust.confined(root, entry)
                signature, loaded = load_any(root, entry, record, model)
            except TrustError:
                raise  # a forged or altered artifact is never a bucket to fall back from
            except CacheError as exc:
                if strict:
                    raise
                log.warning("%s (serving batch=%d from the compile cache instead)", exc, record.batch_size)
                report.errors.append(str(exc))
                continue
            if loaded is None:  # a prefill package: generate() runs its own prefill, the mounted path runs this one
                continue
            function = loaded
            decoder.by_signature[signature] = function
            report.loaded[entry] = signature
            if isinstance(function, PackagedDecodeStep):
                report.package_batches.add(record.batch_size)

    def get_compiled_call(config: Any) -> Any:
        return decoder if config is compile_config else original(config)

    model.get_compiled_call = get_compiled_call
    return decoder, report
