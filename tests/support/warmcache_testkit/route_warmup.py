"""One route's warmup and verify, measured from the outside, and its signed guard snapshot: what the benchmarks of a
production start (``tools/bench/bench_realistic.py``, ``tools/bench/bench_start.py``) warm before they time a start.

Each step is a ``python -m warmcache`` subprocess (``warmup``, ``verify``, ``guard export --sign``), its wall time and
its own peak RSS measured with ``os.wait4``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

#: The manifest's ``precompile`` value of each route.
ROUTES = {"inductor": "false", "precompile": "true", "aotinductor": '"aotinductor"'}


@dataclass(frozen=True)
class Warmed:
    """One route's warmup and verify, measured from the outside."""

    route: str
    root: Path
    warmup_s: float
    spec_s: float
    peak_rss_gib: float
    bytes_written: int
    verify_s: float
    verified: bool

    @property
    def registry(self) -> str:
        return registry_url(self.root)


def registry_url(root: Path) -> str:
    """The registry ``warm`` writes a route's rows to, in the route's folder ``root``."""
    return f"sqlite:///{root / 'registry.sqlite'}"


def run_measured(command: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """Run ``command``; its wall seconds, its own peak RSS in GiB (``wait4``: this child's, not the largest so far)
    and its stdout."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        begin = time.perf_counter()
        process = subprocess.Popen(command, env=env, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(process.pid, 0)
        seconds = time.perf_counter() - begin
        process.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if process.returncode:
            raise SystemExit(f"{' '.join(command[1:5])} failed ({process.returncode}): {err.read()[-3000:]}")
        return seconds, usage.ru_maxrss / 2**20, out.read()


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.exists() else 0


def warm(args: argparse.Namespace, route: str, model: Path, work: Path, env: dict[str, str]) -> Warmed:
    """``warmcache warmup`` then ``warmcache verify`` of one bucket through ``route``, in its own folder."""
    root = work / route
    root.mkdir()
    manifest = root / "bench.toml"
    manifest.write_text(
        f'[registry]\nurl = "sqlite:///{root / "registry.sqlite"}"\n[cache]\ndir = "{root / "cache"}"\n'
        f'[[model]]\nname = "bench"\npath = "{model}"\ndtype = "{args.dtype}"\nbackend = '
        f'"{args.backend}"\nprecompile = {ROUTES[route]}\n'
        f"[[model.generate]]\nbatch_sizes = [{args.batch}]\nprompt_lengths = "
        f"[{args.prompt}]\nmax_cache_len = {args.max_cache_len}\n"
    )
    warmup_s, peak, out = run_measured([sys.executable, "-m", "warmcache", "warmup", str(manifest), "--json"], env)
    (spec,) = json.loads(out)["specs"]
    if spec["status"] != "compiled":
        raise SystemExit(f"{route}: warmup did not compile the bucket: {spec}")
    verify_s, _, out = run_measured([sys.executable, "-m", "warmcache", "verify", str(manifest), "--json"], env)
    # aot_eager leaves nothing on disk to prove: its replay is all verify can do.
    proven = ("verified", "replay-only") if args.backend == "aot_eager" else ("verified",)
    verified = all(v["verdict"] in proven for v in json.loads(out)["specs"])
    return Warmed(route, root, warmup_s, spec["seconds"], peak, folder_bytes(root / "cache"), verify_s, verified)


def export_snapshot(root: Path, key: Path, env: dict[str, str]) -> Path:
    """The rows of the route warmed in ``root`` as a signed guard snapshot beside its cache entries: what a production
    pod starts from, no database."""
    cache = root / "cache"
    command = [
        sys.executable,
        "-m",
        "warmcache",
        "guard",
        "export",
        "--model",
        "bench",
        "--out",
        str(cache),
        "--sign",
        str(key),
        "--db",
        registry_url(root),
    ]
    run_measured(command, env)
    return cache
