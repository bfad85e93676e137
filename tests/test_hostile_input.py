"""Issue 15's table of hostile inputs: each is one line naming the file, key and value, a
non-zero exit code, and nothing written (no registry file, no cache folder, no staging)."""

from __future__ import annotations

import io
import sqlite3
import tarfile
import time
from pathlib import Path

import pytest
import test_bundle
from click.testing import Result
from test_bundle import Built, _edit_meta, _set, pack, rebuild
from test_cache_neuron import cli

built = test_bundle.built  # the build machine's cache and registry (a fixture)

MANIFEST = """
[[model]]
name = "m"
path = "{path}"
dtype = "{dtype}"
[[model.generate]]
batch_sizes = [{batch}]
prompt_lengths = [8]
max_cache_len = 32
"""


def write(tmp_path: Path, text: str) -> Path:
    manifest = tmp_path / "manifest.toml"
    manifest.write_text(text)
    return manifest


def manifest_text(path: str = "some-org/some-model", dtype: str = "float32", batch: str = "1") -> str:
    return MANIFEST.format(path=path, dtype=dtype, batch=batch)


def one_line_error(result: Result, exit_code: int, *parts: str) -> str:
    """The result failed with ``exit_code`` and one short ``warmcache: error:`` line holding every part."""
    assert result.exit_code == exit_code, result.output
    assert "Traceback" not in result.output
    # e.g. --allow-unsigned's
    lines = [line for line in result.stderr.strip().splitlines() if not line.startswith("warmcache: warning: ")]
    assert len(lines) == 1 and lines[0].startswith("warmcache: error: "), result.stderr[:2000]
    assert len(lines[0]) < 1200, f"error line is {len(lines[0])} characters"
    for part in parts:
        assert part in lines[0], lines[0]
    return lines[0]


def plan(tmp_path: Path, manifest: Path) -> Result:
    return cli("plan", str(manifest), "--db", f"sqlite:///{tmp_path / 'reg.sqlite'}")


# ------------------------------------------------------------------ manifests


def test_a_path_component_over_255_bytes_is_a_manifest_error(tmp_path: Path) -> None:
    manifest = write(tmp_path, manifest_text(path="./" + "a" * 300 + "/model"))
    one_line_error(
        plan(tmp_path, manifest), 2, str(manifest), "model[0].path", "has a component of 300 bytes", "(308 characters)"
    )
    assert not (tmp_path / "reg.sqlite").exists()


def test_deeply_nested_arrays_are_refused_before_parsing(tmp_path: Path) -> None:
    manifest = write(tmp_path, manifest_text(batch="[" * 100_000 + "1" + "]" * 100_000))
    one_line_error(plan(tmp_path, manifest), 2, str(manifest), "nests 100001 levels deep")
    dotted = write(tmp_path, "a" + ".b" * 100_000 + " = 1\n" + manifest_text())
    one_line_error(plan(tmp_path, dotted), 2, "nests 100001 levels deep")
    # Each key within the nesting bound, thousands of them: tomllib would build a table per part for seconds.
    many = write(tmp_path, "\n".join(f"k{i}" + ".a" * 62 + " = 1" for i in range(1500)) + "\n" + manifest_text())
    one_line_error(plan(tmp_path, many), 2, str(many), "dotted keys (a.b.c = ...) joined by 93001 dots")
    assert not (tmp_path / "reg.sqlite").exists()


def test_manifest_text_from_anywhere_meets_the_same_bounds() -> None:
    """``manifest.loads``: the front door the CLI's file and the service's request body share."""
    from warmcache.errors import ManifestError
    from warmcache.manifest import loads

    assert loads(manifest_text(), "inline.toml").models[0].name == "m"
    for text, problem in (
        ("a = " + "[" * 100 + "]" * 100, "nests 100 levels deep"),
        (b"\xff", "cannot read manifest"),
        ("x" * (2 << 20), "larger than"),
    ):
        with pytest.raises(ManifestError, match=f"^inline.toml: .*{problem}"):
            loads(text, "inline.toml")


@pytest.mark.parametrize("value", [2**63, 2**31, 10**30])
def test_integers_the_registry_cannot_hold_fail_validation(tmp_path: Path, value: int) -> None:
    manifest = write(tmp_path, manifest_text(batch=str(value)))
    one_line_error(
        plan(tmp_path, manifest),
        2,
        "model[0].generate[0].batch_sizes[0]",
        f"{value} is larger than the registry can hold (2147483647)",
    )
    assert not (tmp_path / "reg.sqlite").exists()


