"""The one check every store URL passes before it is parsed: nothing in its text may be silently dropped.

``urlparse`` strips tabs and newlines anywhere in a URL (``team/n\\nl:pro\\td`` parses as
``team/nl:prod``) and sets a ``?query`` or ``#fragment`` aside: a store named that way
would be another store than the text says, so ``s3://``, ``file://`` and ``oci://``
URLs are refused instead.
"""

from __future__ import annotations

from warmcache.errors import UsageError, shown


def refuse_dropped_parts(url: str) -> None:
    """Refuse a store URL holding a control character (a newline?), a query or a fragment: one line naming it."""
    if any(ord(c) < 32 or c == "\x7f" for c in url):
        raise UsageError(f"store URL {shown(url)}: holds a control character (a newline?); refused")
    for mark, part in (("?", "query"), ("#", "fragment")):
        if mark in url:
            raise UsageError(f"store URL {shown(url)}: a {part} ({mark}...) is not part of a store location; refused")
