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

from pathlib import Path

from warmcache.cache.layout import WORK_DIR_PREFIX
from warmcache.errors import CacheError

#: The file that names the folder's platform; the prefix keeps it out of entries, scans and bundles.
MARK = f"{WORK_DIR_PREFIX}cpu-platform"


def claim_for_platform(root: Path, platform: str) -> None:
    """Name ``platform`` as the one ``root``'s Inductor code is for, or raise :class:`CacheError` if another holds it.

    The first writer wins (an exclusive create); a folder that cannot be written (an image
    volume, mounted read-only) is only checked.
    """
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
            f"{root}: this Inductor cache holds code generated for {held}, and this process generates for {platform}: "
            "torch's FX graph cache key leaves out the CPU's vector ISA, so it would load kernels made for the "
            "other (wrong numbers); give each platform its own cache folder (--cache-dir), or empty this one and "
            f"delete {mark}"
        )
