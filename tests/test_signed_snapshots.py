"""Signed guard snapshots: rows name precompiled code, so only rows a trusted key signed may load it (no compiles here).

The end-to-end proof, a ``.so`` whose constructor writes a file and is never loaded, is in
``tests/test_aotinductor.py`` (it needs a real package).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_cli_query import _compile_all  # the registry's real claim → mark_compiled path
from test_guard import MANIFEST

from warmcache.artifacts.aot_compile import AOT_COMPILE
from warmcache.artifacts.aotinductor import AOTINDUCTOR
from warmcache.artifacts.trust import ArtifactTrust
from warmcache.cli import main
from warmcache.errors import TrustError, UsageError
from warmcache.registry.records import ArtifactRef
from warmcache.runtime.guard import ShapeGuard
from warmcache.runtime.snapshot import SNAPSHOT_FILE, verify_snapshot
from warmcache.trust import TrustedKeys, generate_key

SHA = "ab" * 32


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, Path]:
    """Public key files of two key pairs, ``ours`` and ``theirs``; the private key is the same path without ``.pub``."""
    (tmp_path / "keys").mkdir()
    for name in ("ours", "theirs"):
        generate_key(tmp_path / "keys" / name)
    return {name: tmp_path / "keys" / f"{name}.pub" for name in ("ours", "theirs")}


@pytest.fixture
def registry(tmp_path: Path, write_manifest) -> str:
    url = f"sqlite:///{tmp_path / 'registry.sqlite'}"
    _compile_all(url, write_manifest(MANIFEST))
    return url


def export(registry: str, out: Path, key: Path | None = None) -> dict[str, object]:
    sign = ["--sign", str(key.with_suffix(""))] if key else []
    result = CliRunner().invoke(
        main, ["guard", "export", "--model", "m", "--out", str(out), "--db", registry, "--json", *sign]
    )
    assert result.exit_code == 0, result.output
    return dict(json.loads(result.output))


def test_a_signed_snapshot_is_verified_and_every_other_is_refused(
    registry: str, keys: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    signed, unsigned = tmp_path / "signed.json", tmp_path / "unsigned.json"
    assert (
        export(registry, signed, keys["ours"])["signed_by"] == TrustedKeys.load([str(keys["ours"])], "t").keys[0].key_id
    )
    assert export(registry, unsigned)["signed_by"] is None

    guard = ShapeGuard.from_snapshot(signed, "m", trust=[str(keys["ours"])])
    assert guard.buckets == ShapeGuard.from_registry(registry, "m", telemetry=False).buckets
    assert guard.artifact_trust.signed_by and "trust=" in guard.artifact_trust.signed_by
    monkeypatch.setenv("WARMCACHE_TRUSTED_KEYS", str(keys["ours"]))  # the default trust source
    assert ShapeGuard.from_snapshot(signed, "m").artifact_trust.signed_by

    refusals = {
        "unsigned": (unsigned, keys["ours"], "unsigned, but trusted keys are configured"),
        "theirs": (signed, keys["theirs"], "which is not trusted"),
    }
    altered = json.loads(signed.read_text())
    altered["records"][0]["cache_root"] = "/tmp/elsewhere"
    (tmp_path / "altered.json").write_text(json.dumps(altered))
    refusals["altered"] = (tmp_path / "altered.json", keys["ours"], "altered after signing")
    for name, (path, key, message) in refusals.items():
        with pytest.raises(TrustError, match=message) as refused:
            ShapeGuard.from_snapshot(path, "m", trust=[str(key)])
        assert str(path) in str(refused.value) and "\n" not in str(refused.value), name


def test_verify_snapshot_takes_a_folder_and_refuses_without_keys_unless_allowed(
    registry: str, keys: dict[str, Path], tmp_path: Path
) -> None:
    folder = tmp_path / "shipped"
    folder.mkdir()
    assert export(registry, folder, keys["ours"])["path"] == str(folder / SNAPSHOT_FILE)
    verified = verify_snapshot(folder, TrustedKeys.load([str(keys["ours"])], "test"))
    assert verified.signature.checked and len(verified.records) == 7
    with pytest.raises(TrustError, match="no trusted keys configured") as refused:
        verify_snapshot(folder, TrustedKeys())
    assert str(folder / SNAPSHOT_FILE) in str(refused.value)
    assert not verify_snapshot(folder, TrustedKeys(), allow_unsigned=True).signature.checked
    # A folder is also where the snapshot's artifacts load from.
    guard = ShapeGuard.from_snapshot(folder, "m", trust=[str(keys["ours"])])
    assert guard.artifact_trust.root(guard.records[0], None) == folder


def test_rows_of_an_unverified_snapshot_name_no_code_that_loads(tmp_path: Path) -> None:
    unverified = ArtifactTrust("guard.json", signed_by="")
    with pytest.raises(TrustError, match="guard snapshot not verified .* allow_unsigned=True") as refused:
        unverified.require_trusted_rows()
    assert "\n" not in str(refused.value)
    ArtifactTrust("guard.json", signed_by="", allow_unsigned=True).require_trusted_rows()
    ArtifactTrust.registry("sqlite:///r.sqlite").require_trusted_rows()


def test_a_snapshot_row_never_chooses_the_folder_code_loads_from(
    registry: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    compiled = ShapeGuard.from_registry(registry, "m", telemetry=False).records[0]
    row = dataclasses.replace(
        compiled, cache_root="/tmp/attacker", artifacts=(ArtifactRef("aotinductor", f"aotinductor/{SHA}", 1),)
    )
    assert ArtifactTrust.registry("db").root(row, None) == Path("/tmp/attacker")  # warmup on the fleet wrote it
    monkeypatch.setenv("WARMCACHE_CACHE_DIR", str(tmp_path / "cache"))
    snapshot = ArtifactTrust("guard.json", signed_by="key")
    assert snapshot.root(row, None) == (tmp_path / "cache").resolve()
    monkeypatch.delenv("WARMCACHE_CACHE_DIR")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    assert snapshot.root(row, None) == tmp_path / "inductor"
    assert snapshot.root(row, tmp_path / "given") == tmp_path / "given"


@pytest.mark.parametrize(
    "entry",
    [
        f"aotinductor/../../evil/{SHA}",
        f"/tmp/aotinductor/{SHA}",
        "aotinductor/.partial",
        f"fxgraph/ab/{SHA}",
        "aotinductor/short",
        f"precompiled/{SHA}",  # another route's folder: the row's recorded kind decides, not the folder
    ],
)
def test_an_artifact_entry_outside_the_layout_is_refused(entry: str, tmp_path: Path) -> None:
    with pytest.raises(TrustError, match="is not a <sha256> file of aotinductor/, where its recorded kind aotinductor"):
        ArtifactTrust("guard.json", signed_by="key").confined(tmp_path, entry, AOTINDUCTOR)


def test_an_artifact_linked_out_of_the_cache_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "evil").mkdir()
    (tmp_path / "evil" / SHA).write_bytes(b"\x7fELF")
    (tmp_path / "cache" / "aotinductor").mkdir(parents=True)
    os.symlink(tmp_path / "evil" / SHA, tmp_path / "cache" / "aotinductor" / SHA)
    with pytest.raises(TrustError, match="leads outside the cache folder"):
        ArtifactTrust("guard.json", signed_by="key").confined(tmp_path / "cache", f"aotinductor/{SHA}", AOTINDUCTOR)
    (tmp_path / "cache" / "precompiled").mkdir()
    (tmp_path / "cache" / "precompiled" / SHA).write_bytes(b"ok")
    assert (
        ArtifactTrust("guard.json", signed_by="key").confined(tmp_path / "cache", f"precompiled/{SHA}", AOT_COMPILE)
        == tmp_path / "cache" / "precompiled" / SHA
    )


def test_a_snapshot_nested_deep_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(UsageError, match="nests 100000 levels deep") as refused:
        ShapeGuard.from_snapshot(path, "m")
    assert str(path) in str(refused.value)


@pytest.mark.parametrize("status", [200, 500])
def test_a_service_answer_nested_deep_is_one_line(status: int) -> None:
    """``from_url`` (and each refresh) reads the answer with the snapshot's bounds; an error body nested deep is no
    traceback either."""
    import http.server
    import threading

    deep = b"[" * 100_000 + b"]" * 100_000

    class Answer(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(deep)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(UsageError) as refused:
            ShapeGuard.from_url(f"http://127.0.0.1:{server.server_port}", "m", telemetry=False)
    finally:
        server.shutdown()
    message = str(refused.value)
    assert "/v1/guard/m" in message and "\n" not in message
    assert ("nests 100000 levels deep" if status == 200 else "500") in message
