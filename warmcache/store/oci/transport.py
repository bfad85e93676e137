"""How every request to a registry travels: oras's client on a session that bounds what a registry may send back.

oras (the ORAS project's Python SDK) brings reference and URL building and authentication
as registries do it: HTTP basic (``htpasswd``, Harbor robot accounts) and the bearer-token
dance (Docker Hub, ECR, Artifact Registry, GHCR), with credentials from the docker config
and its credential helpers (:mod:`.credentials`). Its requests, and the token requests it
makes on its own, all go through :class:`BoundedSession`, which holds a hostile or broken
registry to these rules:

- **Socket timeouts** on every request (5 s to connect, 20 s per read); the whole request
  is bounded by :class:`~warmcache.store.deadline.Deadline` in the caller.
- **Bodies bounded before they are read.** An answer read whole (a manifest, a tag page, a
  token, an error) is refused above :data:`MAX_ANSWER_BYTES`, by its ``Content-Length``
  before a byte is read, else as it arrives; no transfer compression is asked for. A blob
  is streamed and cut at its declared size by the caller.
- **Redirects checked and followed here** (at most :data:`MAX_REDIRECTS`, for reads only):
  to HTTPS anywhere (a blob on S3 or a CDN), to plain HTTP only on the registry's own
  loopback host and port; credentials never go to another host.
- **A token service on another host over plain HTTP is refused**: the docker-config
  credentials would cross the network in clear.
"""

from __future__ import annotations

import logging
from http.cookiejar import DefaultCookiePolicy
from typing import Any
from urllib.parse import urljoin, urlparse

import oras.auth
import oras.auth.utils
import oras.provider
import requests

from warmcache.errors import StoreError
from warmcache.store.oci.credentials import load_docker_config
from warmcache.store_location import OciReference

CONNECT_SECONDS, READ_SECONDS = 5.0, 20.0
#: A manifest, a page of tags, a token or an error is a few KiB; a registry answer larger than this is not one.
MAX_ANSWER_BYTES = 4 * 1024 * 1024
#: Redirects followed for one read (a registry sends a blob read to its storage once).
MAX_REDIRECTS = 5
_READ_METHODS = ("GET", "HEAD")

log = logging.getLogger(__name__)


class BoundedSession(requests.Session):
    """A session for one registry: timeouts, bounded answers, checked redirects (see the module docstring)."""

    def __init__(self, reference: OciReference) -> None:
        super().__init__()
        self.reference = reference
        self.max_redirects = MAX_REDIRECTS
        self.headers["Accept-Encoding"] = "identity"  # a blob's digest is of its bytes; no bomb to inflate
        self.cookies.set_policy(DefaultCookiePolicy(allowed_domains=[]))  # oras ignores cookies (Harbor's CSRF ones)

    def request(self, method: str | bytes, url: str | bytes, **kwargs: Any) -> requests.Response:  # type: ignore[override]
        kwargs.setdefault("timeout", (CONNECT_SECONDS, READ_SECONDS))
        stream = kwargs.pop("stream", False)
        follow = kwargs.pop("allow_redirects", True) and str(method).upper() in _READ_METHODS
        headers = dict(kwargs.pop("headers", None) or {})
        target = url.decode() if isinstance(url, bytes) else url
        for _ in range(MAX_REDIRECTS + 1):
            kwargs.update(headers=headers, stream=True, allow_redirects=False)
            response = super().request(str(method), target, **kwargs)
            if not (follow and response.is_redirect):
                break
            response.close()  # its body is never read: a redirect may carry gigabytes
            following = self.checked_redirect(target, response.headers.get("location", ""))
            crossed = urlparse(following).netloc != urlparse(target).netloc
            if crossed:
                headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
            log.debug(
                "%s: %s redirected (HTTP %d) to %s%s",
                self.reference.repository_url,
                str(method).upper(),
                response.status_code,
                _without_query(following),  # a storage URL's query may be a presigned secret
                "; credentials not sent there" if crossed else "",
            )
            target = following
        else:
            raise StoreError(f"{self.reference.repository_url}: more than {MAX_REDIRECTS} redirects; refused")
        if not stream:
            read_bounded(response, MAX_ANSWER_BYTES, self.reference.repository_url)
        return response

    def checked_redirect(self, current: str, location: str) -> str:
        """The absolute URL ``location`` sends a read to, refused unless HTTPS or this loopback registry's own
        address."""
        target = urljoin(current, location)
        parsed = urlparse(target)
        if parsed.scheme == "https" or (parsed.scheme == "http" and parsed.netloc == self.reference.host):
            return target
        raise StoreError(
            f"{self.reference.repository_url}: the registry redirects a read to {parsed.scheme}://{parsed.netloc}, "
            f"neither HTTPS nor the registry's own address; refused"
        )


