"""Where an artifact store is: a :class:`StoreLocation`, checked once where it is given, as a registry location is.

``--store``, ``$WARMCACHE_STORE`` and a manifest's ``[store] url`` accept the same forms
(:data:`ACCEPTED_FORMS`): an S3 bucket, a ``file://`` folder, an OCI repository, or a plain
folder path (anchored at the manifest's folder, or at the current one for the flag and the
variable). Everything below the edge takes the parsed value; the OCI reference's own parts
(host, repository, tag) are read by :mod:`warmcache.store.oci.reference`.
"""

from __future__ import annotations

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
class StoreLocation:
    """A store URL, normalised once (a folder path becomes ``file:///absolute/path``), with where it came from."""

    url: str
    source: str = "store URL"

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
        return cls(text, source)

    @property
    def scheme(self) -> str:
        return urlparse(self.url).scheme

    @property
    def is_oci(self) -> bool:
        return self.scheme in OCI_SCHEMES

    @property
    def folder(self) -> Path:
        """A ``file://`` store's folder."""
        return Path(unquote(urlparse(self.url).path))

    def __str__(self) -> str:
        return self.url
