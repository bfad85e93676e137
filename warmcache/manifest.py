"""TOML manifest → validated models and their expanded :class:`ShapeSpec` list.

Validation collects every problem before failing, and each problem is one line
that names the file, the key path (``model[0].generate[1].batch_sizes[2]``) and
the value at fault, with a did-you-mean for misspelt keys. Nothing is written
anywhere until a manifest validates.
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from warmcache.bounds import MAX_COUNT, MAX_KEY_DOTS, MAX_NESTING, path_problem, toml_nesting
from warmcache.errors import MAX_SHOWN_CHARS, ManifestError, UsageError, shown
from warmcache.settings import REGISTRY, RegistryLocation
from warmcache.shapes import DTYPE_ALIASES, SettingValue, ShapeFamily, ShapeSpec
from warmcache.trust import TrustedKeys
from warmcache.units import parse_size

DEVICES = ("neuron", "cpu", "cuda")
BACKENDS = ("neuron", "inductor", "aot_eager", "eager")
DEFAULT_BACKEND = {"neuron": "neuron", "cpu": "inductor", "cuda": "inductor"}
MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
CACHE_IMPLEMENTATIONS = ("static", "hybrid")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")

_TOP_KEYS = ("registry", "cache", "store", "trust", "model")
_REGISTRY_KEYS = ("url", "lease_seconds")
_CACHE_KEYS = ("dir",)
_STORE_KEYS = ("url", "endpoint_url", "push", "max_pull_size", "sign_key")
_TRUST_KEYS = ("keys",)
_MODEL_KEYS = ("name", "path", "revision", "dtype", "device", "backend", "mode", "attn_implementation", "precompile", "distributed", "generate", "train")
#: Backends whose decode graph torch 2.13 can save as a precompiled artifact (AOTAutograd-based; not Neuron yet, see README).
PRECOMPILE_BACKENDS = ("inductor", "aot_eager")
#: ``precompile = "aotinductor"``: each bucket's decode step as an AOTInductor package (no Dynamo, no compiler at start-up).
AOTINDUCTOR = "aotinductor"
_DISTRIBUTED_KEYS = ("tp_size", "fsdp_size")
_GENERATE_KEYS = (
    "batch_sizes",
    "prompt_lengths",
    "max_cache_len",
    "num_beams",
    "num_return_sequences",
    "do_sample",
    "prefill_chunk_size",
    "cache_implementation",
)
_TRAIN_KEYS = ("batch_sizes", "seq_lengths", "bf16", "gradient_checkpointing")

DEFAULT_LEASE_SECONDS = 600
#: A manifest with a thousand models is a few hundred KB; tomllib is slow on much larger input.
MAX_MANIFEST_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class GenerateWorkload:
    """One ``[[model.generate]]`` table: a grid of prompt shapes and its graph-changing settings."""

    batch_sizes: tuple[int, ...]
    prompt_lengths: tuple[int, ...]
    max_cache_len: int
    num_beams: int = 1
    num_return_sequences: int = 1
    do_sample: bool = False
    prefill_chunk_size: int | None = None
    cache_implementation: str = "static"

    def settings(self) -> tuple[tuple[str, SettingValue], ...]:
        return (
            ("cache_implementation", self.cache_implementation),
            ("do_sample", self.do_sample),
            ("num_beams", self.num_beams),
            ("num_return_sequences", self.num_return_sequences),
            ("prefill_chunk_size", self.prefill_chunk_size),
        )


@dataclass(frozen=True, slots=True)
class TrainWorkload:
    """One ``[[model.train]]`` table: a grid of training shapes and its graph-changing settings."""

    batch_sizes: tuple[int, ...]
    seq_lengths: tuple[int, ...]
    bf16: bool = False
    gradient_checkpointing: bool = False

    def settings(self) -> tuple[tuple[str, SettingValue], ...]:
        return (("bf16", self.bf16), ("gradient_checkpointing", self.gradient_checkpointing))


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """One ``[[model]]`` entry, with paths resolved against the manifest's folder."""

    name: str
    path: str
    revision: str | None = None
    dtype: str = "float32"
    device: str = "cpu"
    backend: str = "inductor"
    mode: str = "default"
    tp_size: int = 1
    fsdp_size: int = 1
    #: ``from_pretrained(attn_implementation=...)`` at every load (warmup, verify, the guard's check);
    #: ``None``: whatever transformers picks. Part of each shape's identity.
    attn_implementation: str | None = None
    #: Warmup also saves each generate bucket's decode step as a precompiled artifact production loads without tracing.
    precompile: bool = False
    #: ...as an AOTInductor package (``precompile = "aotinductor"``) instead of an ``aot_compile`` artifact.
    aotinductor: bool = False
    generate: tuple[GenerateWorkload, ...] = ()
    train: tuple[TrainWorkload, ...] = ()

    @property
    def is_local(self) -> bool:
        return Path(self.path).is_dir()

    @property
    def world_size(self) -> int:
        return self.tp_size * self.fsdp_size

    def family(self, workload: str, settings: tuple[tuple[str, SettingValue], ...], max_cache_len: int | None) -> ShapeFamily:
        return ShapeFamily(
            model=self.name,
            workload=workload,  # type: ignore[arg-type]
            dtype=self.dtype,
            max_cache_len=max_cache_len,
            tp_size=self.tp_size,
            fsdp_size=self.fsdp_size,
            settings=settings,
        )

    def specs(self) -> list[ShapeSpec]:
        """Every declared shape of this model, deduplicated, in a stable order."""
        out: dict[str, ShapeSpec] = {}
        for gen in self.generate:
            family = self.family("generate", gen.settings(), gen.max_cache_len)
            for b in gen.batch_sizes:
                for length in gen.prompt_lengths:
                    spec = ShapeSpec(family, b, length)
                    out.setdefault(spec.shape_hash, spec)
        for train in self.train:
            family = self.family("train", train.settings(), None)
            for b in train.batch_sizes:
                for length in train.seq_lengths:
                    spec = ShapeSpec(family, b, length)
                    out.setdefault(spec.shape_hash, spec)
        return list(out.values())


