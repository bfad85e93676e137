"""Wait out a registry that went away, instead of dying with work in hand.

A fleet's database restarts, fails over, or refuses connections for a moment
(``too many clients``); a worker that gives up then loses a compile that took
minutes. Only :class:`~warmcache.errors.RegistryUnavailableError` is retried: a
refused login or a wrong schema will not heal by waiting.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

from warmcache.errors import RegistryUnavailableError

T = TypeVar("T")

log = logging.getLogger(__name__)

#: The first wait after a failure; each further one doubles, up to ``_LONGEST_WAIT``.
_FIRST_WAIT = 0.1
_LONGEST_WAIT = 2.0


def patiently(call: Callable[[], T], patience_seconds: float) -> T:
    """``call()``, retried while the registry is unavailable, for up to ``patience_seconds``.

    Waits are jittered so a fleet that lost its database together does not come
    back as one burst of connections.
    """
    deadline = time.monotonic() + patience_seconds
    wait = _FIRST_WAIT
    while True:
        try:
            return call()
        except RegistryUnavailableError as exc:
            if time.monotonic() + wait > deadline:
                log.warning("registry still unavailable after %.0f s; giving up: %s", patience_seconds, exc)
                raise
            log.debug("registry unavailable, retrying in about %.1f s: %s", wait, exc)
        time.sleep(wait * random.uniform(0.5, 1.5))
        wait = min(wait * 2, _LONGEST_WAIT)
