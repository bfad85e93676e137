"""ShapeGuard decisions, snapshots, miss telemetry and the ``misses``/``guard export`` commands (no compiles)."""

from __future__ import annotations

import dataclasses
import json
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import closing
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_cli_query import _compile_all  # the registry's real claim → mark_compiled path
from warmcache_testkit.manifests import generate, manifest_toml, model, train

from warmcache.cli import main
from warmcache.errors import RegistryError, UnseenShapeError, UsageError
from warmcache.runtime.guard import ShapeGuard
from warmcache.runtime.snapshot import HOST_LOCAL
from warmcache.runtime.telemetry import MissTelemetry


def _manifest_of_m(
    path: str = "{qwen3}",
    batch_sizes: Sequence[int] = (1, 2, 4),
    prompt_lengths: Sequence[int] = (16, 32),
    max_cache_len: int = 64,
) -> str:
    """Model ``m``'s manifest; tests vary its checkpoint and generate shapes."""
    return manifest_toml(
        model(
            "m",
            path,
            backend="aot_eager",
            generate=[generate(batch_sizes, prompt_lengths, max_cache_len)],
            train=[train(seq_lengths=[32])],
        )
    )


MANIFEST = _manifest_of_m()


@pytest.fixture
def compiled(registry_url: str, write_manifest) -> str:
    _compile_all(registry_url, write_manifest(MANIFEST))
    return registry_url


def test_decide_pads_to_the_smallest_fitting_bucket(compiled: str) -> None:
    with ShapeGuard.from_registry(compiled, "m", telemetry=False) as guard:
        assert guard.buckets == [(1, 16), (1, 32), (2, 16), (2, 32), (4, 16), (4, 32)]
        assert guard.decide(2, 32).kind == "exact"
        decision = guard.decide(3, 20)
        assert (decision.kind, decision.target) == ("pad", (4, 32))
        assert guard.decide(1, 1).target == (1, 16)


@pytest.mark.parametrize(
    ("policy", "batch", "seq", "expected"),
    [
        ("pad", 8, 16, "request batch=8 seq=16 fits no compiled shape; nearest compiled: batch=4 seq=16"),
        ("pad", 1, 33, "request batch=1 seq=33 fits no compiled shape; nearest compiled: batch=1 seq=32"),
        (
            "refuse",
            3,
            20,
            # nearest first: what the request would pad to (batch=2 seq=16 is smaller on both sizes)
            "request batch=3 seq=20 is not compiled exactly (policy refuse); nearest compiled: batch=4 seq=32",
        ),
    ],
)
def test_refusals_name_the_request_and_the_nearest_compiled_shapes(
    compiled: str, policy: str, batch: int, seq: int, expected: str
) -> None:
    guard = ShapeGuard.from_registry(compiled, "m", policy=policy, telemetry=False)  # type: ignore[arg-type]
    with pytest.raises(UnseenShapeError) as info:
        guard.decide(batch, seq)
    assert expected in str(info.value)
    assert str(info.value).startswith("m/generate float32 max_cache_len=64")
    assert [(e.batch_size, e.seq_len, e.decision) for e in guard.misses()] == [(batch, seq, "refuse")]


def test_warn_pads_what_fits_and_lets_the_rest_through(compiled: str, caplog: pytest.LogCaptureFixture) -> None:
    guard = ShapeGuard.from_registry(compiled, "m", policy="warn", telemetry=False)
    assert guard.decide(3, 20).target == (4, 32)
    beyond = guard.decide(8, 16)
    assert beyond.kind == "refuse" and beyond.target is None
    assert "batch=8 seq=16 fits no compiled shape and will compile (policy warn)" in caplog.text
    assert sorted((e.decision, e.count) for e in guard.misses()) == [("pad", 1), ("warn", 1)]


