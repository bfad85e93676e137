"""Which Inductor cache entries a region of code looked up, hit or written.

Listing the cache before and after a spec only shows what the spec *wrote*; a spec
whose graphs another spec already compiled (two prompt lengths share one decode
graph) writes nothing, yet depends on those entries. Its registry row must name
them too, or prune and bundles would treat them as someone else's. Inductor and
AOTAutograd announce every lookup's key in an INFO log line, which this records.
"""

from __future__ import annotations

import logging
import re
from types import TracebackType

from warmcache.cache.layout import INDUCTOR_AOTAUTOGRAD, INDUCTOR_FXGRAPH

#: logger name -> (message pattern with the key, entry kind)
_LOOKUP_LOGS: dict[str, tuple[re.Pattern[str], str]] = {
    "torch._inductor.codecache": (re.compile(r"^fx graph cache (?:hit|miss) for key (\S+)"), INDUCTOR_FXGRAPH),
    "torch._functorch._aot_autograd.autograd_cache": (
        re.compile(r"^AOTAutograd cache (?:hit|miss) for key (\S+)"),
        INDUCTOR_AOTAUTOGRAD,
    ),
}


def entry_for_key(kind: str, key: str) -> str:
    """The cache entry path of a lookup key (torch 2.13's ``_get_tmp_dir_for_key``)."""
    if kind == INDUCTOR_FXGRAPH:
        return f"fxgraph/{key[1:3]}/{key}"
    return f"aotautograd/{key}"


class _Collect(logging.Handler):
    def __init__(self, pattern: re.Pattern[str], kind: str, sink: dict[str, str]) -> None:
        super().__init__(logging.INFO)
        self.pattern, self.kind, self.sink = pattern, kind, sink

    def emit(self, record: logging.LogRecord) -> None:
        match = self.pattern.match(record.getMessage())
        if match:
            self.sink[entry_for_key(self.kind, match.group(1))] = self.kind


class InductorLookups:
    """``with InductorLookups() as used: ...`` then ``used.entries`` is ``{entry path: kind}``.

    The loggers are raised to INFO for the region only and kept from propagating,
    so nothing extra is printed.
    """

    def __init__(self) -> None:
        self.entries: dict[str, str] = {}
        self._saved: list[tuple[logging.Logger, int, bool, logging.Handler]] = []

    def __enter__(self) -> InductorLookups:
        for name, (pattern, kind) in _LOOKUP_LOGS.items():
            logger = logging.getLogger(name)
            handler = _Collect(pattern, kind, self.entries)
            self._saved.append((logger, logger.level, logger.propagate, handler))
            logger.addHandler(handler)
            if logger.getEffectiveLevel() > logging.INFO:
                # Only silence propagation when we are the reason INFO is on.
                logger.setLevel(logging.INFO)
                logger.propagate = False
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for logger, level, propagate, handler in self._saved:
            logger.removeHandler(handler)
            logger.setLevel(level)
            logger.propagate = propagate
        self._saved.clear()
