"""What a precompiled route is: the one interface warmup, the runtime and verify use for every route.

A route is a way of saving a bucket's decode step ahead of time so that production
loads it instead of compiling it (``aot_compile`` artifacts, AOTInductor packages). Each
route is one module of this package with one :class:`PrecompiledRoute`, listed in
:data:`warmcache.artifacts.kinds.ROUTES` under its :attr:`~PrecompiledRoute.kind`: the
registry's ``artifact_kind`` of what it saves. That kind is the only thing anything chooses
a route by: the manifest's ``precompile`` value names it (:meth:`PrecompileRoute.artifact_kind`),
warmup records it on the row beside each file it writes, and the loader reads it back from
the row. A folder name decides nothing (``cache scan`` classifies files by folder, where no
row is at hand).

What a route answers:

* **save** (:meth:`~PrecompiledRoute.writes`): the files warmup writes for one spec, from the
  decode call it captured; :meth:`~PrecompiledRoute.companions` the entries recorded beside
  one (an AOTInductor package's unpacked library);
* **load** (:meth:`~PrecompiledRoute.load`): one file checked and loaded for a row;
* **prove** (:meth:`~PrecompiledRoute.prove`): verify's exact check before its numeric one;
* **trust** (:attr:`~PrecompiledRoute.runs_code`, :attr:`~PrecompiledRoute.folder`): loading
  runs the file's code, so only rows from a trusted source may name it
  (:meth:`warmcache.artifacts.trust.ArtifactTrust.require_trusted_rows`), and only a
  ``<folder>/<sha256>`` file inside the cache folder is read
  (:meth:`~warmcache.artifacts.trust.ArtifactTrust.confined`).

Nothing here, nor in a route's module, imports torch's compiler when imported: a serving
process imports this package, and the save and prove halves import what they need when
called.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from warmcache.artifacts.format import ROW_FINGERPRINT, Signature
from warmcache.targets.routes import PrecompileRoute

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from warmcache.artifacts.code_check import ModelCodeCheck
    from warmcache.registry import ShapeRecord


class SavePhase(StrEnum):
    """The phases of a route's save, as warmup's progress lines say them (its ``Phase`` has the same members)."""

    PRECOMPILING = "precompiling the decode step"
    EXPORTING = "exporting the decode step"
    EXPORTING_PREFILL = "exporting the prefill"
    PACKAGING = "building the package"
    """``aoti_compile_and_package``: lowering and the C++ compile."""


class Progress(Protocol):
    """Told each phase a save enters (warmup's ``SpecPhases``)."""

    def enter(self, phase: SavePhase) -> None: ...


class _Silent:
    def enter(self, phase: SavePhase) -> None:
        pass


#: What a save reports to when nobody listens.
SILENT: Progress = _Silent()


@dataclass(frozen=True)
class SaveJob:
    """What warmup hands a route to save one spec's artifacts."""

    root: Path
    model: PreTrainedModel
    #: The decode call captured during warmup's real ``generate()`` (:mod:`warmcache.artifacts.capture`).
    decode_kwargs: dict[str, Any]
    #: The header fingerprint's row fields (:data:`warmcache.artifacts.format.ROW_FINGERPRINT`).
    fields: dict[str, Any]
    #: The bucket's prompt length.
    seq_len: int
    progress: Progress = SILENT
    #: Whether the route also saves the bucket's prefill (the manifest's ``package_prefill``).
    package_prefill: bool = True


#: One file a route writes: what tells it apart from the spec's other files in warmup's per-process memo (rows of one
#: batch share a decode graph), and the write (its entry, or ``None``: nothing to write for this spec).
Write = tuple[tuple[Any, ...], Callable[[], "str | None"]]


class PrecompiledRoute(ABC):
    """One precompiled route; its module holds its save, load and proof, each importing the heavy parts when run."""

    #: The manifest's ``precompile`` value that selects this route.
    setting: ClassVar[PrecompileRoute]
    #: The registry's ``artifact_kind`` of its files (``setting.artifact_kind``): what the loader dispatches on.
    kind: ClassVar[str]
    #: The folder under a cache root its files lie in, each as ``<folder>/<sha256>``.
    folder: ClassVar[str]
    #: Loading runs the file's code: rows naming it must come from a trusted source.
    runs_code: ClassVar[bool] = True
    #: A loaded file serves its bucket with nothing left to warm by running it once.
    ready_when_loaded: ClassVar[bool] = False

    def entries(self, record: ShapeRecord) -> list[str]:
        """The row's files of this route, by the kind the row recorded for each."""
        return [a.path for a in record.artifacts if a.kind == self.kind]

    @abstractmethod
    def writes(self, job: SaveJob) -> list[Write]:
        """The files warmup writes for one spec (each written under ``job.root``, its entry returned)."""

    def companions(self, root: Path, entry: str) -> dict[str, str]:
        """``{entry: kind}`` of other cache entries a written file needs recorded on every row that records it."""
        return {}

    @abstractmethod
    def load(
        self, root: Path, entry: str, record: ShapeRecord, model: Any, code: ModelCodeCheck
    ) -> tuple[Signature, Callable[..., Any] | None]:
        """Check (sha256, header fingerprint against ``record``, the model code digest against ``code``) and load one
        file; returns its decode signature and the function generate()'s decode call runs (model first), or ``None``
        for a file generate() does not call."""

    def prove(
        self, model: PreTrainedModel, record: ShapeRecord, root: Path, max_cache_len: int, generate_call: dict[str, Any]
    ) -> str | None:
        """verify's exact proof of the row's files of this route, before it serves the bucket through them: ``None``,
        or why not (one line). ``generate_call``: the bucket's ``generate()`` arguments."""
        return None


def expected_fingerprint(record: ShapeRecord) -> dict[str, Any]:
    """The fingerprint fields a row fixes (every :class:`~warmcache.artifacts.format.Fingerprint` field but the call's
    signature, each a column of the row under the same name), to compare with a file's header before loading it."""
    return {name: getattr(record, name) for name in ROW_FINGERPRINT}
