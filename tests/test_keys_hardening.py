"""Key files never leak into messages and are never weak: a private key passed as a trusted key is not
quoted, a signing key others can read is refused (as ssh refuses one), the public key is 0644 whatever the umask."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import test_bundle
from test_bundle import Built
from test_cache_neuron import cli
from test_hostile_input import nothing_written, unpack

from warmcache.errors import UsageError
from warmcache.trust import SigningKey, generate_key

built = test_bundle.built  # the build machine: two compiled Neuron shapes (a fixture)


def test_a_private_key_given_as_a_trusted_key_is_named_never_quoted(tmp_path: Path) -> None:
    generate_key(tmp_path / "signer")
    secret = (tmp_path / "signer").read_text()
    result = unpack(tmp_path / "any.tar", tmp_path, "--trust", str(tmp_path / "signer"))
    assert result.exit_code == 2 and "holds a private key; pass the .pub file" in result.stderr
    body = "".join(secret.splitlines()[1:-1])
    assert body[:20] not in result.stderr and "PRIVATE KEY" not in result.stderr


def test_a_file_that_is_not_a_key_is_not_quoted_either(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("password=hunter2-very-secret\n")
    result = unpack(tmp_path / "any.tar", tmp_path, "--trust", str(tmp_path / "notes.txt"))
    assert result.exit_code == 2 and "hunter2" not in result.stderr and "notes.txt" in result.stderr


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604])
def test_signing_refuses_a_private_key_others_can_read(tmp_path: Path, mode: int) -> None:
    generate_key(tmp_path / "signer")
    os.chmod(tmp_path / "signer", mode)
    with pytest.raises(UsageError) as caught:
        SigningKey.load(tmp_path / "signer")
    assert f"chmod 600 {tmp_path / 'signer'}" in str(caught.value)
    result = cli(
        "bundle", "pack", str(tmp_path / "m.toml"), "-o", str(tmp_path / "b.tar"), "--sign", str(tmp_path / "signer")
    )
    assert result.exit_code == 2 and "chmod 600" in result.stderr
    os.chmod(tmp_path / "signer", 0o600)
    assert SigningKey.load(tmp_path / "signer").public


def test_keys_generate_writes_the_public_key_0644_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        assert cli("keys", "generate", str(tmp_path / "signer")).exit_code == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "signer.pub").st_mode) == 0o644
    assert stat.S_IMODE(os.stat(tmp_path / "signer").st_mode) == 0o600


def test_an_unsigned_bundle_is_not_installed_without_trust_unless_allowed(
    built: Built, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert test_bundle.pack(built, tmp_path / "warm.tar").exit_code == 0
    base = (
        "bundle",
        "unpack",
        str(tmp_path / "warm.tar"),
        "--cache-dir",
        str(tmp_path / "prod"),
        "--db",
        f"sqlite:///{tmp_path / 'prod.sqlite'}",
    )
    refused = cli(*base)
    assert (
        refused.exit_code == 5
        and "no trusted keys configured" in refused.stderr
        and "--allow-unsigned" in refused.stderr
    )
    assert nothing_written(tmp_path)
    allowed = cli(*base, "--allow-unsigned")
    assert allowed.exit_code == 0, allowed.output
    assert allowed.stderr.count("--allow-unsigned: installing compiled code whose origin nobody verified") == 1
    monkeypatch.setenv("WARMCACHE_ALLOW_UNSIGNED", "1")  # a CI image may opt out once, in its environment
    assert cli(*base).exit_code == 0


def test_a_pull_without_trust_is_refused_before_the_store_is_read_unless_allowed(built: Built, tmp_path: Path) -> None:
    store = ["--store", (tmp_path / "store").as_uri()]
    assert cli("push", str(built.manifest), "--cache-dir", str(built.root), "--db", built.url, *store).exit_code == 0
    base = (
        "pull",
        str(built.manifest),
        "--cache-dir",
        str(tmp_path / "prod"),
        "--db",
        f"sqlite:///{tmp_path / 'prod.sqlite'}",
        *store,
    )
    refused = cli(*base)
    assert refused.exit_code == 5 and "no trusted keys configured" in refused.stderr and nothing_written(tmp_path)
    allowed = cli(*base, "--allow-unsigned")
    # 1: a shape nobody compiled
    assert allowed.exit_code == 1 and "installing compiled code whose origin nobody verified" in allowed.stderr, (
        allowed.output
    )
    assert (tmp_path / "prod").is_dir()


def test_a_private_key_pasted_as_text_is_never_echoed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, write_manifest
) -> None:
    """``--trust "$(cat key)"``, ``$WARMCACHE_TRUSTED_KEYS`` or an inline ``[trust] keys`` entry holding the key
    itself."""
    from warmcache.manifest import load_manifest
    from warmcache.trust import TrustedKeys

    generate_key(tmp_path / "signer")
    secret = (tmp_path / "signer").read_text()
    body = "".join(secret.splitlines()[1:-1])
    flag = unpack(tmp_path / "any.tar", tmp_path, "--trust", secret)
    monkeypatch.setenv("WARMCACHE_TRUSTED_KEYS", secret)
    env = unpack(tmp_path / "any.tar", tmp_path)
    monkeypatch.delenv("WARMCACHE_TRUSTED_KEYS")
    quoted = secret.replace("\n", "\\n")
    with pytest.raises(UsageError) as inline:
        load_manifest(
            write_manifest(
                f'[trust]\nkeys = ["{quoted}"]\n[[model]]\nname = "m"\npath = '
                '"gpt2"\n[[model.generate]]\nbatch_sizes = [1]\n'
            )
        )
    for where, message in (
        ("--trust", flag.stderr),
        ("$WARMCACHE_TRUSTED_KEYS", env.stderr),
        ("trust.keys", str(inline.value)),
    ):
        assert "a private key was given where a public key belongs" in message, (where, message)
        assert body[:12] not in message and "BEGIN" not in message and where in message
    with pytest.raises(UsageError, match=r"a block of text \(\d+ characters, not shown\)") as pem:
        TrustedKeys.load(["-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEA\n-----END PUBLIC KEY-----"], "--trust")
    assert "MCowBQ" not in str(pem.value)
