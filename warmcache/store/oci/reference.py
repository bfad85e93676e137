"""What the distribution spec calls a digest; the ``oci://`` reference itself is parsed with the store URL
(:class:`warmcache.store_location.OciReference`), once, where the URL is given."""

from __future__ import annotations

import re

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def is_digest(text: object) -> bool:
    """Whether ``text`` is a sha256 digest as the distribution spec writes it (``sha256:`` and 64 lowercase hex)."""
    return isinstance(text, str) and _DIGEST.fullmatch(text) is not None
