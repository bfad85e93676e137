"""Parsed TOML → a validated :class:`~warmcache.manifest.schema.Manifest`, collecting every problem before failing.

Nothing is written anywhere until a manifest validates. The keys each table accepts come
from the schema's dataclasses (:func:`~warmcache.manifest.schema.allowed_keys`); every
relative path is anchored at the manifest's folder by one :class:`~warmcache.anchor.Anchor`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from warmcache.anchor import Anchor
from warmcache.bounds import MAX_MANIFEST_SHAPES
from warmcache.errors import ManifestError, UsageError, shown
from warmcache.manifest.checker import Checker, show
from warmcache.manifest.schema import (
    CACHE_IMPLEMENTATIONS,
    DEFAULT_LEASE_SECONDS,
    MODES,
    GenerateWorkload,
    Manifest,
    ModelSpec,
    StoreSettings,
    TrainWorkload,
    allowed_keys,
)
from warmcache.modeling.generation import prompt_fits
from warmcache.settings import REGISTRY, STORE, RegistryLocation
from warmcache.shapes import DTYPE_ALIASES
from warmcache.shapes.workload_settings import GenerateSettings, TrainSettings
from warmcache.store_location import StoreLocation
from warmcache.targets import BACKENDS, DEVICE_ALIASES, DEVICES, TARGET_CLASSES, PrecompileRoute
from warmcache.targets.routes import PRECOMPILE_VALUES
from warmcache.trust import TrustedKeys
from warmcache.units import parse_size

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # whole names only (fullmatch): '$' matched before a newline


def parse_manifest(raw: dict[str, Any], file: Path) -> Manifest:
    """Validate already-parsed TOML; ``file`` names the source in messages and anchors relative paths."""
    check = Checker(file)
    anchor = Anchor.of(file)
    check.unknown_keys(raw, allowed_keys(Manifest), "")

    registry = check.table(raw, "registry", "registry")
    check.unknown_keys(registry, allowed_keys(Manifest, "registry"), "registry")
    url = check.string(registry, "url", "registry")
    location = None
    if url is not None:
        try:
            location = RegistryLocation.parse(url, REGISTRY.sources(file)[2], anchor.base)
        except UsageError as exc:
            check.problem("registry.url", str(exc).removeprefix(REGISTRY.sources(file)[2]).lstrip())
    lease = check.positive_int(registry, "lease_seconds", "registry", default=DEFAULT_LEASE_SECONDS)

    cache = check.table(raw, "cache", "cache")
    check.unknown_keys(cache, allowed_keys(Manifest, "cache"), "cache")
    cache_dir = check.file_path(cache, "dir", "cache")

    trusted = _parse_trust(check, check.table(raw, "trust", "trust"), anchor)

    store = _parse_store(check, check.table(raw, "store", "store"), anchor)

    models: list[ModelSpec] = []
    seen: dict[str, int] = {}
    entries = check.tables(raw, "model", "model")
    if not entries and not check.problems:
        check.problem("model", "no [[model]] entries: declare at least one model")
    for index, entry in enumerate(entries):
        model = _parse_model(check, entry, f"model[{index}]", anchor)
        if model is None:
            continue
        if model.name in seen:
            check.problem(
                f"model[{index}].name",
                f"duplicate model name {shown(model.name)} (first used by model[{seen[model.name]}])",
            )
            continue
        seen[model.name] = index
        models.append(model)

    _check_expansion(check, models, seen)
    if check.problems:
        raise ManifestError(check.problems)
    return Manifest(
        path=file,
        models=tuple(models),
        registry=location,
        lease_seconds=lease or DEFAULT_LEASE_SECONDS,
        cache_dir=anchor.path(cache_dir) if cache_dir else None,
        store=store,
        trusted_keys=trusted,
    )


def _check_expansion(check: Checker, models: list[ModelSpec], index: dict[str, int]) -> None:
    """Refuse a manifest that declares more than :data:`MAX_MANIFEST_SHAPES` shapes, counted from the axes' lengths
    (nothing is built)."""
    grids = [
        (len(b) * len(lengths), len(b), len(lengths), f"model[{index[m.name]}] {m.name!r} {table}")
        for m in models
        for table, _, b, lengths in m.grids()
    ]
    total = sum(count for count, *_ in grids)
    if total > MAX_MANIFEST_SHAPES:
        count, batches, lengths, where = max(grids, key=lambda grid: grid[0])  # the first of the largest
        check.problem(
            "model",
            f"declares {total:,} shapes (batch sizes × lengths, over every grid), more than the "
            f"{MAX_MANIFEST_SHAPES:,} a manifest may; "
            f"the largest grid, {where}: {batches} batch sizes × {lengths} lengths = {count:,} "
            "(choose buckets with warmcache buckets suggest, or split the manifest)",
        )


def _parse_store(check: Checker, table: dict[str, Any], anchor: Anchor) -> StoreSettings:
    """``[store]``: its URL parsed as ``--store``'s is, a plain path anchored at the manifest's folder."""
    check.unknown_keys(table, allowed_keys(StoreSettings), "store")
    text = check.string(table, "url", "store")
    url = None
    if text is not None:
        source = STORE.sources(check.file)[2]
        try:
            url = StoreLocation.parse(text, source, anchor.base)
        except UsageError as exc:
            check.problem("store.url", str(exc).removeprefix(source).lstrip())
    max_size = check.string(table, "max_pull_size", "store")
    max_bytes = None
    if max_size is not None:
        try:
            max_bytes = parse_size(max_size, option="store.max_pull_size")
        except UsageError as exc:
            check.problem("store.max_pull_size", str(exc).split(": ", 1)[-1])
    sign_key = check.file_path(table, "sign_key", "store")
    return StoreSettings(
        url,
        check.string(table, "endpoint_url", "store"),
        check.boolean(table, "push", "store", False),
        max_bytes,
        anchor.path(sign_key) if sign_key else None,
    )


def _parse_trust(check: Checker, trust: dict[str, Any], anchor: Anchor) -> TrustedKeys:
    """``[trust] keys``: public keys (``ed25519:...``) or ``.pub`` files relative to the manifest."""
    check.unknown_keys(trust, allowed_keys(Manifest, "trust"), "trust")
    entries = trust.get("keys", [])
    if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
        check.problem("trust.keys", f"must be a list of public keys or key files, got {show(entries)}")
        return TrustedKeys()
    try:
        return TrustedKeys.load(entries, f"{check.file}: trust.keys", anchor.base)
    except UsageError as exc:
        check.problems.append(str(exc))
        return TrustedKeys()


def _model_path(text: str, anchor: Anchor) -> str:
    """A local model folder is anchored like any path; anything else is a hub id and stays as written."""
    if (
        os.path.isabs(os.path.expanduser(text))
        or text.startswith((".", "~"))
        or os.path.exists(anchor.base / os.path.expanduser(text))
    ):
        return str(anchor.path(text))
    return text


def _parse_model(check: Checker, entry: dict[str, Any], where: str, anchor: Anchor) -> ModelSpec | None:
    before = len(check.problems)
    name = _parse_name(check, entry, where)
    check.unknown_keys(entry, allowed_keys(ModelSpec), where)
    path = check.file_path(entry, "path", where, required=True)
    revision = check.string(entry, "revision", where)
    dtype = _parse_dtype(check, entry, where)
    device, backend, mode = _parse_target(check, entry, where)
    attn_implementation = check.string(entry, "attn_implementation", where)
    precompile = _parse_precompile(check, entry, where, device, backend, mode)
    package_prefill = check.boolean(entry, "package_prefill", where, True)
    if "package_prefill" in entry and precompile is not PrecompileRoute.AOTINDUCTOR:
        check.problem(f"{where}.package_prefill", "applies only with precompile = 'aotinductor'")
    tp, fsdp = _parse_distributed(check, entry, where)
    generate = _parse_each(check, entry, "generate", where, _parse_generate)
    train = _parse_each(check, entry, "train", where, _parse_train)
    if precompile is PrecompileRoute.AOTINDUCTOR:
        _check_aotinductor(check, where, tp * fsdp, generate)
    if not generate and not train and len(check.problems) == before:
        check.problem(where, f"model {shown(name)} declares no workload: add [[model.generate]] or [[model.train]]")

    if len(check.problems) != before:
        return None
    assert name is not None and path is not None and dtype is not None and device and backend and mode
    return ModelSpec(
        name=name,
        path=_model_path(path, anchor),
        revision=revision,
        dtype=dtype,
        device=device,
        backend=backend,
        mode=mode,
        attn_implementation=attn_implementation,
        precompile=precompile,
        package_prefill=package_prefill,
        tp_size=tp,
        fsdp_size=fsdp,
        generate=tuple(generate),
        train=tuple(train),
    )


def _parse_name(check: Checker, entry: dict[str, Any], where: str) -> str | None:
    """The model's name; once it is known, every later problem of the entry names the model."""
    name = check.string(entry, "name", where, required=True)
    if name is not None and not _NAME_RE.fullmatch(name):
        check.problem(
            f"{where}.name",
            f"{shown(name)} must start with a letter or digit and use only letters, digits, '.', '_' and '-'",
        )
    elif name is not None:
        check.name(where, f"model {name!r}")
    return name