@dataclass(frozen=True, slots=True)
class StoreSettings:
    """The ``[store]`` table: where compiled caches are published and fetched (see :mod:`warmcache.store`)."""

    url: str | None = None
    #: An S3-compatible server (MinIO, R2, ...); AWS itself needs none.
    endpoint_url: str | None = None
    #: ``warmcache warmup`` publishes each shape as soon as it is compiled.
    push: bool = False
    max_pull_bytes: int | None = None
    #: The private key that signs every index this host pushes (``warmcache keys generate``).
    sign_key: Path | None = None


@dataclass(frozen=True, slots=True)
class Manifest:
    """A validated manifest file."""

    path: Path
    models: tuple[ModelSpec, ...]
    registry: RegistryLocation | None = None  # [registry] url, normalised (relative paths against the manifest's folder)
    lease_seconds: int = DEFAULT_LEASE_SECONDS
    cache_dir: Path | None = None
    store: StoreSettings = field(default_factory=lambda: StoreSettings())
    trusted_keys: TrustedKeys = TrustedKeys()

    def model(self, name: str) -> ModelSpec:
        for model in self.models:
            if model.name == name:
                return model
        raise ManifestError(f"{self.path}: no model named {shown(name)} (known: {', '.join(m.name for m in self.models)})")

    def specs(self) -> list[ShapeSpec]:
        return [spec for model in self.models for spec in model.specs()]


