"""A database URL's text as warmcache may print it, and the characters no part of one may hold.

:func:`printable_url` is the only way a registry URL becomes text a person sees (an
error line, ``serve``'s banner, its log, a request file), and it reads the text rather
than a parsed URL: a value refused at validation is not yet a URL any parser vouches
for, and hiding more than a parser would is the safe side of a disagreement.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

#: The libpq connection parameters whose values are secrets (the ones libpq itself shows as ``*``): a URL may carry
#: them in its query (``postgresql://u@h/db?password=…``) as well as in its user part.
SECRET_PARAMETERS = ("password", "sslpassword", "oauth_client_secret")
HIDDEN = "***"

# A secret parameter's value wherever it is set: ``?password=…``, ``&sslpassword=…``, and inside a value that is
# itself a connection string (``dbname=host%3Dh%20password%3D…``); the value runs to the next ``&`` (or blank).
_SECRET_VALUE = re.compile(
    r"(?<![A-Za-z_])(" + "|".join(SECRET_PARAMETERS) + r")(\s*=\s*|%3D)('[^']*'|[^&\s]*)", re.IGNORECASE
)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def printable_url(text: str) -> str:
    """``text`` (a database URL or a file path) with every secret hidden: the password of its user part and the value
    of each :data:`SECRET_PARAMETERS` in its query.

    The user part ends at the last ``@`` once the query's secrets are hidden, so a
    password holding an ``@`` (or a ``?``) is hidden whole; an ``@`` in another query
    value hides more than it must, never less.
    """
    scheme, separator, rest = text.partition("://")
    if not separator:
        return text
    rest = _SECRET_VALUE.sub(lambda found: f"{found[1]}{found[2]}{HIDDEN}", rest)
    userinfo, at, host = rest.rpartition("@")
    if at and ":" in userinfo:
        rest = f"{userinfo.split(':', 1)[0]}:{HIDDEN}@{host}"
    return f"{scheme}://{rest}"


def control_character_problem(text: str) -> str | None:
    """Which part of a database URL (or file path) holds a control character, raw or percent-encoded, or ``None``.

    A raw newline splits a one-line error in two; ``%00`` ends the value where libpq
    reads it, so ``db%00x`` connects to ``db``, another database than the one given.
    The answer names the part (``database name``, ``query parameter 'sslmode'``) and
    the character, never a password's text.
    """
    for part, value in _parts(text):
        found = _CONTROL.search(value) or ("://" in text and _CONTROL.search(unquote(value)))
        if found:
            return f"its {part} holds the control character {ascii(found[0])}; refused"
    return None


def _parts(text: str) -> list[tuple[str, str]]:
    """``text`` cut into the parts a refusal names, together covering all of it."""
    scheme, separator, rest = text.partition("://")
    if not separator:
        return [("path", text)]
    location, _, query = rest.partition("?")
    userinfo, _, host_and_path = location.rpartition("@")
    user, _, password = userinfo.partition(":")
    host, _, database = host_and_path.partition("/")
    parts = [("scheme", scheme), ("user name", user), ("password", password), ("host", host)]
    parts.append(("database name" if scheme.startswith("postgres") else "path", database))
    for pair in query.split("&") if query else ():
        name = pair.partition("=")[0]
        label = f"query parameter {ascii(unquote(name))}" if not _CONTROL.search(unquote(name)) else "query"
        parts.append((label, pair))
    return parts
