"""The fleet simulation: warmcache's real claim loop at hundreds of workers, with the compile replaced by a sleep.

This is the coordination benchmark (``tools/bench/bench_fleet.py --simulate``). Every
worker is a process running :func:`warmcache.warmup.claims.claim_loop` against
PostgreSQL, with its real claims, leases, heartbeats, file locks and registry
writes; only the compile is replaced, through the loop's :class:`SpecRunner`
seam, by a sleep of the spec's drawn compile time. Nothing in the test suite
replaces torch.compile this way: this measures the coordination layer, not compiles.

Compile times come from a log-normal (``--median``, ``--spread``: the sigma of
its log) or a file of recorded ``compile_s``, scaled so that the ideal makespan
(total compile time / workers) is ``--target`` seconds (by default, so that the
fleet claims 10 specs a second: what two cores running the server and every
worker keep up with; see ``bench_fleet.CLAIMS_PER_SECOND``). A spec's "older
toolchain" compile time (its true time with ±15 % noise) is seeded in the
registry, as a fleet upgrading torch would have it, so longest-first has
something to go by. Workers are forked from one parent that imported the
registry code once (no torch anywhere), use the registry once on no row, and
wait at a gate until all are up: the makespan is the fleet's, not Python's
start-up. After the gate they start at ``STARTS_PER_SECOND``, and the LPT bound
frees each worker at its own start.
"""

from __future__ import annotations

import dataclasses
import gc
import heapq
import json
import logging
import math
import multiprocessing
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import filelock  # noqa: F401  (the claim loop imports it at a worker's first spec: here once, before the fork, like the rest of its code)
import sqlalchemy as sa

from warmcache.errors import RegistryUnavailableError
from warmcache.identity.plan import PlannedShape
from warmcache.registry import Registry, ShapeRecord
from warmcache.registry.models import CompiledShape
from warmcache.registry.patience import patiently
from warmcache.registry.statuses import Status
from warmcache.settings import normalise_url
from warmcache.targets import Target
from warmcache.warmup.claims import claim_loop
from warmcache.warmup.ordering import expected_seconds, longest_first
from warmcache.warmup.progress import SpecOutcome
from warmcache.warmup.worker import SpecRun
from warmcache_testkit.fleet_faults import BackendTerminator, Killer, OutageProxy
from warmcache_testkit.postgres_schema import temporary_schema

ORDERS = ("identity", "longest")
#: Workers opening the registry (schema check) at once, before the gate.
_OPENING_AT_ONCE = 16
#: Workers start at this rate after the gate (32 a second: 256 workers within 8 s), each at its own drawn moment.
#: A fleet's hosts start over seconds to minutes, each on its own CPU; here all of them and the server share two
#: cores, and 256 starting within 1.2 s queued their first claims behind each other for up to 5 s (the machine's
#: run queue, not the registry). The bound below starts each worker when it really starts, so this costs no margin.
STARTS_PER_SECOND = 32.0


@dataclass(frozen=True)
class Faults:
    """What goes wrong during a run (all off: a clean run)."""

    kill_fraction: float = 0.0
    terminate_every: float = 0.0
    outage_seconds: float = 0.0


@dataclass(frozen=True)
class Setup:
    workers: int
    specs: int
    seconds: tuple[float, ...]
    """Each spec's compile time in the simulation (already scaled), in manifest order."""
    lease_seconds: float
    faults: Faults = Faults()
    starts_per_second: float = STARTS_PER_SECOND

    def start_offsets(self, seed: int) -> list[float]:
        """When each worker starts, in seconds after the gate: uniform over ``workers / starts_per_second``."""
        rng = random.Random(seed + 3)
        return [rng.uniform(0, self.workers / self.starts_per_second) for _ in range(self.workers)]


@dataclass
class Result:
    setup: Setup
    order: str
    makespan: float
    ideal: float
    lpt_bound: float
    claim_ms: list[float]
    statements: int
    specs_by_survivors: int
    renewals: int
    connections_max: int
    connections_mean: float
    compiled_twice: int
    rerun_after_kill: int
    lost: int
    killed: int
    terminated: int
    refused: int
    crashed: list[str]
    status_text: str = ""
    claims_unavailable: int = 0
    """Claims the database refused or dropped (retried by the loop; not in the latency figures)."""

    @property
    def over_bound(self) -> float:
        return (self.makespan / self.lpt_bound - 1) * 100

    def claim_percentile(self, q: float) -> float:
        values = sorted(self.claim_ms)
        return values[min(len(values) - 1, int(q * len(values)))] if values else math.nan

    def summary_line(self) -> str:
        return (
            f"simulate: {self.setup.workers} workers, {self.setup.specs} specs, order={self.order}: "
            f"makespan {self.makespan:.1f} s, "
            f"bound {self.lpt_bound:.1f} s ({self.over_bound:.1f}% over), claim p99 "
            f"{self.claim_percentile(0.99):.0f} ms, "
            f"compiled twice {self.compiled_twice}, lost {self.lost}"
        )

    @property
    def ok(self) -> bool:
        return not self.lost and not self.compiled_twice and not self.crashed