def _parse_dtype(check: Checker, entry: dict[str, Any], where: str) -> str | None:
    """The canonical dtype name of any spelling the manifest accepts (``float32`` when unset)."""
    dtype_raw = check.string(entry, "dtype", where, default="float32")
    dtype = DTYPE_ALIASES.get(dtype_raw or "")
    if dtype is None:
        check.problem(
            f"{where}.dtype",
            f"unknown dtype {shown(dtype_raw)} (allowed: {', '.join(sorted(set(DTYPE_ALIASES.values())))})",
        )
    return dtype


def _parse_target(check: Checker, entry: dict[str, Any], where: str) -> tuple[str | None, str | None, str | None]:
    """``(device, backend, mode)``: a device named outright, and a backend that compiles for it."""
    if entry.get("device") == "auto":
        check.problem(
            f"{where}.device",
            "'auto' is refused: with device_map='auto' a Neuron model silently loads on CPU and "
            "compiles nothing; name the device (neuron, cpu or cuda)",
        )
        device = None
    else:
        device = check.choice(entry, "device", where, DEVICES, "cpu", DEVICE_ALIASES)
    backends = TARGET_CLASSES[device or "cpu"].BACKENDS
    backend = check.choice(entry, "backend", where, BACKENDS, backends[0])
    if device and backend and backend not in backends:
        check.problem(
            f"{where}.backend", f"backend {backend!r} does not compile for device {device!r} (use {backends[0]!r})"
        )
    mode = check.choice(entry, "mode", where, MODES, "default")
    return device, backend, mode


