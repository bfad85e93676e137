"""``python -m warmcache.warmup REQUEST REPORT``: the entry point of every child process warmcache starts.

The request's type says what the child does (:mod:`warmcache.warmup.child`
describes the protocol): claim specs as a ``warmup --jobs`` worker, warm the
sharded models as one rank of a torchrun, or replay specs for ``verify``.
"""

from __future__ import annotations

import sys

from warmcache.diagnostics import configure, debug_requested
from warmcache.warmup import distributed
from warmcache.warmup.child import ReportWriter, read_request
from warmcache.warmup.runner import claim_as_worker, warm_as_torchrun_child
from warmcache.warmup.summary import ClaimRequest, WarmupRequest
from warmcache.warmup.verify.messages import ReplayRequest
from warmcache.warmup.verify.replayer import replay


def main(request_path: str, report_path: str) -> None:
    # a --debug parent's WARMCACHE_DEBUG: this child's decisions reach its stderr too
    configure(debug=debug_requested())
    # Under torchrun only rank 0 reports: it speaks for the group.
    with (
        ReportWriter(report_path if distributed.is_registry_writer() else None) as reports,
        reports.failures_reported(),
    ):
        request: ClaimRequest | WarmupRequest | ReplayRequest = read_request(
            request_path, [ClaimRequest, WarmupRequest, ReplayRequest]
        )
        if isinstance(request, ClaimRequest):
            claim_as_worker(request, reports.send, reports.send)
        elif isinstance(request, WarmupRequest):
            warm_as_torchrun_child(request, reports.send, reports.send)
        else:
            replay(request, reports.send, reports.send)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
