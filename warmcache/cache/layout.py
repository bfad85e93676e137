"""What one "entry" of a compile cache is, so that warmup, scan, prune and bundles agree.

Artifacts in the registry are entries, named by their path relative to the
cache root. Observed layouts:

Inductor (``TORCHINDUCTOR_CACHE_DIR``, torch 2.13)::

    fxgraph/<xx>/<key>              FX graph cache entry            kind inductor-fxgraph
    aotautograd/<key>               AOTAutograd cache entry         kind inductor-aotautograd
    <xx>/<hash>.{py,cpp,so,...}     generated code / compiled C++   kind inductor-code
    triton/<device>/<hash>          Triton kernels (CUDA)           kind inductor-triton
    precompiled/<sha256>            a bucket's precompiled decode   kind inductor-precompiled
                                    graph (warmcache's own, see ``artifacts.format``)
    aotinductor/<sha256>            a bucket's AOTInductor decode   kind aotinductor
                                    package (same file format)
    aotinductor-lib/<sha256>        a package's .so, unpacked at    kind aotinductor-library
                                    warmup (``artifacts.format.unpack_library``)
    locks/                          transient locks                 (not an entry)

Neuron persistent cache (torch-xla era; ``--cache_dir``)::

    neuronxcc-<ver>/MODULE_<hlo-hash>+<flags-hash>/   kind neuron-module

Native Neuron backend (``TORCH_NEURONX_NEFF_CACHE_DIR``): each top-level child
is one entry, kind neuron-neff.

Top-level folders named ``.warmcache-*`` are warmcache's own work folders (the
trash of a prune, the staging folder of a bundle unpack) and never entries.
"""

from __future__ import annotations

import os
from pathlib import Path

from warmcache.artifacts.format import AOTINDUCTOR_DIR, AOTINDUCTOR_LIBRARY, AOTINDUCTOR_LIBRARY_DIR, PRECOMPILED_DIR
from warmcache.targets.flavors import CacheFlavor
from warmcache.targets.routes import PrecompileRoute

INDUCTOR_FXGRAPH = "inductor-fxgraph"
INDUCTOR_AOTAUTOGRAD = "inductor-aotautograd"
INDUCTOR_CODE = "inductor-code"
INDUCTOR_TRITON = "inductor-triton"
INDUCTOR_PRECOMPILED = PrecompileRoute.AOT_COMPILE.artifact_kind
AOTINDUCTOR = PrecompileRoute.AOTINDUCTOR.artifact_kind
NEURON_MODULE = "neuron-module"
NEURON_NEFF = "neuron-neff"

#: Kinds whose entries are shared between compiled graphs: Inductor kernel files are
#: content-addressed, a graph compiled later loads kernels an earlier one wrote, and
#: warmup records an entry only under the spec that wrote it. Measured (tiny Qwen3,
#: Inductor, batch 1 then batch 2): the batch-2 graph loads 14 code files recorded only
#: under batch 1. So no registry row says which graphs need a kernel file.
SHARED_KINDS = frozenset({INDUCTOR_CODE, INDUCTOR_TRITON})

#: Prefix of warmcache's work folders at the top of a cache root (never entries).
WORK_DIR_PREFIX = ".warmcache-"
#: Work folders a crash can leave behind: a prune's trash, an unpack's staging folder.
TRASH_PREFIX = f"{WORK_DIR_PREFIX}trash-"
#: Folder under a cache root that holds warmup's per-spec file locks (a work folder, never an entry).
LOCK_DIRNAME = f"{WORK_DIR_PREFIX}locks"
STAGING_PREFIX = f"{WORK_DIR_PREFIX}unpack-"


def entry_of(flavor: CacheFlavor, relpath: str) -> tuple[str, str] | None:
    """``(kind, entry path)`` of the entry that holds ``relpath`` (POSIX, relative), or ``None``."""
    parts = relpath.split("/")
    if flavor == "inductor":
        found = _inductor_entry(parts)
        # Inductor writes ``<dir>/.<pid>.<tid>.tmp`` and renames it into place: such a
        # name is a write in progress (or a crashed one's leftover), never an entry.
        if found is None or any(name.startswith(".") for name in found[1].split("/")):
            return None
        return found
    if flavor == "neuron":
        if len(parts) >= 2 and parts[0].startswith("neuronxcc-") and parts[1].startswith("MODULE_"):
            return NEURON_MODULE, "/".join(parts[:2])
        return None
    return NEURON_NEFF, parts[0]


def _inductor_entry(parts: list[str]) -> tuple[str, str] | None:
    """The Inductor entry ``parts`` falls in, by the layout in the module docstring."""
    head = parts[0]
    if head == "fxgraph" and len(parts) >= 3:
        return INDUCTOR_FXGRAPH, "/".join(parts[:3])
    if head == "aotautograd" and len(parts) >= 2:
        return INDUCTOR_AOTAUTOGRAD, "/".join(parts[:2])
    if head == "triton" and len(parts) >= 3:
        return INDUCTOR_TRITON, "/".join(parts[:3])
    if head == PRECOMPILED_DIR and len(parts) == 2:
        return INDUCTOR_PRECOMPILED, "/".join(parts)
    if head == AOTINDUCTOR_DIR and len(parts) == 2:
        return AOTINDUCTOR, "/".join(parts)
    if head == AOTINDUCTOR_LIBRARY_DIR and len(parts) == 2:
        return AOTINDUCTOR_LIBRARY, "/".join(parts)
    if head in ("locks", "fxgraph", "aotautograd", "triton", PRECOMPILED_DIR, AOTINDUCTOR_DIR, AOTINDUCTOR_LIBRARY_DIR):
        return None
    if len(parts) == 2:
        return INDUCTOR_CODE, "/".join(parts)
    return None


def list_entries(root: Path, flavor: CacheFlavor) -> dict[str, str]:
    """Every entry under ``root`` as ``{entry path: kind}``; an absent root has none."""
    entries: dict[str, str] = {}
    if not root.is_dir():
        return entries
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        if rel_dir == ".":
            dirnames[:] = [d for d in dirnames if not d.startswith(WORK_DIR_PREFIX)]
            filenames = [f for f in filenames if not f.startswith(WORK_DIR_PREFIX)]
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            rel = name if rel_dir == "." else f"{rel_dir}/{name}".replace(os.sep, "/")
            found = entry_of(flavor, rel)
            if found is not None:
                entries[found[1]] = found[0]
        if flavor == "neuron" and rel_dir.count(os.sep) >= 1 and Path(rel_dir).name.startswith("MODULE_"):
            entries.setdefault(rel_dir.replace(os.sep, "/"), NEURON_MODULE)
            dirnames[:] = []
    return entries


def entry_size(root: Path, entry: str) -> int:
    """Bytes on disk of one entry (a file, or a folder's files).

    Files that vanish while being counted (another worker's write-then-rename on a
    shared cache) count as zero instead of failing the caller.
    """
    path = root / entry
    files = [path] if path.is_file() else [p for p in path.rglob("*") if not p.is_symlink()]
    return sum(_size_if_file(p) for p in files)


def _size_if_file(path: Path) -> int:
    try:
        return path.stat().st_size if path.is_file() else 0
    except FileNotFoundError:
        return 0