@dataclass
class _Checker:
    """Walks the parsed TOML, collecting one line per problem."""

    file: Path
    problems: list[str] = field(default_factory=list)

    def problem(self, key: str, message: str) -> None:
        self.problems.append(f"{self.file}: {key}: {message}")

    def unknown_keys(self, table: dict[str, Any], allowed: tuple[str, ...], where: str) -> None:
        for key in table:
            if key not in allowed:
                close = _close_match(key, allowed)
                hint = f" (did you mean {close!r}?)" if close else f" (allowed: {', '.join(allowed)})"
                self.problem(f"{where}{'.' if where else ''}{_key_shown(key)}", f"unknown key{hint}")

    def table(self, parent: dict[str, Any], key: str, where: str) -> dict[str, Any]:
        value = parent.get(key, {})
        if not isinstance(value, dict):
            self.problem(where, f"must be a table, got {_show(value)}")
            return {}
        return value

    def tables(self, parent: dict[str, Any], key: str, where: str) -> list[dict[str, Any]]:
        value = parent.get(key, [])
        if isinstance(value, dict):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            self.problem(where, f"must be an array of tables ([[{key}]]), got {_show(value)}")
            return []
        return value

    def string(self, table: dict[str, Any], key: str, where: str, *, required: bool = False, default: str | None = None) -> str | None:
        if key not in table:
            if required:
                self.problem(f"{where}.{key}", "missing required key")
            return default
        value = table[key]
        if not isinstance(value, str) or not value.strip():
            self.problem(f"{where}.{key}", f"must be a non-empty string, got {_show(value)}")
            return default
        return value

    def choice(self, table: dict[str, Any], key: str, where: str, choices: tuple[str, ...], default: str | None) -> str | None:
        value = self.string(table, key, where, default=default)
        if value is not None and value not in choices:
            close = _close_match(value, choices)
            hint = f"; did you mean {close!r}?" if close else ""
            self.problem(f"{where}.{key}", f"unknown value {shown(value)} (allowed: {', '.join(choices)}){hint}")
            return default
        return value

    def file_path(self, table: dict[str, Any], key: str, where: str, *, required: bool = False) -> str | None:
        """A string the file system can take as a path (checked now: later it would be an OSError)."""
        value = self.string(table, key, where, required=required)
        problem = path_problem(value) if value is not None else None
        if problem:
            self.problem(f"{where}.{key}", f"{shown(value)} {problem}")
            return None
        return value

    def boolean(self, table: dict[str, Any], key: str, where: str, default: bool) -> bool:
        value = table.get(key, default)
        if not isinstance(value, bool):
            self.problem(f"{where}.{key}", f"must be true or false, got {_show(value)}")
            return default
        return value

    def positive_int(self, table: dict[str, Any], key: str, where: str, *, required: bool = False, default: int | None = None) -> int | None:
        if key not in table:
            if required:
                self.problem(f"{where}.{key}", "missing required key")
            return default
        return self._positive(table[key], f"{where}.{key}", default)

    def _positive(self, value: Any, key: str, default: int | None) -> int | None:
        if isinstance(value, bool) or not isinstance(value, int):
            self.problem(key, f"must be an integer, got {_show(value)}")
            return default
        if value <= 0:
            self.problem(key, f"must be > 0, got {shown(value)}")
            return default
        if value > MAX_COUNT:
            self.problem(key, f"{shown(value)} is larger than the registry can hold ({MAX_COUNT})")
            return default
        return value

    def positive_ints(self, table: dict[str, Any], key: str, where: str) -> tuple[int, ...]:
        if key not in table:
            self.problem(f"{where}.{key}", "missing required key")
            return ()
        value = table[key]
        if isinstance(value, int) and not isinstance(value, bool):
            value = [value]
        if not isinstance(value, list) or not value:
            self.problem(f"{where}.{key}", f"must be a non-empty list of integers, got {_show(value)}")
            return ()
        good = [self._positive(v, f"{where}.{key}[{i}]", None) for i, v in enumerate(value)]
        return tuple(sorted({v for v in good if v is not None}))


def _show(value: Any) -> str:
    return f"{shown(value)} ({type(value).__name__})"


def _key_shown(key: str) -> str:
    return key if len(key) <= MAX_SHOWN_CHARS and key.isprintable() else shown(key)


def _close_match(value: str, choices: tuple[str, ...]) -> str | None:
    """A did-you-mean; a value far longer than any choice is no typo (and difflib is slow on it)."""
    if len(value) > MAX_SHOWN_CHARS:
        return None
    close = difflib.get_close_matches(value, choices, n=1)
    return close[0] if close else None


def load_manifest(path: str | Path) -> Manifest:
    """Read and validate a manifest file; raise :class:`ManifestError` listing every problem (see :func:`loads`)."""
    file = Path(path)
    try:
        with open(file, "rb") as handle:
            data = handle.read(MAX_MANIFEST_BYTES + 1)
    except FileNotFoundError:
        raise ManifestError(f"{file}: manifest not found") from None
    except OSError as exc:
        raise ManifestError(f"{file}: cannot read manifest: {exc}") from None
    return loads(data, file)


