"""AOTInductor packages load from a read-only mount as they are: the ``.so`` is ``dlopen``-ed where it lies.

Warmup writes each CPU package's library unpacked beside it (``aotinductor-lib/<sha256>``),
names its digest in the package header and records it on the package's rows, so bundles,
pushes and image volumes carry it. A start checks it through one descriptor and maps that
descriptor: nothing is unpacked, nothing is written anywhere. The packages are the suite's
one AOTInductor warmup (``conftest.packaged``); the loads here take milliseconds.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from warmcache.artifacts.format import (
    AOTINDUCTOR_LIBRARY_DIR,
    MAGIC,
    Fingerprint,
    Header,
    encode,
    library_of,
    library_path,
)
from warmcache.artifacts.mapped_library import checked_library
from warmcache.cache.layout import AOTINDUCTOR, AOTINDUCTOR_LIBRARY
from warmcache.errors import CacheError, TrustError
from warmcache.registry import Registry

#: Loads every package of the batch-1 row from folders the caller mounted read-only, and says what it mapped.
LOAD = textwrap.dedent(
    """
    import json, sys
    import torch
    from transformers import AutoModelForCausalLM
    from warmcache.errors import CacheError
    from warmcache.artifacts.aoti_loader import load_package
    from warmcache.artifacts.code_check import ModelCodeCheck

    model_path, loads = sys.argv[1], json.loads(sys.argv[2])
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    outcomes = []
    for root, entry in loads:
        try:
            load_package(__import__("pathlib").Path(root), entry, {}, model, ModelCodeCheck(model))
            outcomes.append("loaded")
        except CacheError as exc:
            outcomes.append(str(exc))
    maps = [line.split(None, 5)[-1].strip() for line in open("/proc/self/maps") if len(line.split()) == 6]
    print(json.dumps({"outcomes": outcomes, "mapped": sorted(set(maps))}))
    """
)


def _packages(packaged: Path, batch: int = 1) -> list[str]:
    with Registry.open(f"sqlite:///{packaged}/registry.sqlite") as registry:
        (row,) = [r for r in registry.rows(model="m", with_artifacts=True) if r.batch_size == batch]
    return sorted(a.path for a in row.artifacts if a.kind == AOTINDUCTOR)


def _decode_package(packaged: Path, batch: int = 1) -> str:
    """The row's decode package (a header with no ``step`` predates prefill packages: a decode one)."""
    (entry,) = [
        e for e in _packages(packaged, batch) if _header(packaged / "cache" / e).get("step", "decode") == "decode"
    ]
    return entry


def _header(path: Path) -> dict[str, Any]:
    with path.open("rb") as file:
        file.read(len(MAGIC))
        aotinductor: dict[str, Any] = json.loads(file.readline())["aotinductor"]
    return aotinductor


def _copy_entries(source: Path, into: Path, entries: list[str]) -> Path:
    for entry in entries:
        (into / entry).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source / entry, into / entry)
    return into


def _as_old_package(source: Path, entry: str, into: Path) -> str:
    """The package as warmup wrote it before libraries were unpacked: the same bytes, its header naming none. Its
    model-code digest kept (packages older than libraries had none, and every load now refuses those first): what is
    tested is the loader's path for a package with no library to map."""
    data = (source / entry).read_bytes()
    end = data.index(b"\n", len(MAGIC))
    raw = json.loads(data[len(MAGIC) : end])
    raw["aotinductor"].pop("library")
    fingerprint = Fingerprint.from_json(raw["fingerprint"])
    header = Header(fingerprint, raw["module_globals"], raw["aotinductor"], raw["model_code"])
    old = encode(header, data[end + 1 :])
    name = f"aotinductor/{__import__('hashlib').sha256(old).hexdigest()}"
    (into / name).parent.mkdir(parents=True, exist_ok=True)
    (into / name).write_bytes(old)
    return name


def _mapped() -> set[str]:
    return {line.split(None, 5)[-1].strip() for line in Path("/proc/self/maps").read_text().splitlines()}


def _model(path: Path) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _logits(step: Any) -> Any:
    """The step run on fixed inputs of its own signature (the same for every load of the same package)."""
    import torch

    seeded = torch.Generator().manual_seed(0)
    tensors = []
    for _, shape, dtype_name in step.inputs:
        dtype = getattr(torch, dtype_name.removeprefix("torch."))
        if dtype.is_floating_point:
            tensors.append(torch.zeros(shape, dtype=dtype))  # an additive mask that masks nothing, an empty cache
        else:
            tensors.append(torch.randint(0, 8, shape, generator=seeded).to(dtype))
    return step.run([name for name, _, _ in step.inputs], tensors, step.fixed)


def _unshare_permitted() -> bool:
    return shutil.which("unshare") is not None and subprocess.run(["unshare", "--mount", "true"]).returncode == 0


@pytest.mark.slow
def test_warmup_records_each_package_library_on_its_rows_and_ships_it(packaged: Path) -> None:
    """The header names the library, the rows record it beside the package, and what bundles and pushes ship (their
    one list of a row's entries) holds it: the image volume a pod mounts has it unpacked."""
    from warmcache.cache.locate import CacheLocation
    from warmcache.shipping.bundle import entries_needed

    cache = packaged / "cache"
    with Registry.open(f"sqlite:///{packaged}/registry.sqlite") as registry:
        rows = list(registry.rows(model="m", with_artifacts=True))
    for row in rows:
        kinds = {a.path: a.kind for a in row.artifacts}
        packages = [path for path, kind in kinds.items() if kind == AOTINDUCTOR]
        assert packages, kinds
        for package in packages:
            library = library_of(cache, package)
            assert library == library_path(_header(cache / package)["library"])
            assert kinds.get(library) == AOTINDUCTOR_LIBRARY, (package, kinds)
            assert (cache / library).is_file()
    shipped = entries_needed(rows, CacheLocation(cache, "inductor", "test"))
    assert {library_of(cache, p) for p in shipped if p.startswith("aotinductor/")} <= set(shipped)