def _without_query(url: str) -> str:
    """``scheme://host/path`` of ``url``: what a log line may show of it."""
    parsed = urlparse(url)
    return f"{parsed.scheme}://{parsed.netloc}{parsed.path}"


def read_bounded(response: requests.Response, limit: int, where: str) -> bytes:
    """The whole body of a streamed ``response`` (then also its ``.content``), refused above ``limit`` bytes before
    more is read."""
    declared = response.headers.get("Content-Length", "")
    if declared.isdigit() and int(declared) > limit:
        response.close()
        raise StoreError(
            f"{where}: the registry answers {response.request.method} with {declared} bytes, more than "
            f"the {limit} an answer may have; refused"
        )
    body = bytearray()
    for block in response.iter_content(64 * 1024):
        body += block
        if len(body) > limit:
            response.close()
            raise StoreError(
                f"{where}: the registry's answer to {response.request.method} runs past {limit} bytes; refused"
            )
    content = bytes(body)  # one copy, kept by the response too: the peak is twice the answer, not three times
    del body
    response._content, response._content_consumed = content, True
    return content


class ChallengeAuth(oras.auth.TokenAuth):
    """oras's token auth, plus HTTP basic when the registry's challenge asks for it, and no token service that would
    carry the credentials in clear to another host.

    oras picks one scheme up front; a registry says which it wants in ``WWW-Authenticate``
    (``Basic`` for htpasswd, ``Bearer realm=...`` for a token service), so this follows it.
    After the first basic challenge the credentials go with every request (no 401 round trip each).
    """

    basic = False
    reference: OciReference

    def authenticate_request(
        self, original: requests.Response, headers: dict[str, str], refresh: bool = False
    ) -> tuple[dict[str, str], bool]:
        challenge = original.headers.get("Www-Authenticate", "")
        if challenge.lower().startswith("basic"):
            if not getattr(self, "_basic_auth", None):
                return headers, False
            self.basic = True
            return {**(headers or {}), "Authorization": f"Basic {self._basic_auth}"}, True
        realm = oras.auth.utils.parse_auth_header(challenge).realm or ""
        realm = realm if realm.startswith("http") else f"{self.prefix}://{realm}"
        parsed = urlparse(realm)
        if parsed.scheme != "https" and parsed.netloc != self.reference.host:
            raise StoreError(
                f"{self.reference.repository_url}: the registry sends credentials to a token service on "
                f"{parsed.scheme}://{parsed.netloc} over plain HTTP; refused"
            )
        return super().authenticate_request(original, headers, refresh)


class Oras(oras.provider.Registry):
    """oras's registry client with our session and auth, and one request without its sleeping retry decorator."""

    def __init__(self, reference: OciReference) -> None:
        super().__init__(hostname=reference.host, insecure=reference.plain_http, auth_backend="token")
        session = BoundedSession(reference)
        auth = ChallengeAuth()
        auth.session, auth.prefix, auth._tls_verify, auth.reference = session, self.prefix, True, reference
        # Our reading of the docker config ($DOCKER_CONFIG honoured, URL keys normalised): oras looks the host up in it.
        auth._auth_config = load_docker_config()
        self.session, self.auth = session, auth

    def request_once(
        self, url: str, method: str, headers: dict[str, str], data: Any = None, stream: bool = False
    ) -> requests.Response:
        """One request with oras's authentication (a 401 answered once), without its sleeping retry decorator."""
        if self.auth.basic and getattr(self.auth, "_basic_auth", None):
            headers = {**headers, "Authorization": f"Basic {self.auth._basic_auth}"}
        undecorated = oras.provider.Registry.do_request.__wrapped__
        response: requests.Response = undecorated(self, url, method, data=data, headers=headers, stream=stream)
        return response
