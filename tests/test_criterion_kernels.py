"""verify's criterion on a real Inductor decode under each CPU kernel choice this machine has: the right decode
passes, wrong ones fail.

``ATEN_CPU_CAPABILITY`` picks ATen's eager kernels and the vector ISA Inductor generates
code for; on a CPU where the eager decode landed within rounding of a one-pass reference
in the model's own dtype, a criterion calibrated on it collapsed to its floor and failed a
right package (issue 36: a Xeon with AMX, and ``avx2``/``default`` elsewhere). Each
capability runs ``tools/sweeps/criterion_figures.py`` in its own process (the variable is read
once, at import): a tiny model's decode compiled by Inductor, judged against the float64
reference, beside the same tokens through other weights and through one MLP scaled by 1.05.
And the route that failed there: ``warmcache warmup`` then ``warmcache verify`` of the tiny AOTInductor manifest, under
each capability. The whole AOTInductor and verify test files under each are ``tools/ci/capability_tests.sh`` (about
6 min of CPU a capability: too much beside the suite in CI's time).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SWEEPS = Path(__file__).resolve().parent.parent / "tools" / "sweeps"


def _capabilities() -> list[str]:
    """``default`` always; ``avx2`` and ``avx512`` where this CPU has them (an x86 CPU lists them in its flags), but not
    the CPU's own best: the rest of the suite runs with it (``test_aotinductor.py``'s verify), about 20 s a process."""
    import torch

    try:
        flags = set(Path("/proc/cpuinfo").read_text().split("flags", 1)[1].split("\n", 1)[0].split())
    except (OSError, IndexError):
        flags = set()
    best = torch.backends.cpu.get_cpu_capability().lower()
    named = [name for name, flag in (("avx2", "avx2"), ("avx512", "avx512f")) if flag in flags and name != best]
    return ["default", *named]


@pytest.mark.slow
@pytest.mark.parametrize("capability", _capabilities())
def test_a_right_inductor_decode_passes_and_wrong_ones_fail_under_each_cpu_capability(
    capability: str, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    config = tiny_models["llama"] / "config.json"
    done = subprocess.run(
        [sys.executable, str(SWEEPS / "criterion_figures.py"), str(config), "--models", str(tmp_path / "models")],
        capture_output=True,
        text=True,
        check=False,
        cwd=SWEEPS,
        env={**os.environ, "ATEN_CPU_CAPABILITY": capability, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["capability"] == capability and figures["compiled"]
    assert figures["eager"] > 0, figures  # a float64 reference: the float32 eager decode is never it bitwise
    assert figures["right"]["agrees"], figures
    assert not figures["other_weights"]["agrees"] and not figures["mlp_x1.05"]["agrees"], figures


@pytest.mark.slow
@pytest.mark.parametrize("capability", _capabilities())
def test_a_right_aotinductor_package_is_verified_under_each_cpu_capability(
    capability: str, tiny_models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from test_aotinductor import package_steps, warm_packages

    from warmcache.registry import Registry

    monkeypatch.setenv("ATEN_CPU_CAPABILITY", capability)  # read by the warmup and verify processes
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    # The decode is what the kernel choice changes; package_prefill = false skips the prefill's compile (and proves
    # the switch: the row holds its decode package alone).
    root = warm_packages(tmp_path, tiny_models["llama"], "cpu", batches=[4], package_prefill=False)
    with Registry.open(f"sqlite:///{root}/registry.sqlite") as registry:
        rows = registry.rows(model="m", with_artifacts=True)
    assert [row.status for row in rows] == ["verified"]  # warm_packages failed unless verify exited 0
    assert list(package_steps(rows[0])) == ["decode"]
