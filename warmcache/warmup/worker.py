"""Run one spec on this process: the boundary between "what to compile" and "how".

A :class:`Worker` owns the loaded models (each loaded once, then reused for every
spec of that model) and the per-target process setup, and runs one planned spec
at a time, measuring what it compiled: seconds, Dynamo graphs, Inductor cache
hits/misses and the cache entries that appeared. Claiming, leases and the
registry are the runner's business; the same Worker serves warmup (which records
what it produced) and verify (which must see nothing produced).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from warmcache.artifacts.capture import capture_decode_call
from warmcache.artifacts.kinds import route_for
from warmcache.artifacts.route import SaveJob
from warmcache.cache.layout import LOCK_DIRNAME, entry_size, list_entries
from warmcache.cache.platform_mark import claim_for_target
from warmcache.cache.usage import InductorLookups
from warmcache.errors import UsageError
from warmcache.identity.plan import PlannedShape
from warmcache.manifest import Manifest, ModelSpec
from warmcache.registry.records import ArtifactRef
from warmcache.shapes.workload_settings import TrainSettings, WorkloadSettings
from warmcache.targets import Target, resolve_cache_dir, target_for
from warmcache.warmup.phases import NO_PHASES, Phase, PhaseListener, SpecPhases
from warmcache.warmup.sharding import sharded_load_kwargs
from warmcache.warmup.workloads import WorkloadResult, run_generate, run_train

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from warmcache.modeling.compile_counter import CompileCounter
    from warmcache.targets.flavors import CacheFlavor


def lock_path(cache_root: Path, identity: str) -> Path:
    return cache_root / LOCK_DIRNAME / f"{identity}.lock"


@dataclass(frozen=True, slots=True)
class SpecRun:
    """What running one spec did to the compiler and its cache."""

    seconds: float
    graphs: int
    padded_graphs: int
    cache_hits: int
    cache_misses: int
    new_entries: dict[str, str]
    cache_root: Path
    persistent_cache: bool
    #: Entries the spec looked up and found (compiled earlier by another spec), still on disk.
    reused_entries: dict[str, str] = field(default_factory=dict)

    def artifacts(self) -> list[ArtifactRef]:
        """Every entry the spec needs: the ones it wrote and the ones it reused."""
        needed = {**self.reused_entries, **self.new_entries}
        return [ArtifactRef(kind, entry, entry_size(self.cache_root, entry)) for entry, kind in sorted(needed.items())]


@dataclass
class Worker:
    """Loads models once per process and runs planned specs on them."""

    manifest: Manifest
    cache_dir: str | Path | None = None
    #: Save precompiled artifacts for models that ask (warmup); verify replays without writing any.
    precompile: bool = True
    #: Told each spec's phases as it runs (the CLI's renderer, or a child's report file).
    on_phase: PhaseListener | None = None
    #: verify's replay: the decode step's phase says "replaying", not "compiling" (it loads what warmup compiled).
    replaying: bool = False
    _roots: dict[Target, Path] = field(default_factory=dict)
    #: Precompiled artifact per decode graph already written by this process (rows of one batch share it).
    _precompiled: dict[tuple[Any, ...], str] = field(default_factory=dict)
    _models: dict[tuple[Any, ...], PreTrainedModel] = field(default_factory=dict)

    def cache_root(self, target: Target) -> Path:
        """The target's cache root; the first call points the compiler at it (before any compile)."""
        root = self._roots.get(target)
        if root is None:
            root, chosen = resolve_cache_dir(target, self.cache_dir, self.manifest.cache_dir)
            if chosen:
                target.point_cache_at(root)
            root.mkdir(parents=True, exist_ok=True)
            target.check_available()
            claim_for_target(root, target)
            target.prepare()
            self._roots[target] = root
        return root

    def run(self, planned: PlannedShape) -> SpecRun:
        """Run the spec's real workload once and measure it; a failure names the phase it broke in."""
        phases = SpecPhases(planned.spec.describe(), self.on_phase)
        with phases.naming_the_phase():
            return self._run(planned, phases)

    def _run(self, planned: PlannedShape, phases: SpecPhases) -> SpecRun:
        model_spec, spec = planned.model, planned.spec
        target = target_for(model_spec)
        root = self.cache_root(target)
        model = self._model(model_spec, target, spec.family.settings, phases)
        flavor = target.cache_flavor
        if flavor == "inductor":
            _forget_compiled_graphs()
        before = list_entries(root, flavor) if flavor else {}
        start = time.perf_counter()
        precompile = self.precompile and model_spec.precompile.applies_to(spec.workload)
        measured = _run_workload(model, planned, target, phases, capture_decode=precompile, replaying=self.replaying)
        entries = self._precompile(planned, model, root, measured.decode_kwargs, phases) if precompile else {}
        seconds = time.perf_counter() - start
        new, reused = _entries_needed(root, flavor, before, measured.lookups)
        for entry, kind in entries.items():
            (new if entry not in before else reused)[entry] = kind
        return SpecRun(
            seconds=seconds,
            graphs=measured.counter.graphs,
            padded_graphs=measured.result.padded_graphs,
            cache_hits=measured.counter.cache_hits,
            cache_misses=measured.counter.cache_misses,
            new_entries=new,
            cache_root=root,
            persistent_cache=flavor is not None or precompile,
            reused_entries=reused,
        )

    def _precompile(
        self,
        planned: PlannedShape,
        model: PreTrainedModel,
        root: Path,
        decode_kwargs: dict[str, Any],
        phases: SpecPhases,
    ) -> dict[str, str]:
        """``{entry: kind}`` of the spec's precompiled files as its route saves them
        (:class:`warmcache.artifacts.route.PrecompiledRoute`), each written once per process and reused by rows that
        share it, and the entries each needs recorded beside it."""
        spec, model_spec = planned.spec, planned.model
        if not decode_kwargs:
            raise UsageError(
                f"{spec.describe()}: generate() made no compiled decode call to precompile (is the cache static?)"
            )
        route = route_for(model_spec.precompile)
        job = SaveJob(
            root, model, decode_kwargs, _fingerprint_fields(planned), spec.seq_len, phases, model_spec.package_prefill
        )
        key = (model_spec.name, planned.config_hash, planned.toolchain.hash, spec.family, spec.batch_size)
        entries: dict[str, str] = {}
        for suffix, write in route.writes(job):
            for entry in self._written(root, (*key, *suffix), write):
                entries[entry] = route.kind
                entries.update(route.companions(root, entry))
        return entries

    def _written(self, root: Path, key: tuple[Any, ...], write: Callable[[], str | None]) -> list[str]:
        """The artifact this process wrote for ``key`` if it is still there, else what ``write`` writes now (``[]``:
        nothing to write)."""
        entry = self._precompiled.get(key)
        if entry is None or not (root / entry).is_file():
            written = write()
            if written is None:
                return []
            entry = self._precompiled[key] = written
        return [entry]

    def model_for(self, planned: PlannedShape) -> tuple[PreTrainedModel, Target]:
        """The loaded model a spec runs on, and its target (verify proves artifacts on the replay's model)."""
        target = target_for(planned.model)
        return self._model(planned.model, target, planned.spec.family.settings), target

    def _model(
        self, model_spec: ModelSpec, target: Target, settings: WorkloadSettings, phases: SpecPhases = NO_PHASES
    ) -> PreTrainedModel:
        # Training mutates the model (train mode, weights, gradient checkpointing), so
        # generate and each training configuration get their own copy.
        key: tuple[Any, ...] = (model_spec.name, settings.workload) + (
            (settings.gradient_checkpointing,) if isinstance(settings, TrainSettings) else ()
        )
        model = self._models.get(key)
        if model is None:
            phases.enter(Phase.LOADING)
            model = self._models[key] = load_model(model_spec, target, train=settings.workload == "train")
        return model