# ------------------------------------------------------------------ compile times


def draw_seconds(specs: int, median: float, spread: float, seed: int, recorded: Path | None) -> list[float]:
    """Unscaled compile times: a log-normal, or recorded ones (one number per line, or JSON numbers / rows with
    compile_s(econds))."""
    rng = random.Random(seed)
    if recorded is None:
        return [rng.lognormvariate(math.log(median), spread) for _ in range(specs)]
    text = recorded.read_text()
    try:
        data = json.loads(text)
        values = [
            float(v if isinstance(v, int | float) else v.get("compile_s", v.get("compile_seconds"))) for v in data
        ]
    except json.JSONDecodeError:
        values = [float(line) for line in text.split() if line.strip()]
    values = [v for v in values if v > 0]
    if not values:
        raise SystemExit(f"{recorded}: no positive compile times")
    return [rng.choice(values) for _ in range(specs)]


def scaled(seconds: Sequence[float], workers: int, target: float) -> tuple[float, ...]:
    """Scale so that total / workers (the ideal makespan) is ``target`` seconds."""
    factor = target * workers / sum(seconds)
    return tuple(s * factor for s in seconds)


def lpt_bound(seconds: Sequence[float], starts: Sequence[float]) -> float:
    """The makespan of longest-processing-time-first list scheduling with the true times, each worker free from its
    start."""
    loads = sorted(starts)
    for s in sorted(seconds, reverse=True):
        heapq.heapreplace(loads, loads[0] + s)
    return max(loads)


# ------------------------------------------------------------------ the registry and manifest


def write_manifest(work: Path, specs: int) -> Path:
    """One model (a config.json is all a plan reads) with a batch × length grid of at least ``specs`` decode shapes."""
    model = work / "sim-model"
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text(
        json.dumps({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 128})
    )
    batches = max(d for d in range(1, math.isqrt(specs) + 1) if specs % d == 0)
    lengths = specs // batches
    manifest = work / "sim.toml"
    manifest.write_text(
        f'[[model]]\nname = "sim"\npath = "{model}"\nbackend = "inductor"\n'
        f"[[model.generate]]\nbatch_sizes = {list(range(1, batches + 1))}\nprompt_lengths = "
        f"{[8 * i for i in range(1, lengths + 1)]}\nmax_cache_len = {8 * lengths + 64}\n"
    )
    return manifest


def seed_history(registry: Registry, planned: Sequence[PlannedShape], seconds: Sequence[float], seed: int) -> None:
    """Rows of an older toolchain, compiled, with each shape's time ±15 %: what longest-first goes by."""
    rng = random.Random(seed + 1)
    older = [
        dataclasses.replace(p, toolchain=dataclasses.replace(p.toolchain, platform=p.toolchain.platform + "-older"))
        for p in planned
    ]
    registry.ensure_pending(older)
    with registry.session() as session:
        ids = dict(
            session.execute(
                sa.select(CompiledShape.identity, CompiledShape.id).where(CompiledShape.status == Status.PENDING)
            )
            .tuples()
            .all()
        )
        rows = [
            {
                "id": ids[p.identity],
                "status": Status.COMPILED,
                "compile_seconds": s * rng.uniform(0.85, 1.15),
                "graphs_compiled": 1,
            }
            for p, s in zip(older, seconds)
        ]
        session.execute(sa.update(CompiledShape), rows)


def worker_url(url: str, name: str, port: int | None = None) -> str:
    parsed = sa.make_url(normalise_url(url)).update_query_dict({"application_name": name})
    if port is not None:
        parsed = parsed.set(host="127.0.0.1", port=port)
    return parsed.render_as_string(hide_password=False)


# ------------------------------------------------------------------ a worker process