def loads(text: str | bytes, source: str | Path) -> Manifest:
    """Parse and validate manifest text from anywhere (a file, a request body): the one front door.

    ``source`` names it in messages and anchors its relative paths. Size, nesting and
    dotted keys are bounded before tomllib sees the text: it recurses once per nesting
    level and builds a table per key part, so a hostile manifest would otherwise end
    in a ``RecursionError`` or take minutes.
    """
    file = Path(source)
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    if len(data) > MAX_MANIFEST_BYTES:
        raise ManifestError(f"{file}: manifest is larger than {MAX_MANIFEST_BYTES} bytes, far more than any real manifest; refused")
    try:
        decoded = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ManifestError(f"{file}: cannot read manifest: {exc}") from None
    depth, dots = toml_nesting(decoded)
    if depth > MAX_NESTING:
        raise ManifestError(f"{file}: nests {depth} levels deep (arrays, tables or dotted keys); a manifest needs at most {MAX_NESTING}; refused")
    if dots > MAX_KEY_DOTS:
        raise ManifestError(f"{file}: dotted keys (a.b.c = ...) joined by {dots} dots; a manifest needs far fewer than {MAX_KEY_DOTS}; refused")
    try:
        raw = tomllib.loads(decoded)
    except (tomllib.TOMLDecodeError, ValueError, RecursionError) as exc:  # ValueError: an integer of thousands of digits
        raise ManifestError(f"{file}: invalid TOML: {exc}") from None
    return parse_manifest(raw, file)


def parse_manifest(raw: dict[str, Any], file: Path) -> Manifest:
    """Validate already-parsed TOML; ``file`` names the source in messages and anchors relative paths."""
    check = _Checker(file)
    base = file.resolve().parent
    check.unknown_keys(raw, _TOP_KEYS, "")

    registry = check.table(raw, "registry", "registry")
    check.unknown_keys(registry, _REGISTRY_KEYS, "registry")
    url = check.string(registry, "url", "registry")
    location = None
    if url is not None:
        try:
            location = RegistryLocation.parse(url, REGISTRY.sources(file)[2], base)
        except UsageError as exc:
            check.problem("registry.url", str(exc).removeprefix(REGISTRY.sources(file)[2]).lstrip())
    lease = check.positive_int(registry, "lease_seconds", "registry", default=DEFAULT_LEASE_SECONDS)

    cache = check.table(raw, "cache", "cache")
    check.unknown_keys(cache, _CACHE_KEYS, "cache")
    cache_dir = check.file_path(cache, "dir", "cache")

    trusted = _parse_trust(check, check.table(raw, "trust", "trust"), base)

    store = _parse_store(check, check.table(raw, "store", "store"), base)

    models: list[ModelSpec] = []
    seen: dict[str, int] = {}
    entries = check.tables(raw, "model", "model")
    if not entries and not check.problems:
        check.problem("model", "no [[model]] entries: declare at least one model")
    for index, entry in enumerate(entries):
        model = _parse_model(check, entry, f"model[{index}]", base)
        if model is None:
            continue
        if model.name in seen:
            check.problem(f"model[{index}].name", f"duplicate model name {shown(model.name)} (first used by model[{seen[model.name]}])")
            continue
        seen[model.name] = index
        models.append(model)

    if check.problems:
        raise ManifestError(check.problems)
    return Manifest(
        path=file,
        models=tuple(models),
        registry=location,
        lease_seconds=lease or DEFAULT_LEASE_SECONDS,
        cache_dir=(base / os.path.expanduser(cache_dir)).resolve() if cache_dir else None,
        store=store,
        trusted_keys=trusted,
    )


def _parse_store(check: _Checker, table: dict[str, Any], base: Path) -> StoreSettings:
    """``[store]``: a plain path is a ``file://`` store relative to the manifest's folder."""
    check.unknown_keys(table, _STORE_KEYS, "store")
    url = check.string(table, "url", "store")
    if url is not None and "://" not in url:
        url = (base / Path(url).expanduser()).resolve().as_uri()
    elif url is not None and not url.startswith(("s3://", "file://")):
        check.problem("store.url", f"unsupported store {url!r} (use s3://bucket/prefix, file:///path or a folder path)")
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
        (base / os.path.expanduser(sign_key)).resolve() if sign_key else None,
    )


