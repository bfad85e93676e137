"""Stopping the servers tests start as child processes: the one way each fixture ends them."""

from __future__ import annotations

import subprocess


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 10 s: a server that ignores the first still leaves no process behind a test."""
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
