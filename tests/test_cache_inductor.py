"""prune and pack on a hand-built Inductor cache: kernel files are shared between graphs.

The real-cache version (a warmup of two shapes) is tests/test_bundle_inductor.py;
this one runs in a second and pins the rule down.
"""

from __future__ import annotations

import json
import os
import tarfile
import time
from pathlib import Path

from test_cache_neuron import cli
from warmcache_testkit.manifests import generate, manifest_toml, model

from warmcache.identity.plan import plan_manifest
from warmcache.manifest import load_manifest
from warmcache.registry import Registry
from warmcache.registry.records import ArtifactRef

MANIFEST = manifest_toml(model("m", backend="inductor", generate=[generate(batch_sizes=[1, 2])]))


def write(root: Path, path: str, size: int = 1000, age: float = 7200) -> str:
    file = root / path
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_bytes(os.urandom(size))
    stamp = time.time() - age
    os.utime(file, (stamp, stamp))
    return path


def test_kernel_files_stay_while_any_compiled_graph_may_load_them(tmp_path: Path, write_manifest) -> None:
    root = tmp_path / "inductor"
    graph_1 = write(root, "fxgraph/ab/fabkey1/entry").rsplit("/", 1)[0]  # the entry is the key's folder
    graph_2 = write(root, "fxgraph/cd/fcdkey2/entry").rsplit("/", 1)[0]
    kernel = write(root, "xy/cxykernel.so")  # written by graph 1's compile, loaded by graph 2's as well
    own_kernel = write(root, "zz/czzkernel.so")
    manifest = write_manifest(MANIFEST)
    url = f"sqlite:///{tmp_path / 'r.sqlite'}"
    planned = {p.spec.batch_size: p for p in plan_manifest(load_manifest(manifest))}
    with Registry.open(url) as registry:
        registry.ensure_pending(list(planned.values()))
        for batch, paths in ((1, [graph_1, kernel]), (2, [graph_2, own_kernel])):
            row = registry.claim([planned[batch].identity], "w", 60)
            assert row is not None
            kinds = {graph_1: "inductor-fxgraph", graph_2: "inductor-fxgraph"}
            registry.mark_compiled(
                row.id,
                "w",
                compile_seconds=1,
                graphs_compiled=1,
                artifacts=[ArtifactRef(kinds.get(p, "inductor-code"), p) for p in paths],
            )
        registry.forget([r.id for r in registry.rows() if r.batch_size == 1])

    [plan] = json.loads(cli("cache", "prune", "--cache-dir", str(root), "--db", url, "--orphans", "--json").output)
    assert plan["result"]["removed"] == [graph_1]
    assert (root / kernel).exists() and any("kernels are shared between graphs" in n for n in plan["notes"])

    packed = cli("bundle", "pack", str(manifest), "-o", str(tmp_path / "b.tar"), "--cache-dir", str(root), "--db", url)
    assert packed.exit_code == 0, packed.output
    with tarfile.open(tmp_path / "b.tar") as tar:
        assert set(tar.getnames()[1:]) == {f"cache/{graph_2}/entry", f"cache/{own_kernel}", f"cache/{kernel}"}

    [forced] = json.loads(
        cli(
            "cache", "prune", "--cache-dir", str(root), "--db", url, "--orphans", "--include-referenced", "--json"
        ).output
    )
    assert forced["result"]["removed"] == [kernel]
    # it may have loaded that kernel
    assert [f["shape"] for f in forced["forget"]] == ["m generate batch=2 seq=8 (compiled)"]
    with Registry.open(url) as registry:
        assert registry.rows() == []


def test_inductor_temp_files_are_not_entries(tmp_path: Path) -> None:
    """Inductor writes ``<xx>/.<pid>.<tid>.tmp`` then renames it: a write in progress, not a kernel."""
    from warmcache.cache.layout import entry_of, list_entries

    root = tmp_path / "inductor"
    kernel = write(root, "xy/cxykernel.so")
    write(root, "xy/.1234.5678.tmp")
    write(root, "fxgraph/ab/.1234.5678.tmp")
    graph = write(root, "fxgraph/ab/fabkey1/.1234.5678.tmp").rsplit("/", 1)[0]  # inside an entry: part of it
    assert list_entries(root, "inductor") == {kernel: "inductor-code", graph: "inductor-fxgraph"}
    assert entry_of("inductor", "xy/.1234.5678.tmp") is None
    # native entries may be named anything
    assert entry_of("neuron-native", ".hidden/model.neff") == (
        "neuron-neff",
        ".hidden",
    )


def test_last_used_skips_files_that_vanish_while_it_reads(tmp_path: Path, monkeypatch) -> None:
    import warmcache.cache.inventory as inventory

    root = tmp_path / "inductor"
    write(root, "aotautograd/akey/entry", age=7200)
    real_files = inventory._files

    def with_a_vanished_temp(folder: Path):  # type: ignore[no-untyped-def]
        yield folder / ".1234.5678.tmp"  # listed by os.walk, renamed away before lstat
        yield from real_files(folder)

    monkeypatch.setattr(inventory, "_files", with_a_vanished_temp)
    assert abs(inventory.last_used(root / "aotautograd" / "akey") - (time.time() - 7200)) < 60
    assert inventory.last_used(root / "gone") >= time.time() - 60  # an entry renamed away right now is not old