class _CountingRegistry(Registry):
    """The real registry, timing each won claim and noting each renewal in the worker's log."""

    log: Any = None

    def claim_batch(
        self, identities: Sequence[str], worker: str, lease_seconds: float, count: int, *, retry_failed: bool = False
    ) -> list[ShapeRecord]:
        start = time.perf_counter()
        try:
            records = super().claim_batch(identities, worker, lease_seconds, count, retry_failed=retry_failed)
        except RegistryUnavailableError:
            self.log.write("unavailable\n")  # retried by the claim loop; counted, and excluded from the claim latency
            raise
        if records:
            self.log.write(f"claim {(time.perf_counter() - start) * 1000:.2f} {time.time():.3f} {len(records)}\n")
        return records

    def renew_leases(self, row_ids: Sequence[int], worker: str, lease_seconds: float) -> set[int]:
        renewed = super().renew_leases(row_ids, worker, lease_seconds)
        self.log.write("renew\n")
        return renewed


@dataclass
class SleepingCompile:
    """The claim loop's :class:`SpecRunner` in the simulation: sleeps for the spec's compile time."""

    seconds: dict[str, float]
    root: Path
    log: Any

    def cache_root(self, target: Target) -> Path:
        return self.root

    def run(self, planned: PlannedShape) -> SpecRun:
        seconds = self.seconds[planned.identity]
        self.log.write(f"start {planned.identity} {time.time():.3f}\n")
        time.sleep(seconds)
        self.log.write(f"done {planned.identity} {time.time():.3f}\n")
        return SpecRun(
            seconds,
            graphs=1,
            padded_graphs=0,
            cache_hits=0,
            cache_misses=1,
            new_entries={},
            cache_root=self.root,
            persistent_cache=False,
        )


def _worker(
    url: str,
    todo: Sequence[PlannedShape],
    expected: dict[str, float],
    seconds: dict[str, float],
    lease: float,
    work: Path,
    index: int,
    gate: Any,
    start: float,
    opening: Any,
) -> None:
    with open(work / f"worker-{index}.log", "w", buffering=1) as log:
        with opening:  # a few at a time: the server (shared with others) must never run out of connections
            registry = patiently(lambda: _CountingRegistry.open(url, hold_connections=False), 120)
            _first_use(registry)
        statements = Counter[str]()
        sa.event.listen(registry.engine, "before_cursor_execute", lambda *args: statements.update(["n"]))
        registry.log = log
        runner = SleepingCompile(seconds, work / "cache", log)
        (work / f"ready-{index}").touch()
        gate.wait()
        time.sleep(start)  # a fleet's hosts start within seconds, not in one instant

        def report(outcome: SpecOutcome) -> None:
            log.write(f"outcome {outcome.identity} {outcome.status}\n")

        try:
            claim_loop(registry, runner, todo, lease, report, expected=expected)
        finally:
            log.write(f"statements {statements['n']}\n")
            registry.close()


def _first_use(registry: Registry) -> None:
    """Run each registry write once on no row, before the gate: the one-time cost of a process's first use.

    A worker's first claim compiles its statements and touches pages it shares with
    the parent since the fork (20 ms of CPU). A fleet's hosts pay that on their own
    CPUs; here 256 workers would pay it on two shared cores, all within seconds, and
    the run would measure this machine's run queue. Nothing is claimed or changed.
    """
    # the base class's: nothing is logged as a claim or renewal
    Registry.claim_batch(registry, ["first-use"], "first-use", 1, 2)
    Registry.renew_leases(registry, [-1], "first-use", 1)
    # mark_compiled on no row warns that its claim was lost (24 such lines in a --quick run that lost nothing):
    # none was made here, so the registry's warnings are off for these two calls.
    registry_log = logging.getLogger("warmcache.registry.registry")
    level = registry_log.level
    registry_log.setLevel(logging.ERROR)
    try:
        with registry.together():
            Registry.mark_compiled(registry, -1, "first-use", compile_seconds=0, graphs_compiled=0)
            Registry.release(registry, -1, "first-use")
    finally:
        registry_log.setLevel(level)
    registry.drop_connections()


# ------------------------------------------------------------------ one run


class _ConnectionSampler(threading.Thread):
    def __init__(self, engine: sa.Engine, prefix: str) -> None:
        super().__init__(daemon=True, name="sim-connections")
        self._engine, self._prefix = engine, prefix
        self._stop = threading.Event()
        self.samples: list[int] = []

    def run(self) -> None:
        query = sa.text("SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE :p")
        while not self._stop.wait(0.25):
            with self._engine.connect() as conn:
                self.samples.append(int(conn.execute(query, {"p": f"{self._prefix}%"}).scalar_one()))

    def stop(self) -> None:
        self._stop.set()


