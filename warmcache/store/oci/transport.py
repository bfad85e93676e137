"""How every request to a registry travels: authentication as registries ask for it, on a session that bounds what a
registry may send back, all on ``requests``' public API.

:class:`RegistryTransport` answers a registry's challenge (``WWW-Authenticate``) as registries
do it: HTTP basic (``htpasswd``, Harbor robot accounts) and the bearer-token dance (Docker Hub,
ECR, Artifact Registry, GHCR), with credentials from the docker config and its credential
helpers (:mod:`.credentials`). Its requests, and the token requests it makes, all go through
:class:`BoundedSession`, which holds a hostile or broken registry to these rules:

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
import re
from collections.abc import Iterator
from http.cookiejar import DefaultCookiePolicy
from typing import Any, NoReturn
from urllib.parse import urljoin, urlparse

import requests

from warmcache.errors import StoreError
from warmcache.store.oci.credentials import basic_credentials
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
        self.cookies.set_policy(DefaultCookiePolicy(allowed_domains=[]))  # no cookies (Harbor's CSRF ones)

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
    more is read; once refused, the body reads as empty."""
    capped = _CappedBody(response.raw, limit, where, str(response.request.method))
    response.raw = capped
    declared = response.headers.get("Content-Length", "")
    if declared.isdigit() and int(declared) > limit:
        capped.refuse(
            f"the registry answers {capped.method} with {declared} bytes, more than the {limit} an answer may have"
        )
    return response.content


class _CappedBody:
    """A response's raw body that gives ``requests`` at most ``limit`` bytes: it reads ``.content`` through
    :meth:`stream` (and turns the socket's errors into its own, as for any body)."""

    def __init__(self, raw: Any, limit: int, where: str, method: str) -> None:
        self.raw, self.left, self.where, self.method = raw, limit, where, method
        self.limit, self.refused = limit, False

    def stream(self, amount: int, decode_content: bool | None = None) -> Iterator[bytes]:
        if self.refused:
            return
        for block in self.raw.stream(amount, decode_content=decode_content):
            self.left -= len(block)
            if self.left < 0:
                self.refuse(f"the registry's answer to {self.method} runs past {self.limit} bytes")
            yield block

    def refuse(self, what: str) -> NoReturn:
        self.refused = True
        self.close()
        raise StoreError(f"{self.where}: {what}; refused")

    def close(self) -> None:
        self.raw.close()

    def release_conn(self) -> None:
        self.raw.release_conn()


class ChallengeUnanswered(Exception):
    """The registry asks for credentials this host has none of (or a token service gave none)."""


class RegistryTransport:
    """One registry's requests, each answered once when the registry challenges it (401; a 403 once more with a
    fresh token).

    A ``Basic`` challenge gets the docker config's credentials, and every later request
    carries them (no 401 round trip each); a ``Bearer realm=...`` challenge gets a token from
    the realm for the challenge's scope (with the credentials, else anonymously), kept for later
    requests until a challenge asks for another. A token
    service on another host over plain HTTP is refused: the credentials would cross the
    network in clear.
    """

    def __init__(self, reference: OciReference) -> None:
        self.reference = reference
        self.prefix = "http" if reference.plain_http else "https"
        self.session = BoundedSession(reference)
        #: base64 ``user:password`` for this registry (inline, or from a credential helper), or ``None``.
        self.credentials = basic_credentials(reference.host)
        self.basic = False
        self.token: str | None = None

    def request_once(
        self, url: str, method: str, headers: dict[str, str], data: Any = None, stream: bool = False
    ) -> requests.Response:
        """One request, its challenge answered once; :class:`ChallengeUnanswered` when it cannot be."""
        response = self.session.request(method, url, data=data, headers=self._authorised(headers), stream=stream)
        if response.status_code not in (401, 403):
            return response
        response.close()
        response = self.session.request(method, url, data=data, headers=self._answer(response, headers), stream=stream)
        if response.status_code == 403 and _challenge(response).lower().startswith("bearer"):
            response.close()  # the token may be stale or too narrow: one fresh one
            response = self.session.request(
                method, url, data=data, headers=self._answer(response, headers), stream=stream
            )
        return response

    def _authorised(self, headers: dict[str, str]) -> dict[str, str]:
        if self.basic and self.credentials:
            return {**headers, "Authorization": f"Basic {self.credentials}"}
        if self.token:
            return {**headers, "Authorization": f"Bearer {self.token}"}
        return headers

    def _answer(self, challenged: requests.Response, headers: dict[str, str]) -> dict[str, str]:
        """``headers`` with what answers the registry's challenge."""
        challenge = _challenge(challenged)
        if not challenge:
            raise ChallengeUnanswered("the registry refused without saying how to authenticate")
        if challenge.lower().startswith("basic"):
            if not self.credentials:
                raise ChallengeUnanswered("the registry asks for a password")
            self.basic = True
            return self._authorised(headers)
        # a token this request carried did not do (expired, or for another scope: a pull's token on a push)
        self.token = self._fetch_token(dict(_CHALLENGE_PARAMETER.findall(challenge)))
        return self._authorised(headers)

    def _fetch_token(self, challenge: dict[str, str]) -> str:
        """A bearer token from the challenge's realm, for its service and scope."""
        realm = challenge.get("realm", "")
        if not realm:
            raise ChallengeUnanswered("the registry's challenge names no token service")
        realm = realm if realm.startswith("http") else f"{self.prefix}://{realm}"
        parsed = urlparse(realm)
        if parsed.scheme != "https" and parsed.netloc != self.reference.host:
            raise StoreError(
                f"{self.reference.repository_url}: the registry sends credentials to a token service on "
                f"{parsed.scheme}://{parsed.netloc} over plain HTTP; refused"
            )
        params = {name: challenge[name] for name in ("service", "scope") if name in challenge}
        headers = {"Accept": "application/json"}
        if self.credentials:
            headers["Authorization"] = f"Basic {self.credentials}"
        response = self.session.get(realm, params=params, headers=headers)
        if response.status_code != 200:
            raise ChallengeUnanswered(f"the token service answers HTTP {response.status_code}")
        try:
            answer = response.json()
        except ValueError:
            raise ChallengeUnanswered("the token service's answer is not JSON") from None
        token = answer.get("token") or answer.get("access_token") if isinstance(answer, dict) else None
        if not isinstance(token, str) or not token:
            raise ChallengeUnanswered("the token service gave no token")
        return token


def _challenge(response: requests.Response) -> str:
    return response.headers.get("Www-Authenticate", "")


#: ``name="value"`` pairs of a ``WWW-Authenticate`` header (realm, service, scope).
_CHALLENGE_PARAMETER = re.compile(r'([A-Za-z]+)="(.+?)"')