def test_guard_needs_one_family_and_usable_rows(registry_url: str, write_manifest) -> None:
    two_families = MANIFEST + "[[model.generate]]\nbatch_sizes = [1]\nprompt_lengths = [16]\nmax_cache_len = 128\n"
    _compile_all(registry_url, write_manifest(two_families))
    with pytest.raises(UsageError, match="several compiled families .*max_cache_len=128 .*max_cache_len=64 "):
        ShapeGuard.from_registry(registry_url, "m", telemetry=False)
    assert ShapeGuard.from_registry(registry_url, "m", max_cache_len=128, telemetry=False).buckets == [(1, 16)]
    with pytest.raises(UsageError, match="no usable compiled model 'other' generate shapes"):
        ShapeGuard.from_registry(registry_url, "other", telemetry=False)
    with pytest.raises(UsageError, match="policy 'strict' is not one of pad, refuse, warn"):
        ShapeGuard.from_registry(registry_url, "m", policy="strict", max_cache_len=128)  # type: ignore[arg-type]


def test_refresh_picks_up_newly_compiled_buckets(registry_url: str, write_manifest) -> None:
    path = write_manifest(MANIFEST)
    _compile_all(registry_url, path, keep=lambda p: p.spec.batch_size == 1)
    guard = ShapeGuard.from_registry(registry_url, "m", telemetry=False)
    assert guard.buckets == [(1, 16), (1, 32)]
    with pytest.raises(UnseenShapeError):
        guard.decide(2, 16)
    _compile_all(registry_url, path)
    guard.refresh()
    assert guard.decide(2, 16).kind == "exact"


