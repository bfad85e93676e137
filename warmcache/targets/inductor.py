"""``torch.compile`` on CPU and CUDA: Inductor, plus the cache-less eager/aot_eager backends.

Inductor keeps its persistent cache in ``TORCHINDUCTOR_CACHE_DIR`` (default
``<tmp>/torchinductor_<user>``), read when it first compiles, so the runner sets
the variable before torch compiles anything. ``eager`` and ``aot_eager`` trace
with Dynamo but generate no code: they have no persistent cache, which makes
them fast for tests and means a fresh process has nothing to load.
"""

from __future__ import annotations

import getpass
import os
import platform
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from warmcache.errors import TargetUnavailableError
from warmcache.targets.base import Target, ToolchainFactors
from warmcache.targets.flavors import CacheFlavor
from warmcache.targets.routes import PrecompileRoute

CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
#: Triton generates every CUDA kernel Inductor compiles (the wheel is ``pytorch-triton`` on nightlies).
CUDA_PACKAGES = ("triton", "pytorch-triton")
#: Backends whose decode graph torch 2.13 can save as an ``aot_compile`` artifact (AOTAutograd-based; not Neuron yet,
#: see docs/guides/precompiled.md); an AOTInductor package needs Inductor itself.
PRECOMPILE_BACKENDS = {
    PrecompileRoute.AOT_COMPILE: ("inductor", "aot_eager"),
    PrecompileRoute.AOTINDUCTOR: ("inductor",),
}


def inductor_default_cache_dir() -> Path:
    """torch's own default, computed without importing torch."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return Path(tempfile.gettempdir()) / ("torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))


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


#: Picks ATen's CPU kernels and, while Inductor's ``cpp.simdlen`` is unset, the vector ISA Inductor generates CPU code
#: for (``torch._inductor.cpu_vec_isa.pick_vec_isa``): ``default`` turns vectorisation off, ``avx2`` narrows it.
CPU_CAPABILITY_ENV = "ATEN_CPU_CAPABILITY"


def _cpu_platform(backend: str) -> str:
    """``cpu:ARCH:ISA``, and for Inductor the ``ATEN_CPU_CAPABILITY`` it was told, when set (an explicit value equal to
    the CPU's best still reads as a change, as an explicit compiler variable does)."""
    chosen = os.environ.get(CPU_CAPABILITY_ENV, "").strip().lower()
    base = f"cpu:{platform.machine()}:{_cpu_isa()}"
    return f"{base}:{CPU_CAPABILITY_ENV}={chosen}" if chosen and backend == "inductor" else base


def nvidia_driver_version(proc_text: str) -> str:
    """The driver version in ``/proc/driver/nvidia/version``'s first line (both the proprietary and the open module's
    wording)."""
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
class InductorTarget(Target):
    """``device`` is ``cpu`` or ``cuda``; ``backend`` is ``inductor``, ``aot_eager`` or ``eager``."""

    DEVICES: ClassVar[tuple[str, ...]] = ("cpu", "cuda")
    DEVICE_ALIASES: ClassVar[dict[str, str]] = {"gpu": "cuda", "nvidia": "cuda"}
    BACKENDS: ClassVar[tuple[str, ...]] = ("inductor", "aot_eager", "eager")

    @classmethod
    def precompile_problem(cls, route: PrecompileRoute, device: str, backend: str, mode: str) -> str | None:
        if route is PrecompileRoute.NONE or (backend in PRECOMPILE_BACKENDS[route] and mode == "default"):
            return None
        backends = " or ".join(repr(b) for b in PRECOMPILE_BACKENDS[route])
        return f"{route.artifacts} need backend {backends} in mode 'default' (got {device}/{backend}/{mode})"

    @property
    def cache_flavor(self) -> CacheFlavor | None:
        return "inductor" if self.backend == "inductor" else None

    def default_cache_dir(self) -> Path:
        env = os.environ.get(CACHE_ENV)
        return Path(env) if env else inductor_default_cache_dir()

    def point_cache_at(self, root: Path) -> None:
        os.environ[CACHE_ENV] = str(root)

    def toolchain_factors(self) -> ToolchainFactors:
        """On CPU the ISA Inductor generates code for (the CPU's widest, or ``ATEN_CPU_CAPABILITY``'s); on CUDA the
        compute capability, the driver and Triton."""
        if self.device == "cuda":
            return ToolchainFactors(
                platform=f"cuda:{_cuda_capability()}", packages=CUDA_PACKAGES, cuda_driver=_cuda_driver()
            )
        return ToolchainFactors(platform=_cpu_platform(self.backend))

    def code_platform(self) -> str | None:
        """On CPU Inductor's: its FX graph cache key leaves out the vector ISA its kernels are written for (Triton's
        CUDA kernels are keyed by the GPU)."""
        return self.toolchain_factors().platform if self.device == "cpu" and self.backend == "inductor" else None

    def check_available(self) -> None:
        if self.device != "cuda":
            return
        import torch

        if not torch.cuda.is_available():
            raise TargetUnavailableError(
                f"device 'cuda' ({self.describe()}): torch {torch.__version__} sees no CUDA device on this machine"
            )

    def load_kwargs(self) -> dict[str, Any]:
        return {"device_map": "cuda"} if self.device == "cuda" else {}

    def input_device(self) -> str:
        return self.device
