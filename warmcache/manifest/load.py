"""The one front door to a manifest: text from anywhere (a file, a request body), bounded before TOML sees it."""

from __future__ import annotations

import tomllib
from pathlib import Path

from warmcache.bounds import MAX_KEY_DOTS, MAX_NESTING, toml_nesting
from warmcache.errors import ManifestError
from warmcache.manifest.parse import parse_manifest
from warmcache.manifest.schema import Manifest

#: A manifest with a thousand models is a few hundred KB; tomllib is slow on much larger input.
MAX_MANIFEST_BYTES = 1 << 20


def load_manifest(path: str | Path) -> Manifest:
    """Read and validate a manifest file; raise :class:`ManifestError` listing every problem (see :func:`loads`).

    :param path: the TOML file; relative paths inside it (models, cache folder) resolve against its folder.
    :returns: the validated manifest.
    :raises ManifestError: the file is missing, unreadable, over 1 MiB, not TOML, or breaks the schema.
    """
    file = Path(path)
    try:
        with open(file, "rb") as handle:
            data = handle.read(MAX_MANIFEST_BYTES + 1)
    except FileNotFoundError:
        raise ManifestError(f"{file}: manifest not found") from None
    except OSError as exc:
        raise ManifestError(f"{file}: cannot read manifest: {exc}") from None
    return loads(data, file)


def loads(text: str | bytes, source: str | Path) -> Manifest:
    """Parse and validate manifest text from anywhere (a file, a request body): the one front door.

    ``source`` names it in messages and anchors its relative paths. Size, nesting and
    dotted keys are bounded before tomllib sees the text: it recurses once per nesting
    level and builds a table per key part, so a hostile manifest would otherwise end
    in a ``RecursionError`` or take minutes.
    """
    file = Path(source)
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    if len(data) > MAX_MANIFEST_BYTES:
        raise ManifestError(
            f"{file}: manifest is larger than {MAX_MANIFEST_BYTES} bytes, far more than any real manifest; refused"
        )
    try:
        decoded = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ManifestError(f"{file}: cannot read manifest: {exc}") from None
    depth, dots = toml_nesting(decoded)
    if depth > MAX_NESTING:
        raise ManifestError(
            f"{file}: nests {depth} levels deep (arrays, tables or dotted keys); a manifest needs at "
            f"most {MAX_NESTING}; refused"
        )
    if dots > MAX_KEY_DOTS:
        raise ManifestError(
            f"{file}: dotted keys (a.b.c = ...) joined by {dots} dots; a manifest needs far fewer "
            f"than {MAX_KEY_DOTS}; refused"
        )
    try:
        raw = tomllib.loads(decoded)
    except (
        tomllib.TOMLDecodeError,
        ValueError,
        RecursionError,
    ) as exc:  # ValueError: an integer of thousands of digits
        raise ManifestError(f"{file}: invalid TOML: {exc}") from None
    return parse_manifest(raw, file)
