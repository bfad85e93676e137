"""scan, doctor and prune on hand-built Neuron caches in the documented layout.

``neuronxcc-<ver>/MODULE_<hlo-hash>+<flags-hash>/`` with ``model.hlo_module.pb``,
``compile_flags.json``, ``model.neff`` + ``model.done`` (done), ``model.log``
without a NEFF (failed), ``*.lock`` (locked) or only the HLO (incomplete). Rows
are recorded through the registry's real claim path; no torch is involved.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from warmcache_testkit.manifests import generate, manifest_toml, model

from warmcache.cache.inventory import scan_cache
from warmcache.cache.layout import TRASH_PREFIX
from warmcache.cache.locate import CacheLocation
from warmcache.cache.neuron import neuron_compiler_running
from warmcache.cache.prune import PruneRules, plan_prune
from warmcache.cli import main
from warmcache.identity.plan import PlannedShape, plan_manifest
from warmcache.manifest import load_manifest
from warmcache.registry import Registry
from warmcache.registry.records import ArtifactRef
from warmcache.registry.usability import local_toolchain_hash

VERSION = "2.15.128.0+56dc5a86"
HOUR = 3600.0

NEURON_MANIFEST = manifest_toml(
    model(
        "neuron-m", device="neuron", generate=[generate(batch_sizes=[1, 2, 4], prompt_lengths=[16], max_cache_len=64)]
    )
)


def module(root: Path, name: str, files: dict[str, bytes], age: float = 2 * HOUR, version: str = VERSION) -> str:
    """Write one module folder; its files look ``age`` seconds old. Returns the entry path."""
    folder = root / f"neuronxcc-{version}" / f"MODULE_{name}"
    folder.mkdir(parents=True)
    stamp = time.time() - age
    for file, data in files.items():
        (folder / file).write_bytes(data)
        os.utime(folder / file, (stamp, stamp))
    return f"neuronxcc-{version}/MODULE_{name}"


def hlo() -> dict[str, bytes]:
    return {
        "model.hlo_module.pb": b"\x08hlo" * 64,
        "compile_flags.json": json.dumps(["--model-type=transformer", "-O1"]).encode(),
    }


def done_files(size: int = 4096) -> dict[str, bytes]:
    return {**hlo(), "model.neff": os.urandom(size), "model.done": b""}


@pytest.fixture
def neuron_manifest(write_manifest) -> Path:
    return write_manifest(NEURON_MANIFEST)


def planned_by_batch(manifest: Path) -> dict[int, PlannedShape]:
    return {p.spec.batch_size: p for p in plan_manifest(load_manifest(manifest))}


def record_compiled(
    url: str, planned: PlannedShape, artifacts: list[str], *, host: str | None = None, cache_root: Path | None = None
) -> None:
    """Mark ``planned`` compiled with ``artifacts`` through ensure_pending → claim → mark_compiled."""
    with Registry.open(url) as registry:
        registry.ensure_pending([planned])
        row = registry.claim([planned.identity], "test-worker", 60)
        assert row is not None
        refs = [ArtifactRef("neuron-module", a, None) for a in artifacts]
        assert registry.mark_compiled(
            row.id,
            "test-worker",
            compile_seconds=1.0,
            graphs_compiled=1,
            artifacts=refs,
            host=host,
            cache_root=str(cache_root) if cache_root else None,
        )


def statuses(url: str) -> dict[int, str]:
    with Registry.open(url) as registry:
        return {r.batch_size: r.status for r in registry.rows()}


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def empty_registry(tmp_path: Path) -> str:
    """A new registry with no rows (the cache commands read one and never create it): every entry is an orphan."""
    url = f"sqlite:///{tmp_path / 'r.sqlite'}"
    Registry.open(url).close()
    return url


def tree(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")}


@pytest.fixture
def held_lock() -> Iterator[Callable[[Path], None]]:
    """Hold an flock on a file the way a live neuronx-cc process holds its cache lock."""
    handles = []

    def hold(path: Path) -> None:
        handle = open(path, "a")
        fcntl.flock(handle, fcntl.LOCK_EX)
        handles.append(handle)

    yield hold
    for handle in handles:
        handle.close()


@dataclass(frozen=True)
class NeuronCache:
    root: Path
    url: str
    manifest: Path
    entries: dict[str, str]
    planned: dict[int, PlannedShape]


@pytest.fixture
def cache(tmp_path: Path, neuron_manifest: Path, held_lock, registry_url: str) -> NeuronCache:
    """A Neuron cache with one entry per state, a compiled row on ``done`` and one on a vanished entry (SQLite and
    PostgreSQL)."""
    root = tmp_path / "neuron-cache"
    entries = {
        "done": module(root, "aaa+f1", done_files()),
        "orphan": module(root, "bbb+f1", done_files(2048)),
        "failed": module(root, "ccc+f1", {**hlo(), "model.log": b"ERROR: compilation failed\n"}),
        "incomplete": module(root, "ddd+f1", hlo()),
        "stale_lock": module(root, "eee+f1", {**done_files(), "model.hlo_module.pb.lock": b""}),
        "crashed": module(root, "ggg+f1", {**hlo(), "model.hlo_module.pb.lock": b""}),
        "held_lock": module(root, "fff+f1", {**hlo(), "model.hlo_module.pb.lock": b""}),
    }
    held_lock(root / entries["held_lock"] / "model.hlo_module.pb.lock")
    url = registry_url
    planned = planned_by_batch(neuron_manifest)
    record_compiled(url, planned[1], [entries["done"]])
    record_compiled(url, planned[2], [f"neuronxcc-{VERSION}/MODULE_gone+f1"])
    return NeuronCache(root, url, neuron_manifest, entries, planned)


def test_scan_reports_state_version_flags_and_who_uses_each_entry(cache) -> None:
    root, url, entries = cache.root, cache.url, cache.entries
    result = cli("cache", "scan", "--cache-dir", str(root), "--db", url, "--json")
    assert result.exit_code == 0, result.output
    [info] = json.loads(result.output)
    assert info["flavor"] == "neuron"
    by_path = {e["path"]: e for e in info["entries"]}
    states = {name: by_path[path]["state"] for name, path in entries.items()}
    assert states == {
        "done": "done", "orphan": "done", "failed": "failed", "incomplete": "incomplete",
        "stale_lock": "locked", "crashed": "locked", "held_lock": "locked",
    }  # fmt: skip
    assert by_path[entries["stale_lock"]]["content_state"] == "done"
    done = by_path[entries["done"]]
    assert done["compiler_version"] == VERSION
    assert done["flags"] == ["--model-type=transformer", "-O1"]
    assert done["size_bytes"] == sum(len(v) for v in done_files().values())
    assert [(u["batch_size"], u["status"]) for u in done["used_by"]] == [(1, "compiled")] and not done["orphan"]
    assert by_path[entries["orphan"]]["orphan"]
    locks = {by_path[entries[n]]["locks"][0]["held"] for n in ("stale_lock", "held_lock")}
    assert locks == {True, False}
    assert [(m["path"], m["used_by"]["batch_size"]) for m in info["missing"]] == [
        (f"neuronxcc-{VERSION}/MODULE_gone+f1", 2)
    ]
    text = cli("cache", "scan", "--cache-dir", str(root), "--db", url).output
    assert "neuron-module: 7" in text and "1 failed" in text and "neuronxcc 2.15.128.0+56dc5a86" in text
    assert "missing: neuronxcc-2.15.128.0+56dc5a86/MODULE_gone+f1" in text


def test_doctor_dry_run_changes_nothing_and_fix_repairs(cache) -> None:
    root, url, entries = cache.root, cache.url, cache.entries
    before = tree(root)
    dry = cli("cache", "doctor", "--cache-dir", str(root), "--db", url, "--json")
    assert dry.exit_code == 0, dry.output
    [plan] = json.loads(dry.output)
    removed = {r["path"] for r in plan["remove"]}
    # A stale lock on a finished entry goes alone; a stale lock on an unfinished one marks a crashed compile.
    assert removed == {
        entries["failed"],
        entries["incomplete"],
        entries["crashed"],
        f"{entries['stale_lock']}/model.hlo_module.pb.lock",
    }
    assert plan["freed_bytes"] == sum(r["size_bytes"] for r in plan["remove"]) > 0
    assert [f["shape"] for f in plan["forget"]] == ["neuron-m generate batch=2 seq=16 (compiled)"]
    assert any("live process" in n and entries["held_lock"] in n for n in plan["notes"])
    assert tree(root) == before and statuses(url) == {1: "compiled", 2: "compiled"}
    assert "would free" in cli("cache", "doctor", "--cache-dir", str(root), "--db", url).output

    fixed = cli("cache", "doctor", "--cache-dir", str(root), "--db", url, "--fix")
    assert fixed.exit_code == 0, fixed.output
    assert "forgot 1 rows" in fixed.output
    after = tree(root)
    assert not {entries["failed"], entries["incomplete"], entries["crashed"]} & after
    assert entries["stale_lock"] in after and f"{entries['stale_lock']}/model.hlo_module.pb.lock" not in after
    assert f"{entries['held_lock']}/model.hlo_module.pb.lock" in after and f"{entries['done']}/model.neff" in after
    assert statuses(url) == {1: "compiled"}
    plan_out = json.loads(cli("plan", str(cache.manifest), "--db", url, "--json").output)
    assert {i["batch_size"]: i["status"] for i in plan_out} == {1: "compiled", 2: "missing", 4: "missing"}
    again = json.loads(cli("cache", "doctor", "--cache-dir", str(root), "--db", url, "--json").output)[0]
    assert again["remove"] == [] and again["forget"] == []


def prune(cache: NeuronCache, *args: str) -> dict:
    result = cli("cache", "prune", "--cache-dir", str(cache.root), "--db", cache.url, "--json", *args)
    assert result.exit_code == 0, result.output
    [plan] = json.loads(result.output)
    return plan


def test_prune_never_deletes_an_entry_a_compiled_shape_needs_unless_asked(cache) -> None:
    needed = cache.entries["done"]
    everything = prune(cache, "--max-size", "0", "--dry-run")
    assert needed not in {r["path"] for r in everything["remove"]}
    assert f"{needed}: kept: needed by compiled shapes (--include-referenced deletes it anyway)" in everything["notes"]
    assert any("above --max-size" in n for n in everything["notes"])
    assert cache.entries["held_lock"] not in {r["path"] for r in everything["remove"]}

    orphans = prune(cache, "--orphans")
    assert {r["path"] for r in orphans["remove"]} >= {cache.entries["orphan"], cache.entries["failed"]}
    assert orphans["forget"] == [] and (cache.root / needed / "model.neff").is_file()
    assert not (cache.root / cache.entries["orphan"]).exists()

    forced = prune(cache, "--max-size", "0", "--include-referenced")
    assert needed in forced["result"]["removed"] and forced["result"]["forgotten_rows"] == 1
    assert not (cache.root / needed).exists()
    assert statuses(cache.url) == {2: "compiled"}  # the row whose entry was deleted reads missing again
    assert (cache.root / cache.entries["held_lock"]).is_dir()  # a live compile is never pruned


def test_prune_max_size_evicts_least_recently_used_first(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    old = module(root, "old+f", done_files(10_000), age=30 * 86400)
    mid = module(root, "mid+f", done_files(10_000), age=10 * 86400)
    new = module(root, "new+f", done_files(10_000), age=1 * 86400)
    url = empty_registry(tmp_path)
    result = cli("cache", "prune", "--cache-dir", str(root), "--db", url, "--max-size", "25K", "--json")
    [plan] = json.loads(result.output)
    assert [r["path"] for r in plan["remove"]] == [old]
    assert (root / mid).is_dir() and (root / new).is_dir() and not (root / old).exists()
    aged = json.loads(
        cli("cache", "prune", "--cache-dir", str(root), "--db", url, "--older-than", "5d", "--json").output
    )[0]
    assert [r["path"] for r in aged["remove"]] == [mid]


def test_prune_keeps_fresh_orphans_a_running_warmup_may_still_record(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    fresh = module(root, "fresh+f", done_files(), age=5)
    url = empty_registry(tmp_path)
    [plan] = json.loads(cli("cache", "prune", "--cache-dir", str(root), "--db", url, "--orphans", "--json").output)
    assert plan["remove"] == [] and "running warmup" in plan["notes"][0]
    [plan] = json.loads(
        cli("cache", "prune", "--cache-dir", str(root), "--db", url, "--orphans", "--grace", "1s", "--json").output
    )
    assert [r["path"] for r in plan["remove"]] == [fresh]


def test_prune_stale_toolchains_deletes_what_only_old_toolchains_use(
    tmp_path: Path, neuron_manifest: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    local_toolchain_hash.cache_clear()  # memoised per process: start from this test's environment
    root = tmp_path / "cache"
    url = empty_registry(tmp_path)
    old_entry = module(root, "old+f2", done_files(), version="2.14.0.0")
    current_entry = module(root, "cur+f1", done_files())
    monkeypatch.setenv("NEURON_CC_FLAGS", "--model-type=transformer -O2")  # another compiler configuration
    record_compiled(url, planned_by_batch(neuron_manifest)[1], [old_entry])
    monkeypatch.delenv("NEURON_CC_FLAGS")
    local_toolchain_hash.cache_clear()
    record_compiled(url, planned_by_batch(neuron_manifest)[1], [current_entry])
    result = cli("cache", "prune", "--cache-dir", str(root), "--db", url, "--stale-toolchains")
    assert result.exit_code == 0, result.output
    assert "forgot 1 rows" in result.output
    assert not (root / old_entry).exists() and (root / current_entry / "model.neff").is_file()
    with Registry.open(url) as registry:
        rows = registry.rows(with_artifacts=True)
    assert [(r.status, [a.path for a in r.artifacts]) for r in rows] == [("compiled", [current_entry])]


def test_prune_interrupted_after_forgetting_leaves_registry_and_cache_consistent(
    cache, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crash between the two steps leaves orphans, never a row that names a deleted entry."""

    def crash(*_: object) -> None:
        raise KeyboardInterrupt

    with Registry.open(cache.url) as registry:
        info = scan_cache(CacheLocation(cache.root, "neuron", "test"), registry.rows(with_artifacts=True))
        plan = plan_prune(info, PruneRules(max_size_bytes=0, include_referenced=True))
        assert cache.entries["done"] in {r.path for r in plan.removals}
        monkeypatch.setattr(os, "rename", crash)
        with pytest.raises(KeyboardInterrupt):
            plan.execute(registry)
        monkeypatch.undo()
    with Registry.open(cache.url) as registry:
        for row in registry.rows(with_artifacts=True):
            assert all((cache.root / a.path).exists() for a in row.artifacts if "gone" not in a.path), row
    assert (cache.root / cache.entries["done"] / "model.neff").is_file()
    assert statuses(cache.url) == {2: "compiled"}


