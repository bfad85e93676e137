"""What an ``oci://`` store URL names: a registry, a repository and a tag.

``oci://HOST[:PORT]/REPOSITORY[:TAG]`` speaks HTTPS, as every registry in production
does (ECR, Artifact Registry, Harbor); ``oci+http://`` speaks plain HTTP and is accepted
only for a registry on loopback (a test registry, a node-local mirror), so that neither
credentials nor compiled code cross a network unencrypted. The tag defaults to
``latest``, as ``docker`` and ``skopeo`` default it. Credentials never appear in a URL:
they come from ``$DOCKER_CONFIG/config.json`` (:mod:`.credentials`), so no command line
or error message can carry them.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import urlparse

from warmcache.errors import UsageError, shown
from warmcache.store_location import OCI_SCHEMES, refuse_dropped_parts

DEFAULT_TAG = "latest"
#: The OCI distribution spec's grammar for repository names and tags.
_REPOSITORY = re.compile(r"[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*)*")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
_LOOPBACK_NAMES = ("localhost",)
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


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


def parse_oci_url(url: str) -> OciReference:
    """Parse ``oci://HOST[:PORT]/REPOSITORY[:TAG]`` (or ``oci+http://`` on loopback); :class:`UsageError` naming the
    fault."""
    refuse_dropped_parts(url)  # urlparse strips tabs and newlines: ``team/n\nl:pro\td`` would name team/nl:prod
    parsed = urlparse(url)
    if parsed.scheme not in OCI_SCHEMES:
        raise UsageError(f"store URL {shown(url)}: not an OCI registry URL (oci://HOST[:PORT]/REPOSITORY[:TAG])")
    if parsed.username is not None or parsed.password is not None:
        raise UsageError(
            f"store URL {parsed.scheme}://…@{parsed.hostname}: credentials do not belong in a URL; "
            "put them in ~/.docker/config.json (docker login, or a credential helper)"
        )
    if not parsed.hostname or parsed.query or parsed.fragment or parsed.params:
        raise UsageError(f"store URL {shown(url)}: expected {parsed.scheme}://HOST[:PORT]/REPOSITORY[:TAG]")
    try:
        port = parsed.port
    except ValueError:
        raise UsageError(f"store URL {shown(url)}: the port is not a number") from None
    name = parsed.path.strip("/")
    repository, _, tag = name.rpartition(":") if ":" in name.rsplit("/", 1)[-1] else (name, "", DEFAULT_TAG)
    if "@" in name:
        raise UsageError(f"store URL {shown(url)}: name a tag, not a digest (a push writes the tag; a pull reads it)")
    if not _REPOSITORY.fullmatch(repository):
        raise UsageError(
            f"store URL {shown(url)}: {shown(repository)} is not a repository name (lowercase "
            "letters, digits, '.', '_', '-', '/')"
        )
    if not _TAG.fullmatch(tag):
        raise UsageError(
            f"store URL {shown(url)}: {shown(tag)} is not a tag (letters, digits, '_', '.', '-'; at most 128)"
        )
    plain_http = parsed.scheme == "oci+http"
    if plain_http and not _is_loopback(parsed.hostname):
        raise UsageError(
            f"store URL {shown(url)}: plain HTTP (oci+http://) only reaches a registry on loopback; "
            f"use oci:// (HTTPS) for {parsed.hostname}"
        )
    host = parsed.hostname if ":" not in parsed.hostname else f"[{parsed.hostname}]"
    return OciReference(f"{host}:{port}" if port else host, repository, tag, plain_http)


def is_digest(text: object) -> bool:
    """Whether ``text`` is a sha256 digest as the distribution spec writes it (``sha256:`` and 64 lowercase hex)."""
    return isinstance(text, str) and _DIGEST.fullmatch(text) is not None


def _is_loopback(hostname: str) -> bool:
    if hostname.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(hostname).is_loopback
    except ValueError:
        return False
