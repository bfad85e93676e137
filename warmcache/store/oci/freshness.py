"""Signed tags that cannot be rolled back: what a push signs for its tag, and what a puller remembers of it.

A shape index is signed, but says nothing of which tag it belongs to or when: re-tagging an
older signed manifest (or copying one under another name) would install older code that
every signature still vouches for. So each push also writes ``.warmcache-image/tag.json``,
signed with the same key, modelled on TUF's timestamp and snapshot roles (as python-tuf's
``TrustedMetadataSet`` applies them):

- it names the **repository and tag** it was pushed to (a mirror on another host keeps
  both; a copy under another name is refused: push it there again with ``--sign``);
- it carries a **version**, one more than the tag's before (and the push time);
- it **expires** (TUF's timestamp role does, against a freeze: a registry that keeps serving
  the last version a host saw, hiding newer pushes): ``push --expires AGE``, else
  ``$WARMCACHE_TAG_EXPIRES``, else 30 days; a pull refuses it once past, naming tag and date,
  and a push renews it (a new version, nothing else changed) once half its validity is gone
  (or when it shortens it);
- it lists the sha256 of **every shape index** the image holds (TUF's snapshot: an index
  from another push cannot be slipped into this one).

With trusted keys a pull verifies it before believing any index, then compares the version
with what this host remembers for that tag at that location (:class:`TagMemory`, a JSON
file in the state folder: ``--state-dir``, ``$WARMCACHE_STATE_DIR``, then
``$XDG_STATE_HOME/warmcache``) and with the deployment's pin (``--min-tag-version``): an
older version is refused, one line naming both; an equal one is the same push, a newer one
is remembered. As in TUF, the memory is written (atomically, under a lock) only after the
document verified. Where no state folder can be written (a read-only root file system) a
pin must take its place: a pull that can neither remember nor compare with a pin is refused.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from warmcache.errors import TrustError, UsageError, shown
from warmcache.store.index import index_bytes
from warmcache.store.oci.reference import OciReference
from warmcache.trust import SIGNATURE_MEMBER, SigningKey, TrustedKeys, sign_document
from warmcache.units import parse_age

TAG_FORMAT = 1
STATE_ENV = "WARMCACHE_STATE_DIR"
MIN_VERSION_ENV = "WARMCACHE_MIN_TAG_VERSION"
EXPIRES_ENV = "WARMCACHE_TAG_EXPIRES"
#: How long a signed tag is valid when neither ``--expires`` nor ``$WARMCACHE_TAG_EXPIRES`` says: the longest a
#: registry can hide newer pushes from a host by serving it the last version it saw.
DEFAULT_VALIDITY_S = 30 * 86400
MEMORY_FILE = "oci-tags.json"
#: Versions are JSON integers every reader holds exactly.
MAX_VERSION = 2**53
_LOCK_SECONDS = 30.0


@dataclass(frozen=True, slots=True)
class TagVersion:
    """One verified push of a tag: its version, when it was pushed (Unix seconds) and the manifest's digest."""

    version: int
    pushed_at: float
    digest: str

    def describe(self) -> str:
        return f"version {self.version} (pushed {_when(self.pushed_at)}, {self.digest[:19]})"


