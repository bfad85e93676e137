"""One CPU platform per Inductor cache folder: torch's FX graph cache key leaves out the vector ISA.

torch 2.13 keys an FX graph cache entry by the graph, its inputs, Inductor's config and the
GPU it sees (``CacheBase.get_system``), not by the CPU's vector ISA. A process whose Inductor
generates code for another ISA (another CPU sharing the folder, or ``ATEN_CPU_CAPABILITY=avx2``
beside an AVX-512 run) loads the wrapper and kernel source made for the other vector width and
builds that source for its own. Measured: wrong numbers (a 1000-wide RMSNorm, matmul and softmax
2.2 off; Qwen3-0.6B's decode NaN) or a crash (docs/measurements/criterion.md). So the first warmup
or verify on a folder writes down the platform it compiles for (the target's ``platform``
toolchain factor: the CPU's widest ISA, and ``ATEN_CPU_CAPABILITY`` when set), and a process
compiling for another is refused before it compiles anything.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from warmcache.cache.layout import WORK_DIR_PREFIX
from warmcache.errors import CacheError
from warmcache.targets import Target, target_of

#: The file that names the folder's platform; the prefix keeps it out of entries, scans and bundles.
MARK = f"{WORK_DIR_PREFIX}cpu-platform"


def claim_for_target(root: Path, target: Target) -> None:
    """Claim ``root`` for the platform ``target`` generates code for, where its compiler's cache keys leave it out
    (Inductor on CPU: :meth:`~warmcache.targets.Target.code_platform`); other targets' folders are left as they are."""
    platform = target.code_platform()
    if platform is not None:
        claim_for_platform(root, platform)


def claim_for_platform(root: Path, platform: str, claimant: str = "this process generates for") -> None:
    """Name ``platform`` as the one ``root``'s Inductor code is for, or raise :class:`CacheError` if another holds it.

    The first writer wins (an exclusive create); a folder that cannot be written (an image
    volume, mounted read-only) is only checked. ``claimant`` says in the message who brings
    ``platform``'s code: this process, or a bundle or pull being installed.
    """
    with contextlib.suppress(OSError):  # the mark goes in before the compiler's first file; read-only: checked only
        root.mkdir(parents=True, exist_ok=True)
    mark = root / MARK
    try:
        with mark.open("x", encoding="utf-8") as out:
            out.write(platform + "\n")
        return
    except FileExistsError:
        pass
    except OSError:
        if not mark.is_file():
            return
    held = mark.read_text(encoding="utf-8").strip()
    if held and held != platform:
        raise CacheError(
            f"{root}: this Inductor cache holds code generated for {held}, and {claimant} {platform}: "
            "torch's FX graph cache key leaves out the CPU's vector ISA, so it would load kernels made for the "
            "other (wrong numbers); give each platform its own cache folder (--cache-dir), or empty this one and "
            f"delete {mark}"
        )


def claim_for_rows(root: Path, rows: Iterable[Mapping[str, Any]], source: str) -> None:
    """Claim ``root`` for the platform the installed rows' Inductor CPU code was generated on (a bundle's or a pull's).

    Their files are that platform's code whatever machine unpacks them (``--force`` lets a bundle of another
    toolchain in): marked, a later compile here for another platform is refused instead of loading them.
    """
    # One question per target, not per row: code_platform() reads /proc/cpuinfo.
    by_target = {(row["device"], row["backend"], row["mode"], row["toolchain"]["platform"]) for row in rows}
    generated_on = {
        platform
        for device, backend, mode, platform in by_target
        if target_of(device, backend, mode).code_platform() is not None
    }
    for platform in sorted(generated_on):
        claim_for_platform(root, platform, f"{source} holds code generated for")