def test_doctor_removes_leftover_work_folders_and_scans_ignore_them(cache) -> None:
    trash = cache.root / f"{TRASH_PREFIX}0123"
    (trash / "0").mkdir(parents=True)
    (trash / "0" / "model.neff").write_bytes(b"x" * 100)
    os.utime(trash, (time.time() - HOUR, time.time() - HOUR))
    [info] = json.loads(cli("cache", "scan", "--cache-dir", str(cache.root), "--db", cache.url, "--json").output)
    assert not any(e["path"].startswith(".warmcache") for e in info["entries"])
    assert [w["path"] for w in info["work_dirs"]] == [trash.name]
    fixed = cli("cache", "doctor", "--cache-dir", str(cache.root), "--db", cache.url, "--fix")
    assert f"removed {trash.name}" in fixed.output and not trash.exists()


def test_doctor_on_a_missing_folder_forgets_nothing(cache, tmp_path: Path) -> None:
    result = cli(
        "cache", "doctor", "--cache-dir", str(tmp_path / "typo"), "--flavor", "neuron", "--db", cache.url, "--fix"
    )
    assert result.exit_code == 0 and "does not exist" in result.output
    assert statuses(cache.url) == {1: "compiled", 2: "compiled"}


def test_cache_folder_precedence_and_remote_caches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, neuron_manifest: Path
) -> None:
    url = empty_registry(tmp_path)

    def roots(*args: str) -> list[str]:
        result = cli("cache", "scan", "--db", url, "--json", *args)
        assert result.exit_code == 0, result.output
        return [i["root"] for i in json.loads(result.output)]

    monkeypatch.setenv("NEURON_CC_FLAGS", f"--cache_dir={tmp_path / 'flags'} -O1")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    assert roots() == [str(tmp_path / "inductor"), str(tmp_path / "flags")]
    assert roots("--manifest", str(neuron_manifest)) == [str(tmp_path / "flags")]
    with_dir = neuron_manifest.with_name("with-dir.toml")
    with_dir.write_text(f'[cache]\ndir = "{tmp_path / "manifest-dir"}"\n' + neuron_manifest.read_text())
    assert roots("--manifest", str(with_dir)) == [str(tmp_path / "manifest-dir")]
    monkeypatch.setenv("WARMCACHE_CACHE_DIR", str(tmp_path / "env"))
    assert roots("--manifest", str(with_dir)) == [str(tmp_path / "env")]
    assert roots("--manifest", str(with_dir), "--cache-dir", str(tmp_path / "flag")) == [str(tmp_path / "flag")]
    monkeypatch.delenv("WARMCACHE_CACHE_DIR")
    monkeypatch.setenv("NEURON_CC_FLAGS", "-O1")
    monkeypatch.setenv("NEURON_COMPILE_CACHE_URL", "s3://bucket/neuron-cache")
    # A manifest's Neuron model needs a local cache to record artifacts from; without a manifest,
    # scan lists the s3:// cache through the store (tests/test_store.py).
    remote = cli("cache", "scan", "--db", url, "--manifest", str(neuron_manifest))
    assert remote.exit_code == 2 and "s3://bucket/neuron-cache" in remote.stderr and "--cache-dir" in remote.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-size", "12Q"], "--max-size: '12Q' is not a size"),
        (["--older-than", "soon"], "--older-than: 'soon' is not an age"),
        ([], "say what to prune"),
    ],
)
def test_prune_rejects_bad_options_with_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    result = cli("cache", "prune", "--cache-dir", str(tmp_path), "--db", f"sqlite:///{tmp_path / 'r.sqlite'}", *args)
    assert result.exit_code == 2 and message in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_a_running_neuron_compiler_keeps_every_unheld_lock(cache, tmp_path: Path) -> None:
    """The cache's lock may be a plain file no flock probe sees: while neuronx-cc runs here, no lock is stale."""
    compiler = tmp_path / "neuronx-cc"
    shutil.copy(shutil.which("sleep") or "/bin/sleep", compiler)
    process = subprocess.Popen([str(compiler), "60"])
    try:
        deadline = time.time() + 10
        while not neuron_compiler_running() and time.time() < deadline:
            time.sleep(0.05)
        [plan] = json.loads(
            cli("cache", "doctor", "--cache-dir", str(cache.root), "--db", cache.url, "--fix", "--json").output
        )
    finally:
        process.kill()
        process.wait()
    removed = {r["path"] for r in plan["remove"]}
    assert not any(path.endswith(".lock") for path in removed) and cache.entries["crashed"] not in removed
    assert (cache.root / cache.entries["stale_lock"] / "model.hlo_module.pb.lock").exists()
    assert cache.entries["failed"] in removed  # a failure is not a lock: still removed