def test_a_50_mb_value_is_refused_quickly_in_one_short_line(tmp_path: Path) -> None:
    manifest = write(tmp_path, manifest_text(dtype="x" * 50_000_000))
    started = time.perf_counter()
    result = plan(tmp_path, manifest)
    elapsed = time.perf_counter() - started
    one_line_error(result, 2, str(manifest), "larger than 1048576 bytes")
    assert elapsed < 10, f"{elapsed:.1f}s (it took 16.5 s when the value was parsed and echoed)"


def test_a_long_invalid_value_is_echoed_cut_with_its_length(tmp_path: Path) -> None:
    manifest = write(tmp_path, manifest_text(dtype="x" * 900_000))
    line = one_line_error(plan(tmp_path, manifest), 2, "model[0].dtype: unknown dtype 'xxxx", "(900000 characters)")
    assert line.count("x") < 300


# ------------------------------------------------------------------ model configs


def _model_with_config(tmp_path: Path, config: str) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(config)
    return write(
        tmp_path, manifest_text(path=str(folder)).replace('dtype = "float32"', 'dtype = "float32"\nbackend = "eager"')
    )


@pytest.mark.parametrize(
    ("config", "says"),
    [
        (
            '{"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 0}',
            "transformers cannot read its config: ZeroDivisionError",
        ),
        (
            '{"model_type": "llama", "x": ' + "[" * 100_000 + "]" * 100_000 + "}",
            "config.json nests 100001 levels deep; a model config needs at most 64",
        ),
        ('{"model_type": "llama", "x": "' + "a" * (5 << 20) + '"}', "config.json is larger than 4194304 bytes"),
    ],
    ids=["zero-heads", "nested-100k", "5-MiB"],
)
def test_a_hostile_model_config_is_one_line_for_every_command_that_reads_it(
    config: str, says: str, tmp_path: Path
) -> None:
    """A model's config.json is input like a manifest: read with the same bounds, never a traceback (plan, explain,
    warmup)."""
    manifest = _model_with_config(tmp_path, config)
    db = tmp_path / "reg.sqlite"
    assert cli("db", "upgrade", "--db", str(db)).exit_code == 0
    for command in ("plan", "explain", "warmup"):
        one_line_error(cli(command, str(manifest), "--db", str(db)), 2, says)


# ------------------------------------------------------------------ registry URLs


