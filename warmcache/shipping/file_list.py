"""The file list a bundle's metadata or a store index ships: checked before anything in it is believed.

Its nesting is bounded and its format and signature (when trusted keys are configured)
checked before any field is read; every file is a safe path inside an entry of its
cache layout, listed once with a sha256 and a size; every artifact of a row has its
files listed.
"""

from __future__ import annotations

import json
from typing import Any

from warmcache.bounds import MAX_BYTES, MAX_NESTING, json_nesting
from warmcache.cache.layout import CacheFlavor, entry_of
from warmcache.cache.locate import FLAVORS, flavor_of_kind
from warmcache.errors import CacheError, shown
from warmcache.shipping.bundle import BundleFile, check_relpath
from warmcache.trust import SignatureCheck, TrustedKeys

_HEX = frozenset("0123456789abcdef")


def read_signed_document(
    data: bytes, where: str, what: str, expected_format: int, trusted: TrustedKeys
) -> tuple[dict[str, Any], SignatureCheck, CacheFlavor]:
    """Parse a shipped file list (bundle metadata, store index): bounded nesting, its format, its
    signature when trusted keys are configured, then its cache layout.

    The signature is checked before any field is interpreted, so with trust configured
    nothing an attacker wrote is believed.
    """
    depth = json_nesting(data)
    if depth > MAX_NESTING:
        raise CacheError(f"{where}: nests {depth} levels deep; {what} metadata needs at most {MAX_NESTING}; refused")
    try:
        raw = json.loads(data)
    except ValueError as exc:
        raise CacheError(f"{where} is not valid JSON ({exc})") from None
    if not isinstance(raw, dict) or raw.get("format") != expected_format:
        raise CacheError(
            f"{where}: unsupported {what} format "
            f"{shown(raw.get('format') if isinstance(raw, dict) else raw)} (this warmcache reads "
            f"format {expected_format})"
        )
    signature = trusted.check_document(raw, where)
    flavor = raw.get("flavor")
    if flavor not in FLAVORS:
        raise CacheError(f"{where}: unknown cache layout {shown(flavor)}")
    return raw, signature, flavor


def check_artifacts(row: dict[str, Any], files: dict[str, BundleFile], flavor: CacheFlavor, where: str) -> None:
    """Every artifact of a shipped row (bundle or store index) is a safe path, in this layout, with files listed
    beside it."""
    for artifact in row["artifacts"]:
        path = check_relpath(artifact["path"], f"{where} artifact")
        if flavor_of_kind(artifact["kind"]) != flavor:
            raise CacheError(
                f"{where} artifact {shown(path)} of kind {shown(artifact['kind'])} is not in a {flavor} cache"
            )
        if not any(name == path or name.startswith(path + "/") for name in files):
            raise CacheError(f"{where} artifact {shown(path)} has no files listed")


def check_files(listed: Any, flavor: CacheFlavor, where: str) -> dict[str, BundleFile]:
    if not isinstance(listed, list):
        raise CacheError(f"{where}: 'files' must be a list")
    files: dict[str, BundleFile] = {}
    for index, item in enumerate(listed):
        if not isinstance(item, dict):
            raise CacheError(f"{where}: files[{index}] must be an object")
        path = check_relpath(item.get("path"), f"{where}: files[{index}]")
        digest, size = item.get("sha256"), item.get("size")
        if not isinstance(digest, str) or len(digest) != 64 or not set(digest) <= _HEX:
            raise CacheError(f"{where}: files[{index}] ({path}): sha256 {shown(digest)} is not a hex sha256")
        if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_BYTES:
            raise CacheError(f"{where}: files[{index}] ({path}): size {shown(size)} is not a byte count")
        if entry_of(flavor, path) is None:
            raise CacheError(f"{where}: files[{index}] {shown(path)} is not part of any {flavor} cache entry")
        if path in files:
            raise CacheError(f"{where}: files[{index}] {shown(path)} is listed twice")
        files[path] = BundleFile(path, digest, size)
    return files