def test_native_neff_cache_is_scanned_but_never_judged_broken(tmp_path: Path) -> None:
    root = tmp_path / "neff-cache"
    (root / "graph-a").mkdir(parents=True)
    (root / "graph-a" / "graph.neff").write_bytes(b"n" * 300)
    (root / "graph-b").mkdir()
    (root / "graph-b" / "graph.hlo").write_bytes(b"h" * 10)
    (root / "c.neff").write_bytes(b"n" * 50)
    [info] = json.loads(
        cli("cache", "scan", "--cache-dir", str(root), "--db", empty_registry(tmp_path), "--json").output
    )
    assert info["flavor"] == "neuron-native"
    assert {e["path"]: (e["kind"], e["state"], e["size_bytes"]) for e in info["entries"]} == {
        "graph-a": ("neuron-neff", "done", 300),
        "graph-b": ("neuron-neff", "incomplete", 10),
        "c.neff": ("neuron-neff", "done", 50),
    }
    [plan] = json.loads(
        cli(
            "cache",
            "doctor",
            "--cache-dir",
            str(root),
            "--db",
            empty_registry(tmp_path),
            "--grace",
            "0s",
            "--json",
        ).output
    )
    assert plan["remove"] == []  # the native layout is not documented enough to call an entry broken


def test_prune_keeps_orphans_while_a_warmup_holds_a_lock_in_the_cache(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    orphan = module(root, "old+f", done_files(), age=30 * 86400)
    (root / ".warmcache-locks").mkdir()
    spec_lock = root / ".warmcache-locks" / "0123abcd.lock"
    spec_lock.touch()
    url = empty_registry(tmp_path)
    with open(spec_lock) as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # as warmup's FileLock holds it while a spec compiles
        [plan] = json.loads(cli("cache", "prune", "--cache-dir", str(root), "--db", url, "--orphans", "--json").output)
    assert plan["remove"] == [] and "while a warmup compiles into this cache" in plan["notes"][0]
    [plan] = json.loads(cli("cache", "prune", "--cache-dir", str(root), "--db", url, "--orphans", "--json").output)
    assert plan["result"]["removed"] == [orphan]  # the lock file stays behind when released: only holding it counts


def test_doctor_leaves_rows_of_other_hosts_that_name_nothing_in_this_cache(
    tmp_path: Path, neuron_manifest: Path
) -> None:
    """A fleet registry: build-7 compiled batch=4 into its own cache; this host's cache never had it."""
    root, url = tmp_path / "cache", empty_registry(tmp_path)
    kept = module(root, "kept+f1", done_files())
    planned = planned_by_batch(neuron_manifest)
    record_compiled(url, planned[4], [f"neuronxcc-{VERSION}/MODULE_elsewhere+f1"], host="build-7")
    record_compiled(url, planned[1], [kept, f"neuronxcc-{VERSION}/MODULE_lost+f1"], host="build-7")  # half here: damage
    [plan] = json.loads(cli("cache", "doctor", "--cache-dir", str(root), "--db", url, "--json").output)
    assert [f["shape"] for f in plan["forget"]] == ["neuron-m generate batch=1 seq=16 (compiled)"]
    assert any("other hosts" in n and "--any-host" in n for n in plan["notes"])
    [plan] = json.loads(
        cli("cache", "doctor", "--cache-dir", str(root), "--db", url, "--any-host", "--fix", "--json").output
    )
    assert sorted(f["shape"] for f in plan["forget"]) == [
        "neuron-m generate batch=1 seq=16 (compiled)",
        "neuron-m generate batch=4 seq=16 (compiled)",
    ]
    assert statuses(url) == {}


def test_doctor_forgets_only_rows_compiled_into_the_folder_it_examines(neuron_manifest: Path, tmp_path: Path) -> None:
    url = empty_registry(tmp_path)
    cache_a, cache_b = tmp_path / "cache-a", tmp_path / "cache-b"
    entry = module(cache_a, "one+f1", done_files())
    module(cache_b, "unrelated+f1", done_files())  # another Neuron cache on the same host
    record_compiled(url, planned_by_batch(neuron_manifest)[1], [entry], cache_root=cache_a)

    # Pointed at another folder of the same host, doctor must not forget cache A's row.
    [plan] = json.loads(cli("cache", "doctor", "--cache-dir", str(cache_b), "--db", url, "--fix", "--json").output)
    assert plan["forget"] == [] and statuses(url) == {1: "compiled"}
    assert any("another cache" in n for n in plan["notes"])

    # Its own folder lost the entry: now the row is forgotten and the shape reads missing.
    shutil.rmtree(cache_a / entry)
    [plan] = json.loads(cli("cache", "doctor", "--cache-dir", str(cache_a), "--db", url, "--fix", "--json").output)
    assert [f["shape"] for f in plan["forget"]] == ["neuron-m generate batch=1 seq=16 (compiled)"]
    assert statuses(url) == {}


def test_a_scan_survives_work_folders_vanishing_under_it(tmp_path: Path) -> None:
    """A concurrent prune or unpack removes its work folder while a scan sizes it: skip it, never crash."""
    import threading

    root = tmp_path / "cache"
    root.mkdir()
    stop = threading.Event()

    def churn() -> None:  # a real file system race, bounded by the scans below
        n = 0
        while not stop.is_set():
            folder = root / f"{TRASH_PREFIX}{n % 8}"
            (folder / "0").mkdir(parents=True, exist_ok=True)
            (folder / "0" / "model.neff").write_bytes(b"x")
            shutil.rmtree(folder, ignore_errors=True)
            n += 1

    worker = threading.Thread(target=churn, daemon=True)
    worker.start()
    try:
        for _ in range(3000):
            info = scan_cache(CacheLocation(root, "neuron", "test"))
            assert all(w.path.startswith(TRASH_PREFIX) for w in info.work_dirs)
    finally:
        stop.set()
        worker.join()
