"""What a compile target is: a device, a backend, and the compile cache it fills.

A target answers the questions the warmup runner and verify must not hard-code
per device: where the persistent compile cache lives (and how to point the
compiler at another folder *before* it compiles), how to load a model onto the
device, and which ``CompileConfig`` ``generate()`` should use. Targets never
import torch at module import time, so planning and the fast "already warm"
path stay torch-free.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from warmcache.targets.flavors import CacheFlavor
from warmcache.targets.routes import PrecompileRoute

if TYPE_CHECKING:
    from transformers import CompileConfig

#: Dynamo falls back to eager after this many recompiles of one function; warmup
#: compiles every declared shape of a model in one process, so it must be far higher.
WARMUP_RECOMPILE_LIMIT = 4096


@dataclass(frozen=True, slots=True)
class ToolchainFactors:
    """The parts of the toolchain fingerprint a target reads for itself
    (:func:`warmcache.identity.fingerprint.current_toolchain` adds the common packages, the compiler's environment
    variables and the target's name).

    Each field is stored with every registry row as it is named here, so a target
    that has nothing to say for one leaves its default: the stored identity of a row
    never depends on how a target computes it.
    """

    #: Which machine the code is generated for (``cpu:x86_64:avx512f``, ``cuda:sm_90``, ``neuron:trn1``).
    platform: str
    #: Packages beyond the common ones whose version changes what this target compiles.
    packages: tuple[str, ...] = ()
    #: The Neuron compiler's flags, normalised; empty on every other target.
    neuron_cc_flags: str = ""
    #: The NVIDIA driver of a CUDA target; ``None`` on every other target.
    cuda_driver: str | None = None


@dataclass(frozen=True, slots=True)
class Target(ABC):
    """One ``(device, backend, mode)`` a model compiles for."""

    device: str
    backend: str
    mode: str = "default"

    #: The devices this target compiles for (their torch names); adding a device means adding a target.
    DEVICES: ClassVar[tuple[str, ...]] = ()
    #: What people call those devices when they do not use the torch name: a did-you-mean answers ``gpu`` with
    #: ``cuda``.
    DEVICE_ALIASES: ClassVar[dict[str, str]] = {}
    #: The backends that compile for these devices, the default first.
    BACKENDS: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def precompile_problem(cls, route: PrecompileRoute, device: str, backend: str, mode: str) -> str | None:
        """Why this target cannot build ``route`` for ``backend`` in ``mode``, or ``None`` when it can."""
        if route is PrecompileRoute.NONE:
            return None
        return f"{route.artifacts} are not built for device {device!r} (got {device}/{backend}/{mode})"

    @property
    @abstractmethod
    def cache_flavor(self) -> CacheFlavor | None:
        """The layout of the persistent cache, or ``None`` when the backend keeps none."""

    @abstractmethod
    def default_cache_dir(self) -> Path:
        """Where the compiler caches when warmcache is not told otherwise (env, then its default)."""

    @abstractmethod
    def point_cache_at(self, root: Path) -> None:
        """Make the compiler cache under ``root``; must run before the first compile."""

    @abstractmethod
    def toolchain_factors(self) -> ToolchainFactors:
        """What on this machine decides what this target compiles, beyond the common packages (read without torch
        where it can be)."""

    @abstractmethod
    def check_available(self) -> None:
        """Raise :class:`~warmcache.errors.TargetUnavailableError` if this machine cannot run the target."""

    def describe(self) -> str:
        return f"{self.device}/{self.backend}"

    def code_platform(self) -> str | None:
        """The platform the code this target caches is generated for, where the compiler's own cache keys leave it
        out, so that a cache folder holds one (:mod:`warmcache.cache.platform_mark`); ``None`` where they hold it."""
        return None

    def prepare(self) -> None:
        """Process-wide settings every warmup or replay process needs before compiling."""
        import torch._dynamo.config as dynamo_config

        dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, WARMUP_RECOMPILE_LIMIT)
        dynamo_config.accumulated_recompile_limit = max(
            dynamo_config.accumulated_recompile_limit, WARMUP_RECOMPILE_LIMIT
        )

    def load_kwargs(self) -> dict[str, Any]:
        """Extra ``from_pretrained`` arguments that place the model on the device."""
        return {}

    def input_device(self) -> str:
        """Where generate() inputs are built; ``generate()`` moves what ``forward`` needs."""
        return "cpu"

    def compile_config(self) -> CompileConfig:
        from warmcache.modeling.generation import compile_config

        return compile_config(self.backend, self.mode, self.device)