def _fingerprint_fields(planned: PlannedShape) -> dict[str, Any]:
    """The header fingerprint of the spec's precompiled artifacts: every row field they are valid for."""
    spec, model_spec = planned.spec, planned.model
    return {
        "config_hash": planned.config_hash,
        "toolchain_hash": planned.toolchain.hash,
        "batch_size": spec.batch_size,
        "max_cache_len": spec.family.generate.max_cache_len,
        "dtype": spec.family.dtype,
        "backend": model_spec.backend,
        "mode": model_spec.mode,
    }


def load_model(model_spec: ModelSpec, target: Target, *, train: bool) -> PreTrainedModel:
    """``from_pretrained`` onto the target's device in the manifest's dtype and declared attention implementation."""
    import torch
    from transformers import AutoModelForCausalLM

    attention = {"attn_implementation": model_spec.attn_implementation} if model_spec.attn_implementation else {}
    model = AutoModelForCausalLM.from_pretrained(
        model_spec.path,
        revision=model_spec.revision,
        dtype=getattr(torch, model_spec.dtype),
        **attention,
        **sharded_load_kwargs(model_spec, target.load_kwargs()),
    )
    return model.train() if train else model.eval()


class _Measured(NamedTuple):
    """What running a spec's workload once showed: its result, the compiles counted, the cache entries looked up, and
    the decode call captured for a precompiled artifact (empty when none is made)."""

    result: WorkloadResult
    counter: CompileCounter
    lookups: InductorLookups
    decode_kwargs: dict[str, Any]


