"""Prove a warm cache serves: the parent (:mod:`.parent`) replays compiled specs in a fresh process (:mod:`.replayer`).

The replay's one measurement (:class:`ReplayResult`, :mod:`.messages`) travels to the
parent, which judges it into a verdict (:mod:`.verdicts`).
"""

from warmcache.warmup.verify.messages import ReplayRequest, ReplayResult
from warmcache.warmup.verify.parent import run_verify
from warmcache.warmup.verify.replayer import merge_ranks, replay
from warmcache.warmup.verify.verdicts import SpecVerdict, Verdict, VerifySummary, judge

__all__ = [
    "ReplayRequest",
    "ReplayResult",
    "SpecVerdict",
    "Verdict",
    "VerifySummary",
    "judge",
    "merge_ranks",
    "replay",
    "run_verify",
]