def run_once(
    db: str,
    work: Path,
    manifest: Path,
    planned: Sequence[PlannedShape],
    setup: Setup,
    order: str,
    seed: int,
    progress: Any,
) -> Result:
    """One simulated fleet warmup on a fresh PostgreSQL schema."""
    prefix = f"wcsim{os.getpid()}x{order[0]}"
    with temporary_schema(db, prefix="sim") as url:
        with Registry.open(url) as registry:
            seed_history(registry, planned, setup.seconds, seed)
            registry.ensure_pending(planned)
            expected = expected_seconds(registry, planned)
            todo = list(planned) if order == "identity" else longest_first(planned, expected)
        seconds = {p.identity: s for p, s in zip(planned, setup.seconds)}
        run_dir = work / f"run-{order}-{time.time_ns()}"
        (run_dir / "cache").mkdir(parents=True)
        faults = setup.faults
        proxy = OutageProxy(_pg_address(url)) if faults.outage_seconds else None
        if proxy:
            proxy.start()
        context = multiprocessing.get_context("fork")
        gate = context.Event()
        opening = context.Semaphore(_OPENING_AT_ONCE)
        gc.collect()
        gc.freeze()  # forked workers share the parent's imported code instead of copying it page by page
        processes = []
        ideal = sum(setup.seconds) / setup.workers
        starts = setup.start_offsets(seed)
        for i in range(setup.workers):
            name = f"{prefix}-{i}"
            port = proxy.port if proxy and i == setup.workers - 1 else None
            process = context.Process(
                target=_worker,
                args=(
                    worker_url(url, name, port),
                    todo,
                    expected,
                    seconds,
                    setup.lease_seconds,
                    run_dir,
                    i,
                    gate,
                    starts[i],
                    opening,
                ),
                daemon=True,
            )
            process.start()
            processes.append(process)
        gc.unfreeze()
        monitor = sa.create_engine(worker_url(url, f"monitor-{prefix}"), pool_size=2)
        _wait_until_open(run_dir, setup.workers)
        rng = random.Random(seed + 2)
        start = time.time()
        gate.set()
        progress(f"{order}: {setup.workers} workers started")
        doomed = rng.sample(processes[:-1], round(faults.kill_fraction * setup.workers)) if faults.kill_fraction else []
        killer = Killer([(p.pid, rng.uniform(0.1, 0.7) * ideal) for p in doomed if p.pid], start)
        killer.start()
        terminator = BackendTerminator(monitor, prefix, faults.terminate_every, 2) if faults.terminate_every else None
        if terminator:
            terminator.start()
        if proxy:
            proxy.outage(start + 0.2 * ideal, faults.outage_seconds)
        sampler = _ConnectionSampler(monitor, prefix)
        sampler.start()
        for process in processes:
            process.join()
        sampler.stop()
        if terminator:
            terminator.stop()
        killer.join(timeout=1)
        crashed = [f"worker {i} exited {p.exitcode}" for i, p in enumerate(processes) if p.exitcode and p not in doomed]
        killed = {i for i, p in enumerate(processes) if p.pid in killer.killed}
        result = _collect(run_dir, setup, order, start, ideal, lpt_bound(setup.seconds, starts), planned, url, killed)
        result.connections_max, result.connections_mean = (
            max(sampler.samples, default=0),
            statistics.fmean(sampler.samples or [0]),
        )
        result.killed, result.crashed = len(killer.killed), crashed
        result.terminated = terminator.terminated if terminator else 0
        result.refused = proxy.refused if proxy else 0
        if faults != Faults():
            result.status_text = _status(manifest, url)
        monitor.dispose()
        if proxy:
            proxy.close()
    return result


def _pg_address(url: str) -> tuple[str, int]:
    parsed = sa.make_url(normalise_url(url))
    return parsed.host or "127.0.0.1", parsed.port or 5432


def _wait_until_open(run_dir: Path, workers: int) -> None:
    """Every worker has opened the registry before the gate opens."""
    deadline = time.monotonic() + 600
    while sum(1 for _ in run_dir.glob("ready-*")) < workers:
        if time.monotonic() > deadline:
            raise SystemExit("workers did not start within 600 s")
        time.sleep(0.2)