@pytest.mark.slow
def test_a_package_loads_from_a_read_only_mount_and_writes_nothing(
    packaged: Path, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    """The cache folder, ``$TMPDIR``, ``/tmp``, ``/var/tmp`` and the working folder read-only (``unshare --mount``:
    root ignores file modes, not a read-only mount): the package loads, mapping the library in the mount, and no file
    changes. A package with no library (as every package was before) cannot load there: it needs a writable folder to
    unpack into."""
    if not _unshare_permitted():
        pytest.skip("unshare --mount is not permitted here: a read-only bind mount needs it")
    cache = packaged / "cache"
    entry = _decode_package(packaged)
    old_root = tmp_path / "old-cache"
    old = _as_old_package(cache, entry, old_root)
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    script = tmp_path / "load.py"
    script.write_text(LOAD)
    read_only = [p for p in (Path("/tmp"), Path("/var/tmp"), tmpdir, cache, old_root) if p.is_dir()]
    before = {folder: sorted(folder.rglob("*")) for folder in (tmpdir, cache, old_root)}
    mounts = " && ".join(f"mount --bind {p} {p} && mount -o remount,bind,ro {p}" for p in read_only)
    loads = json.dumps([[str(cache), entry], [str(old_root), old]])
    command = f"{mounts} && cd {cache} && exec {sys.executable} {script} {tiny_models['llama']} '{loads}'"
    done = subprocess.run(
        ["unshare", "--mount", "sh", "-c", command],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TMPDIR": str(tmpdir), "HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    loaded, unpacked = result["outcomes"]
    assert loaded == "loaded", loaded
    assert "AOTInductor package does not load" in unpacked and "\n" not in unpacked, unpacked
    library = str(cache / library_of(cache, entry))  # type: ignore[operator]
    assert library in result["mapped"], result["mapped"]
    assert not [m for m in result["mapped"] if "warmcache-aoti-" in m or "aotinductor_" in m], result["mapped"]
    assert {folder: sorted(folder.rglob("*")) for folder in before} == before


@pytest.mark.slow
def test_an_old_package_still_loads_through_a_private_temporary_folder_and_computes_the_same(
    packaged: Path, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    """A package whose header names no library (written before warmup unpacked them) loads as it always did, and the
    library loaded where it lies computes the same logits as the package unpacked."""
    import torch

    from warmcache.artifacts.aoti_loader import load_package
    from warmcache.artifacts.code_check import ModelCodeCheck

    cache, entry = packaged / "cache", _decode_package(packaged)
    old = _as_old_package(cache, entry, tmp_path / "cache")
    model = _model(tiny_models["llama"])
    _, mapped = load_package(cache, entry, {}, model, ModelCodeCheck(model))
    _, unpacked = load_package(tmp_path / "cache", old, {}, model, ModelCodeCheck(model))
    assert str(cache / library_of(cache, entry)) in _mapped()  # type: ignore[operator]
    assert not (tmp_path / "cache" / AOTINDUCTOR_LIBRARY_DIR).exists()
    assert mapped is not None and unpacked is not None
    assert torch.equal(_logits(mapped), _logits(unpacked))


@pytest.mark.slow
def test_a_tampered_library_is_refused_with_one_line_before_it_loads(
    packaged: Path, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    from warmcache.artifacts.aoti_loader import load_package
    from warmcache.artifacts.code_check import ModelCodeCheck

    cache, entry = packaged / "cache", _decode_package(packaged)
    library = library_of(cache, entry)
    assert library is not None
    copy = _copy_entries(cache, tmp_path / "cache", [entry, library])
    data = bytearray((copy / library).read_bytes())
    data[len(data) // 2] ^= 0x01
    (copy / library).write_bytes(bytes(data))
    with pytest.raises(TrustError, match=r"AOTInductor library sha256 .* differs from the .* its package") as refused:
        model = _model(tiny_models["llama"])
        load_package(copy, entry, {}, model, ModelCodeCheck(model))
    assert "\n" not in str(refused.value) and str(copy / library) in str(refused.value)
    assert str(copy / library) not in _mapped()


def test_a_library_others_may_write_is_not_loaded_where_it_lies(tmp_path: Path) -> None:
    """Checked then loaded through one folder descriptor, a file is safe from renames above its folder, not from a
    write into it or a rename in its folder: one that others may write, or in a folder others may write, is left alone
    (the package is unpacked into a private folder instead)."""
    import hashlib

    data = b"\x7fELF not really, never loaded here"
    digest = hashlib.sha256(data).hexdigest()
    path = tmp_path / library_path(digest)
    path.parent.mkdir()
    path.write_bytes(data)
    package = tmp_path / "aotinductor" / ("0" * 64)
    for mode, usable in ((0o644, True), (0o444, True), (0o664, False), (0o646, False)):
        path.chmod(mode)
        with checked_library(tmp_path, digest, package) as mapped:
            assert (mapped is not None) is usable, oct(mode)
            if mapped is not None:
                assert Path(mapped).read_bytes() == data and os.path.samefile(mapped, path)
    path.parent.chmod(0o777)  # another user could rename another file into its place
    with checked_library(tmp_path, digest, package) as mapped:
        assert mapped is None
    path.parent.chmod(0o755)
    with checked_library(tmp_path, "1" * 64, package) as absent:
        assert absent is None
    with pytest.raises(CacheError, match="names library '../x', not a sha256"):
        with checked_library(tmp_path, "../x", package):
            pass
