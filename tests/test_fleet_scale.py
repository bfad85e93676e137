"""A fleet at scale: claims longest first, connections not held while compiling, a registry that goes away.

Real PostgreSQL (and SQLite where the behaviour is the same); the registry rows go
through the real claim and mark path. No compile runs here: what is under test is
the coordination, and the manifests name a config-only model (a plan reads no weights).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from warmcache_testkit.fleet_faults import OutageProxy
from warmcache_testkit.fleet_sim import worker_url
from warmcache_testkit.manifests import generate, manifest_toml, model

from warmcache.cli.status import render
from warmcache.errors import RegistryUnavailableError
from warmcache.identity.plan import PlannedShape, plan_manifest
from warmcache.manifest import load_manifest
from warmcache.registry import Registry
from warmcache.registry.patience import patiently
from warmcache.reports.status import warmup_status
from warmcache.settings import normalise_url
from warmcache.warmup.claim_queue import WINDOW, ClaimQueue
from warmcache.warmup.claims import _poll_wait, run_claimed
from warmcache.warmup.ordering import expected_seconds, longest_first
from warmcache.warmup.progress import Outcome
from warmcache.warmup.worker import SpecRun


def _planned(tmp_path: Path, *models: dict) -> list[PlannedShape]:
    folder = tmp_path / "config-only"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2}))
    manifest = tmp_path / "fleet.toml"
    manifest.write_text(manifest_toml(*models).replace("{qwen3}", str(folder)))
    return plan_manifest(load_manifest(manifest))


def _older(p: PlannedShape) -> PlannedShape:
    """The same shape on an older toolchain: its row is history, not this run's work."""
    return dataclasses.replace(p, toolchain=dataclasses.replace(p.toolchain, platform=p.toolchain.platform + "-older"))


def _record(registry: Registry, shapes: list[PlannedShape], seconds: list[float]) -> None:
    registry.ensure_pending(shapes)
    for shape, value in zip(shapes, seconds):
        row = registry.claim([shape.identity], "history:1", 60)
        assert row is not None
        registry.mark_compiled(row.id, "history:1", compile_seconds=value, graphs_compiled=1)


def test_claims_follow_the_given_order_across_windows(registry_url: str, tmp_path: Path) -> None:
    """A worker claims exactly in the order it was given, also past its first window, and finds a released spec
    again."""
    planned = _planned(tmp_path, model("m", generate=[generate(batch_sizes=range(1, WINDOW + 11))]))
    order = [p.identity for p in reversed(planned)]
    with Registry.open(registry_url) as registry:
        registry.ensure_pending(planned)
        queue = ClaimQueue(registry, order, "w:1", 60)
        claimed = [record for batch in iter(queue.claim, []) for record in batch]
        assert [r.identity for r in claimed] == order
        registry.release(claimed[3].id, "w:1")  # given back behind the cursor: found after narrowing
        assert queue.claim() == []
        assert queue.narrow()
        [again] = queue.claim()
        assert again.identity == order[3]
        registry.mark_compiled(again.id, "w:1", compile_seconds=1, graphs_compiled=1)
        for record in claimed:
            registry.mark_compiled(record.id, "w:1", compile_seconds=1, graphs_compiled=1)
        assert not queue.narrow(), "every spec is compiled: nothing is left to wait for"
        report = warmup_status(registry, planned)
    assert report.groups[0].reclaimed == 1, "status says one spec was claimed twice"
    assert "1 shape claimed more than once" in render(report)


def test_longest_first_goes_by_own_history_then_the_group_median_then_size(registry_url: str, tmp_path: Path) -> None:
    planned = _planned(
        tmp_path,
        model("known", generate=[generate(batch_sizes=[1, 2, 3, 4])]),
        model("unknown", generate=[generate(batch_sizes=[1, 8])]),
    )
    known = [p for p in planned if p.model.name == "known"]
    unknown = {p.spec.batch_size: p for p in planned if p.model.name == "unknown"}
    with Registry.open(registry_url) as registry:
        # batch 1 and 2 were compiled on an older toolchain (40 s, 10 s); 3 and 4 never: the group median is 25 s.
        _record(registry, [_older(known[0]), _older(known[1])], [40.0, 10.0])
        ordered = longest_first(planned, expected_seconds(registry, planned))
    by_batch = {p.spec.batch_size: p for p in known}
    assert [p.identity for p in ordered] == [
        unknown[8].identity,  # no history at all: first, largest first (it may be the longest of all)
        unknown[1].identity,
        by_batch[1].identity,  # 40 s recorded
        by_batch[4].identity,  # 25 s (median); the larger of the two first
        by_batch[3].identity,
        by_batch[2].identity,  # 10 s recorded
    ]


