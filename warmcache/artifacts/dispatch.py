"""Serve decode steps from precompiled artifacts: load them checked, dispatch each call to its own.

The artifacts were compiled with Dynamo's guards dropped, so a loaded function
would run on whatever it is handed. The registry is the guard instead: each
artifact is loaded only for the rows that recorded it (after its sha256 and
header fingerprint matched them, see :mod:`warmcache.artifacts.format`), and
:class:`PrecompiledDecoder` runs it only on a call whose exact input signature
(every tensor's shape and dtype, every scalar's value) is the one it was
compiled for. Any other call goes to the ``torch.compile`` path it replaced,
where the guard's policy and recompile sentinel apply as before.

Each file is loaded by the route of the kind its row recorded for it
(:data:`warmcache.artifacts.kinds.ROUTES`), never by the folder it lies in; loading
compiles no frame.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from warmcache.artifacts.code_check import ModelCodeCheck
from warmcache.artifacts.format import Signature, decode_signature
from warmcache.artifacts.kinds import precompiled
from warmcache.artifacts.trust import ArtifactTrust
from warmcache.errors import CacheError, TrustError

if TYPE_CHECKING:
    from warmcache.registry import ShapeRecord

log = logging.getLogger("warmcache.runtime")


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
    #: Batch sizes a file of a route that is ready once loaded serves (an AOTInductor package: loaded and bound,
    #: nothing left to warm by running it).
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
    if any(route.runs_code for r in records for route, _ in precompiled(r)):
        trust.require_trusted_rows()
    original = type(model).get_compiled_call.__get__(model)
    decoder = PrecompiledDecoder(model, fallback=lambda: original(compile_config))
    report = LoadReport()
    code = ModelCodeCheck(model)  # each file is refused unless traced from the code this model runs
    for record in records:
        root = trust.root(record, root_override)
        for route, entry in precompiled(record):
            if entry in report.loaded:
                if route.ready_when_loaded:
                    report.package_batches.add(record.batch_size)
                continue
            try:
                if root is None:
                    raise CacheError(
                        f"row {record.identity}: precompiled artifact {entry} has no cache folder recorded; pass "
                        "cache_dir="
                    )
                trust.confined(root, entry, route)
                signature, loaded = route.load(root, entry, record, model, code)
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
            decoder.by_signature[signature] = loaded
            report.loaded[entry] = signature
            if route.ready_when_loaded:
                report.package_batches.add(record.batch_size)

    def get_compiled_call(config: Any) -> Any:
        return decoder if config is compile_config else original(config)

    model.get_compiled_call = get_compiled_call
    return decoder, report
