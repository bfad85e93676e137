"""What travels between verify's parent and its fresh replay process (:mod:`warmcache.warmup.child`'s protocol)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from warmcache.settings import RegistryLocation

if TYPE_CHECKING:
    from warmcache.warmup.worker import SpecRun


@dataclass(frozen=True, slots=True)
class ReplayRequest:
    """What the replay process is asked: replay these specs of the manifest, each once."""

    manifest: str
    identities: tuple[str, ...]
    cache_dir: str | None
    registry: RegistryLocation | None


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """What one spec's replay measured, or why it could not: the one measurement, from the replay process to the
    verdict.

    The replay process sends it as its message; the parent's :class:`~warmcache.warmup.verify.verdicts.SpecVerdict`
    keeps it as it came, so the counters are stated here once.
    """

    identity: str
    seconds: float = 0.0
    graphs: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    new_entries: tuple[str, ...] = ()
    persistent_cache: bool = False
    error: str | None = None
    """The replay raised: it proves nothing either way."""
    recompiled: str | None = None
    """A decode step after the first compiled again: no cache can make that shape warm."""
    decode_error: str | None = None
    """The row's precompiled artifact failed its proof."""

    @classmethod
    def of_run(cls, identity: str, seconds: float, run: SpecRun, decode_error: str | None) -> ReplayResult:
        """What the worker's run of the spec did to the compiler and its cache, as verify measures it."""
        return cls(
            identity,
            seconds,
            graphs=run.graphs,
            cache_hits=run.cache_hits,
            cache_misses=run.cache_misses,
            new_entries=tuple(sorted(run.new_entries)),
            persistent_cache=run.persistent_cache,
            decode_error=decode_error,
        )