def _connections(url: str, name: str) -> int:
    engine = sa.create_engine(normalise_url(url))
    try:
        with engine.connect() as conn:
            return int(
                conn.execute(
                    sa.text("SELECT count(*) FROM pg_stat_activity WHERE application_name = :n"), {"n": name}
                ).scalar_one()
            )
    finally:
        engine.dispose()


def test_a_warmup_worker_holds_no_connection_while_it_compiles(postgres_url: str, tmp_path: Path) -> None:
    """256 workers fit PostgreSQL's default 100 connections only if a compiling worker holds none."""
    planned = _planned(tmp_path, model("m", generate=[generate(batch_sizes=[1, 2])]))
    name = f"wc-budget-{time.time_ns()}"
    with Registry.open(worker_url(postgres_url, name), hold_connections=False) as registry:
        registry.ensure_pending(planned)
        row = registry.claim([p.identity for p in planned], "w:1", 60)
        assert row is not None
        assert _connections(postgres_url, name) == 1, "one connection while it talks to the registry"
        registry.drop_connections()  # what the claim loop does before each compile
        assert _connections(postgres_url, name) == 0
        assert registry.mark_compiled(row.id, "w:1", compile_seconds=1, graphs_compiled=1)
        assert _connections(postgres_url, name) == 1, "never more than one"


def test_unfinished_answers_a_long_list_as_it_answers_a_short_one(registry_url: str, tmp_path: Path) -> None:
    """A worker's list of 10,000 is matched against the unfinished rows; a short one is asked about directly: the
    same answer."""
    planned = _planned(
        tmp_path,
        model("m", generate=[generate(batch_sizes=range(1, 43), prompt_lengths=range(8, 408, 8), max_cache_len=512)]),
    )
    other = _planned(tmp_path, model("other", generate=[generate(batch_sizes=[1, 2])]))
    identities = [p.identity for p in planned]
    assert len(identities) > 2000
    with Registry.open(registry_url) as registry:
        registry.ensure_pending([*planned, *other])
        done = registry.claim(identities[:1], "w:1", 60)
        held = registry.claim(identities[1:2], "w:1", 60)
        assert done is not None and held is not None
        assert registry.mark_compiled(done.id, "w:1", compile_seconds=1, graphs_compiled=1)
        expected = set(identities[1:])
        assert registry.unfinished(identities) == expected, "not another model's pending rows, nor the compiled one"
        assert registry.unfinished(identities[:10]) == set(identities[1:10])


def test_a_freshly_filled_registry_is_claimed_through_the_identity_index(postgres_url: str, tmp_path: Path) -> None:
    """Filling a registry refreshes PostgreSQL's statistics: left saying "a few pending rows", the server answered
    each claim by scanning them all."""
    planned = _planned(
        tmp_path,
        model("m", generate=[generate(batch_sizes=range(1, 21), prompt_lengths=range(8, 80, 8), max_cache_len=128)]),
    )
    engine = sa.create_engine(normalise_url(postgres_url))
    try:
        with Registry.open(postgres_url) as registry:
            registry.ensure_pending(planned)
            statements: list[tuple[str, dict]] = []
            sa.event.listen(
                registry.engine,
                "before_cursor_execute",
                lambda _c, _cur, statement, params, *_: statements.append((statement, params)),
            )
            assert registry.claim([p.identity for p in planned[100:]], "w:1", 60) is not None
        statement, params = statements[-1]
        with engine.connect() as conn:
            plan = "\n".join(row[0] for row in conn.exec_driver_sql("EXPLAIN " + statement, params))
    finally:
        engine.dispose()
    assert len(planned) >= 180
    assert "uq_compiled_shapes_identity" in plan and "ix_compiled_shapes_status" not in plan, plan