def test_snapshot_round_trip_and_stale_rows(compiled: str, tmp_path: Path) -> None:
    out = tmp_path / "guard.json"
    result = CliRunner().invoke(
        main, ["guard", "export", "--model", "m", "--out", str(out), "--db", compiled, "--json"]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["shapes"] == 7
    from_db = ShapeGuard.from_registry(compiled, "m", telemetry=False)
    from_file = ShapeGuard.from_snapshot(out, "m")
    assert from_file.buckets == from_db.buckets and from_file.family == from_db.family
    # the same rows, less what they say of the host that exported them (its paths, ids, claims)
    assert from_file.records == [dataclasses.replace(r, **HOST_LOCAL) for r in from_db.records]
    assert ShapeGuard.from_snapshot(out, "m", "train").buckets == [(2, 32)]

    # A row compiled by another toolchain is stale here: the guard must not trust it.
    document = json.loads(out.read_text())
    for record in document["records"]:
        if record["batch_size"] == 4:
            record["toolchain_hash"] = "0" * 20
    out.write_text(json.dumps(document))
    stale = ShapeGuard.from_snapshot(out, "m")
    assert (4, 16) not in stale.buckets
    with pytest.raises(UnseenShapeError):
        stale.decide(4, 16)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{", "not a JSON file"),
        ('{"format": "other"}', "not a warmcache guard snapshot"),
        ('{"format": "warmcache-guard-snapshot", "version": 9, "records": []}', "snapshot version 9 is not supported"),
        ('{"format": "warmcache-guard-snapshot", "version": 1, "records": [{"id": 1}]}', "records[0]: missing key(s)"),
    ],
)
def test_bad_snapshot_names_file_and_key(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "snap.json"
    path.write_text(content)
    with pytest.raises(UsageError) as info:
        ShapeGuard.from_snapshot(path, "m")
    assert str(path) in str(info.value) and message in str(info.value)


def test_export_of_an_unknown_model_fails_cleanly(compiled: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main, ["guard", "export", "--model", "nope", "--out", str(tmp_path / "x.json"), "--db", compiled]
    )
    assert result.exit_code == 2
    assert "model 'nope' has no compiled shapes" in result.stderr
    assert not (tmp_path / "x.json").exists()


def test_misses_are_flushed_in_the_background_and_summarised(compiled: str) -> None:
    guard = ShapeGuard.from_registry(compiled, "m", telemetry_interval=0.05)
    for _ in range(5):
        guard.decide(3, 20)
    with pytest.raises(UnseenShapeError):
        guard.decide(8, 16)
    deadline = time.monotonic() + 10
    while guard.telemetry.flushed < 6 and time.monotonic() < deadline:
        time.sleep(0.05)
    guard.close()
    assert guard.telemetry.flushed == 6
    runner = CliRunner()
    summary = json.loads(runner.invoke(main, ["misses", "--db", compiled, "--json", "--model", "m"]).output)
    assert [
        (s["batch_size"], s["seq_len"], s["decision"], s["padded_batch"], s["padded_seq"], s["count"]) for s in summary
    ] == [
        (3, 20, "pad", 4, 32, 5),
        (8, 16, "refuse", None, None, 1),
    ]
    text = runner.invoke(main, ["misses", "--db", compiled]).output
    assert "4x32" in text and text.strip().endswith("6 misses over 2 shapes")
    assert json.loads(runner.invoke(main, ["misses", "--db", compiled, "--json", "--model", "other"]).output) == []


@pytest.fixture
def silent_postgres() -> Iterator[str]:
    """A PostgreSQL URL whose server accepts TCP connections and then never answers (a hung database)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    try:
        yield f"postgresql://postgres@127.0.0.1:{server.getsockname()[1]}/test"
    finally:
        server.close()


def _closed_port_url() -> str:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    return f"postgresql://postgres@127.0.0.1:{port}/test"


@pytest.mark.parametrize("outage", ["hung", "refused"])
def test_a_database_outage_never_blocks_or_fails_requests(
    write_manifest, tmp_path: Path, silent_postgres: str, outage: str
) -> None:
    source = f"sqlite:///{tmp_path / 'source.sqlite'}"
    _compile_all(source, write_manifest(MANIFEST))
    snapshot = tmp_path / "guard.json"
    assert (
        CliRunner().invoke(main, ["guard", "export", "--model", "m", "--out", str(snapshot), "--db", source]).exit_code
        == 0
    )
    url = silent_postgres if outage == "hung" else _closed_port_url()
    guard = ShapeGuard.from_snapshot(snapshot, "m", telemetry_url=url, telemetry_interval=0.01)
    start = time.perf_counter()
    for i in range(2000):
        assert guard.decide(1 + i % 3, 17 + i % 10).runnable
        if i % 100 == 0:
            time.sleep(0.002)  # let the flusher run (and hang or fail) while requests keep coming
    elapsed = time.perf_counter() - start
    closing = time.perf_counter()
    guard.close(timeout=0.5)
    close_seconds = time.perf_counter() - closing
    print(
        f"\n{outage} database: 2000 guarded decisions in {elapsed * 1000:.1f} ms, close() in "
        f"{close_seconds * 1000:.0f} ms"
    )
    # Liveness, not speed (tools/bench/bench_guard.py measures that): a request or close() that
    # waited on the database would hang here for the whole connect timeout or forever.
    assert elapsed < 10 and close_seconds < 10
    assert sum(e.count for e in guard.misses()) == 2000  # every request padded (lengths 17-26), every one counted
    if outage == "refused":
        assert guard.telemetry.failed_flushes >= 1 and guard.telemetry.flushed == 0


def test_runtime_guard_and_cli_import_without_torch() -> None:
    code = "import sys, warmcache.runtime.guard, warmcache.cli; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_telemetry_memory_is_bounded_under_a_flood_of_unique_shapes(
    compiled: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from warmcache.runtime import telemetry

    monkeypatch.setattr(telemetry, "MAX_KEYS", 50)
    guard = ShapeGuard.from_registry(compiled, "m", telemetry=False)
    unique = [(b, n) for n in range(1, 33) for b in range(1, 5) if (b, n) not in guard.buckets]
    for batch, length in unique:
        guard.decide(batch, length)
    assert len(guard.misses()) == 50
    assert guard.telemetry.dropped == len(unique) - 50  # every miss beyond the bound is counted, not kept


def test_a_miss_the_registry_cannot_hold_is_dropped_and_never_blocks_the_others(compiled: str) -> None:
    """A refused request of batch 2**40 cannot be stored; kept pending, it would fail every flush and lose every miss
    after it."""
    guard = ShapeGuard.from_registry(compiled, "m", telemetry_interval=3600)
    with pytest.raises(UnseenShapeError):
        guard.decide(2**40, 16)
    guard.decide(3, 20)
    assert guard.telemetry.flush() and guard.telemetry.flush()
    guard.close()
    assert guard.telemetry.dropped == 1 and guard.telemetry.failed_flushes == 0
    assert _miss_counts(compiled) == [(3, 20, "pad", 1)]


def test_a_model_of_another_config_is_refused(compiled: str, tiny_models: dict[str, Path]) -> None:
    guard = ShapeGuard.from_registry(compiled, "m", telemetry=False)
    config = json.loads((tiny_models["qwen3"] / "config.json").read_text())
    # graph-irrelevant keys may differ
    guard.check_model_config({**config, "_name_or_path": "elsewhere", "eos_token_id": 7})
    with pytest.raises(UsageError, match="model 'm': config_hash .* matches no compiled rows"):
        guard.check_model_config({**config, "num_hidden_layers": 3})
    guard.refresh()
    assert len(guard.buckets) == 6


def _another_config_of(model_dir: Path, into: Path) -> Path:
    """A checkpoint folder of model ``m`` whose config compiles other graphs (3 layers)."""
    into.mkdir()
    config = json.loads((model_dir / "config.json").read_text())
    (into / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
    return into


def test_buckets_of_another_config_are_not_offered_until_the_config_is_known(
    compiled: str, write_manifest, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    other = _another_config_of(tiny_models["qwen3"], tmp_path / "deeper")
    only_batch_8 = _manifest_of_m(str(other), batch_sizes=[2, 8])
    _compile_all(compiled, write_manifest(only_batch_8, name="other.toml"))
    with ShapeGuard.from_registry(compiled, "m", telemetry=False) as guard:
        # (8, 16) exists only for the deeper config, (1, 16) only for the original: neither is safe yet.
        assert guard.buckets == [(2, 16), (2, 32)]
        with pytest.raises(UnseenShapeError):
            guard.decide(5, 16)
        guard.check_model_config(json.loads((other / "config.json").read_text()))
        assert guard.buckets == [(2, 16), (2, 32), (8, 16), (8, 32)]
        assert guard.decide(5, 16).target == (8, 16)


def test_a_refused_refresh_keeps_the_old_table_serving(compiled: str, write_manifest, tmp_path: Path) -> None:
    guard = ShapeGuard.from_registry(compiled, "m", telemetry=False)
    # A new family appears (another max_cache_len): refresh must refuse and keep serving the old buckets.
    _compile_all(compiled, write_manifest(_manifest_of_m(prompt_lengths=[128], max_cache_len=256), name="longer.toml"))
    with pytest.raises(UsageError, match="several compiled families"):
        guard.refresh()
    with pytest.raises(UnseenShapeError):
        guard.decide(1, 100)
    assert guard.decide(1, 20).target == (1, 32)


def _miss_counts(url: str) -> list[tuple[int, int, str, int]]:
    """The registry's miss summary for model ``m``, read back through the ``misses`` command."""
    summary = json.loads(CliRunner().invoke(main, ["misses", "--db", url, "--json", "--model", "m"]).output)
    return [(s["batch_size"], s["seq_len"], s["decision"], s["count"]) for s in summary]


def test_a_miss_recorded_while_the_flusher_writes_reaches_the_registry_on_close(
    compiled: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from warmcache.registry import Registry

    # Hold the flusher inside its first (real) write until close() has asked it to stop.
    real_record_misses = Registry.record_misses
    writing, release = threading.Event(), threading.Event()

    def held_record_misses(self: Registry, events) -> None:  # type: ignore[no-untyped-def]
        writing.set()
        assert release.wait(10)
        real_record_misses(self, events)

    monkeypatch.setattr(Registry, "record_misses", held_record_misses)
    guard = ShapeGuard.from_registry(compiled, "m", telemetry_interval=0.01)
    guard.decide(3, 20)
    assert writing.wait(10)
    with pytest.raises(UnseenShapeError):
        guard.decide(8, 16)  # queued while the flusher is inside flush()
    closer = threading.Thread(target=guard.close, args=(10.0,))
    closer.start()
    deadline = time.monotonic() + 10
    while not guard.telemetry._stopping and time.monotonic() < deadline:
        time.sleep(0.001)
    release.set()
    closer.join(10)
    assert not closer.is_alive()
    assert guard.telemetry.flushed == 2
    assert _miss_counts(compiled) == [(3, 20, "pad", 1), (8, 16, "refuse", 1)]


def test_a_miss_recorded_after_close_is_flushed_by_the_next_close(compiled: str) -> None:
    guard = ShapeGuard.from_registry(compiled, "m", telemetry_interval=60)
    guard.decide(3, 20)
    guard.close()
    guard.decide(3, 20)  # the flusher has ended; only another close() (or the exit hook) can send it
    guard.close()
    assert guard.telemetry.flushed == 2
    assert _miss_counts(compiled) == [(3, 20, "pad", 2)]


def test_a_snapshot_that_is_not_utf8_is_a_usage_error_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "snap.json"
    path.write_bytes(b'{"format": "\xff\xfe"}')
    with pytest.raises(UsageError) as info:
        ShapeGuard.from_snapshot(path, "m")
    message = str(info.value)
    assert str(path) in message and "not a JSON file" in message and "\n" not in message


def test_export_leaves_no_temporary_file(compiled: str, tmp_path: Path) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    out = folder / "guard.json"
    for _ in range(2):  # the second export replaces the first
        result = CliRunner().invoke(main, ["guard", "export", "--model", "m", "--out", str(out), "--db", compiled])
        assert result.exit_code == 0, result.output
    assert [p.name for p in folder.iterdir()] == ["guard.json"]
    assert out.stat().st_mode & 0o044  # readable by a replica running as another user, as before


def test_a_failed_export_leaves_no_temporary_file(tmp_path: Path) -> None:
    from warmcache.runtime.snapshot import SNAPSHOT_FILE, write_snapshot

    folder = tmp_path / "out"
    out = folder / "guard.json"
    (out / SNAPSHOT_FILE).mkdir(parents=True)  # a snapshot folder; os.replace cannot put a file over the folder in it
    with pytest.raises(UsageError, match="cannot write snapshot"):
        write_snapshot(out, [], "test")
    assert [p.name for p in folder.iterdir()] == ["guard.json"] and [p.name for p in out.iterdir()] == [SNAPSHOT_FILE]


def test_a_guard_built_from_a_snapshot_imports_no_database_layer(compiled: str, tmp_path: Path) -> None:
    out = tmp_path / "guard.json"
    assert (
        CliRunner().invoke(main, ["guard", "export", "--model", "m", "--out", str(out), "--db", compiled]).exit_code
        == 0
    )
    probe = (
        "import sys\n"
        "from warmcache.runtime.guard import ShapeGuard\n"
        f"guard = ShapeGuard.from_snapshot({str(out)!r}, 'm')\n"
        "assert guard.decide(3, 20).target == (4, 32)\n"
        "guard.close()\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'sqlalchemy', 'alembic'}))\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_read_paths_never_create_a_registry(tmp_path: Path) -> None:
    missing = tmp_path / "typo" / "registry.sqlite"
    with pytest.raises(RegistryError, match="does not exist"):
        ShapeGuard.from_registry(f"sqlite:///{missing}", "m", telemetry=False)
    assert not missing.exists() and not missing.parent.exists()

    empty = tmp_path / "empty.sqlite"
    empty.touch()
    with pytest.raises(RegistryError, match="holds no warmcache schema"):
        ShapeGuard.from_registry(f"sqlite:///{empty}", "m", telemetry=False)
    with closing(sqlite3.connect(empty)) as db:  # opening writes SQLite's header (WAL mode), never a table
        assert db.execute("SELECT name FROM sqlite_master").fetchall() == [], "a read must not initialise the schema"


def test_telemetry_never_creates_the_registry_it_flushes_to(compiled: str, tmp_path: Path) -> None:
    missing = tmp_path / "typo.sqlite"
    with ShapeGuard.from_registry(compiled, "m", telemetry=False) as source:
        family = source.family
    telemetry = MissTelemetry(family, f"sqlite:///{missing}", interval=3600)
    telemetry.record(source.decide(3, 20))
    assert telemetry.flush() is False
    telemetry.close(timeout=1)
    assert not missing.exists()
