"""Where an artifact store is: a :class:`StoreLocation`, checked once where it is given, as a registry location is.

``--store``, ``$WARMCACHE_STORE`` and a manifest's ``[store] url`` accept the same forms
(:data:`ACCEPTED_FORMS`): an S3 bucket, a ``file://`` folder, an OCI repository, or a plain
folder path (anchored at the manifest's folder, or at the current one for the flag and the
variable). An ``oci://`` URL is parsed to its :class:`OciReference` (host, repository, tag) here too, so a
malformed repository fails where the URL is given (a manifest fails to load), and the reference
and the source label travel together to the store, which never parses the text again.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from warmcache.anchor import Anchor
from warmcache.errors import UsageError, shown

#: An OCI registry over HTTPS, or plain HTTP on loopback.
OCI_SCHEMES = ("oci", "oci+http")
#: Every scheme a store URL may have.
SCHEMES = ("s3", "file", *OCI_SCHEMES)
#: What a store location may be; every refused one is answered with this list.
ACCEPTED_FORMS = "s3://bucket/prefix, file:///path, oci://host/repository:tag or a folder path"
DEFAULT_TAG = "latest"
#: The OCI distribution spec's grammar for repository names and tags.
_REPOSITORY = re.compile(r"[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*)*")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
_LOOPBACK_NAMES = ("localhost",)


def refuse_dropped_parts(url: str, source: str = "store URL") -> None:
    """Refuse a store URL holding a control character (a newline?), a query or a fragment: one line naming it.

    ``urlparse`` strips tabs and newlines anywhere in a URL (``team/n\\nl:pro\\td`` parses as
    ``team/nl:prod``) and sets a ``?query`` or ``#fragment`` aside: a store named that way would
    be another store than the text says.
    """
    if any(ord(c) < 32 or c == "\x7f" for c in url):
        raise UsageError(f"{source} {shown(url)}: holds a control character (a newline?); refused")
    for mark, part in (("?", "query"), ("#", "fragment")):
        if mark in url:
            raise UsageError(f"{source} {shown(url)}: a {part} ({mark}...) is not part of a store location; refused")


@dataclass(frozen=True, slots=True)
class OciReference:
    """``host`` (with its port), ``repository`` and ``tag``; ``plain_http`` for a loopback registry without TLS."""

    host: str
    repository: str
    tag: str
    plain_http: bool = False

    @property
    def url(self) -> str:
        """The store URL as warmcache prints it (never with credentials: it never holds any)."""
        return f"{'oci+http' if self.plain_http else 'oci'}://{self.host}/{self.repository}:{self.tag}"

    @property
    def repository_url(self) -> str:
        """The repository without its tag: what ``store ls|gc|check`` cover."""
        return f"{'oci+http' if self.plain_http else 'oci'}://{self.host}/{self.repository}"

    @property
    def image(self) -> str:
        """``host/repository:tag``, as ``skopeo`` and the Kubernetes ``image.reference`` field name it."""
        return f"{self.host}/{self.repository}:{self.tag}"

    def with_tag(self, tag: str) -> OciReference:
        return OciReference(self.host, self.repository, tag, self.plain_http)


@dataclass(frozen=True, slots=True)
class StoreLocation:
    """A store URL, normalised once (a folder path becomes ``file:///absolute/path``), with where it came from
    (``--store``, ``$WARMCACHE_STORE``, a manifest's ``[store] url``) and, for ``oci://``, its parsed reference."""

    url: str
    source: str = "store URL"
    oci: OciReference | None = None

    @classmethod
    def parse(cls, text: str, source: str = "store URL", base: Path | None = None) -> StoreLocation:
        """Check ``text`` (a URL or a folder path; a relative path anchors at ``base``, else the current folder)."""
        if not text.strip():
            raise UsageError(f"{source} is empty; give {ACCEPTED_FORMS}")
        refuse_dropped_parts(text, source)
        if "://" not in text:
            return cls((Anchor(base) if base else Anchor.here()).path(text).as_uri(), source)
        parsed = urlparse(text)
        if parsed.scheme not in SCHEMES:
            raise UsageError(f"{source} {shown(text)}: unknown scheme {shown(parsed.scheme)}; give {ACCEPTED_FORMS}")
        if parsed.scheme == "s3" and not parsed.netloc:
            raise UsageError(f"{source} {shown(text)}: name the bucket (s3://bucket/prefix)")
        if parsed.scheme == "file" and (parsed.netloc not in ("", "localhost") or not parsed.path.startswith("/")):
            raise UsageError(f"{source} {shown(text)}: a file store is file:///absolute/path")
        return cls(text, source, _parse_oci(text, source) if parsed.scheme in OCI_SCHEMES else None)

    @property
    def scheme(self) -> str:
        return urlparse(self.url).scheme

    @property
    def is_oci(self) -> bool:
        return self.oci is not None

    def oci_reference(self) -> OciReference:
        """The ``oci://`` reference; :class:`UsageError` naming the source for any other store."""
        if self.oci is None:
            raise UsageError(
                f"{self.source} {shown(self.url)}: not an OCI registry URL (oci://HOST[:PORT]/REPOSITORY[:TAG])"
            )
        return self.oci

    @property
    def folder(self) -> Path:
        """A ``file://`` store's folder."""
        return Path(unquote(urlparse(self.url).path))

    def __str__(self) -> str:
        return self.url


def _parse_oci(url: str, source: str) -> OciReference:
    """Parse ``oci://HOST[:PORT]/REPOSITORY[:TAG]`` (or ``oci+http://`` on loopback) that :func:`refuse_dropped_parts`
    passed; :class:`UsageError` naming ``source`` and the fault."""
    parsed = urlparse(url)
    if parsed.username is not None or parsed.password is not None:
        raise UsageError(
            f"{source} {parsed.scheme}://…@{parsed.hostname}: credentials do not belong in a URL; "
            "put them in ~/.docker/config.json (docker login, or a credential helper)"
        )
    if not parsed.hostname or parsed.query or parsed.fragment or parsed.params:
        raise UsageError(f"{source} {shown(url)}: expected {parsed.scheme}://HOST[:PORT]/REPOSITORY[:TAG]")
    try:
        port = parsed.port
    except ValueError:
        raise UsageError(f"{source} {shown(url)}: the port is not a number") from None
    name = parsed.path.strip("/")
    repository, _, tag = name.rpartition(":") if ":" in name.rsplit("/", 1)[-1] else (name, "", DEFAULT_TAG)
    if "@" in name:
        raise UsageError(f"{source} {shown(url)}: name a tag, not a digest (a push writes the tag; a pull reads it)")
    if not _REPOSITORY.fullmatch(repository):
        raise UsageError(
            f"{source} {shown(url)}: {shown(repository)} is not a repository name (lowercase "
            "letters, digits, '.', '_', '-', '/')"
        )
    if not _TAG.fullmatch(tag):
        raise UsageError(
            f"{source} {shown(url)}: {shown(tag)} is not a tag (letters, digits, '_', '.', '-'; at most 128)"
        )
    plain_http = parsed.scheme == "oci+http"
    if plain_http and not _is_loopback(parsed.hostname):
        raise UsageError(
            f"{source} {shown(url)}: plain HTTP (oci+http://) only reaches a registry on loopback; "
            f"use oci:// (HTTPS) for {parsed.hostname}"
        )
    host = parsed.hostname if ":" not in parsed.hostname else f"[{parsed.hostname}]"
    return OciReference(f"{host}:{port}" if port else host, repository, tag, plain_http)


def _is_loopback(hostname: str) -> bool:
    if hostname.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(hostname).is_loopback
    except ValueError:
        return False