def _parse_precompile(
    check: Checker, entry: dict[str, Any], where: str, device: str | None, backend: str | None, mode: str | None
) -> PrecompileRoute:
    """The model's precompile route, only where its target can build it (the target says why not)."""
    route = PrecompileRoute.from_toml(entry.get("precompile", False))
    if route is None:
        check.problem(f"{where}.precompile", f"must be {PRECOMPILE_VALUES}, got {show(entry['precompile'])}")
        return PrecompileRoute.NONE
    if device and backend and mode:
        problem = TARGET_CLASSES[device].precompile_problem(route, device, backend, mode)
        if problem:
            check.problem(f"{where}.precompile", problem)
    return route


def _parse_distributed(check: Checker, entry: dict[str, Any], where: str) -> tuple[int, int]:
    """``(tp_size, fsdp_size)`` of the ``distributed`` table, 1 each when unset."""
    distributed = check.table(entry, "distributed", f"{where}.distributed")
    check.unknown_keys(distributed, allowed_keys(ModelSpec, "distributed"), f"{where}.distributed")
    tp = check.positive_int(distributed, "tp_size", f"{where}.distributed", default=1) or 1
    fsdp = check.positive_int(distributed, "fsdp_size", f"{where}.distributed", default=1) or 1
    return tp, fsdp