def _collect(
    run_dir: Path,
    setup: Setup,
    order: str,
    start: float,
    ideal: float,
    bound: float,
    planned: Sequence[PlannedShape],
    url: str,
    killed: set[int],
) -> Result:
    """Read every worker's log: when each spec ran where, claim times, statements, renewals.

    A spec that ran twice is allowed only if each earlier run was on a worker that was
    killed before recording it (it died holding the claim).
    """
    starts: dict[str, list[tuple[float, int]]] = {}
    recorded_by: dict[int, set[str]] = {}
    claim_ms: list[float] = []
    statements = renewals = by_survivors = unavailable = 0
    last_done = start
    for log in run_dir.glob("worker-*.log"):
        index = int(log.stem.split("-")[1])
        recorded: set[str] = set()
        done_here = 0
        finished = False
        for line in log.read_text().splitlines():
            kind, *rest = line.split()
            if kind == "claim":
                claim_ms.append(float(rest[0]))
            elif kind == "renew":
                renewals += 1
            elif kind == "unavailable":
                unavailable += 1
            elif kind == "start":
                starts.setdefault(rest[0], []).append((float(rest[1]), index))
            elif kind == "outcome":
                recorded.add(rest[0])
            elif kind == "done":
                done_here += 1
                last_done = max(last_done, float(rest[1]))
            elif kind == "statements":
                statements += int(rest[0])
                finished = True
        recorded_by[index] = recorded
        if finished:
            by_survivors += done_here
    twice = rerun = 0
    for identity, runs in starts.items():
        workers = [index for _, index in sorted(runs)]
        if len(workers) > 1:
            if all(w in killed and identity not in recorded_by[w] for w in workers[:-1]):
                rerun += 1
            else:
                twice += 1
                print(f"compiled twice: {identity} by workers {workers} (killed: {sorted(killed)})", file=sys.stderr)
    with Registry.open(url) as registry, registry.session() as session:
        compiled = set(
            session.scalars(sa.select(CompiledShape.identity).where(CompiledShape.status == Status.COMPILED))
        )
    lost = sum(1 for p in planned if p.identity not in compiled)
    makespan = last_done - start
    result = Result(
        setup,
        order,
        makespan,
        ideal,
        bound,
        claim_ms,
        statements,
        by_survivors,
        renewals,
        0,
        0.0,
        twice,
        rerun,
        lost,
        0,
        0,
        0,
        [],
    )
    result.claims_unavailable = unavailable
    return result


def _status(manifest: Path, url: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "warmcache", "status", str(manifest), "--db", url],
        capture_output=True,
        text=True,
        check=False,
    )
    return f"$ warmcache status (exit {done.returncode})\n{done.stdout}{done.stderr}"


# ------------------------------------------------------------------ the report


def report(results: Sequence[Result]) -> str:
    lines = [
        f"{'order':>8} {'faults':>6} {'makespan_s':>10} {'ideal_s':>7} {'lpt_bound_s':>11} "
        f"{'over_bound':>10} {'claim_p50_ms':>12} {'claim_p99_ms':>12} "
        f"{'stmts/spec':>10} {'renew/s':>7} {'conns_max':>9} {'conns_mean':>10} {'claims_retried':>14}"
    ]
    for r in results:
        lines.append(
            f"{r.order:>8} {'yes' if r.setup.faults != Faults() else 'no':>6} {r.makespan:>10.1f} "
            f"{r.ideal:>7.1f} {r.lpt_bound:>11.1f} {r.over_bound:>9.1f}% "
            f"{r.claim_percentile(0.5):>12.1f} {r.claim_percentile(0.99):>12.1f} "
            f"{r.statements / max(1, r.specs_by_survivors):>10.1f} "
            f"{r.renewals / max(r.makespan, 1e-9):>7.1f} {r.connections_max:>9} "
            f"{r.connections_mean:>10.1f} {r.claims_unavailable:>14}"
        )
    for r in results:
        if r.setup.faults != Faults():
            lines.append(
                f"faults ({r.order}): {r.killed} workers SIGKILLed, {r.terminated} backends terminated, "
                "one worker's database cut for "
                f"{r.setup.faults.outage_seconds:.0f} s ({r.refused} connections refused); "
                f"{r.rerun_after_kill} specs compiled again after their worker "
                f"was killed holding them, {r.compiled_twice} compiled twice otherwise, {r.lost} not compiled"
                + (f"; CRASHED: {', '.join(r.crashed)}" if r.crashed else "")
            )
            lines.append(r.status_text.rstrip())
    return "\n".join(lines)
