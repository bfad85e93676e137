"""verify's verdicts: what each spec's replay proves, judged in the parent from the replay's one measurement."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from warmcache.errors import ExitCode
from warmcache.units import format_count
from warmcache.warmup.verify.messages import ReplayResult


class Verdict(StrEnum):
    """What one spec's replay proves (reported by verify, never stored: rows keep their
    :class:`~warmcache.registry.statuses.Status`)."""

    VERIFIED = "verified"
    """Loaded from the cache: no backend compile, no new entry. The row becomes ``verified``."""
    RECOMPILED = "recompiled"
    """The replay compiled: production would too. The row goes back to ``failed``."""
    REPLAY_ONLY = "replay-only"
    """The backend keeps no persistent cache, so there is nothing to prove; the row stays ``compiled``."""
    DISPROVEN = "disproven"
    """The row's precompiled artifact cannot serve this model: refused on load, not serving the decode, another
    graph than the model exports, or decoding farther from the model than eager does; or, on any route, the decode
    through warmcache's cache is not the model's computation. Production must not load it: the row goes back to
    ``failed`` (``warmup --retry-failed`` builds an artifact again; a cache the family defeats stays disproven)."""
    REPLAY_FAILED = "replay-failed"
    """The replay raised or never ran: it proves nothing either way; the row is kept."""

    @property
    def failed(self) -> bool:
        return self in (Verdict.RECOMPILED, Verdict.DISPROVEN, Verdict.REPLAY_FAILED)

    @property
    def demotes(self) -> bool:
        """Whether the verdict proves the row's cache or artifact wrong, so the row goes back to ``failed``."""
        return self in (Verdict.RECOMPILED, Verdict.DISPROVEN)


@dataclass(frozen=True, slots=True)
class SpecVerdict:
    """One spec's verdict, with the replay's measurement as it came (zeros when the replay never measured)."""

    description: str
    verdict: Verdict
    measured: ReplayResult
    reason: str | None = None

    @property
    def identity(self) -> str:
        return self.measured.identity

    @property
    def failed(self) -> bool:
        return self.verdict.failed

    def message(self) -> str:
        """The progress line's text: the verdict and why, or what the replay measured."""
        if self.reason and self.verdict != Verdict.REPLAY_ONLY:
            return f"{self.verdict}: {self.reason}"
        m = self.measured
        if self.verdict == Verdict.REPLAY_ONLY:
            # Said where it is printed: "replay-only" alone reads like a mode the user chose, or a half failure.
            return (
                f"{self.verdict} (ran without error, {format_count(m.graphs, 'graph')} traced in {m.seconds:.1f}s; "
                "its backend keeps no compile cache on disk, so no cache hit can be proven and the row stays compiled)"
            )
        return (
            f"{self.verdict} ({m.cache_misses} cache misses, {m.cache_hits} hits, "
            f"{format_count(m.graphs, 'graph')} traced in {m.seconds:.1f}s)"
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "identity": self.identity,
            "spec": self.description,
            "verdict": self.verdict,
            "graphs_traced": self.measured.graphs,
            "cache_hits": self.measured.cache_hits,
            "cache_misses": self.measured.cache_misses,
            "new_entries": list(self.measured.new_entries),
            "reason": self.reason,
        }


@dataclass
class VerifySummary:
    verdicts: list[SpecVerdict] = field(default_factory=list)
    not_compiled: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def count(self, verdict: Verdict) -> int:
        return sum(1 for v in self.verdicts if v.verdict == verdict)

    @property
    def exit_code(self) -> int:
        """1 if anything recompiled, was disproven, failed to replay, or was never compiled."""
        bad = sum(1 for v in self.verdicts if v.failed) + len(self.not_compiled)
        return ExitCode.NOT_DONE if bad else ExitCode.OK

    def as_json(self) -> dict[str, Any]:
        return {
            "ok": self.exit_code == 0,
            "verified": self.count(Verdict.VERIFIED),
            "recompiled": self.count(Verdict.RECOMPILED),
            "disproven": self.count(Verdict.DISPROVEN),
            "replay_failed": self.count(Verdict.REPLAY_FAILED),
            "replay_only": self.count(Verdict.REPLAY_ONLY),
            "not_compiled": self.not_compiled,
            "seconds": round(self.seconds, 3),
            "specs": [v.as_json() for v in self.verdicts],
        }

    def lines(self) -> list[str]:
        out = [f"{v.verdict}: {v.description}: {v.reason}" for v in self.verdicts if v.failed]
        out += [f"not compiled: {d} (run warmcache warmup first)" for d in self.not_compiled]
        if self.count(Verdict.REPLAY_ONLY):
            out.append(
                f"{self.count(Verdict.REPLAY_ONLY)} spec(s) use a backend with no persistent cache (eager/aot_eager): "
                "replayed without error, nothing on disk to verify; left as compiled"
            )
        out.append(
            f"verify: {self.count(Verdict.VERIFIED)} verified, {self.count(Verdict.RECOMPILED)} recompiled, "
            f"{self.count(Verdict.DISPROVEN)} disproven, {self.count(Verdict.REPLAY_FAILED)} failed to replay, "
            f"{len(self.not_compiled)} not compiled in {self.seconds:.1f}s"
        )
        return out


def judge(identity: str, description: str, result: ReplayResult | None) -> SpecVerdict:
    """Turn one replay's measurement into a verdict (``None``: the replay never reached the spec)."""
    if result is None:
        return SpecVerdict(
            description,
            Verdict.REPLAY_FAILED,
            ReplayResult(identity),
            reason="the replay process stopped before this spec",
        )
    if result.error:
        return SpecVerdict(description, Verdict.REPLAY_FAILED, result, reason=result.error)
    if result.recompiled:
        return SpecVerdict(description, Verdict.RECOMPILED, result, reason=result.recompiled)
    if result.decode_error:
        return SpecVerdict(description, Verdict.DISPROVEN, result, reason=result.decode_error)
    if not result.persistent_cache:
        return SpecVerdict(description, Verdict.REPLAY_ONLY, result, reason="backend keeps no persistent cache")
    if result.cache_misses or result.new_entries:
        reason = f"{result.cache_misses} cache miss(es), {len(result.new_entries)} new cache entr(ies)"
        if result.new_entries:
            reason += f" (first: {result.new_entries[0]})"
        return SpecVerdict(description, Verdict.RECOMPILED, result, reason=reason)
    return SpecVerdict(description, Verdict.VERIFIED, result)
