"""A store URL is decided once, where it is given: an ``oci://`` reference is parsed with it (a malformed repository
fails the manifest's load, not a later push or pull), its errors name where the URL came from, and the store is
built from that parsed reference, not from the text parsed again."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_manifest import GOOD

from warmcache.cli import main
from warmcache.errors import ManifestError, UsageError
from warmcache.manifest import load_manifest
from warmcache.store import OciStore, resolve_store, resolve_tag_store, store_location
from warmcache.store_location import StoreLocation

BAD_REPOSITORY = "oci://registry.example/Team/Cache:v1"  # the distribution spec's names are lowercase


def test_a_malformed_oci_repository_fails_the_manifest_load(write_manifest: Callable[..., Path]) -> None:
    with pytest.raises(ManifestError) as info:
        load_manifest(write_manifest(f'[store]\nurl = "{BAD_REPOSITORY}"\n' + GOOD))
    assert "store.url: " in str(info.value) and "'Team/Cache' is not a repository name" in str(info.value)


def test_plan_refuses_a_manifest_with_a_malformed_oci_repository(write_manifest: Callable[..., Path]) -> None:
    """``plan`` speaks to no store, yet the manifest it reads is refused whole: the typo shows before any warmup."""
    path = write_manifest(f'[store]\nurl = "{BAD_REPOSITORY}"\n' + GOOD)
    result = CliRunner().invoke(main, ["plan", str(path)])
    assert result.exit_code == 2, result.output
    assert f"store.url: '{BAD_REPOSITORY}': 'Team/Cache' is not" in result.stderr


@pytest.mark.parametrize(
    ("flag", "variable", "label"),
    [(BAD_REPOSITORY, None, "--store"), (None, BAD_REPOSITORY, "$WARMCACHE_STORE")],
)
def test_an_oci_error_names_where_the_url_came_from(
    flag: str | None, variable: str | None, label: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if variable is None:
        monkeypatch.delenv("WARMCACHE_STORE", raising=False)
    else:
        monkeypatch.setenv("WARMCACHE_STORE", variable)
    with pytest.raises(UsageError) as info:
        store_location(flag)
    assert str(info.value).startswith(f"{label} '{BAD_REPOSITORY}': 'Team/Cache' is not a repository name")


def test_the_store_is_built_from_the_reference_the_manifest_parsed(write_manifest: Callable[..., Path]) -> None:
    manifest = load_manifest(write_manifest('[store]\nurl = "oci+http://127.0.0.1:5000/team/cache:v1"\n' + GOOD))
    location = manifest.store.url
    assert location is not None and location.oci is not None and location.source.endswith("[store] url")
    store = resolve_store(None, None, manifest)
    assert isinstance(store, OciStore) and store.reference is location.oci  # not parsed again from its text
    assert store.tagged


def test_promote_names_the_argument_that_is_not_an_oci_tag() -> None:
    with pytest.raises(UsageError) as info:
        resolve_tag_store(StoreLocation.parse("file:///srv/store", "DST"))
    assert str(info.value).startswith("DST 'file:///srv/store': not an OCI registry URL")
