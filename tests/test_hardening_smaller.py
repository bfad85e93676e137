"""The fourth hardening pass's smaller findings, each one line and a non-zero exit, or no harm done: a store URL with a
control character or a non-hex digest, a database password in an error, a registry created by a read, the compiler's
shared default folder called orphans, a model name ending in a newline, a write body sent a byte at a time or
abandoned, a token file others can read, a public key passed to ``--sign``, ``$WARMCACHE_ALLOW_UNSIGNED`` for guards,
a push that would drop another model's shapes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.parse
import uuid
from pathlib import Path

import pytest
from test_cache_neuron import NEURON_MANIFEST, cli, done_files, module, planned_by_batch, record_compiled
from test_service import TOKEN, wait_ready
from test_store import error_lines, run
from warmcache_testkit.hostile_servers import HostileRegistry
from warmcache_testkit.oci_registry import RunningRegistry

from warmcache.artifacts.trust import ArtifactTrust
from warmcache.service import ServiceConfig
from warmcache.service.server import running_server
from warmcache.settings import RegistryLocation
from warmcache.store.oci.image import read_image
from warmcache.store.oci.store import OciStore
from warmcache.trust import generate_key


def test_a_control_character_in_an_oci_url_is_refused_not_stripped() -> None:
    with HostileRegistry().running() as hostile:
        assert isinstance(hostile, HostileRegistry)
        hostile.put_manifest("team/nl", "prod", b"{}")  # what the URL would name with its tab and newline stripped
        code, _, err = run("store", "ls", "--store", f"oci+http://{hostile.host}/team/n\nl:pro\td")
        assert code == 2 and len(error_lines(err)) == 1 and "control character" in err, err
        assert not any("/team/nl/" in path for _, path, _ in hostile.seen), hostile.seen


def test_a_digest_that_is_not_hex_never_reaches_a_request_path() -> None:
    with HostileRegistry().running() as hostile:
        assert isinstance(hostile, HostileRegistry)
        bad = "sha256:../../../v2/x/blobs/y?z=" + "0" * 40  # 71 characters, as long as a digest
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": bad, "size": 2},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": bad, "size": 2}],
        }
        hostile.put_manifest("team/hex", "prod", json.dumps(manifest).encode())
        code, _, err = run("store", "ls", "--store", hostile.url("team/hex", "prod"))
        assert code == 5 and len(error_lines(err)) == 1 and "no sha256 digest" in err, err
        assert not any("?z=" in path or "/v2/x/" in path for _, path, _ in hostile.seen), hostile.seen


def test_a_refused_database_url_never_shows_its_password(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WARMCACHE_DB", "postgresql://bob:S3CRETPW@db.internal:5432/")
    for args in (["misses"], ["db", "upgrade"]):
        result = cli(*args)
        assert result.exit_code == 2 and "names no database" in result.stderr, result.stderr
        assert "S3CRETPW" not in result.stderr and "bob:***@db.internal" in result.stderr, result.stderr


def test_verify_on_a_missing_registry_creates_none(tmp_path: Path, write_manifest) -> None:  # type: ignore[no-untyped-def]
    manifest = write_manifest('[[model]]\nname = "m"\npath = "/nowhere"\n[[model.generate]]\nbatch_sizes = [1]\n'
                              "prompt_lengths = [8]\nmax_cache_len = 16\n")  # fmt: skip
    db = tmp_path / "typo" / "registry.sqlite"
    result = cli("verify", str(manifest), "--db", f"sqlite:///{db}")
    assert result.exit_code == 3 and "does not exist" in result.stderr and not db.parent.exists(), result.stderr


@pytest.mark.parametrize(
    "command",
    [
        ["cache", "scan"],
        ["cache", "doctor"],
        ["cache", "doctor", "--fix"],
        ["cache", "prune", "--orphans", "--grace", "0s", "--dry-run"],
        ["cache", "prune", "--orphans", "--grace", "0s"],
    ],
)
def test_cache_commands_on_a_missing_registry_refuse_and_create_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: list[str]
) -> None:
    """Judged against a new, empty registry every entry is an orphan: ``prune --orphans`` would delete them all."""
    entry = tmp_path / "cache" / "fxgraph" / "ab" / "fabcdef0123"
    entry.parent.mkdir(parents=True)
    entry.write_bytes(b"a graph the registry that is not there would name")
    monkeypatch.chdir(tmp_path)  # no project registry above it
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("WARMCACHE_DB", raising=False)
    where = ["--cache-dir", str(tmp_path / "cache"), "--flavor", "inductor"]
    for db in ([], ["--db", f"sqlite:///{tmp_path / 'typo' / 'registry.sqlite'}"]):
        result = cli(*command, *where, *db)
        assert result.exit_code == 3 and len(error_lines(result.stderr)) == 1, (result.output, result.stderr)
        assert "does not exist" in result.stderr and "db upgrade" in result.stderr, result.stderr
    assert not (tmp_path / "xdg").exists() and not (tmp_path / "typo").exists(), "a cache command created a registry"
    assert entry.exists()


def test_cache_scan_counts_no_orphans_in_the_compilers_shared_folder(tmp_path: Path) -> None:
    shared = tmp_path / "tmp" / "torchinductor_someone" / "fxgraph" / "ab"
    shared.mkdir(parents=True)
    (shared / "fabcdef0123").write_bytes(b"a graph some other program compiled")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("WARMCACHE_", "TORCHINDUCTOR_"))},
        "TMPDIR": str(tmp_path / "tmp"),
        "USER": "someone",
        "LOGNAME": "someone",
        "XDG_CACHE_HOME": str(tmp_path / "xdg"),
    }
    default_registry = tmp_path / "xdg" / "warmcache" / "registry.sqlite"  # scan reads it, never creates it
    assert cli("db", "upgrade", "--db", f"sqlite:///{default_registry}").exit_code == 0
    done = subprocess.run(
        [sys.executable, "-m", "warmcache", "cache", "scan", "--flavor", "inductor", "--json"],
        capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (info,) = json.loads(done.stdout)
    assert info["root"] == str(shared.parent.parent) and info["entry_count"] >= 1, info
    assert info["orphan_count"] == 0 and "shared by every process" in info["orphans_unknown"], info


def test_a_model_name_ending_in_a_newline_is_refused(write_manifest) -> None:  # type: ignore[no-untyped-def]
    manifest = write_manifest('[[model]]\nname = "m\\n"\npath = "/nowhere"\n')
    result = cli("plan", str(manifest))
    assert result.exit_code == 2 and "must start with a letter or digit" in result.stderr, result.stderr


@pytest.fixture
def slow_body_service(tmp_path: Path) -> object:
    from warmcache.registry import Registry

    Registry.open(f"sqlite:///{tmp_path / 'r.sqlite'}").close()
    config = ServiceConfig(RegistryLocation.parse(f"sqlite:///{tmp_path / 'r.sqlite'}"), token=TOKEN, body_timeout_s=1)
    with running_server(config) as base:
        wait_ready(base)
        yield base


def _post_headers(base: str, length: int) -> socket.socket:
    address = urllib.parse.urlsplit(base)
    sock = socket.create_connection((address.hostname, address.port))
    sock.sendall(
        f"POST /v1/misses HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n".encode()
    )
    return sock


def test_a_write_body_sent_a_byte_at_a_time_is_refused_at_its_deadline(slow_body_service: str) -> None:
    sock = _post_headers(slow_body_service, 1000)
    started, answer = time.monotonic(), b""
    sock.settimeout(0.2)
    while time.monotonic() - started < 8 and not answer:
        try:
            sock.send(b" ")
            answer = sock.recv(200)
        except TimeoutError:
            continue
        except OSError:
            break
    sock.close()
    assert answer.startswith(b"HTTP/1.1 408") and time.monotonic() - started < 4, answer


def test_a_client_that_disconnects_mid_body_prints_no_traceback(
    slow_body_service: str, capfd: pytest.CaptureFixture[str]
) -> None:
    sock = _post_headers(slow_body_service, 1000)
    sock.sendall(b'{"misses": [')
    sock.close()
    time.sleep(0.5)
    assert "Traceback" not in capfd.readouterr().err


def test_a_token_file_others_can_read_is_refused(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("a-long-enough-secret-token\n")
    token.chmod(0o644)
    command = [sys.executable, "-m", "warmcache", "serve", "--db", f"sqlite:///{tmp_path / 'r.sqlite'}",
               "--token-file", str(token), "--port", "0"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)  # a server that starts: a timeout
    assert result.returncode == 2 and "token file is readable by others (mode 644)" in result.stderr, result.stderr
    assert "a-long-enough" not in result.stderr


def test_a_public_key_given_to_sign_is_named_as_one(tmp_path: Path) -> None:
    generate_key(tmp_path / "key")
    result = cli("guard", "export", "--model", "m", "--db", f"sqlite:///{tmp_path / 'r.sqlite'}",
                 "--out", str(tmp_path / "s.json"), "--sign", str(tmp_path / "key.pub"))  # fmt: skip
    assert result.exit_code == 2 and "this is a public key" in result.stderr and str(tmp_path / "key") in result.stderr
    assert "readable by others" not in result.stderr, result.stderr


def test_allow_unsigned_from_the_environment_lets_a_guard_load_what_its_refusal_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    unverified = ArtifactTrust("guard.json", signed_by="")
    with pytest.raises(Exception, match=r"WARMCACHE_ALLOW_UNSIGNED=1"):
        unverified.require_trusted_rows()
    monkeypatch.setenv("WARMCACHE_ALLOW_UNSIGNED", "1")
    unverified.require_trusted_rows()


def test_a_push_whose_entry_path_another_models_shape_holds_with_other_bytes_is_refused(
    registry_host: RunningRegistry, tmp_path: Path, write_manifest
) -> None:  # type: ignore[no-untyped-def]
    url = registry_host.url(f"team/clash-{uuid.uuid4().hex[:8]}", "prod")
    hosts = {}
    for name in ("first-m", "second-m"):  # one entry path each, with other bytes
        manifest = write_manifest(NEURON_MANIFEST.replace('"neuron-m"', f'"{name}"'), name=f"{name}.toml")
        root, db = tmp_path / name, f"sqlite:///{tmp_path / name}.sqlite"
        record_compiled(db, planned_by_batch(manifest)[1], [module(root, "aaa+f1", done_files(5000))])
        hosts[name] = ["push", str(manifest), "--cache-dir", str(root), "--db", db, "--store", url]
    code, _, err = run(*hosts["first-m"])
    assert code == 0, err
    code, _, err = run(*hosts["second-m"])
    (line,) = error_lines(err)
    assert code == 5 and "MODULE_aaa+f1" in line and "'first-m'" in line and "nothing pushed" in line, err
    store = OciStore.open(url)
    image = read_image(store.client, "prod")
    assert image is not None and [key.split("/")[1] for key in image.indexes] == ["first-m"]