def test_a_terminated_backend_and_an_outage_are_waited_out(postgres_url: str, tmp_path: Path) -> None:
    """The database drops the worker's connection, then is unreachable for a second: the result still lands."""
    planned = _planned(tmp_path, model("m", generate=[generate(batch_sizes=[1])]))
    target = sa.make_url(normalise_url(postgres_url))
    proxy = OutageProxy((target.host or "127.0.0.1", target.port or 5432))
    proxy.start()
    name = f"wc-outage-{time.time_ns()}"
    try:
        with Registry.open(worker_url(postgres_url, name, proxy.port), hold_connections=False) as registry:
            registry.ensure_pending(planned)
            row = registry.claim([planned[0].identity], "w:1", 60)
            assert row is not None
            engine = sa.create_engine(normalise_url(postgres_url))
            with engine.begin() as conn:
                conn.execute(
                    sa.text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = :n"),
                    {"n": name},
                )
            engine.dispose()
            with pytest.raises(RegistryUnavailableError):
                registry.renew_lease(row.id, "w:1", 60)  # the pooled connection is gone: "unavailable", worth a retry
            proxy.outage(time.time(), 1.0)
            time.sleep(0.2)
            with pytest.raises(RegistryUnavailableError):
                registry.renew_lease(row.id, "w:1", 60)
            started = time.monotonic()
            assert patiently(lambda: registry.mark_compiled(row.id, "w:1", compile_seconds=1, graphs_compiled=1), 30)
            assert time.monotonic() - started >= 0.5, "the outage was waited out, not missed"
            (record,) = registry.rows(identities=[planned[0].identity])
            assert record.status == "compiled" and record.attempts == 1
    finally:
        proxy.close()


def test_short_specs_are_claimed_several_at_a_time_and_the_tail_is_shared(registry_url: str, tmp_path: Path) -> None:
    """A claim takes as many specs as ``batch_seconds`` holds by their expected time, one at a time when unknown,
    and never more than an eighth of the work left, so the last specs are spread over the workers finishing together."""
    planned = _planned(tmp_path, model("m", generate=[generate(batch_sizes=range(1, 41))]))
    order = [p.identity for p in planned]
    expected = {identity: 1.0 for identity in order[4:]}  # the first four have no history: the order puts them first
    with Registry.open(registry_url) as registry:
        registry.ensure_pending(planned)
        queue = ClaimQueue(registry, order, "w:1", 60, expected, batch_seconds=4)
        batches = list(iter(queue.claim, []))
    assert [r.identity for batch in batches for r in batch] == order
    assert [len(batch) for batch in batches[:4]] == [1, 1, 1, 1]
    position = 4
    for batch in batches[4:]:
        share = (len(order) - position) / 8  # 1 s each: an eighth of the seconds left
        # the batch's 4 s, drawn between half and all of it
        budget_at_most, budget_at_least = (
            min(4, share),
            min(2, share),
        )
        assert max(1, int(budget_at_least)) <= len(batch) <= max(1, int(budget_at_most)), (position, len(batch))
        position += len(batch)
    assert len(batches[4]) >= 2 and len(batches[-1]) == 1


class _Sleeps:
    """The claim loop's compile seam, sleeping instead of compiling: what is under test is the lease and the records."""

    def __init__(self, root: Path, seconds: float) -> None:
        self.root, self.seconds, self.ran = root, seconds, []

    def cache_root(self, target: object) -> Path:
        return self.root

    def run(self, planned: PlannedShape) -> SpecRun:
        self.ran.append(planned.identity)
        time.sleep(self.seconds)
        return SpecRun(
            self.seconds,
            graphs=1,
            padded_graphs=0,
            cache_hits=0,
            cache_misses=1,
            new_entries={},
            cache_root=self.root,
            persistent_cache=False,
        )


