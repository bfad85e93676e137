"""Guarded generate(): every call lands on a compiled bucket, with the exact call warmup compiled.

The decode graph depends on the effective batch, the static cache length and the
generation settings, so the guard builds the call with
:func:`warmcache.modeling.generation.generate_kwargs` and :func:`compile_config` (the
definition warmup compiles with), pins ``max_cache_len`` to the compiled value
and keeps ``max_new_tokens`` inside it: a prompt bucket of ``L`` leaves room for
``max_cache_len - L + 1`` new tokens before the cache grows and recompiles.

Start-up (:func:`prime`) loads every compiled bucket once (each a cache hit)
and only then arms the strict recompile sentinel around every call.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from warmcache.errors import UnseenShapeError, UsageError
from warmcache.modeling.compile_counter import CompileCounter
from warmcache.modeling.generation import DECODE_TOKENS, compile_config, generate_kwargs, max_new_tokens_that_fit
from warmcache.runtime.budget import loud_recompile_limit, reserve_recompile_room
from warmcache.runtime.padding import fit_generate_inputs, left_padded
from warmcache.runtime.sentinel import recompile_sentinel

if TYPE_CHECKING:
    from warmcache.runtime.guarded import Guard
    from warmcache.runtime.padding import FittedBatch
    from warmcache.shapes.workload_settings import GenerateSettings

log = logging.getLogger("warmcache.runtime")

#: generate() keyword arguments that are per-token tensors of the batch.
INPUT_KEYS = ("input_ids", "attention_mask", "token_type_ids")
#: generate() keyword arguments the guard builds itself: a caller may not even repeat them. Every
#: :class:`GenerateSettings` field is fixed by the compiled family too: a caller may repeat it, not change it.
_SET_BY_GUARD = ("compile_config", "cache")


def guarded_generate(guard: Guard, model: Any, /, **kwargs: Any) -> Any:
    """``model.generate(**kwargs)`` padded onto a compiled bucket; returns the output without the padding."""
    inputs = {name: kwargs.pop(name) for name in INPUT_KEYS if name in kwargs}
    requested = kwargs.pop("max_new_tokens", None)
    settings = guard.family.generate
    _refuse_changed_settings(guard, kwargs, settings)
    fitted = fit_generate_inputs(guard, inputs, _pad_token_id(model))
    batch, length = fitted.shape
    _refuse_padding_the_model_would_keep(guard, model, fitted)
    max_new_tokens = fit_max_new_tokens(guard, fitted, requested, settings.max_cache_len)
    device, backend, mode = guard.target
    call = generate_kwargs(
        settings, max_new_tokens=max_new_tokens, config=compile_config(backend, mode, device), model_config=model.config
    )
    if not guard.primed:
        return fitted.unpad(model.generate(**fitted.inputs, **call, **kwargs))
    with recompile_sentinel(guard.policy, f"{guard.family.describe()} batch={batch} seq={length}"):
        output = model.generate(**fitted.inputs, **call, **kwargs)
    return fitted.unpad(output)


def _refuse_changed_settings(guard: Guard, kwargs: dict[str, Any], settings: GenerateSettings) -> None:
    expected = {**settings.stored(), "max_cache_len": settings.max_cache_len}
    for name in (*expected, *_SET_BY_GUARD):
        if name not in kwargs:
            continue
        value = kwargs.pop(name)
        if name in _SET_BY_GUARD or value != expected.get(name):
            raise UsageError(
                f"generate(): {name}={value!r} differs from the compiled {guard.family.describe()} "
                f"({name}={expected.get(name)!r}); the guard sets it"
            )


def _refuse_padding_the_model_would_keep(guard: Guard, model: Any, fitted: FittedBatch) -> None:
    """Refuse a left-padded batch for a model whose recurrent state would keep the pad tokens
    (:mod:`warmcache.modeling.padding_probe`): its rows would not get the tokens their unpadded runs get."""
    from warmcache.modeling.padding_probe import padding_leak

    if not bool((fitted.inputs["attention_mask"] == 0).any()):
        return
    leak = padding_leak(model)
    if leak is not None:
        batch, length = fitted.shape
        guard.telemetry.record(fitted.decision, "refuse")
        raise UsageError(
            f"{guard.family.describe()} batch={batch} seq={length}: this batch is left-padded (rows of "
            f"different lengths, or padded to the compiled bucket), and {leak}; send rows of exactly one compiled "
            f"prompt length ({', '.join(str(n) for n in sorted({n for _, n in guard.buckets}))}), unpadded"
        )


def _pad_token_id(model: Any) -> int | None:
    generation = getattr(model, "generation_config", None)
    for candidate in (getattr(generation, "pad_token_id", None), getattr(model.config, "pad_token_id", None)):
        if candidate is not None:
            return int(candidate)
    return None


def fit_max_new_tokens(guard: Guard, fitted: Any, requested: int | None, max_cache_len: int) -> int:
    """The requested ``max_new_tokens`` if it fits the compiled cache; clipped (pad/warn) or refused (refuse) if not."""
    batch, length = fitted.shape
    room = max_new_tokens_that_fit(length, max_cache_len)
    if room < 1:
        raise UnseenShapeError(
            f"{guard.family.describe()}: prompt length {length} leaves no room in max_cache_len={max_cache_len}"
        )
    if requested is None:
        return room
    if requested <= room:
        return int(requested)
    message = (
        f"{guard.family.describe()}: max_new_tokens={requested} with prompt bucket seq={length} "
        f"overflows the compiled max_cache_len={max_cache_len} (at most {room} fit)"
    )
    if guard.policy == "refuse":
        guard.telemetry.record(fitted.decision, "refuse")
        raise UnseenShapeError(message)
    guard.telemetry.record(fitted.decision, "clip")
    log.warning("%s; clipped to %d", message, room)
    return room


@dataclass
class PrimeReport:
    """What loading every bucket cost: Dynamo graphs traced and Inductor cache hits/misses (misses mean real
    compiles)."""

    buckets: list[tuple[int, int]] = field(default_factory=list)
    graphs: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    seconds: float = 0.0
    #: Precompiled artifacts loaded (buckets whose decode step runs without Dynamo) and the seconds that took.
    artifacts_loaded: int = 0
    artifact_load_seconds: float = 0.0
    #: One line per artifact that was refused or failed to load (policy ``warn``: its bucket was traced instead).
    artifact_errors: list[str] = field(default_factory=list)


def prime(
    guard: Guard,
    model: Any,
    *,
    check_config: bool = True,
    precompiled: bool = True,
    cache_dir: str | Path | None = None,
) -> PrimeReport:
    """Run each compiled bucket once through :func:`guarded_generate`, then arm the strict sentinel.

    With ``precompiled`` (default), buckets whose rows recorded a precompiled
    artifact load it instead of tracing (:mod:`warmcache.artifacts.dispatch`;
    ``cache_dir`` overrides the rows' cache folder). An artifact the guard's rows
    cannot vouch for, or whose bytes were altered, fails start-up under every policy
    (:mod:`warmcache.artifacts.trust`); a missing or foreign one fails it under
    ``pad``/``refuse`` and is traced from the cache under ``warn``.

    Dynamo's recompile limit is raised to cover the buckets first (see
    :mod:`warmcache.runtime.budget`), and priming runs with
    ``fail_on_recompile_limit_hit`` so a bucket that would still run eager is an
    error, not a slow surprise. Each bucket runs an unpadded request and a left-padded
    one (:func:`_request_forms`: the masks production sends), each forced to the new tokens
    warmup loads a bucket with (:data:`~warmcache.modeling.generation.DECODE_TOKENS`): the
    prefill's token, the first decode call and the steady one. A model whose first decode call
    is a graph of its own (RecurrentGemma: its prefill lays out the conv state it keeps on its
    modules otherwise than its decode does) then had its steady graph first traced by
    production's second token, and the strict sentinel refused every request. A bucket an
    AOTInductor package serves is not run: loading and binding the package is all its start-up
    needs (no trace, no cache to warm).
    """
    import torch
    from torch._dynamo.exc import FailOnRecompileLimitHit

    if check_config:
        guard.check_model_config(model.config.to_diff_dict(), getattr(model.config, "_attn_implementation", None))
    buckets = guard.buckets
    reserve_recompile_room(2 * len(buckets))  # a model whose padded request traces a graph of its own: two a bucket
    token = model.config.bos_token_id if model.config.bos_token_id is not None else 1
    max_cache_len = guard.family.generate.max_cache_len
    report = PrimeReport(buckets)
    start = time.perf_counter()
    # Buckets an AOTInductor package serves are ready once bound: running them would warm nothing.
    packaged = (
        _install_precompiled(guard, model, report, Path(cache_dir) if cache_dir else None) if precompiled else set()
    )
    log.debug(
        "priming %d buckets of %s: %d bound from precompiled packages (not run), the others run once",
        len(buckets),
        guard.family.describe(),
        sum(1 for batch, _ in buckets if batch in packaged),
    )
    if guard.policy == "warn" or any(batch not in packaged for batch, _ in buckets):
        guard.claim_compile_folder()  # this process will compile: never from another platform's kernels
    guard.primed = False
    with CompileCounter() as counter, loud_recompile_limit():
        for i, (batch, length) in enumerate(buckets, 1):
            if batch in packaged:
                continue
            t0 = time.perf_counter()
            ids = torch.full((batch, length), int(token), dtype=torch.long)
            new_tokens = min(DECODE_TOKENS, max_new_tokens_that_fit(length, max_cache_len))
            try:
                for form_ids, form_mask in _request_forms(model, ids):
                    guarded_generate(
                        guard,
                        model,
                        input_ids=form_ids,
                        attention_mask=form_mask,
                        max_new_tokens=new_tokens,
                        min_new_tokens=new_tokens,
                    )
            except FailOnRecompileLimitHit:
                raise UsageError(
                    f"{guard.family.describe()} batch={batch} seq={length}: torch._dynamo.config.recompile_limit="
                    f"{torch._dynamo.config.recompile_limit} is too small for the graphs this process "
                    "compiles; raise it"
                ) from None
            # One line per bucket: on Neuron a bucket can take minutes to load, and the log shows where it stands.
            log.info(
                "primed bucket %d/%d batch=%d seq=%d in %.2fs", i, len(buckets), batch, length, time.perf_counter() - t0
            )
    report.graphs, report.cache_hits, report.cache_misses = counter.graphs, counter.cache_hits, counter.cache_misses
    report.seconds = time.perf_counter() - start
    guard.primed = True
    return report


def _request_forms(model: Any, ids: Any) -> list[tuple[Any, Any]]:
    """The requests ``prime`` runs on a bucket: unpadded (generate() drops its all-ones mask), then with its first row
    left-padded (the mask kept), as warmup runs them: BLOOM builds its ALiBi bias from the mask when there is one and
    from the key length when there is none, so the padded request's decode is a graph of its own, which would
    otherwise first trace at production's first padded request and be refused. Unpadded alone where the bucket has no
    room for padding or the guard refuses padded batches (:func:`_refuse_padding_the_model_would_keep`)."""
    import torch

    from warmcache.modeling.padding_probe import padding_leak

    forms = [(ids, torch.ones_like(ids))]
    if ids.shape[1] >= 2 and padding_leak(model) is None:
        forms.append(left_padded(ids, torch.ones_like(ids), _pad_token_id(model) or 0))
    return forms


def _install_precompiled(guard: Guard, model: Any, report: PrimeReport, cache_dir: Path | None) -> set[int]:
    """Load the rows' artifacts into ``report``; returns the batch sizes AOTInductor packages serve."""
    from warmcache.artifacts.dispatch import install
    from warmcache.artifacts.kinds import precompiled_entries

    if not any(precompiled_entries(r) for r in guard.records):
        return set()
    device, backend, mode = guard.target
    start = time.perf_counter()
    _, loaded = install(
        model,
        compile_config(backend, mode, device),
        guard.records,
        trust=guard.artifact_trust,
        root_override=cache_dir,
        strict=guard.policy != "warn",
    )
    report.artifact_load_seconds = time.perf_counter() - start
    report.artifacts_loaded = len(loaded.loaded)
    report.artifact_errors = loaded.errors
    return loaded.package_batches
