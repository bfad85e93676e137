"""Who may write: a bearer token from ``$WARMCACHE_TOKEN`` or a file; without one, nobody.

Reads are open (the service binds to 127.0.0.1 unless told otherwise); every ``POST``
needs ``Authorization: Bearer <token>``. A server started without a token refuses
writes instead of accepting anonymous ones.
"""

from __future__ import annotations

import hmac
from pathlib import Path

from warmcache.errors import UsageError
from warmcache.service.http import ApiError
from warmcache.settings_table import TOKEN, environment_value
from warmcache.trust import refuse_readable_by_others

TOKEN_ENV = TOKEN.env


#: A bearer token shorter than this is guessable by a client that may try as often as it likes.
MIN_TOKEN_CHARS = 16


def load_token(token_file: Path | None = None) -> str | None:
    """The token from ``token_file`` if given, else ``$WARMCACHE_TOKEN``; ``None`` when neither holds one.

    A token shorter than :data:`MIN_TOKEN_CHARS` is refused (never quoted: it is a secret), and so is a token file
    group or others can read (as a signing key is; a Kubernetes Secret mounts with ``defaultMode: 0600``).
    """
    if token_file is not None:
        try:
            refuse_readable_by_others(token_file, "token file")
            text = token_file.read_text(encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"{token_file}: cannot read token file: {exc.strerror}") from None
        token, source = text.strip(), str(token_file)
        if not token:
            raise UsageError(f"{token_file}: token file is empty")
    else:
        from_env = environment_value(TOKEN)
        token, source = (from_env.text.strip(), from_env.source) if from_env else ("", f"${TOKEN_ENV}")
    if token and len(token) < MIN_TOKEN_CHARS:
        raise UsageError(
            f"{source}: the token has {len(token)} characters, fewer than {MIN_TOKEN_CHARS}; refused "
            "(make one with: python -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )
    return token or None


class WriteAuthorisation:
    """Checks the ``Authorization`` header of a write against the configured token (in constant time)."""

    def __init__(self, token: str | None) -> None:
        self._token = token.encode() if token else None

    @property
    def enabled(self) -> bool:
        return self._token is not None

    def require(self, header: str | None) -> None:
        if self._token is None:
            raise ApiError(
                403, f"writes are disabled: start the server with ${TOKEN_ENV} or --token-file to allow them"
            )
        scheme, _, given = (header or "").partition(" ")
        if scheme.lower() != "bearer" or not given:
            raise ApiError(401, "write needs an 'Authorization: Bearer <token>' header", "Authorization")
        if not hmac.compare_digest(given.strip().encode(), self._token):
            raise ApiError(401, "wrong bearer token", "Authorization")
