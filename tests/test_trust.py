"""Signed bundles: a cache from elsewhere is code production runs, so under trusted keys only a
bundle signed by one of them, unaltered since, is installed."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import pytest
import test_bundle
from click.testing import Result
from test_bundle import Built, _edit_meta, files_under, rebuild
from test_cache_neuron import cli
from test_hostile_input import nothing_written, unpack

from warmcache.errors import TrustError
from warmcache.trust import SigningKey, TrustedKeys, generate_key, sign_document

built = test_bundle.built  # the build machine's cache and registry (a fixture)


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, Path]:
    """Two key pairs: ``ours`` (trusted) and ``theirs``; values are the private key files."""
    out = {}
    for name in ("ours", "theirs"):
        path = tmp_path / "keys" / name
        path.parent.mkdir(exist_ok=True)
        assert cli("keys", "generate", str(path)).exit_code == 0
        out[name] = path
    return out


def pack_signed(built: Built, output: Path, key: Path | None) -> Result:
    args = ("bundle", "pack", str(built.manifest), "-o", str(output), "--cache-dir", str(built.root), "--db", built.url)
    return cli(*args, *(("--sign", str(key)) if key else ()))


def test_keys_generate_writes_a_private_key_only_its_owner_reads(tmp_path: Path) -> None:
    result = cli("keys", "generate", str(tmp_path / "signer"), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert stat.S_IMODE(os.stat(tmp_path / "signer").st_mode) == 0o600
    assert (tmp_path / "signer.pub").read_text().strip() == data["public_key"] and data["public_key"].startswith(
        "ed25519:"
    )
    assert SigningKey.load(tmp_path / "signer").public.key_id == data["key_id"]
    again = cli("keys", "generate", str(tmp_path / "signer"))
    assert again.exit_code == 2 and "already exists" in again.stderr


def _tamper_rehashed(members: list) -> None:
    """Replace a compiled file and rewrite its listed sha256 and size: what hashes alone cannot catch."""
    index = next(i for i, (m, _) in enumerate(members) if m.name.endswith("model.neff"))
    info, _ = members[index]
    evil = b"\x7fELF not the compiled kernel you built"
    info.size = len(evil)
    members[index] = (info, evil)

    def rehash(meta: dict) -> None:
        for listed in meta["files"]:
            if "cache/" + listed["path"] == info.name:
                listed["sha256"], listed["size"] = hashlib.sha256(evil).hexdigest(), len(evil)

    _edit_meta(members, rehash)


def test_a_tampered_rehashed_bundle_is_refused_under_a_trusted_key(
    built: Built, tmp_path: Path, keys: dict[str, Path]
) -> None:
    signed = tmp_path / "signed.tar"
    packed = pack_signed(built, signed, keys["ours"])
    assert packed.exit_code == 0 and "signed by key" in packed.output, packed.output
    tampered = rebuild(signed, tmp_path / "tampered.tar", lambda t, m: _tamper_rehashed(m))
    trust = ("--trust", f"{keys['ours']}.pub")

    refused = unpack(tampered, tmp_path, *trust)
    assert refused.exit_code == 5, refused.output
    assert "altered after signing; refused" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    assert nothing_written(tmp_path)

    good = unpack(signed, tmp_path, *trust)
    assert good.exit_code == 0, good.output
    assert "signature verified (key " in good.stdout
    assert files_under(tmp_path / "prod") == {k: v for k, v in files_under(built.root).items() if "unrelated" not in k}


def test_without_trust_the_tampered_bundle_unpacks_and_says_it_was_not_checked(
    built: Built, tmp_path: Path, keys: dict[str, Path]
) -> None:
    signed = tmp_path / "signed.tar"
    assert pack_signed(built, signed, keys["ours"]).exit_code == 0
    tampered = rebuild(signed, tmp_path / "tampered.tar", lambda t, m: _tamper_rehashed(m))
    result = unpack(tampered, tmp_path)
    assert result.exit_code == 0, result.output
    assert "signature not checked: no trusted keys configured" in result.stdout


def test_unsigned_and_foreign_bundles_are_refused_by_every_trust_source(
    built: Built, tmp_path: Path, keys: dict[str, Path], monkeypatch: pytest.MonkeyPatch, write_manifest
) -> None:
    unsigned, theirs = tmp_path / "unsigned.tar", tmp_path / "theirs.tar"
    assert pack_signed(built, unsigned, None).exit_code == 0
    assert pack_signed(built, theirs, keys["theirs"]).exit_code == 0
    ours_pub = f"{keys['ours']}.pub"

    by_flag = unpack(unsigned, tmp_path, "--trust", ours_pub)
    assert by_flag.exit_code == 5 and "unsigned, but trusted keys are configured (--trust:" in by_flag.stderr

    monkeypatch.setenv("WARMCACHE_TRUSTED_KEYS", Path(ours_pub).read_text().strip())
    by_env = unpack(theirs, tmp_path)
    their_id = SigningKey.load(keys["theirs"]).public.key_id
    assert (
        by_env.exit_code == 5
        and f"signed by key {their_id}, which is not trusted ($WARMCACHE_TRUSTED_KEYS:" in by_env.stderr
    )
    monkeypatch.delenv("WARMCACHE_TRUSTED_KEYS")

    manifest = write_manifest('[trust]\nkeys = ["keys/ours.pub"]\n' + built.manifest.read_text(), name="trusting.toml")
    by_manifest = unpack(theirs, tmp_path, "--manifest", str(manifest))
    assert (
        by_manifest.exit_code == 5
        and "trust.keys" in by_manifest.stderr
        and "which is not trusted" in by_manifest.stderr
    )
    assert nothing_written(tmp_path)


def test_a_bad_trust_setting_is_a_usage_error(built: Built, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = unpack(tmp_path / "any.tar", tmp_path, "--trust", str(tmp_path / "nope.pub"))
    assert missing.exit_code == 2 and "cannot read public key file" in missing.stderr
    garbage = unpack(tmp_path / "any.tar", tmp_path, "--trust", "ed25519:AAAA")
    assert garbage.exit_code == 2 and "not a 32-byte Ed25519 public key" in garbage.stderr
    monkeypatch.setenv("WARMCACHE_TRUSTED_KEYS", "")
    empty = unpack(tmp_path / "any.tar", tmp_path)
    assert empty.exit_code == 2 and "set but empty" in empty.stderr
    assert nothing_written(tmp_path)


def test_the_trust_api_signs_any_json_document(tmp_path: Path) -> None:
    """What the artifact store uses for its indexes: nothing in the API is bundle-specific."""
    generate_key(tmp_path / "k")
    key = SigningKey.load(tmp_path / "k")
    index = {"shape": "abc", "objects": [{"sha256": "00" * 32, "size": 3}], "seconds": 1.5}
    signed = sign_document(index, key)
    trusted = TrustedKeys.load([f"{tmp_path / 'k'}.pub"], "test")
    assert trusted.check_document(json.loads(json.dumps(signed, indent=3)), "index").key_id == key.public.key_id
    assert not TrustedKeys().check_document(signed, "index").checked
    signed["objects"][0]["size"] = 4
    with pytest.raises(TrustError, match="altered after signing"):
        trusted.check_document(signed, "index")