def _when(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def validity_seconds(flag: str | None = None) -> float:
    """How long a push's tag document is valid: ``--expires``, else ``$WARMCACHE_TAG_EXPIRES``, else 30 days."""
    text, source = (flag, "--expires") if flag is not None else (os.environ.get(EXPIRES_ENV), f"${EXPIRES_ENV}")
    seconds = parse_age(text, option=source) if text else DEFAULT_VALIDITY_S
    if seconds <= 0:
        raise UsageError(f"{source}: {shown(text or '')} is no time at all; a tag must be valid for a while")
    return seconds


def needs_renewal(document: dict[str, Any] | None, validity: float, now: float) -> bool:
    """Whether a signed push that changes no shape must still write a new version: the tag's document is unsigned,
    has no expiry, has less than half of ``validity`` left (so a regular push keeps a tag from expiring), or more than
    ``validity`` (the pusher shortened it)."""
    expires = document.get("expires") if isinstance(document, dict) else None
    signed = isinstance(document, dict) and SIGNATURE_MEMBER in document
    return not signed or not isinstance(expires, (int, float)) or not validity / 2 <= expires - now <= validity


def tag_document(
    reference: OciReference,
    version: int,
    pushed_at: float,
    indexes: dict[str, dict[str, Any]],
    signing_key: SigningKey | None,
    validity: float = DEFAULT_VALIDITY_S,
) -> dict[str, Any]:
    """What a push states about the tag it writes (signed with ``signing_key``, as its indexes are), valid for
    ``validity`` seconds from ``pushed_at``."""
    document = {
        "format": TAG_FORMAT,
        "repository": reference.repository,
        "tag": reference.tag,
        "version": version,
        "pushed_at": pushed_at,
        "expires": pushed_at + validity,
        "indexes": {key: hashlib.sha256(index_bytes(index)).hexdigest() for key, index in sorted(indexes.items())},
    }
    return sign_document(document, signing_key) if signing_key else document


def version_of(document: dict[str, Any] | None) -> int:
    """The version a tag document carries (0 for none or a malformed one): a push writes one more."""
    version = document.get("version") if isinstance(document, dict) else None
    return version if isinstance(version, int) and not isinstance(version, bool) and 0 <= version < MAX_VERSION else 0


def check_tag(
    document: dict[str, Any] | None,
    indexes: dict[str, dict[str, Any]],
    reference: OciReference,
    digest: str,
    trusted: TrustedKeys,
    now: float | None = None,
) -> TagVersion:
    """The verified version of the tag ``reference`` names, or :class:`TrustError` (one line): unsigned for its tag,
    signed for another repository or tag, expired (at ``now``), or holding an index the signed list does not name."""
    where = reference.url
    if document is None:
        raise TrustError(
            f"{where}: no signed tag document (.warmcache-image/tag.json), so nothing binds its shapes to this tag "
            "or says how new they are; refused: push it again with --sign"
        )
    trusted.check_document(document, f"{where}: tag document")
    named = f"{document.get('repository')}:{document.get('tag')}"
    if named != f"{reference.repository}:{reference.tag}":
        raise TrustError(
            f"{where}: signed for {shown(named)}, not {reference.repository}:{reference.tag} (moved or copied under "
            "another name); refused: push it to this tag with --sign"
        )
    version, pushed_at, listed = document.get("version"), document.get("pushed_at"), document.get("indexes")
    if version_of(document) != version or not isinstance(pushed_at, (int, float)) or not isinstance(listed, dict):
        raise TrustError(f"{where}: tag document has no version, push time or index list; refused")
    expires = document.get("expires")
    if not isinstance(expires, (int, float)) or isinstance(expires, bool):
        raise TrustError(
            f"{where}: signed tag version {version} has no expiry date; refused: push it again with --sign"
        )
    if (time.time() if now is None else now) >= expires:
        raise TrustError(
            f"{where}: signed tag version {version} (pushed {_when(pushed_at)}) expired {_when(expires)}; refused: "
            "the registry may be hiding newer pushes (push it again with --sign to renew it)"
        )
    for key, index in indexes.items():
        if listed.get(key) != hashlib.sha256(index_bytes(index)).hexdigest():
            raise TrustError(f"{where}: shape index {key} is not the one its tag document lists; refused")
    return TagVersion(version, float(pushed_at), digest)


class TagMemory:
    """The highest verified version this host pulled of each tag (by URL), and the deployment's pinned minimum."""

    def __init__(self, folder: Path, minimum: int = 0, minimum_source: str = "--min-tag-version") -> None:
        self.file = folder / MEMORY_FILE
        self.minimum, self.minimum_source = minimum, minimum_source

    @classmethod
    def resolve(cls, flag: str | None = None, minimum: int | None = None, minimum_source: str = "") -> TagMemory:
        """``--state-dir``, else ``$WARMCACHE_STATE_DIR``, else ``$XDG_STATE_HOME/warmcache`` (``~/.local/state``);
        the pin from ``--min-tag-version``, else ``$WARMCACHE_MIN_TAG_VERSION``, else none."""
        folder = flag or os.environ.get(STATE_ENV)
        if not folder:
            base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
            folder = str(Path(base) / "warmcache")
        if minimum is None:
            text = os.environ.get(MIN_VERSION_ENV)
            minimum, minimum_source = (
                (_parse_pin(text, f"${MIN_VERSION_ENV}"), f"${MIN_VERSION_ENV}") if text else (0, "")
            )
        return cls(Path(folder).expanduser(), minimum, minimum_source or "--min-tag-version")

    def admit(self, url: str, seen: TagVersion) -> None:
        """Refuse ``seen`` if older than the pin or than what this host pulled of ``url`` before; else remember it."""
        if seen.version < self.minimum:
            raise TrustError(
                f"{url}: {seen.describe()} is older than version {self.minimum}, the least the deployment accepts "
                f"({self.minimum_source}); refused: a rolled-back tag"
            )
        try:
            self._admit(url, seen)
        except (OSError, Timeout) as exc:
            if self.minimum:
                return  # no memory here (a read-only root file system): the pin is the floor
            raise UsageError(
                f"{self.file}: cannot remember the tag versions this host pulled "
                f"({getattr(exc, 'strerror', None) or exc}); give a writable --state-dir (${STATE_ENV}), or pin "
                f"--min-tag-version (${MIN_VERSION_ENV})"
            ) from None

    def _admit(self, url: str, seen: TagVersion) -> None:
        self.file.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(f"{self.file}.lock", timeout=_LOCK_SECONDS):
            tags = self._read()
            known = tags.get(url)
            if isinstance(known, dict) and version_of(known) > seen.version:
                before = TagVersion(version_of(known), float(known.get("pushed_at") or 0), str(known.get("digest")))
                raise TrustError(
                    f"{url}: {seen.describe()} is older than {before.describe()}, which this host pulled before "
                    f"({self.file}); refused: a rolled-back tag"
                )
            if not isinstance(known, dict) or version_of(known) < seen.version:
                tags[url] = {"version": seen.version, "pushed_at": seen.pushed_at, "digest": seen.digest}
                self._write(tags)

    def _read(self) -> dict[str, Any]:
        try:
            document = json.loads(self.file.read_bytes())
        except FileNotFoundError:
            return {}
        except ValueError:
            raise UsageError(f"{self.file}: not the tag memory warmcache writes (not JSON); refused") from None
        tags = document.get("tags") if isinstance(document, dict) else None
        if not isinstance(tags, dict):
            raise UsageError(f"{self.file}: not the tag memory warmcache writes (no 'tags' table); refused")
        return tags

    def _write(self, tags: dict[str, Any]) -> None:
        handle, temporary = tempfile.mkstemp(dir=self.file.parent, prefix=f".{self.file.name}.")
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                json.dump({"format": TAG_FORMAT, "tags": tags}, out, indent=1, sort_keys=True)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, self.file)
        finally:
            Path(temporary).unlink(missing_ok=True)


def _parse_pin(text: str, source: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) >= MAX_VERSION:
        raise UsageError(f"{source}: {shown(text)} is not a tag version (a whole number)")
    return int(text)


def parse_pin(text: str | None, source: str) -> int | None:
    """``--min-tag-version``'s value, or ``None`` when not given."""
    return None if text is None else _parse_pin(text, source)
