"""A child process run to its end with its peak resident memory, for the matrices that report what a cell costs.

``resource.getrusage(RUSAGE_CHILDREN)`` only grows over a run of many cells, so each child is
reaped with ``os.wait4``, whose ``ru_maxrss`` is that child's own peak (and its reaped
children's), the figure ``/usr/bin/time -v`` prints as "Maximum resident set size".
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Measured:
    """What a finished child left: exit status, output, and its peak RSS in bytes."""

    returncode: int
    stdout: str
    stderr: str
    peak_rss: int


def run_measured(argv: Sequence[str]) -> Measured:
    """Run ``argv`` to completion, output to temporary files (no pipe to drain while waiting), and measure it."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen(list(argv), stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
        out.seek(0)
        err.seek(0)
        return Measured(child.returncode, out.read(), err.read(), usage.ru_maxrss * 1024)