def test_db_upgrade_refuses_another_applications_database(tmp_path: Path) -> None:
    other = tmp_path / "other-app.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
    one_line_error(
        cli("db", "upgrade", "--db", f"sqlite:///{other}"),
        3,
        "other-app.db",
        "has tables but no warmcache schema revision ('customers')",
        "another application",
    )
    with sqlite3.connect(other) as conn:
        assert [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")] == ["customers"]


def test_a_bare_word_or_unknown_scheme_is_not_a_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    one_line_error(
        cli("shapes", "--db", "not-a-url"),
        2,
        "--db 'not-a-url' is neither a database URL nor a file path",
        "sqlite:///PATH",
        "postgresql://",
    )
    one_line_error(cli("shapes", "--db", "mysql://db/x"), 2, "unknown scheme 'mysql'", "postgresql://")
    assert list(tmp_path.iterdir()) == []
    # A path is still a path: named as the registry that is not there (a read creates none).
    one_line_error(
        cli("shapes", "--db", "./reg.sqlite"), 3, f"registry sqlite:///{tmp_path / 'reg.sqlite'} does not exist"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("postgresql://", "names no database"),
        ("postgresql://127.0.0.1:5432", "names no database"),
        ("postgres://user@db.example/", "names no database"),
        ("sqlite://", "names no database file"),
        ("sqlite:///:memory:", "names no database file"),
        ("sqlite://relative.db", "names no database file"),
    ],
)
def test_a_location_that_names_no_database_is_refused(
    url: str, says: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """libpq would fall back to the local socket and a database named after the user (where a read created warmcache's
    tables); SQLite would open an in-memory database that keeps nothing."""
    one_line_error(cli("shapes", "--db", url), 2, says, "postgresql://[USER@]HOST[:PORT]/DATABASE")
    monkeypatch.setenv("WARMCACHE_DB", url)
    one_line_error(cli("check", "--model", "m", "--batch", "1", "--seq", "8"), 2, f"$WARMCACHE_DB {url!r} {says}")


READ_ONLY_COMMANDS = {
    "shapes": ["shapes", "--json"],
    "check": ["check", "--model", "m", "--batch", "1", "--seq", "8"],
    "plan": ["plan", "{manifest}", "--json"],
    "explain": ["explain", "{manifest}"],
    "status": ["status", "{manifest}"],
    "misses": ["misses"],
    "guard export": ["guard", "export", "--model", "m", "--out", "{out}"],
    "db current": ["db", "current"],
}


@pytest.mark.parametrize("command", sorted(READ_ONLY_COMMANDS))
def test_a_read_only_command_creates_no_registry_anywhere(command: str, tmp_path: Path, write_manifest) -> None:
    """A missing file (and its folder), a file name beside system files, and the default registry: one line naming the
    path and the command that creates one; nothing is created."""
    manifest = write_manifest(
        "[[model]]\nname = 'm'\npath = '{qwen3}'\nbackend = "
        "'eager'\n[[model.generate]]\nbatch_sizes = [1]\nprompt_lengths = [8]\nmax_cache_len = "
        "16\n"
    )
    args = [a.format(manifest=manifest, out=tmp_path / "guard.json") for a in READ_ONLY_COMMANDS[command]]
    before = sorted(tmp_path.rglob("*"))
    for db in (tmp_path / "nonexistent" / "dir" / "reg.sqlite", tmp_path / "passwd.db", None):
        where = ["--db", str(db)] if db else []
        # the default, under the test's $XDG_CACHE_HOME
        shown = db or tmp_path / "xdg-cache" / "warmcache" / "registry.sqlite"
        one_line_error(
            cli(*args, *where),
            3,
            f"registry sqlite:///{shown} does not exist",
            f"warmcache db upgrade --db sqlite:///{shown}",
        )
    assert sorted(tmp_path.rglob("*")) == before


def test_serve_reads_a_missing_registry_as_unavailable_and_creates_none(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Readers get a plain 503 (the registry's location is not theirs to know); the server's log says what is wrong
    and how to fix it; nothing is created."""
    from test_service import call

    from warmcache.service import ServiceConfig
    from warmcache.service.server import running_server
    from warmcache.settings import RegistryLocation

    missing = tmp_path / "typo" / "reg.sqlite"
    with running_server(ServiceConfig(RegistryLocation.parse(str(missing)), refresh_interval=0.2)) as base:
        deadline = time.monotonic() + 15
        while "does not exist" not in caplog.text:
            assert time.monotonic() < deadline, caplog.text[-2000:]
            time.sleep(0.1)
        answer = call(f"{base}/readyz")
        assert answer[0] == 503 and answer[1]["error"]["message"] == "registry unavailable (this server's log says why)"
        assert "warmcache db upgrade --db" in caplog.text and str(missing) not in str(answer)
    assert not missing.parent.exists()


@pytest.mark.postgres
def test_a_search_path_naming_no_schema_says_which_and_how_to_create_it(postgres_url: str) -> None:
    missing = postgres_url.replace("search_path%3D", "search_path%3Dnope_")
    for args in (["shapes"], ["db", "upgrade"], ["db", "current"]):
        one_line_error(
            cli(*args, "--db", missing), 3, "names no schema that exists in this database", 'CREATE SCHEMA "nope_'
        )
    one_line_error(cli("shapes", "--db", postgres_url), 3, "holds no warmcache schema", "warmcache db upgrade --db")
    import sqlalchemy as sa

    engine = sa.create_engine(postgres_url)
    try:
        assert sa.inspect(engine).get_table_names() == []  # the reads created nothing
    finally:
        engine.dispose()


def test_an_empty_db_is_an_error_not_the_default_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    one_line_error(cli("shapes", "--db", ""), 2, "--db is empty", "sqlite:///PATH")
    monkeypatch.setenv("WARMCACHE_DB", "")
    one_line_error(cli("shapes"), 2, "$WARMCACHE_DB is empty")
    assert not (tmp_path / "xdg-cache").exists()  # the default registry was not created


# ------------------------------------------------------------------ bundles


def test_a_refused_unpack_leaves_no_registry_file(tmp_path: Path) -> None:
    db, target = tmp_path / "prod.sqlite", tmp_path / "cache"
    one_line_error(
        cli("bundle", "unpack", str(tmp_path / "missing.tar"), "--cache-dir", str(target), "--db", f"sqlite:///{db}"),
        2,
        "bundle not found",
    )
    one_line_error(
        cli("bundle", "unpack", str(tmp_path / "missing.tar"), "--cache-dir", str(target)), 2, "bundle not found"
    )
    assert list(tmp_path.iterdir()) == []  # no registry (given or default), no cache folder


def unpack(bundle: Path, tmp_path: Path, *args: str) -> Result:
    return cli(
        "bundle",
        "unpack",
        str(bundle),
        "--cache-dir",
        str(tmp_path / "prod"),
        "--db",
        f"sqlite:///{tmp_path / 'prod.sqlite'}",
        "--allow-unsigned",
        *args,
    )


def nothing_written(tmp_path: Path) -> bool:
    return not (tmp_path / "prod").exists() and not (tmp_path / "prod.sqlite").exists()


def _replace_meta(members: list, blob: bytes) -> None:
    info, _ = members[0]
    info.size = len(blob)
    members[0] = (info, blob)


def test_metadata_nested_200000_deep_is_refused_before_parsing(built: Built, tmp_path: Path) -> None:
    good = tmp_path / "good.tar"
    assert pack(built, good).exit_code == 0
    deep = b'{"format": 1, "flavor": "neuron", "rows": ' + b"[" * 200_000 + b"]" * 200_000 + b', "files": []}'
    bad = rebuild(good, tmp_path / "bad.tar", lambda t, m: _replace_meta(m, deep))
    one_line_error(unpack(bad, tmp_path), 5, f"{bad}: warmcache-bundle.json: nests 200001 levels deep")
    assert nothing_written(tmp_path)


def test_a_row_value_the_registry_cannot_hold_is_refused_before_writing(built: Built, tmp_path: Path) -> None:
    good = tmp_path / "good.tar"
    assert pack(built, good).exit_code == 0
    bad = rebuild(good, tmp_path / "bad.tar", lambda t, m: _edit_meta(m, _set("batch_size", 10**30)))
    one_line_error(
        unpack(bad, tmp_path),
        5,
        "rows[1].batch_size is 1000000000000000000000000000000, outside what the registry holds",
    )
    assert nothing_written(tmp_path)


#: sha256 of 1 GiB of zero bytes: the huge member below is a hole in a sparse file, so it reads as zeros.
GIB_OF_ZEROS_SHA256 = "49bc20df15e412a64472421e13fe86ff1c5165e18b2afccf160d4dc19fe68a14"


def _with_huge_member(good: Path, out: Path, size: int) -> Path:
    """A bundle that lists one more file of ``size`` zero bytes, stored as a hole (a sparse file costs no disk)."""
    with tarfile.open(good) as tar:
        members = [(m, tar.extractfile(m).read() if m.isfile() else None) for m in tar.getmembers()]  # type: ignore[union-attr]
    first_file = next(m.name for m, _ in members[1:] if m.isfile())
    name = first_file.rsplit("/", 1)[0] + "/huge.bin"
    _edit_meta(
        members,
        lambda meta: meta["files"].append({"path": name[len("cache/") :], "sha256": GIB_OF_ZEROS_SHA256, "size": size}),
    )
    with open(out, "wb") as raw:
        with tarfile.open(fileobj=raw, mode="w") as tar:
            for info, data in members:
                tar.addfile(info, io.BytesIO(data) if data is not None else None)
            end = tar.offset
        raw.seek(end)  # over the end-of-archive blocks
        raw.truncate()
        huge = tarfile.TarInfo(name)
        huge.size = size
        raw.write(huge.tobuf())
        raw.seek(raw.tell() + size)  # the data: a hole
        raw.write(bytes(2 * tarfile.BLOCKSIZE))
    return out


def test_a_bundle_over_the_size_limit_is_refused_before_extraction(
    built: Built, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    good = tmp_path / "good.tar"
    assert pack(built, good).exit_code == 0
    gib = _with_huge_member(good, tmp_path / "gib.tar", 1024**3)
    one_line_error(
        unpack(gib, tmp_path, "--max-size", "512M"), 5, "more than the unpack limit of 512.0 MiB", "--max-size"
    )
    monkeypatch.setenv("WARMCACHE_MAX_UNPACK_SIZE", "100M")
    one_line_error(unpack(gib, tmp_path), 5, "more than the unpack limit of 100.0 MiB")
    monkeypatch.delenv("WARMCACHE_MAX_UNPACK_SIZE")
    huge = _with_huge_member(good, tmp_path / "huge.tar", 100 * 1024**3)
    one_line_error(unpack(huge, tmp_path), 5, "more than the unpack limit of 64.0 GiB")  # the default
    assert nothing_written(tmp_path)


def test_a_wrong_hash_member_is_refused_before_any_file_is_written(
    built: Built, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    good = tmp_path / "good.tar"
    assert pack(built, good).exit_code == 0

    def flip_last(t: tarfile.TarFile, members: list) -> None:
        info, data = members[-1]
        members[-1] = (info, bytes([data[0] ^ 1]) + data[1:])

    bad = rebuild(good, tmp_path / "bad.tar", flip_last)
    written: list[str] = []
    import warmcache.shipping.unbundle as unbundle

    real = unbundle._extract_checked
    monkeypatch.setattr(
        unbundle,
        "_extract_checked",
        lambda tar, member, expected, target: written.append(member.name) or real(tar, member, expected, target),
    )
    one_line_error(unpack(bad, tmp_path), 5, "content does not match the listed sha256 and size")
    assert written == [] and nothing_written(tmp_path)