def _parse_trust(check: _Checker, trust: dict[str, Any], base: Path) -> TrustedKeys:
    """``[trust] keys``: public keys (``ed25519:...``) or ``.pub`` files relative to the manifest."""
    check.unknown_keys(trust, _TRUST_KEYS, "trust")
    entries = trust.get("keys", [])
    if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
        check.problem("trust.keys", f"must be a list of public keys or key files, got {_show(entries)}")
        return TrustedKeys()
    try:
        return TrustedKeys.load(entries, f"{check.file}: trust.keys", base)
    except UsageError as exc:
        check.problems.append(str(exc))
        return TrustedKeys()


def _resolve_model_path(path: str, base: Path) -> str:
    """Local folders resolve against the manifest's folder; anything else is a hub id."""
    expanded = Path(os.path.expanduser(path))
    candidate = base / expanded
    if expanded.is_absolute() or path.startswith((".", "~")) or os.path.exists(candidate):
        return str(candidate.resolve())
    return path


def _parse_model(check: _Checker, entry: dict[str, Any], where: str, base: Path) -> ModelSpec | None:
    before = len(check.problems)
    check.unknown_keys(entry, _MODEL_KEYS, where)
    name = check.string(entry, "name", where, required=True)
    if name is not None and not _NAME_RE.match(name):
        check.problem(f"{where}.name", f"{shown(name)} must start with a letter or digit and use only letters, digits, '.', '_' and '-'")
    path = check.file_path(entry, "path", where, required=True)
    revision = check.string(entry, "revision", where)

    dtype_raw = check.string(entry, "dtype", where, default="float32")
    dtype = DTYPE_ALIASES.get(dtype_raw or "")
    if dtype is None:
        check.problem(f"{where}.dtype", f"unknown dtype {shown(dtype_raw)} (allowed: {', '.join(sorted(set(DTYPE_ALIASES.values())))})")

    if entry.get("device") == "auto":
        check.problem(
            f"{where}.device",
            "'auto' is refused: with device_map='auto' a Neuron model silently loads on CPU and compiles nothing; name the device (neuron, cpu or cuda)",
        )
        device = None
    else:
        device = check.choice(entry, "device", where, DEVICES, "cpu")
    backend = check.choice(entry, "backend", where, BACKENDS, DEFAULT_BACKEND.get(device or "cpu"))
    if device and backend and (backend == "neuron") != (device == "neuron") and backend not in ("eager", "aot_eager"):
        check.problem(f"{where}.backend", f"backend {backend!r} does not compile for device {device!r} (use {DEFAULT_BACKEND[device]!r})")
    mode = check.choice(entry, "mode", where, MODES, "default")
    attn_implementation = check.string(entry, "attn_implementation", where)
    aotinductor = entry.get("precompile") == AOTINDUCTOR
    if isinstance(entry.get("precompile"), str) and not aotinductor:
        check.problem(f"{where}.precompile", f"must be true, false or {AOTINDUCTOR!r}, got {_show(entry['precompile'])}")
        precompile = False
    else:
        precompile = aotinductor or check.boolean(entry, "precompile", where, False)
    if aotinductor and (backend != "inductor" or mode != "default" or device not in ("cpu", "cuda")):
        check.problem(
            f"{where}.precompile",
            f"AOTInductor packages need backend 'inductor' in mode 'default' on cpu or cuda (got {device}/{backend}/{mode}; Neuron compiles through torch-neuronx, not Inductor)",
        )
    elif precompile and (backend not in PRECOMPILE_BACKENDS or mode != "default" or device == "neuron"):
        check.problem(
            f"{where}.precompile",
            f"precompiled artifacts need backend {' or '.join(PRECOMPILE_BACKENDS)} in mode 'default' on cpu or cuda (got {device}/{backend}/{mode})",
        )

    distributed = check.table(entry, "distributed", f"{where}.distributed")
    check.unknown_keys(distributed, _DISTRIBUTED_KEYS, f"{where}.distributed")
    tp = check.positive_int(distributed, "tp_size", f"{where}.distributed", default=1) or 1
    fsdp = check.positive_int(distributed, "fsdp_size", f"{where}.distributed", default=1) or 1

    generate = _parse_each(check, entry, "generate", where, _parse_generate)
    train = _parse_each(check, entry, "train", where, _parse_train)
    if aotinductor:
        _check_aotinductor(check, where, tp * fsdp, generate)
    if not generate and not train and len(check.problems) == before:
        check.problem(where, f"model {shown(name)} declares no workload: add [[model.generate]] or [[model.train]]")

    if len(check.problems) != before:
        return None
    assert name is not None and path is not None and dtype is not None and device and backend and mode
    return ModelSpec(
        name=name,
        path=_resolve_model_path(path, base),
        revision=revision,
        dtype=dtype,
        device=device,
        backend=backend,
        mode=mode,
        attn_implementation=attn_implementation,
        precompile=precompile,
        aotinductor=aotinductor,
        tp_size=tp,
        fsdp_size=fsdp,
        generate=tuple(generate),
        train=tuple(train),
    )


