"""What makes two compiled graphs the same: the model's config and the toolchain.

Both fingerprints are computed without importing torch or transformers (package
versions come from their metadata), so planning and skipping a fully warm
manifest stays fast. The one exception is a CUDA target, whose compute
capability only torch can tell.

Each target names the toolchain factors only it knows how to read (its platform,
its compiler flags, its driver, the packages that generate its code:
:meth:`warmcache.targets.Target.toolchain_factors`); this module adds what every
target shares and hashes the whole.

Nothing host-specific enters either fingerprint: no host name, user, address,
working directory or cache location, so every host of a fleet computes the same
identity for the same manifest and toolchain (a test runs two "hosts").
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from warmcache.bounds import MAX_CONFIG_BYTES, MAX_NESTING, json_nesting
from warmcache.errors import UsageError, first_line
from warmcache.identity.compile_env import compile_env
from warmcache.shapes import short_hash
from warmcache.targets import target_of

#: Config keys that never change a compiled graph: bookkeeping, token ids (data,
#: not shapes), and dtype (the manifest's dtype is applied explicitly at load).
GRAPH_IRRELEVANT_CONFIG_KEYS = frozenset(
    {
        "_name_or_path",
        "_commit_hash",
        "transformers_version",
        "torch_dtype",
        "dtype",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "sep_token_id",
        "decoder_start_token_id",
        "task_specific_params",
        "finetuning_task",
        "model_type_revision",
    }
)

#: Packages whose version changes what a compile produces on every target; a target names its own extra ones.
_TOOLCHAIN_PACKAGES = ("torch", "transformers", "torch-neuronx", "neuronx-cc", "torch-xla")


@functools.cache
def package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def config_path(model_path: str, revision: str | None = None) -> Path:
    """The ``config.json`` of a local folder, or of a hub id already in the local HF cache."""
    local = Path(model_path)
    if local.is_dir():
        candidate = local / "config.json"
        if candidate.is_file():
            return candidate
        raise UsageError(f"{candidate}: config.json not found in model folder")
    if local.is_absolute():
        # Manifests resolve local paths to absolute ones; a hub id is never absolute.
        raise UsageError(f"{model_path!r} is not a folder")
    from huggingface_hub import try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(model_path, "config.json", revision=revision)
    except ValueError as exc:  # HFValidationError: neither a folder nor a well-formed hub id
        raise UsageError(f"{model_path!r} is neither a folder nor a valid hub id ({first_line(exc)})") from None
    if isinstance(cached, str):
        return Path(cached)
    raise UsageError(
        f"model {model_path!r}: not a local folder and its config.json is not in the Hugging Face "
        "cache; download it first"
    )


#: How transformers writes a float JSON has no literal for into ``config.json`` (``{"__float__": "Infinity"}``).
_FLOAT_TAG = "__float__"


def normalised_config(config: dict[str, Any]) -> dict[str, Any]:
    """The config with graph-irrelevant keys removed (recursively, for nested sub-configs), every value as
    ``config.json`` holds it.

    A loaded config holds ``float("inf")`` where its file holds transformers' tag for it
    (Granite-4.0-H's and Falcon-H1's ``time_step_limit: [0.0, inf]``): both hash as the tag, or
    the guard would find the model it is handed matching no row warmed from the file.
    """
    return {key: _as_saved(value) for key, value in config.items() if key not in GRAPH_IRRELEVANT_CONFIG_KEYS}


def _as_saved(value: Any) -> Any:
    if isinstance(value, dict):
        return normalised_config(value)
    if isinstance(value, list | tuple):
        return [_as_saved(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return {_FLOAT_TAG: "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")}
    return value


def config_hash(config: dict[str, Any]) -> str:
    return short_hash(normalised_config(config))


def model_config_hash(model_path: str, revision: str | None = None) -> str:
    """Fingerprint a model from its ``config.json`` alone; no weights are read."""
    return config_hash(read_config_json(config_path(model_path, revision)))


def read_config_json(path: Path) -> dict[str, Any]:
    """A model's ``config.json``, read with the bounds a manifest gets: size and nesting are checked before ``json``
    parses it (it recurses once per level), and every problem is one line naming the file."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"{path}: unreadable config.json: {exc.strerror or exc}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise UsageError(
            f"{path}: config.json is larger than {MAX_CONFIG_BYTES} bytes, far more than any model's; refused"
        )
    depth = json_nesting(data)
    if depth > MAX_NESTING:
        raise UsageError(
            f"{path}: config.json nests {depth} levels deep; a model config needs at most {MAX_NESTING}; refused"
        )
    try:
        config = json.loads(data.decode("utf-8"))
    except ValueError as exc:  # JSONDecodeError, and UnicodeDecodeError for a file that is not UTF-8
        raise UsageError(f"{path}: unreadable config.json: {exc}") from None
    if not isinstance(config, dict):
        raise UsageError(f"{path}: config.json must hold a JSON object")
    return config


@dataclass(frozen=True, slots=True)
class Toolchain:
    """Everything outside the model that decides what a compile produces."""

    device: str
    backend: str
    mode: str
    packages: tuple[tuple[str, str | None], ...]
    platform: str
    neuron_cc_flags: str
    #: The graph-changing compiler variables set (see :mod:`warmcache.identity.compile_env`).
    compile_env: tuple[tuple[str, str], ...] = ()
    #: The NVIDIA driver on a CUDA target (``None`` elsewhere).
    cuda_driver: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The fingerprint's parts, as stored with each registry row (``warmcache explain`` compares them).

        ``compile_env`` and ``cuda_driver`` appear only when they say something: a toolchain
        with no compiler variables set, off CUDA, hashes the six base parts alone.
        """
        out: dict[str, Any] = {
            "device": self.device,
            "backend": self.backend,
            "mode": self.mode,
            "packages": dict(self.packages),
            "platform": self.platform,
            "neuron_cc_flags": self.neuron_cc_flags,
        }
        if self.compile_env:
            out["compile_env"] = dict(self.compile_env)
        if self.cuda_driver is not None:
            out["cuda_driver"] = self.cuda_driver
        return out

    @property
    def hash(self) -> str:
        return short_hash(self.as_dict())

    def describe(self) -> str:
        versions = " ".join(f"{k}={v}" for k, v in self.packages if v)
        return f"{self.device}/{self.backend}/{self.mode} on {self.platform} ({versions})"


def current_toolchain(device: str, backend: str, mode: str = "default") -> Toolchain:
    """The toolchain this process would compile with for a target: the common parts, and the factors the target
    names."""
    factors = target_of(device, backend, mode).toolchain_factors()
    packages = tuple((name, package_version(name)) for name in (*_TOOLCHAIN_PACKAGES, *factors.packages))
    return Toolchain(
        device=device,
        backend=backend,
        mode=mode,
        packages=packages,
        platform=factors.platform,
        neuron_cc_flags=factors.neuron_cc_flags,
        compile_env=compile_env(device, backend),
        cuda_driver=factors.cuda_driver,
    )
