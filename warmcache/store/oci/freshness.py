"""Signed tags that cannot be rolled back: what a push signs for its tag, and what a puller remembers of it.

A shape index is signed, but says nothing of which tag it belongs to or when: re-tagging an
older signed manifest (or copying one under another name) would install older code that
every signature still vouches for. So each push also writes ``.warmcache-image/tag.json``,
signed with the same key, modelled on TUF's timestamp and snapshot roles (as python-tuf's
``TrustedMetadataSet`` applies them):

- it names the **repository and tag** it was pushed to (a mirror on another host keeps
  both; a copy under another name is refused: ``store promote`` it there, :mod:`.promote`);
- it carries a **version** (below 2**53, which every JSON reader keeps exact), one more than
  the tag's verified one or this host's memory of it (:mod:`.lineage`), and the push time;
- it **expires** (TUF's timestamp role does, against a freeze: a registry that keeps serving
  the last version a host saw, hiding newer pushes): ``push --expires AGE``, else
  ``$WARMCACHE_TAG_EXPIRES``, else 30 days, at most ``--max-expires`` (a year); a pull
  refuses it once past, naming tag and date, and a push renews it (a new version, nothing
  else changed) once half its validity is gone (or when it shortens it);
- it lists the sha256 of **every shape index** the image holds (TUF's snapshot: an index
  from another push cannot be slipped into this one).

With trusted keys a pull verifies it before believing any index, then compares the version
with what this host remembers for that tag at that location (:class:`TagMemory`, a JSON
file in the state folder: ``--state-dir``, ``$WARMCACHE_STATE_DIR``, then
``$XDG_STATE_HOME/warmcache``) and with the deployment's pin (``--min-tag-version``): an
older version is refused, one line naming both, and so is the remembered version with
another manifest; a newer one is remembered (a signed push keeps the same memory, and builds
on nothing older). As in TUF, the memory is written (atomically, under a lock) only after the
document verified. Where no state folder can be written (a read-only root file system) a
pin must take its place: a pull that can neither remember nor compare with a pin is refused.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

from filelock import FileLock, Timeout

from warmcache.errors import TrustError, UsageError, shown
from warmcache.settings_table import MIN_TAG_VERSION, STATE_DIR, TAG_EXPIRES, choose, environment_value
from warmcache.store.index import index_bytes
from warmcache.store_location import OciReference
from warmcache.trust import NOT_CONFIGURED, SIGNATURE_MEMBER, SigningKey, TrustedKeys, sign_document
from warmcache.units import parse_age

TAG_FORMAT = 1
STATE_ENV = STATE_DIR.env
MIN_VERSION_ENV = MIN_TAG_VERSION.env
EXPIRES_ENV = TAG_EXPIRES.env
#: How long a signed tag is valid when neither ``--expires`` nor ``$WARMCACHE_TAG_EXPIRES`` says: the longest a
#: registry can hide newer pushes from a host by serving it the last version it saw.
DEFAULT_VALIDITY_S = 30 * 86400
#: The longest a push signs a tag for unless ``--max-expires`` raises it: a year, as TUF's own timestamp and snapshot
#: roles expire within days and its root within a year (a tag valid for ever disables freeze protection).
DEFAULT_MAX_VALIDITY_S = 365 * 86400
#: What ``--max-expires`` itself may not exceed: ten years (dates stay representable everywhere they are shown).
LONGEST_VALIDITY_S = 10 * 365 * 86400
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


@dataclass(frozen=True, slots=True)
class PushPolicy:
    """What a push to an ``oci://`` tag is told beyond its shapes: its validity (``--expires``, ``None``:
    ``$WARMCACHE_TAG_EXPIRES``, else 30 days) and ceiling (``--max-expires``, ``None``: a year), the keys besides its
    own whose tags it may build on (``--trust``), and whether it builds from the local registry alone (``--fresh``)."""

    expires: str | None = None
    max_expires: str | None = None
    trusted: TrustedKeys = NOT_CONFIGURED
    fresh: bool = False

    def validity(self) -> float:
        """Seconds a signed push's tag document is valid: checked before anything is read or sent."""
        return validity_seconds(self.expires, self.max_expires)