def _check_aotinductor(check: _Checker, where: str, world_size: int, generate: list[GenerateWorkload]) -> None:
    """What an AOTInductor decode package cannot serve, refused at plan time with the reason."""
    if world_size > 1:
        check.problem(f"{where}.precompile", "AOTInductor packages run one process's whole model; a tp/fsdp-sharded model cannot be exported into one")
    for i, workload in enumerate(generate):
        if workload.prefill_chunk_size:
            check.problem(
                f"{where}.generate[{i}].prefill_chunk_size",
                "with precompile = 'aotinductor' prefill chunks would reach the compiled call, which holds only the one-token decode step",
            )
        if workload.num_beams > 1:
            check.problem(f"{where}.generate[{i}].num_beams", "with precompile = 'aotinductor' beam search is not served (it reorders the cache outside the package)")


def _parse_each(check: _Checker, entry: dict[str, Any], key: str, where: str, parse: Callable[[_Checker, dict[str, Any], str], Any]) -> list[Any]:
    parsed = []
    for i, table in enumerate(check.tables(entry, key, f"{where}.{key}")):
        item = parse(check, table, f"{where}.{key}[{i}]")
        if item is not None:
            parsed.append(item)
    return parsed


def _parse_generate(check: _Checker, table: dict[str, Any], where: str) -> GenerateWorkload | None:
    before = len(check.problems)
    check.unknown_keys(table, _GENERATE_KEYS, where)
    batch_sizes = check.positive_ints(table, "batch_sizes", where)
    prompt_lengths = check.positive_ints(table, "prompt_lengths", where)
    max_cache_len = check.positive_int(table, "max_cache_len", where, required=True)
    num_beams = check.positive_int(table, "num_beams", where, default=1) or 1
    num_return = check.positive_int(table, "num_return_sequences", where, default=1) or 1
    do_sample = check.boolean(table, "do_sample", where, False)
    chunk = check.positive_int(table, "prefill_chunk_size", where)
    cache_impl = check.choice(table, "cache_implementation", where, CACHE_IMPLEMENTATIONS, "static") or "static"
    if max_cache_len is not None:
        for length in prompt_lengths:
            if length + 1 > max_cache_len:
                check.problem(
                    f"{where}.prompt_lengths",
                    f"prompt length {length} + 1 new token exceeds max_cache_len {max_cache_len}",
                )
    if not do_sample and num_return > num_beams:
        check.problem(f"{where}.num_return_sequences", f"{num_return} exceeds num_beams {num_beams} (greedy/beam search returns at most num_beams sequences)")
    if len(check.problems) != before:
        return None
    assert max_cache_len is not None
    return GenerateWorkload(batch_sizes, prompt_lengths, max_cache_len, num_beams, num_return, do_sample, chunk, cache_impl)


def _parse_train(check: _Checker, table: dict[str, Any], where: str) -> TrainWorkload | None:
    before = len(check.problems)
    check.unknown_keys(table, _TRAIN_KEYS, where)
    batch_sizes = check.positive_ints(table, "batch_sizes", where)
    seq_lengths = check.positive_ints(table, "seq_lengths", where)
    bf16 = check.boolean(table, "bf16", where, False)
    checkpointing = check.boolean(table, "gradient_checkpointing", where, False)
    if len(check.problems) != before:
        return None
    return TrainWorkload(batch_sizes, seq_lengths, bf16, checkpointing)
