"""The registry transport's own authentication: a bearer token fetched from the challenge's realm with the docker
config's credentials (here from a credential helper, run as docker runs it), kept for later requests, and the
credentials sent to the token service only."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from warmcache_testkit.hostile_servers import HostileRegistry, Reply

from warmcache.store.oci.credentials import basic_credentials
from warmcache.store.oci.store import OciStore

TOKEN = "tok-" + "7" * 12
BASIC = base64.b64encode(b"ci:helper-secret").decode()


class TokenRegistry(HostileRegistry):
    """A registry that answers only bearer tokens from its own ``/token`` service, which wants basic credentials."""

    def route(self, method: str, path: str, full_path: str, body: bytes) -> Reply:
        authorization = {k.lower(): v for k, v in self.seen[-1][2].items()}.get("authorization", "")
        if path == "/token":
            if authorization == f"Basic {BASIC}" and "scope=repository%3Ateam%2Fprivate%3Apull" in full_path:
                return Reply(json.dumps({"token": TOKEN}).encode(), headers={"Content-Type": "application/json"})
            return Reply(b"{}", 401)
        if authorization != f"Bearer {TOKEN}":
            challenge = f'Bearer realm="http://{self.host}/token",service="test",scope="repository:team/private:pull"'
            return Reply(b"{}", 401, {"WWW-Authenticate": challenge})
        return super().route(method, path, full_path, body)


@pytest.fixture
def helper_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A docker config that names a credential helper for every registry, and the helper on ``$PATH``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    helper = bin_dir / "docker-credential-warmcachetest"
    helper.write_text('#!/bin/sh\nread host\necho \'{"Username": "ci", "Secret": "helper-secret"}\'\n')
    helper.chmod(0o755)
    (tmp_path / "config.json").write_text(json.dumps({"credsStore": "warmcachetest"}))
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    yield tmp_path


def test_a_credential_helper_gives_the_basic_credentials(helper_config: Path) -> None:
    assert basic_credentials("registry.example") == BASIC


def test_inline_credentials_are_found_under_the_other_loopback_name(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "config.json").write_text(json.dumps({"auths": {"https://localhost:5000/v1/": {"auth": BASIC}}}))
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    assert basic_credentials("127.0.0.1:5000") == BASIC
    assert basic_credentials("127.0.0.1:5001") is None


def test_a_bearer_token_is_fetched_once_and_the_credentials_go_to_the_token_service_only(helper_config: Path) -> None:
    with TokenRegistry().running() as registry:
        assert isinstance(registry, TokenRegistry)
        registry.put_manifest("team/private", "prod", b'{"schemaVersion": 2}')
        client = OciStore.open(registry.url("team/private", "prod")).client
        first, second = client.manifest("prod"), client.manifest("prod")
        assert first is not None and first == second and first[1] == b'{"schemaVersion": 2}'
        asked = [path for _, path, _ in registry.seen if path.startswith("/token")]
        basic_to = {path for _, path, headers in registry.seen if BASIC in str(headers)}
    assert len(asked) == 1, registry.seen
    assert basic_to == set(asked), "the credentials went to the registry itself"