def _when(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def validity_seconds(flag: str | None = None, ceiling_flag: str | None = None) -> float:
    """How long a push's tag document is valid: ``--expires``, else ``$WARMCACHE_TAG_EXPIRES``, else 30 days; refused
    above the ceiling (``--max-expires``, else a year): a tag that never expires switches freeze protection off."""
    chosen = choose(TAG_EXPIRES, flag)
    text, source = (chosen.text, chosen.source) if chosen else (None, f"${EXPIRES_ENV}")
    seconds = parse_age(text, option=source) if text else DEFAULT_VALIDITY_S
    if seconds <= 0:
        raise UsageError(f"{source}: {shown(text or '')} is no time at all; a tag must be valid for a while")
    ceiling = DEFAULT_MAX_VALIDITY_S if ceiling_flag is None else parse_age(ceiling_flag, option="--max-expires")
    if not 0 < ceiling <= LONGEST_VALIDITY_S:
        raise UsageError(
            f"--max-expires: {shown(ceiling_flag or '')} is not a ceiling warmcache signs under (more than nothing, at "
            f"most {LONGEST_VALIDITY_S // 86400}d)"
        )
    if seconds > ceiling:
        raise UsageError(
            f"{source}: {shown(text or '')} is longer than the {ceiling / 86400:g} days a signed tag may stay valid "
            "(the longest a registry could hide newer pushes); refused: give a shorter one, or raise the ceiling "
            "explicitly with --max-expires AGE"
        )
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
    ``validity`` seconds from ``pushed_at``; refused at a version a JSON reader would not keep exact."""
    if not 0 < version < MAX_VERSION:
        raise TrustError(
            f"{reference.url}: the next version would be {version}, not a tag version (a whole number from 1 to "
            "2**53-1, what every JSON reader keeps exact); refused, nothing pushed"
        )
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
    """The version a tag document carries (0 for none or a malformed one): an unsigned push writes one more."""
    version = document.get("version") if isinstance(document, dict) else None
    return version if _is_version(version) else 0


def _is_version(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MAX_VERSION


def check_tag(
    document: dict[str, Any] | None,
    indexes: dict[str, dict[str, Any]],
    reference: OciReference,
    digest: str,
    trusted: TrustedKeys,
    now: float | None = None,
    *,
    check_expiry: bool = True,
    advice: str | None = None,
) -> TagVersion:
    """The verified version of the tag ``reference`` names, or :class:`TrustError` (one line): unsigned for its tag,
    signed for another repository or tag, at or above 2**53, expired (at ``now``, unless ``check_expiry`` is off), or
    holding an index the signed list does not name. ``advice`` replaces what each refusal tells a puller to do."""
    where = reference.url

    def refused(default: str) -> str:
        return f"refused: {advice or default}"

    if document is None:
        raise TrustError(
            f"{where}: no signed tag document (.warmcache-image/tag.json), so nothing binds its shapes to this tag "
            f"or says how new they are; {refused('push it again with --sign')}"
        )
    try:
        trusted.check_document(document, f"{where}: tag document")
    except TrustError as exc:
        raise TrustError(f"{exc}: {advice}" if advice else str(exc)) from None
    named = f"{document.get('repository')}:{document.get('tag')}"
    if named != f"{reference.repository}:{reference.tag}":
        raise TrustError(
            f"{where}: signed for {shown(named)}, not {reference.repository}:{reference.tag} (moved or copied under "
            f"another name); {refused('push it to this tag with --sign, or warmcache store promote it there')}"
        )
    version, pushed_at, listed = document.get("version"), document.get("pushed_at"), document.get("indexes")
    if isinstance(version, int) and not isinstance(version, bool) and version >= MAX_VERSION:
        raise TrustError(
            f"{where}: signed tag version {version} is at or above 2**53, past what every JSON reader keeps exact; "
            f"{refused('push it again with --sign --fresh')}"
        )
    if not _is_version(version) or not isinstance(pushed_at, (int, float)) or not isinstance(listed, dict):
        raise TrustError(f"{where}: tag document has no version, push time or index list; {refused('nothing read')}")
    expires = document.get("expires")
    if not isinstance(expires, (int, float)) or isinstance(expires, bool):
        raise TrustError(
            f"{where}: signed tag version {version} has no expiry date; {refused('push it again with --sign')}"
        )
    if check_expiry and (time.time() if now is None else now) >= expires:
        raise TrustError(
            f"{where}: signed tag version {version} (pushed {_when(pushed_at)}) expired {_when(expires)}; "
            + refused("the registry may be hiding newer pushes (push it again with --sign to renew it)")
        )
    for key, index in indexes.items():
        if listed.get(key) != hashlib.sha256(index_bytes(index)).hexdigest():
            raise TrustError(
                f"{where}: shape index {key} is not the one its tag document lists; {refused('nothing read')}"
            )
    return TagVersion(version, float(pushed_at), digest)


class TagMemory:
    """The newest verified version this host pulled or pushed of each tag (by URL), and the deployment's pinned
    minimum.

    It only moves forward: an entry that is not one warmcache writes (a version of ``3.0``, ``"3"``, ``2**60``, ``-5``)
    is refused like a malformed file, never rewritten with an older version; a memory that can be read is consulted
    whether or not it can be written.
    """

    def __init__(self, folder: Path, minimum: int = 0, minimum_source: str = "--min-tag-version") -> None:
        self.file = folder / MEMORY_FILE
        self.minimum, self.minimum_source = minimum, minimum_source

    @classmethod
    def resolve(cls, flag: str | None = None, minimum: int | None = None, minimum_source: str = "") -> TagMemory:
        """``--state-dir``, else ``$WARMCACHE_STATE_DIR``, else ``$XDG_STATE_HOME/warmcache`` (``~/.local/state``);
        the pin from ``--min-tag-version``, else ``$WARMCACHE_MIN_TAG_VERSION``, else none. An empty ``--state-dir``
        or variable is refused: falling back would read and write another memory than the one named."""
        if flag == "":
            raise UsageError("--state-dir: empty; name the folder where this host remembers tag versions")
        chosen = choose(STATE_DIR, flag)
        folder = chosen.text if chosen else None
        if folder == "":
            raise UsageError(f"${STATE_ENV} is set but empty; unset it or name the folder (the default would be used)")
        if not folder:
            base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
            folder = str(Path(base) / "warmcache")
        if minimum is None:
            pin = environment_value(MIN_TAG_VERSION)
            minimum, minimum_source = (_parse_pin(pin.text, pin.source), pin.source) if pin and pin.text else (0, "")
        return cls(Path(folder).expanduser(), minimum, minimum_source or "--min-tag-version")

    def known(self, url: str) -> TagVersion | None:
        """The newest version of ``url`` this host verified before (``None``: none); :class:`UsageError` for a memory
        that is not one warmcache writes, :class:`OSError` for one that cannot be read."""
        return self._read().get(url)

    def admit(self, url: str, seen: TagVersion) -> None:
        """A pull: refuse ``seen`` if older than the pin or than what this host verified of ``url`` before, or of the
        same version with another manifest; else remember it."""
        if seen.version < self.minimum:
            raise TrustError(
                f"{url}: {seen.describe()} is older than version {self.minimum}, the least the deployment accepts "
                f"({self.minimum_source}); refused: a rolled-back tag"
            )
        try:
            known = self.known(url)
        except OSError:
            known = None  # nothing to read here (a read-only root file system): writing fails too, below
        self.refuse_older(url, seen, known, same_version_ok=False)
        if known == seen:
            return
        try:
            self._remember(url, seen, same_version_ok=False)
        except (OSError, Timeout) as exc:
            if self.minimum or known is not None:
                return  # cannot write: the pin, or the memory read above, was the floor
            raise UsageError(
                f"{self.file}: cannot remember the tag versions this host pulled "
                f"({getattr(exc, 'strerror', None) or exc}); give a writable --state-dir (${STATE_ENV}), or pin "
                f"--min-tag-version (${MIN_VERSION_ENV})"
            ) from None

    def refuse_older(
        self, url: str, seen: TagVersion, known: TagVersion | None, *, same_version_ok: bool, advice: str = ""
    ) -> None:
        """:class:`TrustError` when ``seen`` is older than ``known`` (what this host verified before), or (unless
        ``same_version_ok``: a pusher meeting a concurrent push) of its version but another manifest."""
        suffix = f" ({advice})" if advice else ""
        if known is not None and known.version > seen.version:
            raise TrustError(
                f"{url}: {seen.describe()} is older than {known.describe()}, which this host pulled or pushed before "
                f"({self.file}); refused: a rolled-back tag{suffix}"
            )
        if known is not None and not same_version_ok and known.version == seen.version and known.digest != seen.digest:
            raise TrustError(
                f"{url}: {seen.describe()} is another manifest than {known.describe()}, which this host pulled or "
                f"pushed before ({self.file}); refused: one version, two contents{suffix}"
            )

    def check_writable(self) -> None:
        """Before a signed push sends anything: :class:`UsageError` unless this host can remember what it pushes."""
        try:
            self.file.parent.mkdir(parents=True, exist_ok=True)
            with FileLock(f"{self.file}.lock", timeout=_LOCK_SECONDS):
                self._read()
        except (OSError, Timeout) as exc:
            raise UsageError(
                f"{self.file}: cannot remember the tag versions this host pushes "
                f"({getattr(exc, 'strerror', None) or exc}); a signed push needs it (so that it never signs a tag "
                f"older than its own last push): give a writable --state-dir (${STATE_ENV})"
            ) from None

    def remember(self, url: str, verified: TagVersion) -> None:
        """A pusher's: remember a version of ``url`` it verified or wrote (unless a newer one is known already; one of
        the same version is a concurrent push, not a rollback)."""
        self._remember(url, verified, same_version_ok=True)

    def _remember(self, url: str, seen: TagVersion, *, same_version_ok: bool) -> None:
        self.file.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(f"{self.file}.lock", timeout=_LOCK_SECONDS):
            tags = self._read()
            known = tags.get(url)
            self.refuse_older(url, seen, known, same_version_ok=same_version_ok)
            if known != seen:
                tags[url] = seen
                self._write(tags)

    def _read(self) -> dict[str, TagVersion]:
        try:
            document = json.loads(self.file.read_bytes())
        except FileNotFoundError:
            return {}
        except ValueError:
            raise UsageError(f"{self.file}: not the tag memory warmcache writes (not JSON); refused") from None
        tags = document.get("tags") if isinstance(document, dict) else None
        if not isinstance(tags, dict):
            raise UsageError(f"{self.file}: not the tag memory warmcache writes (no 'tags' table); refused")
        return {url: self._entry(url, entry) for url, entry in tags.items()}

    def _entry(self, url: str, entry: Any) -> TagVersion:
        """One remembered tag, or :class:`UsageError`: a malformed entry is never read as "nothing known" (which a
        pull would then overwrite with an older version)."""
        fields = entry if isinstance(entry, dict) else {}
        version, pushed_at, digest = fields.get("version"), fields.get("pushed_at"), fields.get("digest")
        if not _is_version(version):
            raise UsageError(
                f"{self.file}: tag {shown(url)} has version {shown(version)}, not a whole number from 0 to 2**53-1; "
                "refused (the memory only moves forward: fix or remove the entry by hand)"
            )
        if not isinstance(pushed_at, (int, float)) or isinstance(pushed_at, bool) or not math.isfinite(pushed_at):
            raise UsageError(f"{self.file}: tag {shown(url)} has push time {shown(pushed_at)}, not a number; refused")
        if not isinstance(digest, str):
            raise UsageError(f"{self.file}: tag {shown(url)} has digest {shown(digest)}, not a string; refused")
        return TagVersion(version, float(pushed_at), digest)

    def _write(self, tags: dict[str, TagVersion]) -> None:
        entries = {url: {"version": t.version, "pushed_at": t.pushed_at, "digest": t.digest} for url, t in tags.items()}
        handle, temporary = tempfile.mkstemp(dir=self.file.parent, prefix=f".{self.file.name}.")
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                json.dump({"format": TAG_FORMAT, "tags": entries}, out, indent=1, sort_keys=True)
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
