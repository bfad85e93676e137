"""bundle pack/unpack on hand-built Neuron caches: round trip, idempotence, toolchains, hostile archives."""

from __future__ import annotations

import errno
import hashlib
import io
import json
import shutil
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import Result
from test_cache_neuron import NEURON_MANIFEST, cli, done_files, module, planned_by_batch, record_compiled

import warmcache.shipping.bundle as bundle_module
from warmcache.registry import Registry
from warmcache.registry.usability import local_toolchain_hash


@dataclass(frozen=True)
class Built:
    manifest: Path
    root: Path
    url: str
    entries: list[str]


@pytest.fixture
def built(tmp_path: Path, write_manifest) -> Built:
    """A build machine: two compiled shapes with their Neuron entries, one declared shape not compiled."""
    manifest = write_manifest(NEURON_MANIFEST)
    root = tmp_path / "build-cache"
    url = f"sqlite:///{tmp_path / 'build.sqlite'}"
    entries = [module(root, "aaa+f1", done_files(5000)), module(root, "bbb+f1", done_files(7000))]
    module(root, "unrelated+f1", done_files(100))
    planned = planned_by_batch(manifest)
    record_compiled(url, planned[1], [entries[0]])
    record_compiled(url, planned[2], [entries[1]])
    return Built(manifest, root, url, entries)


def pack(built: Built, output: Path) -> Result:
    return cli(
        "bundle", "pack", str(built.manifest), "-o", str(output), "--cache-dir", str(built.root), "--db", built.url
    )


def error_lines(result: Result) -> list[str]:
    """stderr without warning lines (``--allow-unsigned`` says it installs unverified code)."""
    return [line for line in result.stderr.strip().splitlines() if not line.startswith("warmcache: warning: ")]