def test_a_batch_keeps_every_claim_alive_and_gives_back_what_it_did_not_start(
    registry_url: str, tmp_path: Path
) -> None:
    """The heartbeat renews every claim of a batch; a batch that runs past half a lease records what ran and releases
    the rest."""
    planned = _planned(tmp_path, model("m", generate=[generate(batch_sizes=[1, 2, 3])]))
    identities = [p.identity for p in planned]
    lease = 1.0
    with Registry.open(registry_url) as registry:
        registry.ensure_pending(planned)
        batch = registry.claim_batch(identities, "w:1", lease, 3)
        assert [r.identity for r in batch] == identities
        runner = _Sleeps(tmp_path / "cache", 1.6)  # longer than the lease: only the heartbeat keeps the batch ours
        taken: list[object] = []
        thief = threading.Timer(1.3, lambda: taken.append(registry.claim(identities, "w:2", lease)))
        thief.start()
        outcomes = run_claimed(registry, runner, [(p, r.id) for p, r in zip(planned, batch)], "w:1", lease)
        thief.join()
        rows = {r.identity: r for r in registry.rows(identities=identities)}
    assert taken == [None], "no claim of the batch expired while it ran"
    assert runner.ran == identities[:1], "past half a lease, the batch started no more specs"
    assert [(o.identity, o.status) for o in outcomes] == [(identities[0], Outcome.COMPILED)]
    assert [rows[i].status for i in identities] == ["compiled", "pending", "pending"], "the unstarted specs went back"
    assert rows[identities[1]].claimed_by is None and rows[identities[1]].attempts == 0, (
        "an unstarted spec's claim is not an attempt"
    )


class _InterruptedAt(_Sleeps):
    def __init__(self, root: Path, seconds: float, at: int) -> None:
        super().__init__(root, seconds)
        self.at = at

    def run(self, planned: PlannedShape) -> SpecRun:
        if len(self.ran) == self.at:
            raise KeyboardInterrupt("signal 15")
        return super().run(planned)


def test_an_interrupted_batch_records_what_ran_and_gives_back_the_rest(registry_url: str, tmp_path: Path) -> None:
    """Ctrl-C in the batch's third spec: the two compiled ones are recorded, not compiled again by the next worker."""
    planned = _planned(tmp_path, model("m", generate=[generate(batch_sizes=[1, 2, 3, 4])]))
    identities = [p.identity for p in planned]
    with Registry.open(registry_url) as registry:
        registry.ensure_pending(planned)
        batch = registry.claim_batch(identities, "w:1", 60, 4)
        with pytest.raises(KeyboardInterrupt):
            run_claimed(
                registry,
                _InterruptedAt(tmp_path / "cache", 0.0, at=2),
                [(p, r.id) for p, r in zip(planned, batch)],
                "w:1",
                60,
            )
        rows = {r.identity: r for r in registry.rows(identities=identities)}
    assert [rows[i].status for i in identities] == ["compiled", "compiled", "pending", "pending"]


def test_a_spec_whose_claim_was_lost_during_the_batch_is_not_started(registry_url: str, tmp_path: Path) -> None:
    """Another worker took a spec of the batch (its lease ran out while the registry was away): this worker skips it."""
    planned = _planned(tmp_path, model("m", generate=[generate(batch_sizes=[1, 2, 3])]))
    identities = [p.identity for p in planned]
    lease = 3.0  # heartbeat at 1.0 s, batch cut at 1.5 s; the first spec ends at 1.25 s
    with Registry.open(registry_url) as registry, Registry.open(registry_url) as later:
        registry.ensure_pending(planned)
        batch = registry.claim_batch(identities, "w:1", lease, 3)
        later.clock = lambda: dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)  # every lease has run out for it
        stolen = later.claim(identities[1:2], "w:2", 600)
        assert stolen is not None
        runner = _Sleeps(tmp_path / "cache", 1.25)
        outcomes = run_claimed(registry, runner, [(p, r.id) for p, r in zip(planned, batch)], "w:1", lease)
        rows = {r.identity: r for r in registry.rows(identities=identities)}
    assert runner.ran == [identities[0], identities[2]]
    assert [o.identity for o in outcomes] == [identities[0], identities[2]]
    assert (rows[identities[1]].status, rows[identities[1]].claimed_by) == ("compiling", "w:2")