def _forget_compiled_graphs() -> None:
    """Forget graphs compiled for earlier specs, so this spec looks its own graphs up in the cache: what it reuses
    is then recorded as its artifacts too."""
    import torch

    torch._dynamo.reset()


def _run_workload(
    model: PreTrainedModel,
    planned: PlannedShape,
    target: Target,
    phases: SpecPhases,
    *,
    capture_decode: bool,
    replaying: bool = False,
) -> _Measured:
    """The spec's real workload, once, counting compiles and cache lookups; ``capture_decode`` keeps the decode call,
    ``replaying`` (verify) names the decode step's phase for what a replay does."""
    from warmcache.modeling.compile_counter import CompileCounter

    model_spec, spec = planned.model, planned.spec
    eager_decode = model_spec.precompile.decodes_eagerly(spec.workload)
    decode_kwargs: dict[str, Any] = {}
    # The Trainer prints its metrics to stdout; keep stdout for --json output.
    with contextlib.redirect_stdout(sys.stderr), CompileCounter() as counter, InductorLookups() as lookups:
        if spec.workload == "generate":
            capturing: contextlib.AbstractContextManager[dict[str, Any]] = (
                capture_decode_call(model, eager=eager_decode)
                if capture_decode or eager_decode
                else contextlib.nullcontext({})
            )
            with capturing as decode_kwargs:
                if eager_decode:
                    phases.enter(Phase.FIRST_STEPS)
                elif replaying:
                    kept = "from the compile cache" if target.cache_flavor else "its backend keeps no compile cache"
                    phases.enter(Phase.REPLAYING, detail=kept)
                else:
                    phases.enter(Phase.COMPILING)
                result = run_generate(
                    model, spec, target.compile_config(), target.input_device(), phases, capture_only=eager_decode
                )
        else:
            result = run_train(model, spec, target.device, target.backend, target.mode, phases)
    return _Measured(result, counter, lookups, decode_kwargs)


def _entries_needed(
    root: Path, flavor: CacheFlavor | None, before: dict[str, str], lookups: InductorLookups
) -> tuple[dict[str, str], dict[str, str]]:
    """The cache entries the spec wrote (new since ``before``) and those it looked up that earlier specs wrote."""
    after = list_entries(root, flavor) if flavor else {}
    new = {e: k for e, k in after.items() if e not in before}
    reused = {e: k for e, k in lookups.entries.items() if e in after and e not in new}
    return new, reused
