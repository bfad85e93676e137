"""AWS Trainium/Inferentia through torch-neuronx (device ``neuron``).

``torch_neuronx`` is imported here and only here, inside methods, so every other
target (and every query command) runs on machines without it. Facts this
follows (see DESIGN.md): load with ``device_map="neuron"`` (``"auto"`` silently
loads on CPU and compiles nothing), keep generate inputs on CPU, compile with
``dynamic=False``. The persistent cache is ``--cache_dir`` in ``NEURON_CC_FLAGS``,
else ``NEURON_COMPILE_CACHE_URL``, else ``/var/tmp/neuron-compile-cache``; the
native backend's NEFF cache is ``TORCH_NEURONX_NEFF_CACHE_DIR``.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from warmcache.errors import TargetUnavailableError, UsageError
from warmcache.targets.base import Target, ToolchainFactors
from warmcache.targets.flavors import CacheFlavor
from warmcache.targets.routes import PrecompileRoute

FLAGS_ENV = "NEURON_CC_FLAGS"
CACHE_URL_ENV = "NEURON_COMPILE_CACHE_URL"
NEFF_CACHE_ENV = "TORCH_NEURONX_NEFF_CACHE_DIR"
DEFAULT_CACHE_DIR = Path("/var/tmp/neuron-compile-cache")
#: Neuron compiler flags that say where or how often to compile, not what.
_CACHE_ONLY_NEURON_FLAGS = ("--cache_dir", "--retry_failed_compilation")


def _flag_cache_dir(flags: str) -> str | None:
    tokens = shlex.split(flags)
    for i, token in enumerate(tokens):
        if token.startswith("--cache_dir="):
            return token.split("=", 1)[1]
        if token == "--cache_dir" and i + 1 < len(tokens):
            return tokens[i + 1]
    return None


def _with_cache_dir(flags: str, root: Path) -> str:
    """``NEURON_CC_FLAGS`` with its ``--cache_dir`` replaced (or added)."""
    tokens = shlex.split(flags)
    kept: list[str] = []
    skip = False
    for token in tokens:
        if skip:
            skip = False
            continue
        if token == "--cache_dir":
            skip = True
            continue
        if not token.startswith("--cache_dir="):
            kept.append(token)
    return shlex.join([*kept, f"--cache_dir={root}"])


def configured_cache_location() -> str | None:
    """The persistent cache the environment names: ``--cache_dir`` in ``NEURON_CC_FLAGS``, then
    ``NEURON_COMPILE_CACHE_URL``."""
    return _flag_cache_dir(os.environ.get(FLAGS_ENV, "")) or os.environ.get(CACHE_URL_ENV)


def remote_cache_url() -> str | None:
    """The ``s3://`` cache the environment names for the Neuron compiler, if it names one."""
    location = configured_cache_location()
    return location if location and location.startswith("s3://") and not os.environ.get(NEFF_CACHE_ENV) else None


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


def _neuron_platform() -> str:
    override = os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE")
    if override:
        return override
    try:
        product = Path("/sys/devices/virtual/dmi/id/product_name").read_text().strip()
    except OSError:
        return "unknown"
    return product.split(".", 1)[0] or "unknown"


@dataclass(frozen=True, slots=True)
class NeuronTarget(Target):
    """``device="neuron"``; backend ``neuron`` (or eager/aot_eager, which still run on the chip)."""

    DEVICES: ClassVar[tuple[str, ...]] = ("neuron",)
    DEVICE_ALIASES: ClassVar[dict[str, str]] = {
        alias: "neuron" for alias in ("trainium", "inferentia", "trn1", "trn2", "inf2", "xla")
    }
    BACKENDS: ClassVar[tuple[str, ...]] = ("neuron", "eager", "aot_eager")

    @classmethod
    def precompile_problem(cls, route: PrecompileRoute, device: str, backend: str, mode: str) -> str | None:
        if route is PrecompileRoute.NONE:
            return None
        return (
            f"{route.artifacts} are built by Inductor on cpu or cuda (got {device}/{backend}/{mode}; "
            "Neuron compiles through torch-neuronx, not Inductor)"
        )

    @property
    def cache_flavor(self) -> CacheFlavor | None:
        return "neuron-native" if os.environ.get(NEFF_CACHE_ENV) else "neuron"

    def default_cache_dir(self) -> Path:
        if os.environ.get(NEFF_CACHE_ENV):
            return Path(os.environ[NEFF_CACHE_ENV])
        location = configured_cache_location()
        if location and "://" in location:
            raise UsageError(
                f"{FLAGS_ENV}/{CACHE_URL_ENV} points at the remote cache {location!r}: warmcache records artifacts "
                "from a local cache; pass --cache-dir DIR (and sync DIR to the remote cache afterwards)"
            )
        return Path(location) if location else DEFAULT_CACHE_DIR

    def point_cache_at(self, root: Path) -> None:
        os.environ[FLAGS_ENV] = _with_cache_dir(os.environ.get(FLAGS_ENV, ""), root)
        os.environ[CACHE_URL_ENV] = str(root)
        if os.environ.get(NEFF_CACHE_ENV):
            os.environ[NEFF_CACHE_ENV] = str(root)

    def toolchain_factors(self) -> ToolchainFactors:
        """The instance family the compiler targets and its flags (normalised: where it caches is not what it
        compiles)."""
        return ToolchainFactors(
            platform=f"neuron:{_neuron_platform()}",
            neuron_cc_flags=normalise_neuron_cc_flags(os.environ.get(FLAGS_ENV)),
        )

    def check_available(self) -> None:
        try:
            import torch_neuronx  # noqa: F401
        except ImportError as exc:
            raise TargetUnavailableError(
                f"device 'neuron': torch_neuronx cannot be imported ({exc}); run on a Trainium/Inferentia instance "
                'with torch-neuronx installed, or set device = "cpu" in the manifest'
            ) from None
        import torch

        neuron = getattr(torch, "neuron", None)
        if neuron is None or not neuron.is_available():
            raise TargetUnavailableError(
                "device 'neuron': torch_neuronx is installed but no Neuron device is visible (check neuron-ls)"
            )

    def load_kwargs(self) -> dict[str, Any]:
        return {"device_map": "neuron"}

    def input_device(self) -> str:
        return "cpu"
