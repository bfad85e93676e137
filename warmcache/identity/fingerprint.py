"""What makes two compiled graphs the same: the model's config and the toolchain.

Both fingerprints are computed without importing torch or transformers (package
versions come from their metadata), so planning and skipping a fully warm
manifest stays fast. The one exception is a CUDA target, whose compute
capability only torch can tell.

Nothing host-specific enters either fingerprint: no host name, user, address,
working directory or cache location, so every host of a fleet computes the same
identity for the same manifest and toolchain (a test runs two "hosts").
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import os
import platform
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from warmcache.bounds import MAX_CONFIG_BYTES, MAX_NESTING, json_nesting
from warmcache.errors import UsageError, first_line
from warmcache.identity.compile_env import compile_env
from warmcache.shapes import short_hash

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

#: Neuron compiler flags that say where or how often to compile, not what.
_CACHE_ONLY_NEURON_FLAGS = ("--cache_dir", "--retry_failed_compilation")

#: Packages whose version changes what a compile produces.
_TOOLCHAIN_PACKAGES = ("torch", "transformers", "torch-neuronx", "neuronx-cc", "torch-xla")
#: Triton generates every CUDA kernel Inductor compiles (the wheel is ``pytorch-triton`` on nightlies).
_CUDA_PACKAGES = ("triton", "pytorch-triton")


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
    raise UsageError(f"model {model_path!r}: not a local folder and its config.json is not in the Hugging Face cache; download it first")


def normalised_config(config: dict[str, Any]) -> dict[str, Any]:
    """The config with graph-irrelevant keys removed (recursively, for nested sub-configs)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if key in GRAPH_IRRELEVANT_CONFIG_KEYS:
            continue
        out[key] = normalised_config(value) if isinstance(value, dict) else value
    return out


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
        raise UsageError(f"{path}: config.json is larger than {MAX_CONFIG_BYTES} bytes, far more than any model's; refused")
    depth = json_nesting(data)
    if depth > MAX_NESTING:
        raise UsageError(f"{path}: config.json nests {depth} levels deep; a model config needs at most {MAX_NESTING}; refused")
    try:
        config = json.loads(data.decode("utf-8"))
    except ValueError as exc:  # JSONDecodeError, and UnicodeDecodeError for a file that is not UTF-8
        raise UsageError(f"{path}: unreadable config.json: {exc}") from None
    if not isinstance(config, dict):
        raise UsageError(f"{path}: config.json must hold a JSON object")
    return config


def normalise_neuron_cc_flags(flags: str | None) -> str:
    """Canonical form of ``NEURON_CC_FLAGS``: cache-location flags dropped, options sorted.

    ``--opt a --opt=b`` spellings collapse to ``--opt=a``; the order of options does
    not change the compile, so it does not change the fingerprint.
    """
    if not flags:
        return ""
    try:
        tokens = shlex.split(flags)
    except ValueError as exc:
        raise UsageError(f"NEURON_CC_FLAGS={flags!r}: {exc}") from None
    options: list[str] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token.startswith("-") and "=" not in token and i + 1 < len(tokens) and not tokens[i + 1].startswith("-"):
            token = f"{token}={tokens[i + 1]}"
            i += 1
        i += 1
        if token.split("=", 1)[0] in _CACHE_ONLY_NEURON_FLAGS:
            continue
        options.append(token)
    return " ".join(sorted(options))


def _cpu_isa() -> str:
    """The widest vector ISA Inductor will generate code for on this CPU."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split("flags", 1)[1].split("\n", 1)[0].split()
    except (OSError, IndexError):
        return platform.processor() or "unknown"
    for isa in ("amx_tile", "avx512_bf16", "avx512f", "avx2", "asimd"):
        if isa in flags:
            return isa
    return "default"


def _neuron_platform() -> str:
    override = os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE")
    if override:
        return override
    try:
        product = Path("/sys/devices/virtual/dmi/id/product_name").read_text().strip()
    except OSError:
        return "unknown"
    return product.split(".", 1)[0] or "unknown"


def nvidia_driver_version(proc_text: str) -> str:
    """The driver version in ``/proc/driver/nvidia/version``'s first line (both the proprietary and the open module's wording)."""
    # "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 ..." or
    # "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build ..." (seen on an H200)
    version = re.search(r"\s(\d+\.\d+(?:\.\d+)*)\s", proc_text.split("\n", 1)[0] + " ")
    return version.group(1) if version else "unknown"


def _cuda_driver() -> str:
    """The NVIDIA kernel driver's version, from ``/proc`` (no torch, no subprocess)."""
    try:
        return nvidia_driver_version(Path("/proc/driver/nvidia/version").read_text())
    except OSError:
        return "unknown"


def _cuda_capability() -> str:
    import torch

    if not torch.cuda.is_available():
        return "unavailable"
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


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

        The newer parts appear only when they say something, so a toolchain with no
        compiler variables set hashes as it did before they were fingerprinted.
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
    """The toolchain this process would compile with for a target."""
    driver = None
    names: tuple[str, ...] = _TOOLCHAIN_PACKAGES
    if device == "neuron":
        plat = f"neuron:{_neuron_platform()}"
        flags = normalise_neuron_cc_flags(os.environ.get("NEURON_CC_FLAGS"))
    elif device == "cuda":
        plat = f"cuda:{_cuda_capability()}"
        flags = ""
        driver = _cuda_driver()
        names += _CUDA_PACKAGES
    else:
        plat = f"cpu:{platform.machine()}:{_cpu_isa()}"
        flags = ""
    packages = tuple((name, package_version(name)) for name in names)
    env = compile_env(device, backend)
    return Toolchain(device=device, backend=backend, mode=mode, packages=packages, platform=plat, neuron_cc_flags=flags, compile_env=env, cuda_driver=driver)