def _check_aotinductor(check: Checker, where: str, world_size: int, generate: list[GenerateWorkload]) -> None:
    """What an AOTInductor decode package cannot serve, refused at plan time with the reason."""
    if world_size > 1:
        check.problem(
            f"{where}.precompile",
            "AOTInductor packages run one process's whole model; a tp/fsdp-sharded model cannot be exported into one",
        )
    for i, workload in enumerate(generate):
        if workload.settings.prefill_chunk_size:
            check.problem(
                f"{where}.generate[{i}].prefill_chunk_size",
                "with precompile = 'aotinductor' prefill chunks would reach the compiled call, which "
                "holds only the one-token decode step",
            )
        if workload.settings.num_beams > 1:
            check.problem(
                f"{where}.generate[{i}].num_beams",
                "with precompile = 'aotinductor' beam search is not served (it reorders the cache outside the package)",
            )


def _parse_each(
    check: Checker, entry: dict[str, Any], key: str, where: str, parse: Callable[[Checker, dict[str, Any], str], Any]
) -> list[Any]:
    parsed = []
    for i, table in enumerate(check.tables(entry, key, f"{where}.{key}")):
        item = parse(check, table, f"{where}.{key}[{i}]")
        if item is not None:
            parsed.append(item)
    return parsed


def _parse_generate(check: Checker, table: dict[str, Any], where: str) -> GenerateWorkload | None:
    before = len(check.problems)
    check.unknown_keys(table, allowed_keys(GenerateWorkload), where)
    batch_sizes = check.positive_ints(table, "batch_sizes", where)
    prompt_lengths = check.positive_ints(table, "prompt_lengths", where)
    settings = _generate_settings(check, table, where)
    if settings is None:
        return None
    for length in prompt_lengths:
        if not prompt_fits(length, settings.max_cache_len):
            check.problem(
                f"{where}.prompt_lengths",
                f"prompt length {length} + 1 new token exceeds max_cache_len {settings.max_cache_len}",
            )
    if not settings.do_sample and settings.num_return_sequences > settings.num_beams:
        check.problem(
            f"{where}.num_return_sequences",
            f"{settings.num_return_sequences} exceeds num_beams {settings.num_beams} (greedy/beam "
            "search returns at most num_beams sequences)",
        )
    if len(check.problems) != before:
        return None
    return GenerateWorkload(batch_sizes, prompt_lengths, settings)


def _generate_settings(check: Checker, table: dict[str, Any], where: str) -> GenerateSettings | None:
    """The table's generate settings; an absent key takes :class:`GenerateSettings`' default (stated there only)."""
    before = len(check.problems)
    max_cache_len = check.positive_int(table, "max_cache_len", where, required=True)
    given: dict[str, Any] = {
        "num_beams": check.positive_int(table, "num_beams", where),
        "num_return_sequences": check.positive_int(table, "num_return_sequences", where),
        "prefill_chunk_size": check.positive_int(table, "prefill_chunk_size", where),
        "cache_implementation": check.choice(table, "cache_implementation", where, CACHE_IMPLEMENTATIONS, None),
        **_given_booleans(check, table, where, ("do_sample",)),
    }
    if len(check.problems) != before or max_cache_len is None:
        return None
    return GenerateSettings(max_cache_len, **{key: value for key, value in given.items() if value is not None})


def _parse_train(check: Checker, table: dict[str, Any], where: str) -> TrainWorkload | None:
    before = len(check.problems)
    check.unknown_keys(table, allowed_keys(TrainWorkload), where)
    batch_sizes = check.positive_ints(table, "batch_sizes", where)
    seq_lengths = check.positive_ints(table, "seq_lengths", where)
    given = _given_booleans(check, table, where, ("bf16", "gradient_checkpointing"))
    if len(check.problems) != before:
        return None
    return TrainWorkload(batch_sizes, seq_lengths, TrainSettings(**given))


def _given_booleans(check: Checker, table: dict[str, Any], where: str, keys: tuple[str, ...]) -> dict[str, bool]:
    """The boolean settings the table states (an absent one is left to the settings type's default)."""
    return {key: check.boolean(table, key, where, False) for key in keys if key in table}
