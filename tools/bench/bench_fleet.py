"""Fleet scaling: wall time of one compile-bound manifest warmed by 1, 2 and 4 processes.

Each run starts N independent ``warmcache warmup`` processes (as N hosts would)
on a fresh registry and a fresh shared cache folder; they split the manifest
through registry claims alone. The output puts the runs side by side with the
speed-up over one process and checks that every spec was compiled exactly once.

Compiles are CPU-bound: the speed-up is capped by the cores of this machine
(printed with the results), and each process pays its own torch import and model
load, which a longer manifest amortises. Processes sharing one host split its
cores (``OMP_NUM_THREADS`` = cores / workers, as torchrun does): on the 2-core
test box, two processes each running torch's default of one thread per core
took 2.0x and 1.2x the time of one process (two runs, other jobs on the box),
against 0.6-0.8x with the cores split (three runs). ``--no-split-cores`` reproduces that.

    python tools/bench/bench_fleet.py                                   # SQLite
    python tools/bench/bench_fleet.py --db postgresql://postgres@127.0.0.1:5432/test
    python tools/bench/bench_fleet.py --quick    # CI smoke run: 2 workers, 2 eager specs; it works, not its figures

``--simulate`` is the coordination benchmark instead (``warmcache_testkit.fleet_sim``): up to
hundreds of worker processes run the real claim loop, leases, heartbeats and
registry writes against PostgreSQL with each compile replaced by a sleep; it puts
identity order and longest-first side by side, and ``--faults`` adds a run that
kills workers, terminates their database connections and cuts one off for a while:

    python tools/bench/bench_fleet.py --simulate --workers 256 --specs 10000 --faults
    python tools/bench/bench_fleet.py --simulate --quick   # 8 workers x 200 specs, faults included, ~45 s
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from warmcache_testkit import fleet_sim
from warmcache_testkit.postgres_schema import temporary_schema

from warmcache.examples.tiny_model import build_tiny_model
from warmcache.identity.plan import plan_manifest
from warmcache.manifest import load_manifest

#: The default time scale: specs a second the simulated fleet claims on average over its LPT makespan. This
#: machine runs the server and all the workers on two cores, and each claim costs it 15-30 ms of CPU (a new
#: connection, the claim, the results, the worker's own bookkeeping). Longest-first's last stretch runs the
#: shortest specs, which the workers claim several at a time (``warmcache.warmup.claims.BATCH_SECONDS``), so the
#: claim rate stays near the average there too. A real fleet of 256 hosts whose compiles take a minute or more
#: claims 2-4 specs a second.
CLAIMS_PER_SECOND = 10.0


def default_target(raw: list[float], workers: int) -> float:
    """The ideal makespan (``--target``) at which the fleet's LPT makespan is ``specs / CLAIMS_PER_SECOND`` seconds."""
    return len(raw) / CLAIMS_PER_SECOND * (sum(raw) / workers) / fleet_sim.lpt_bound(raw, [0.0] * workers)


@dataclass(frozen=True)
class Run:
    workers: int
    wall_seconds: float
    compiled_per_worker: tuple[int, ...]
    compile_seconds: float
    duplicates: int


def manifest_text(models: dict[str, Path], batch_sizes: int, backend: str) -> str:
    """Every batch size is a new decode graph, so each spec is a real compile."""
    tables = []
    for arch, path in models.items():
        tables.append(
            textwrap.dedent(
                f"""
                [[model]]
                name = "tiny-{arch}"
                path = "{path}"
                backend = "{backend}"
                [[model.generate]]
                batch_sizes = {list(range(1, batch_sizes + 1))}
                prompt_lengths = [8]
                max_cache_len = 16
                """
            )
        )
    return "\n".join(tables)


@contextmanager
def fresh_registry(db: str | None, work: Path, name: str) -> Iterator[str]:
    """An empty registry per run: a SQLite file, or a PostgreSQL schema dropped afterwards."""
    if not db or db.startswith("sqlite"):
        yield f"sqlite:///{work / f'{name}.sqlite'}"
        return
    with temporary_schema(db, prefix="bench") as url:
        yield url


def run_fleet(manifest: Path, url: str, cache: Path, workers: int, split_cores: bool) -> Run:
    command = [
        sys.executable,
        "-m",
        "warmcache",
        "warmup",
        str(manifest),
        "--db",
        url,
        "--cache-dir",
        str(cache),
        "--json",
    ]
    env = dict(os.environ)
    if split_cores:
        env["OMP_NUM_THREADS"] = str(threads_per_worker(workers))
    start = time.perf_counter()
    processes = [
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for _ in range(workers)
    ]
    results = [p.communicate() for p in processes]
    wall = time.perf_counter() - start
    summaries = []
    for process, (out, err) in zip(processes, results):
        if process.returncode != 0:
            raise SystemExit(f"a warmup process exited {process.returncode}:\n{err[-2000:]}")
        summaries.append(json.loads(out))
    compiled = [[s for s in summary["specs"] if s["status"] == "compiled"] for summary in summaries]
    counts = Counter(s["identity"] for specs in compiled for s in specs)
    return Run(
        workers=workers,
        wall_seconds=wall,
        compiled_per_worker=tuple(len(specs) for specs in compiled),
        compile_seconds=sum(s["seconds"] for specs in compiled for s in specs),
        duplicates=sum(n - 1 for n in counts.values()),
    )