def files_under(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def rows(url: str) -> list[tuple]:
    with Registry.open(url) as registry:
        return [
            (r.identity, r.status, r.updated_at, tuple(sorted(a.path for a in r.artifacts)))
            for r in registry.rows(with_artifacts=True)
        ]


def production_with_a_failed_entry(built: Built, tmp_path: Path) -> tuple[Path, str]:
    """A production cache holding a failed compile of the bundle's first entry (which an unpack replaces), and its
    registry URL."""
    target = tmp_path / "prod"
    broken = target / built.entries[0]
    broken.mkdir(parents=True)
    (broken / "model.log").write_text("ERROR: compilation failed\n")
    return target, f"sqlite:///{tmp_path / 'prod.sqlite'}"


def test_pack_then_unpack_installs_exactly_the_needed_entries_and_rows(
    built: Built, tmp_path: Path, registry_url: str
) -> None:
    bundle = tmp_path / "warm.tar.gz"
    packed = pack(built, bundle)
    assert packed.exit_code == 0, packed.output
    assert (
        "2 compiled shapes, 2 cache entries, 8 files" in packed.output
        and "1 declared shapes are not in the bundle (not compiled)" in packed.output
    )
    with tarfile.open(bundle) as tar:
        meta = json.load(tar.extractfile(tar.getmembers()[0]))  # type: ignore[arg-type]
        names = tar.getnames()
    assert names[0] == "warmcache-bundle.json" and not any("unrelated" in n for n in names)
    assert sorted(f["path"] for f in meta["files"]) == sorted(n[len("cache/") :] for n in names[1:])
    assert all(len(f["sha256"]) == 64 for f in meta["files"]) and len(meta["rows"]) == 2 and meta["toolchains"]

    target = tmp_path / "prod-cache"
    first = cli(
        "bundle", "unpack", "--allow-unsigned", str(bundle), "--cache-dir", str(target), "--db", registry_url, "--json"
    )
    assert first.exit_code == 0, first.output
    result = json.loads(first.stdout)
    assert (result["entries_added"], result["rows"]["inserted"]) == (2, 2)
    expected = {k: v for k, v in files_under(built.root).items() if "unrelated" not in k}
    assert files_under(target) == expected  # exactly the referenced entries, byte for byte; no staging left
    plan = json.loads(cli("plan", str(built.manifest), "--db", registry_url, "--json").stdout)
    assert sorted(i["status"] for i in plan) == ["compiled", "compiled", "missing"]
    after_first = rows(registry_url)
    assert [r[3] for r in after_first] == [(built.entries[0],), (built.entries[1],)]

    second = json.loads(
        cli(
            "bundle",
            "unpack",
            "--allow-unsigned",
            str(bundle),
            "--cache-dir",
            str(target),
            "--db",
            registry_url,
            "--json",
        ).stdout
    )
    assert (second["entries_added"], second["entries_already_present"]) == (0, 2)
    assert (second["rows"]["inserted"], second["rows"]["updated"], second["rows"]["unchanged"]) == (0, 0, 2)
    assert rows(registry_url) == after_first and files_under(target) == expected


def test_pack_verified_only_ships_only_what_verify_proved(built: Built, tmp_path: Path) -> None:
    args = ("bundle", "pack", str(built.manifest), "--cache-dir", str(built.root), "--db", built.url, "--verified-only")
    none = cli(*args, "-o", str(tmp_path / "none.tar"))
    assert none.exit_code == 5 and "no verified shapes" in none.stderr and "warmcache verify" in none.stderr
    with Registry.open(built.url) as registry:
        registry.mark_verified([planned_by_batch(built.manifest)[2].identity])
    packed = cli(*args, "-o", str(tmp_path / "v.tar"), "--json")
    assert packed.exit_code == 0, packed.output
    assert (json.loads(packed.stdout)["rows"], json.loads(packed.stdout)["entries"]) == (1, 1)
    with tarfile.open(tmp_path / "v.tar") as tar:
        assert {n.split("/")[2] for n in tar.getnames()[1:]} == {built.entries[1].split("/")[1]}


def test_unpack_replaces_a_broken_local_entry_and_completes_a_pending_row(built: Built, tmp_path: Path) -> None:
    bundle = tmp_path / "warm.tar"
    assert pack(built, bundle).exit_code == 0
    target, url = production_with_a_failed_entry(built, tmp_path)
    with Registry.open(url) as registry:
        registry.ensure_pending([planned_by_batch(built.manifest)[1]])
    result = json.loads(
        cli(
            "bundle", "unpack", "--allow-unsigned", str(bundle), "--cache-dir", str(target), "--db", url, "--json"
        ).stdout
    )
    assert (result["entries_added"], result["entries_replaced"]) == (1, 1)
    assert (result["rows"]["inserted"], result["rows"]["updated"]) == (1, 1)
    broken = target / built.entries[0]
    assert not (broken / "model.log").exists() and (broken / "model.done").exists()
    assert {r[1] for r in rows(url)} == {"compiled"}


def test_pack_refuses_a_row_whose_entry_is_gone_and_a_manifest_with_nothing_compiled(
    built: Built, tmp_path: Path, write_manifest
) -> None:
    shutil.rmtree(built.root / built.entries[1])
    gone = pack(built, tmp_path / "b.tar.gz")
    assert gone.exit_code == 5 and "is gone" in gone.stderr and "cache doctor" in gone.stderr
    assert not (tmp_path / "b.tar.gz").exists() and not list(tmp_path.glob(".b.tar.gz.partial*"))
    Registry.open(f"sqlite:///{tmp_path / 'empty.sqlite'}").close()
    empty = cli(
        "bundle",
        "pack",
        str(built.manifest),
        "-o",
        str(tmp_path / "e.tar"),
        "--cache-dir",
        str(built.root),
        "--db",
        f"sqlite:///{tmp_path / 'empty.sqlite'}",
    )
    assert empty.exit_code == 5 and "no compiled shapes" in empty.stderr
    missing = cli(
        "bundle",
        "pack",
        str(built.manifest),
        "-o",
        str(tmp_path / "e.tar"),
        "--cache-dir",
        str(built.root),
        "--db",
        f"sqlite:///{tmp_path / 'typo.sqlite'}",
    )
    # packing only reads
    assert missing.exit_code == 3 and "does not exist" in missing.stderr and not (tmp_path / "typo.sqlite").exists()
    suffix = pack(built, tmp_path / "b.zip")
    assert suffix.exit_code == 2 and "*.tar" in suffix.stderr


@pytest.fixture
def fresh_toolchain() -> Iterator[None]:
    """The toolchain fingerprint is memoised per process; a test that changes it must not leak."""
    local_toolchain_hash.cache_clear()
    yield
    local_toolchain_hash.cache_clear()


def test_unpack_refuses_another_toolchain_unless_forced(
    built: Built, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_toolchain: None
) -> None:
    bundle = tmp_path / "warm.tar.gz"
    assert pack(built, bundle).exit_code == 0
    monkeypatch.setenv("NEURON_CC_FLAGS", "--model-type=transformer -O3")  # this machine compiles differently
    local_toolchain_hash.cache_clear()
    target, url = tmp_path / "prod", f"sqlite:///{tmp_path / 'prod.sqlite'}"
    refused = cli("bundle", "unpack", "--allow-unsigned", str(bundle), "--cache-dir", str(target), "--db", url)
    assert refused.exit_code == 5, refused.output
    assert (
        "another toolchain" in refused.stderr
        and "neuron_cc_flags: bundle , here --model-type=transformer -O3" in refused.stderr
    )
    assert "--force" in refused.stderr and not target.exists() and rows(url) == []
    forced = cli(
        "bundle", "unpack", "--allow-unsigned", str(bundle), "--cache-dir", str(target), "--db", url, "--force"
    )
    assert forced.exit_code == 0, forced.output
    assert len(rows(url)) == 2
    shapes = json.loads(cli("shapes", "--db", url, "--json").stdout)
    assert {s["status"] for s in shapes} == {"stale"}


# ------------------------------------------------------------- hostile archives


def rebuild(
    good: Path, out: Path, change: Callable[[tarfile.TarFile, list[tuple[tarfile.TarInfo, bytes | None]]], None]
) -> Path:
    """Copy a good bundle member by member, letting ``change`` edit the list first."""
    with tarfile.open(good) as tar:
        members = [(m, tar.extractfile(m).read() if m.isfile() else None) for m in tar.getmembers()]  # type: ignore[union-attr]
        change(tar, members)
    with tarfile.open(out, "w") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return out


def _add(
    members: list, name: str, kind: bytes = tarfile.REGTYPE, data: bytes | None = b"evil\n", link: str = ""
) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    info.size = len(data) if kind == tarfile.REGTYPE and data is not None else 0
    members.append((info, data if kind == tarfile.REGTYPE else None))


def _listed(members: list, name: str, data: bytes = b"evil\n") -> None:
    """Add ``name`` and list it in the metadata with a correct hash, so only the path check can stop it."""
    meta_info, blob = members[0]
    meta = json.loads(blob)
    meta["files"].append(
        {
            "path": name[len("cache/") :] if name.startswith("cache/") else name,
            "sha256": hashlib.sha256(data).hexdigest(),
            "size": len(data),
        }
    )
    blob = json.dumps(meta).encode()
    meta_info.size = len(blob)
    members[0] = (meta_info, blob)
    _add(members, name, data=data)


def _grow_first_file(members: list) -> None:
    """A member far larger than the file list says (a decompression bomb's shape)."""
    info, data = members[1]
    info.size = len(data) * 1000
    members[1] = (info, data * 1000)


def _flip_first_file_byte(members: list) -> None:
    info, data = members[1]
    members[1] = (info, bytes([data[0] ^ 0x01]) + data[1:])


HOSTILE: dict[str, tuple[Callable[[tarfile.TarFile, list], None], str]] = {
    "path traversal": (lambda t, m: _listed(m, "cache/../../evil"), "climbs out of the cache with '..'"),
    "absolute path": (lambda t, m: _add(m, "/tmp/warmcache-evil"), "is an absolute path"),
    "symlink": (
        lambda t, m: _add(m, "cache/neuronxcc-1/MODULE_x/model.neff", tarfile.SYMTYPE, None, "/etc/passwd"),
        "is a link (to '/etc/passwd')",
    ),
    "hard link": (
        lambda t, m: _add(m, "cache/neuronxcc-1/MODULE_x/model.neff", tarfile.LNKTYPE, None, "/etc/passwd"),
        "is a link",
    ),
    "device file": (
        lambda t, m: _add(m, "cache/neuronxcc-1/MODULE_x/null", tarfile.CHRTYPE, None),
        "is a device or FIFO",
    ),
    "unlisted file": (
        lambda t, m: _add(m, "cache/neuronxcc-1/MODULE_x/model.neff"),
        "is not in the bundle's file list",
    ),
    "flipped byte": (lambda t, m: _flip_first_file_byte(m), "content does not match the listed sha256 and size"),
    "listed file missing": (lambda t, m: m.pop(), "but the bundle lacks it"),
    "member larger than listed": (lambda t, m: _grow_first_file(m), "but the file list says"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_bundles_are_refused_and_write_nothing(built: Built, tmp_path: Path, case: str) -> None:
    good = tmp_path / "good.tar"
    assert pack(built, good).exit_code == 0
    change, message = HOSTILE[case]
    bad = rebuild(good, tmp_path / "bad.tar", change)
    target, url = tmp_path / "sandbox" / "cache", f"sqlite:///{tmp_path / 'prod.sqlite'}"
    before = {p for p in tmp_path.rglob("*")} | set(Path("/tmp").glob("warmcache-evil*"))
    result = cli("bundle", "unpack", "--allow-unsigned", str(bad), "--cache-dir", str(target), "--db", url)
    assert result.exit_code == 5, result.output
    assert (
        message in result.stderr
        and error_lines(result) == [error_lines(result)[0]]
        and error_lines(result)[0].startswith("warmcache: error: ")
    )
    assert not target.exists()  # not even a staging folder is left behind
    assert {p for p in tmp_path.rglob("*")} | set(
        Path("/tmp").glob("warmcache-evil*")
    ) == before  # no registry file either


def test_a_truncated_compressed_bundle_is_refused(built: Built, tmp_path: Path) -> None:
    good = tmp_path / "good.tar.gz"
    assert pack(built, good).exit_code == 0
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    result = cli(
        "bundle",
        "unpack",
        "--allow-unsigned",
        str(bad),
        "--cache-dir",
        str(tmp_path / "cache"),
        "--db",
        f"sqlite:///{tmp_path / 'p.sqlite'}",
    )
    assert result.exit_code == 5 and "not a readable bundle archive" in result.stderr
    assert not (tmp_path / "cache").exists()


def test_a_bundle_of_another_layout_is_refused_before_touching_the_cache(built: Built, tmp_path: Path) -> None:
    bundle = tmp_path / "neuron.tar"
    assert pack(built, bundle).exit_code == 0
    inductor_cache = tmp_path / "inductor-cache"
    (inductor_cache / "aotautograd" / "akey").mkdir(parents=True)
    (inductor_cache / "aotautograd" / "akey" / "entry").write_bytes(b"compiled")
    before = files_under(inductor_cache)
    result = cli(
        "bundle",
        "unpack",
        "--allow-unsigned",
        str(bundle),
        "--cache-dir",
        str(inductor_cache),
        "--db",
        f"sqlite:///{tmp_path / 'p.sqlite'}",
    )
    assert result.exit_code == 5 and "holds a cache of layout inductor; refused" in result.stderr
    assert files_under(inductor_cache) == before


# ------------------------------------------------- malformed rows, atomic install


def _edit_meta(members: list, edit: Callable[[dict], None]) -> None:
    meta_info, blob = members[0]
    meta = json.loads(blob)
    edit(meta)
    blob = json.dumps(meta).encode()
    meta_info.size = len(blob)
    members[0] = (meta_info, blob)


def _set(field: str, value: object, artifact: bool = False) -> Callable[[dict], None]:
    """Set ``field`` of the last row (or of its first artifact): rows are merged after the first entry moved."""

    def edit(meta: dict) -> None:
        (meta["rows"][-1]["artifacts"][0] if artifact else meta["rows"][-1])[field] = value

    return edit


MALFORMED_ROWS: dict[str, tuple[Callable[[dict], None], str]] = {
    "artifact kind not a string": (_set("kind", 5, artifact=True), "rows[1].artifacts[0].kind is 5, not a string"),
    "artifact path not a string": (
        _set("path", ["x"], artifact=True),
        "rows[1].artifacts[0].path is ['x'], not a string",
    ),
    "batch size a string": (_set("batch_size", "2"), "rows[1].batch_size is '2', not an integer"),
    "attempts a boolean": (_set("attempts", True), "rows[1].attempts is True, not an integer"),
    "toolchain not an object": (_set("toolchain", []), "rows[1].toolchain is [], not an object"),
    # the platform its code is for claims the folder (platform_mark); hypothesis found it unread before
    "toolchain without platform": (_set("toolchain", {}), "rows[1].toolchain.platform is None, not a string"),
    "unknown device": (_set("device", "tpu"), "rows[1].device is 'tpu', which no target compiles for"),
    "settings missing": (_set("settings", None), "rows[1].settings is None, not an object"),
    "bad timestamp": (_set("compiled_at", "yesterday"), "rows[1].compiled_at 'yesterday' is not an ISO timestamp"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED_ROWS))
def test_malformed_rows_are_refused_before_any_entry_moves(built: Built, tmp_path: Path, case: str) -> None:
    good = tmp_path / "good.tar"
    assert pack(built, good).exit_code == 0
    edit, message = MALFORMED_ROWS[case]
    bad = rebuild(good, tmp_path / "bad.tar", lambda t, m: _edit_meta(m, edit))
    target, url = production_with_a_failed_entry(built, tmp_path)
    result = cli("bundle", "unpack", "--allow-unsigned", str(bad), "--cache-dir", str(target), "--db", url)
    assert result.exit_code == 5, result.output
    [line] = error_lines(result)
    assert line.startswith(f"warmcache: error: {bad}: warmcache-bundle.json: ")
    assert message in result.stderr
    assert files_under(target) == {f"{built.entries[0]}/model.log": b"ERROR: compilation failed\n"}
    assert [p.name for p in target.iterdir()] == [built.entries[0].split("/")[0]] and rows(url) == []


def test_a_failed_row_merge_puts_the_originals_back(
    built: Built, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle = tmp_path / "warm.tar"
    assert pack(built, bundle).exit_code == 0
    target, url = production_with_a_failed_entry(built, tmp_path)
    before = {p.relative_to(target) for p in target.rglob("*")}

    def database_gone(*args: object, **kwargs: object) -> None:
        from warmcache.errors import CacheError

        raise CacheError("registry: the database went away")

    monkeypatch.setattr("warmcache.shipping.install.merge_rows", database_gone)
    result = cli("bundle", "unpack", "--allow-unsigned", str(bundle), "--cache-dir", str(target), "--db", url)
    assert result.exit_code == 5 and "the database went away" in result.stderr
    assert {
        p.relative_to(target) for p in target.rglob("*")
    } == before  # the added entry is gone, the original back, no work folder left
    assert (target / built.entries[0] / "model.log").read_text() == "ERROR: compilation failed\n"


def _as_native(members: list, names: dict[str, str]) -> None:
    """Turn a Neuron bundle into a neuron-native one whose entries are named ``names[old entry]``."""

    def rename(path: str) -> str:
        entry = "/".join(path.split("/")[:2])
        return names[entry] + path[len(entry) :]

    def edit(meta: dict) -> None:
        meta["flavor"] = "neuron-native"
        for f in meta["files"]:
            f["path"] = rename(f["path"])
        for row in meta["rows"]:
            row["artifacts"] = [{**a, "kind": "neuron-neff", "path": rename(a["path"])} for a in row["artifacts"]]

    _edit_meta(members, edit)
    files = [(info, data) for info, data in members[1:] if info.isfile()]
    for info, _ in files:
        info.name = "cache/" + rename(info.name[len("cache/") :])
    members[1:] = files


def test_a_native_entry_named_like_a_work_folder_is_installed_as_is(built: Built, tmp_path: Path) -> None:
    good = tmp_path / "good.tar"
    assert pack(built, good).exit_code == 0
    native = rebuild(
        good,
        tmp_path / "native.tar",
        lambda t, m: _as_native(m, {built.entries[0]: ".replaced", built.entries[1]: "mod-b"}),
    )
    target = tmp_path / "native-cache"
    for entry, data in ((".replaced", b"old neff"), ("keep", b"unrelated neff")):
        (target / entry).mkdir(parents=True)
        (target / entry / "model.neff").write_bytes(data)
    result = cli(
        "bundle",
        "unpack",
        "--allow-unsigned",
        str(native),
        "--cache-dir",
        str(target),
        "--db",
        f"sqlite:///{tmp_path / 'p.sqlite'}",
        "--json",
    )
    assert result.exit_code == 0, result.output
    assert (json.loads(result.stdout)["entries_added"], json.loads(result.stdout)["entries_replaced"]) == (1, 1)
    source = files_under(built.root / built.entries[0])
    assert files_under(target / ".replaced") == source  # the bundle's entry, not the original parked inside it
    assert files_under(target / "keep") == {"model.neff": b"unrelated neff"}
    assert sorted(p.name for p in target.iterdir()) == [".replaced", "keep", "mod-b"]


# ------------------------------------------------------- file-system errors in pack


def _disk_full(monkeypatch: pytest.MonkeyPatch, built: Built) -> None:
    def full(self: tarfile.TarFile, *args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tarfile.TarFile, "addfile", full)


def _vanishes(monkeypatch: pytest.MonkeyPatch, built: Built) -> None:
    """A cache file deleted between listing and hashing (a concurrent prune)."""
    original = bundle_module.sha256_of

    def hash_after_delete(path: Path) -> str:
        path.unlink()
        return original(path)

    monkeypatch.setattr(bundle_module, "sha256_of", hash_after_delete)


def _shrinks(monkeypatch: pytest.MonkeyPatch, built: Built) -> None:
    """A cache file truncated after it was hashed, before it is copied into the archive."""
    original = bundle_module.open_quietly
    opened: set[Path] = set()

    def open_after_truncate(path: Path):  # type: ignore[no-untyped-def]
        if path.name == "model.neff" and path in opened:  # opened once to hash, now to copy
            path.write_bytes(b"")
        opened.add(path)
        return original(path)

    monkeypatch.setattr(bundle_module, "open_quietly", open_after_truncate)


PACK_FS_ERRORS: dict[str, tuple[Callable[[pytest.MonkeyPatch, Built], None], str]] = {
    "disk full": (_disk_full, "warm.tar: No space left on device; bundle not written"),
    "file vanishes": (_vanishes, "compile_flags.json: No such file or directory; bundle not written"),
    "file shrinks": (_shrinks, "model.neff: changed while being packed"),
}


@pytest.mark.parametrize("case", sorted(PACK_FS_ERRORS))
def test_file_system_errors_during_pack_are_one_line_errors(
    built: Built, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    cause, message = PACK_FS_ERRORS[case]
    cause(monkeypatch, built)
    result = pack(built, tmp_path / "warm.tar")
    assert result.exit_code == 5, result.output
    *progress, error = result.stderr.strip().splitlines()  # progress lines, then one error line
    assert (
        error.startswith("warmcache: error: ")
        and message in error
        and all(line.startswith("packing: ") for line in progress)
    )
    assert not (tmp_path / "warm.tar").exists() and not list(tmp_path.glob(".warm.tar.partial*"))


def test_pack_into_an_unwritable_place_names_it(built: Built, tmp_path: Path) -> None:
    (tmp_path / "not-a-folder").write_text("")
    result = pack(built, tmp_path / "not-a-folder" / "warm.tar")
    assert result.exit_code == 5, result.output
    assert (
        result.stderr.startswith(f"warmcache: error: {tmp_path / 'not-a-folder'}: ")
        and len(result.stderr.strip().splitlines()) == 1
    )
    assert result.stderr.strip().endswith("; bundle not written")
