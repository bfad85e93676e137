"""``tools/bench/bench_serve.py --quick`` works end to end (its figures are the benchmark's business, not a test's)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_serve_quick_runs_and_reports() -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "bench" / "bench_serve.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "3,000 checks in" in result.stdout and "0 non-200" in result.stdout
    assert "in-process ShapeGuard.bucket" in result.stdout