def threads_per_worker(workers: int) -> int:
    return max(1, (os.cpu_count() or 1) // workers)


def report(runs: list[Run], specs: int, db: str, split_cores: bool) -> str:
    base = runs[0].wall_seconds
    threads = "OMP_NUM_THREADS = cores / workers" if split_cores else "torch's default threads in every process"
    lines = [
        f"fleet warmup of {specs} specs (decode graphs), {db}, {os.cpu_count()} CPU cores, {threads}",
        f"{'workers':>7}  {'wall_s':>7}  {'speed-up':>8}  {'spec_s_sum':>10}  {'median_spec_s':>13}  specs per worker",
    ]
    for run in runs:
        lines.append(
            f"{run.workers:>7}  {run.wall_seconds:>7.1f}  {base / run.wall_seconds:>7.2f}x  "
            f"{run.compile_seconds:>10.1f}  "
            f"{run.compile_seconds / max(1, sum(run.compiled_per_worker)):>13.2f}  "
            f"{'/'.join(map(str, run.compiled_per_worker))}"
            + (f"  ({run.duplicates} DUPLICATE compiles)" if run.duplicates else "")
        )
    lines.append(
        f"ratios 1:{':'.join(f'{base / r.wall_seconds:.2f}' for r in runs[1:])} "
        f"(ceiling: min(workers, {os.cpu_count()} cores); per-spec time grows when processes share cores)"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--db",
        default=os.environ.get("WARMCACHE_TEST_POSTGRES_URL"),
        help="PostgreSQL URL (a fresh schema per run; default: $WARMCACHE_TEST_POSTGRES_URL) or omit for SQLite files.",
    )
    parser.add_argument(
        "--workers", default=None, help="Comma-separated process counts (default: 1,2,4; with --simulate: 8)."
    )
    parser.add_argument(
        "--batch-sizes",
        type=int,
        default=24,
        help="Batch sizes 1..N per model: 2N specs (default 24: ~45 s for one process on 2 cores).",
    )
    parser.add_argument("--backend", default="aot_eager", choices=("eager", "aot_eager", "inductor"))
    parser.add_argument(
        "--no-split-cores",
        dest="split_cores",
        action="store_false",
        help="Leave every process at torch's default thread count.",
    )
    parser.add_argument("--work", type=Path, default=None, help="Working folder (default: a temporary one).")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="A smoke run (CI): 2 workers share 2 eager specs (with --simulate: 8 workers, 200 specs).",
    )
    simulation = parser.add_argument_group("simulation (--simulate)")
    simulation.add_argument(
        "--simulate",
        action="store_true",
        help="Measure the coordination layer: the compile is replaced by a sleep (PostgreSQL only).",
    )
    simulation.add_argument("--specs", default="2000", help="Comma-separated spec counts (default 2000).")
    simulation.add_argument(
        "--order",
        choices=(*fleet_sim.ORDERS, "both"),
        default="both",
        help="Claim order(s) to run, side by side (default both).",
    )
    simulation.add_argument(
        "--median",
        type=float,
        default=60.0,
        help="Median compile seconds of the log-normal, before scaling (default 60).",
    )
    simulation.add_argument(
        "--spread", type=float, default=1.0, help="Sigma of the log-normal's log: 1.0 is skewed (default)."
    )
    simulation.add_argument(
        "--durations",
        type=Path,
        default=None,
        help="A file of recorded compile_s to draw from instead of the log-normal.",
    )
    simulation.add_argument(
        "--target",
        type=float,
        default=None,
        help="Scale compile times so the ideal makespan is this many seconds (default: so that the "
        f"fleet claims {CLAIMS_PER_SECOND:g} specs a second).",
    )
    simulation.add_argument(
        "--starts-per-second",
        type=float,
        default=fleet_sim.STARTS_PER_SECOND,
        help=f"How fast workers start after the gate (default {fleet_sim.STARTS_PER_SECOND:g}).",
    )
    simulation.add_argument("--lease", type=float, default=None, help="Lease seconds (default 60; --quick 8).")
    simulation.add_argument(
        "--faults",
        action="store_true",
        help="Also a longest-first run with faults: SIGKILL, terminated backends, an outage.",
    )
    simulation.add_argument(
        "--faults-only", action="store_true", help="Only the run with faults (its clean twin measured before)."
    )
    simulation.add_argument(
        "--kill", type=float, default=0.1, help="Fraction of workers SIGKILLed in the fault run (default 0.1)."
    )
    simulation.add_argument(
        "--outage",
        type=float,
        default=30.0,
        help="Seconds one worker loses its database in the fault run (default 30; --quick 2).",
    )
    simulation.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if args.simulate:
        simulate(args)
        return
    if args.quick:
        args.workers, args.batch_sizes, args.backend = "2", 1, "eager"
    counts = [int(n) for n in (args.workers or "1,2,4").split(",")]

    with tempfile.TemporaryDirectory(prefix="warmcache-bench-fleet-") as tmp:
        work = args.work or Path(tmp)
        models = {arch: build_tiny_model(arch, work / "models" / f"tiny-{arch}") for arch in ("qwen3", "llama")}
        manifest = work / "fleet.toml"
        manifest.write_text(manifest_text(models, args.batch_sizes, args.backend))
        specs = 2 * args.batch_sizes
        runs = []
        for workers in counts:
            with fresh_registry(args.db, work, f"registry-{workers}") as url:
                run = run_fleet(manifest, url, work / f"cache-{workers}", workers, args.split_cores)
            if sum(run.compiled_per_worker) != specs:
                raise SystemExit(f"{workers} workers compiled {sum(run.compiled_per_worker)} of {specs} specs")
            print(f"{workers} worker(s): {run.wall_seconds:.1f}s", file=sys.stderr, flush=True)
            runs.append(run)
        print(
            report(
                runs, specs, "PostgreSQL" if args.db and args.db.startswith("postgres") else "SQLite", args.split_cores
            )
        )
        if any(r.duplicates for r in runs):
            raise SystemExit("some specs were compiled more than once")


