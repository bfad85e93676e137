"""A 100,000-row registry: plan, listing, serve's refresh and a guard's load at that size.

The registry is filled as a long-lived fleet's would be: ten models of 10,000
shapes each, all compiled (rows written in bulk, not through claims: filling is
not what is measured). Each measurement then runs in a fresh process, so it pays
its imports and reports its own peak memory (max RSS):

- ``warmcache plan`` of one model's 10,000-spec manifest (goal: under 3 s);
- ``warmcache shapes --json`` of every row, streamed (its memory must not grow with the rows);
- one refresh of ``warmcache serve``'s in-memory view (every row and the miss totals);
- ``ShapeGuard.from_registry`` of one model's 10,000 rows.

    python tools/bench/bench_registry.py                 # PostgreSQL from $WARMCACHE_TEST_POSTGRES_URL, else SQLite
    python tools/bench/bench_registry.py --quick         # CI: 10 models x 1,000 shapes, checks it works
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy as sa
from warmcache_testkit.postgres_schema import temporary_schema

from warmcache.identity.plan import plan_manifest
from warmcache.manifest import load_manifest
from warmcache.registry import Registry
from warmcache.registry.models import CompiledShape
from warmcache.registry.statuses import Status

PLAN_GOAL_SECONDS = 3.0

#: Prefixed to each measured program: it reports its own peak memory when it exits. Not ru_maxrss:
#: Linux carries that over fork and exec, so a child would report at least its parent's peak.
REPORT_RSS = (
    "import atexit, sys\n"
    "def _peak():\n"
    "    hwm = [line.split()[1] for line in open('/proc/self/status') if line.startswith('VmHWM:')]\n"
    "    sys.stderr.write(f'\\nmaxrss {hwm[0]}\\n')\n"
    "atexit.register(_peak)\n"
)
#: ``warmcache ARGS...`` as a program for ``python -c``.
CLI = "import sys; sys.argv[0] = 'warmcache'; from warmcache.cli import main; main()"
#: Each measurement, run by ``python -c`` in a fresh process: argv[1] is the registry URL.
SERVE_REFRESH = """
import sys, time
from warmcache.service.view import RegistryView
from warmcache.settings import RegistryLocation
view = RegistryView(RegistryLocation.parse(sys.argv[1]))
start = time.perf_counter()
state = view.refresh()
print(f"{time.perf_counter() - start:.3f}")
"""
GUARD_LOAD = """
import sys, time
start = time.perf_counter()
from warmcache.runtime.guard import ShapeGuard
guard = ShapeGuard.from_registry(sys.argv[1], "m0", telemetry=False)
print(f"{time.perf_counter() - start:.3f}")
"""


def write_manifest(work: Path, models: int, per_model: int) -> Path:
    """``models`` models (one config-only folder: a plan reads no weights) of ``per_model`` decode shapes each."""
    folder = work / "config-only"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2}))
    batches = 100 if per_model >= 10_000 else 10
    lengths = per_model // batches
    tables = [
        f'[[model]]\nname = "m{i}"\npath = "{folder}"\nbackend = "inductor"\n'
        f"[[model.generate]]\nbatch_sizes = {list(range(1, batches + 1))}\nprompt_lengths = "
        f"{[8 * j for j in range(1, lengths + 1)]}\nmax_cache_len = {8 * lengths + 64}\n"
        for i in range(models)
    ]
    (work / "all.toml").write_text("\n".join(tables))
    (work / "one.toml").write_text(tables[0])
    return work


def fill(url: str, manifest: Path) -> int:
    """Every shape of ``manifest`` as a compiled row, in bulk."""
    planned = plan_manifest(load_manifest(manifest))
    with Registry.open(url) as registry:
        registry.ensure_pending(planned)
        now = registry.clock()
        with registry.session() as session:
            session.execute(
                sa.update(CompiledShape)
                .where(CompiledShape.status == Status.PENDING)
                .values(status=Status.COMPILED, compile_seconds=30.0, graphs_compiled=2, host="bench", compiled_at=now)
            )
    return len(planned)


def timed(program: str, *args: str) -> tuple[float, float, str]:
    """Wall seconds, peak RSS (MiB) and stdout of ``program`` run in a fresh process."""
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", REPORT_RSS + program, *args], capture_output=True, text=True, check=False
    )
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{program[:60]!r} {' '.join(args)} exited {done.returncode}: {done.stderr[-2000:]}")
    rss_kib = int(done.stderr.rsplit("maxrss ", 1)[1].split()[0])
    return wall, rss_kib / 1024, done.stdout


@contextmanager
def fresh_registry(db: str | None, work: Path) -> Iterator[str]:
    if db and db.startswith("postgres"):
        with temporary_schema(db, prefix="benchreg") as url:
            yield url
    else:
        yield f"sqlite:///{work / 'registry.sqlite'}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--db",
        default=os.environ.get("WARMCACHE_TEST_POSTGRES_URL"),
        help="PostgreSQL URL (a fresh schema), else a SQLite file.",
    )
    parser.add_argument("--quick", action="store_true", help="CI: 10 models x 1,000 shapes.")
    args = parser.parse_args()
    models, per_model = 10, (1_000 if args.quick else 10_000)
    with tempfile.TemporaryDirectory(prefix="warmcache-bench-registry-") as tmp:
        work = write_manifest(Path(tmp), models, per_model)
        with fresh_registry(args.db, work) as url:
            start = time.perf_counter()
            rows = fill(url, work / "all.toml")
            print(f"filled {rows:,} rows in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
            plan = timed(CLI, "plan", str(work / "one.toml"), "--db", url, "--json")
            planned = len(json.loads(plan[2]))
            listing = timed(CLI, "shapes", "--db", url, "--json")
            listed = len(json.loads(listing[2]))
            refresh = timed(SERVE_REFRESH, url)
            guard = timed(GUARD_LOAD, url)
        db = "PostgreSQL" if url.startswith("postgres") else "SQLite"
        print(
            f"registry of {rows:,} rows ({models} models x {per_model:,}), {db}, {os.cpu_count()} "
            f"cores, load {os.getloadavg()[0]:.1f}; each in a fresh process"
        )
        print(f"{'measurement':<44} {'wall_s':>7} {'inner_s':>7} {'max_rss_MiB':>11}")
        print(f"{f'plan --json of {planned:,} specs':<44} {plan[0]:>7.2f} {'':>7} {plan[1]:>11.0f}")
        print(f"{f'shapes --json of {listed:,} rows (streamed)':<44} {listing[0]:>7.2f} {'':>7} {listing[1]:>11.0f}")
        print(
            f"{f'serve: one refresh of {rows:,} rows':<44} {refresh[0]:>7.2f} "
            f"{float(refresh[2]):>7.2f} {refresh[1]:>11.0f}"
        )
        print(
            f"{f'guard: from_registry of {per_model:,} rows':<44} {guard[0]:>7.2f} "
            f"{float(guard[2]):>7.2f} {guard[1]:>11.0f}"
        )
        if listed != rows or planned != per_model:
            raise SystemExit(f"listed {listed} of {rows} rows, planned {planned} of {per_model} specs")
        if not args.quick and plan[0] > PLAN_GOAL_SECONDS:
            print(f"plan took {plan[0]:.2f} s: over the {PLAN_GOAL_SECONDS:g} s goal")


if __name__ == "__main__":
    main()