def test_batches_shrink_after_one_ran_slower_than_expected(registry_url: str, tmp_path: Path) -> None:
    """History said 1 s, the specs took 10 s (a re-warm that hit a cache recorded the short times): one at a time
    next."""
    planned = _planned(tmp_path, model("m", generate=[generate(batch_sizes=range(1, 101))]))
    order = [p.identity for p in planned]
    with Registry.open(registry_url) as registry:
        registry.ensure_pending(planned)
        queue = ClaimQueue(registry, order, "w:1", 60, dict.fromkeys(order, 1.0), batch_seconds=8)
        first = queue.claim()
        assert len(first) >= 4
        queue.observe({r.identity: 10.0 for r in first})
        assert len(queue.claim()) == 1


def test_a_waiting_worker_looks_again_less_and_less_often() -> None:
    """5 s, 10 s, then every 20 s, each jittered down to half; never more than a third of a short lease, nor
    overflowing."""
    for looks, longest in [(0, 5.0), (1, 10.0), (2, 20.0), (3, 20.0), (5000, 20.0)]:
        waits = [_poll_wait(looks, 60) for _ in range(200)]
        assert all(longest / 2 <= wait <= longest for wait in waits), (looks, min(waits), max(waits))
    assert all(_poll_wait(looks, 1.5) <= 0.5 for looks in range(10))


#: Worker A in its own process: claims the spec and "compiles" it for ten minutes under its cache lock (it is stopped
#: meanwhile).
_HOLDER = """
import sys, time
from pathlib import Path
from warmcache.manifest import load_manifest
from warmcache.identity.plan import plan_manifest
from warmcache.registry import Registry
from warmcache.warmup.claims import claim_loop

url, manifest, root, lease = sys.argv[1:5]

class Compiles:
    def cache_root(self, target):
        return Path(root)

    def run(self, planned):
        print("compiling", flush=True)
        time.sleep(600)

with Registry.open(url) as registry:
    claim_loop(registry, Compiles(), plan_manifest(load_manifest(manifest)), float(lease), print)
"""


def test_a_worker_waiting_on_a_stopped_workers_lock_gives_up_within_its_lease_naming_it(
    registry_url: str, tmp_path: Path
) -> None:
    """A holds the spec's cache lock and is stopped (SIGSTOP); its lease runs out and B reclaims the spec. B's wait
    for the lock ends before B's own claim would (its heartbeat does not renew a claim whose spec cannot start), the
    spec is recorded failed with a line naming A's host and pid, and B's loop ends: nothing is left waiting forever."""
    import os
    import signal
    import socket
    import subprocess
    import sys

    from warmcache.warmup.claims import claim_loop

    (spec,) = _planned(tmp_path, model("m", generate=[generate()]))
    lease, root = 2.5, tmp_path / "cache"
    with Registry.open(registry_url) as registry:
        registry.ensure_pending([spec])
    (tmp_path / "holder.py").write_text(_HOLDER)
    holder = subprocess.Popen(
        [
            sys.executable,
            str(tmp_path / "holder.py"),
            registry_url,
            str(tmp_path / "fleet.toml"),
            str(root),
            str(lease),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "compiling"
        os.kill(holder.pid, signal.SIGSTOP)
        outcomes: list = []
        with Registry.open(registry_url) as registry:
            worker_b = threading.Thread(
                target=claim_loop, args=(registry, _Sleeps(root, 0.0), [spec], lease, outcomes.append), daemon=True
            )
            worker_b.start()
            worker_b.join(3 * lease)  # A's lease runs out, B claims and waits: all within three leases, or never
            assert not worker_b.is_alive(), "worker B is still waiting on the stopped worker's lock"
            (row,) = registry.rows(identities=[spec.identity])
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    (outcome,) = outcomes
    assert outcome.status == Outcome.FAILED and outcome.seconds < lease, outcome
    assert f"host {socket.gethostname()} pid {holder.pid} since " in (outcome.error or ""), outcome.error
    assert (
        outcome.error
        and outcome.error.startswith("TimeoutError: ")
        and "cache lock held by" in outcome.error
        and "\n" not in outcome.error
    )
    assert (row.status, row.claimed_by, row.error) == ("failed", None, outcome.error)