def simulate(args: argparse.Namespace) -> None:
    """The coordination benchmark: each (workers, specs) pair in each order, then optionally a fault run."""
    if not args.db or not args.db.startswith("postgres"):
        raise SystemExit("--simulate needs PostgreSQL: give --db or set $WARMCACHE_TEST_POSTGRES_URL")
    if args.quick:
        args.workers, args.specs, args.target, args.outage, args.faults = args.workers or "8", "200", 4.0, 2.0, True
    lease = args.lease or (8.0 if args.quick else 60.0)
    if (args.faults or args.faults_only) and lease < 2 * args.outage:
        raise SystemExit(
            f"--lease {lease:g} must be at least twice --outage {args.outage:g}: a lease that runs "
            "out during the outage is a second compile by design"
        )
    orders = fleet_sim.ORDERS if args.order == "both" else (args.order,)
    results = []
    failed = False
    with tempfile.TemporaryDirectory(prefix="warmcache-fleet-sim-") as tmp:
        work = args.work or Path(tmp)
        for specs in (int(n) for n in args.specs.split(",")):
            manifest = fleet_sim.write_manifest(work / f"specs-{specs}", specs)
            planned = plan_manifest(load_manifest(manifest))
            raw = fleet_sim.draw_seconds(specs, args.median, args.spread, args.seed, args.durations)
            for workers in (int(n) for n in (args.workers or "8").split(",")):
                target = args.target or default_target(raw, workers)
                runs = [] if args.faults_only else [(order, fleet_sim.Faults()) for order in orders]
                if args.faults or args.faults_only:
                    runs.append(
                        (
                            "longest",
                            fleet_sim.Faults(kill_fraction=args.kill, terminate_every=1.0, outage_seconds=args.outage),
                        )
                    )
                batch = []
                for order, faults in runs:
                    setup = fleet_sim.Setup(
                        workers, specs, fleet_sim.scaled(raw, workers, target), lease, faults, args.starts_per_second
                    )
                    result = fleet_sim.run_once(
                        args.db,
                        work,
                        manifest,
                        planned,
                        setup,
                        order,
                        args.seed,
                        lambda text: print(text, file=sys.stderr, flush=True),
                    )
                    print(result.summary_line(), file=sys.stderr, flush=True)
                    batch.append(result)
                    failed |= not result.ok
                print(
                    f"fleet simulation: {workers} workers x {specs} specs, compile times log-normal(median "
                    f"{args.median:g} s, sigma {args.spread:g}) scaled to an ideal makespan of {target:g} s, "
                    f"workers starting at {args.starts_per_second:g}/s, lease {lease:g} s, {os.cpu_count()} "
                    f"cores, load {os.getloadavg()[0]:.1f}"
                )
                print(fleet_sim.report(batch))
                results.extend(batch)
    for result in results:
        print(result.summary_line())
    if failed:
        raise SystemExit("the simulation lost specs, compiled some twice, or a worker crashed (see above)")


if __name__ == "__main__":
    main()
