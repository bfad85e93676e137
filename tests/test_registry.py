"""The registry on SQLite and PostgreSQL: migrations, claims, leases, marks, stale rows."""

from __future__ import annotations

import dataclasses
import datetime as dt
import threading
import types
import typing
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from warmcache_testkit.manifests import generate, manifest_toml, model

from warmcache.cli import main
from warmcache.errors import SchemaOutOfDateError
from warmcache.identity.plan import PlannedShape, plan_manifest
from warmcache.manifest import load_manifest
from warmcache.registry import ArtifactRef, MissEvent, Registry
from warmcache.registry.engine import create_registry_engine
from warmcache.registry.models import Base
from warmcache.registry.registry import pending_row_values
from warmcache.registry.statuses import Status
from warmcache.settings import RegistryLocation

MANIFEST = manifest_toml(model("m", generate=[generate(batch_sizes=[1, 2], prompt_lengths=[8, 16], max_cache_len=32)]))


@pytest.fixture
def planned(write_manifest) -> list[PlannedShape]:
    return plan_manifest(load_manifest(write_manifest(MANIFEST)))


def test_migrations_build_an_empty_database_to_the_model_schema(registry_url: str) -> None:
    with Registry.open(registry_url) as registry:
        inspector = sa.inspect(registry.engine)
        tables = set(inspector.get_table_names())
        assert {"compiled_shapes", "artifacts", "shape_misses", "alembic_version"} <= tables
        for table in Base.metadata.sorted_tables:
            migrated = {c["name"] for c in inspector.get_columns(table.name)}
            assert migrated == set(table.columns.keys()), f"migration and model disagree on {table.name}"
            checks = {c["name"] for c in inspector.get_check_constraints(table.name)}
            assert checks == {c.name for c in table.constraints if isinstance(c, sa.CheckConstraint)}, (
                f"check constraints differ on {table.name}"
            )


def test_out_of_date_schema_is_a_clear_error_with_the_fix(registry_url: str) -> None:
    Registry.open(registry_url).close()
    engine = create_registry_engine(RegistryLocation.parse(registry_url))
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE alembic_version SET version_num = 'ffff'"))
    with pytest.raises(SchemaOutOfDateError, match="newer warmcache"):
        Registry.open(registry_url)
    # Simulate a database one revision behind: head is re-stamped as an older, known one
    # by pretending the head is unknown to the database (no version row at all but tables exist).
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM alembic_version"))
    with pytest.raises(SchemaOutOfDateError, match="no warmcache schema revision"):
        Registry.open(registry_url)
    engine.dispose()

    result = CliRunner().invoke(main, ["shapes", "--db", registry_url])
    assert result.exit_code == 3
    assert "warmcache: error: registry" in result.stderr and "Traceback" not in result.output


def test_an_older_revision_is_refused_then_upgraded_keeping_its_rows(
    registry_url: str, planned: list[PlannedShape]
) -> None:
    from warmcache.registry import schema

    engine = create_registry_engine(RegistryLocation.parse(registry_url))
    # a registry written by the first release, with the rows it could hold
    schema.upgrade(engine, "0001", display_url="test registry")
    with engine.begin() as conn:
        table = sa.Table("compiled_shapes", sa.MetaData(), autoload_with=conn)
        conn.execute(
            table.insert(), [{k: v for k, v in pending_row_values(p).items() if k in table.c} for p in planned]
        )
    engine.dispose()
    with pytest.raises(
        SchemaOutOfDateError,
        match="at schema revision 0001 but this warmcache needs 0004; run: warmcache db upgrade --db",
    ):
        Registry.open(registry_url)
    shapes = CliRunner().invoke(main, ["shapes", "--db", registry_url])
    assert shapes.exit_code == 3 and "warmcache db upgrade" in shapes.stderr

    upgraded = CliRunner().invoke(main, ["db", "upgrade", "--db", registry_url])
    assert upgraded.exit_code == 0 and "0001 -> 0004" in upgraded.output
    with Registry.open(registry_url) as registry:
        rows = registry.rows()
        _assert_status_is_checked(registry)
    assert len(rows) == 4 and all(r.cache_root is None and r.status == Status.PENDING for r in rows)


def _assert_status_is_checked(registry: Registry) -> None:
    with pytest.raises(sa.exc.IntegrityError, match="ck_compiled_shapes_status"):
        with registry.engine.begin() as conn:
            conn.execute(sa.text("UPDATE compiled_shapes SET status = 'done'"))


def test_the_database_refuses_an_unknown_status(registry_url: str, planned: list[PlannedShape]) -> None:
    with Registry.open(registry_url) as registry:
        registry.ensure_pending(planned)
        _assert_status_is_checked(registry)
        assert {r.status for r in registry.rows()} == {Status.PENDING}


def test_db_upgrade_and_current(registry_url: str) -> None:
    runner = CliRunner()
    result = runner.invoke(main, ["db", "current", "--db", registry_url, "--json"])
    if registry_url.startswith("sqlite"):  # a read: the file that is not there yet is named, not created
        assert (
            result.exit_code == 3 and "does not exist" in result.stderr and "warmcache db upgrade --db" in result.stderr
        )
        assert not Path(registry_url.removeprefix("sqlite:///")).exists()
    else:  # an empty schema of its own
        assert result.exit_code == 0 and '"revision": null' in result.output
    result = runner.invoke(main, ["db", "upgrade", "--db", registry_url])
    assert result.exit_code == 0 and "empty -> 0004" in result.output
    result = runner.invoke(main, ["db", "current", "--db", registry_url])
    assert "schema 0004 (up to date)" in result.output
    result = runner.invoke(main, ["db", "upgrade", "--db", registry_url])
    assert result.exit_code == 0 and result.output.strip().endswith("schema 0004 (already current)")


def test_ensure_pending_is_idempotent(registry_url: str, planned: list[PlannedShape]) -> None:
    with Registry.open(registry_url) as registry:
        assert registry.ensure_pending(planned) == 4
        assert registry.ensure_pending(planned) == 0
        assert [r.status for r in registry.rows()] == ["pending"] * 4


def test_claim_mark_compiled_and_verified(registry_url: str, planned: list[PlannedShape]) -> None:
    with Registry.open(registry_url) as registry:
        registry.ensure_pending(planned)
        ids = [p.identity for p in planned]
        claimed = registry.claim(ids, "w1", lease_seconds=60)
        assert (
            claimed is not None
            and claimed.status == "compiling"
            and claimed.claimed_by == "w1"
            and claimed.attempts == 1
        )
        artifacts = [ArtifactRef("inductor_fxgraph", "fxgraph/ab/fabc", 123)]
        assert not registry.mark_compiled(claimed.id, "w2", compile_seconds=1.0, graphs_compiled=1), (
            "only the claimant may finish"
        )
        assert registry.mark_compiled(claimed.id, "w1", compile_seconds=1.5, graphs_compiled=2, artifacts=artifacts)
        (row,) = registry.rows(identities=[claimed.identity], with_artifacts=True)
        assert (row.status, row.compile_seconds, row.graphs_compiled, row.artifacts) == (
            "compiled",
            1.5,
            2,
            tuple(artifacts),
        )
        assert row.claimed_by is None and row.compiled_at is not None
        assert registry.mark_verified([row.identity]) == 1
        assert registry.rows(identities=[row.identity])[0].status == "verified"


def test_claims_never_hand_one_row_to_two_workers(registry_url: str, planned: list[PlannedShape]) -> None:
    with Registry.open(registry_url) as registry:
        registry.ensure_pending(planned)
    ids = [p.identity for p in planned]
    won: list[tuple[str, int]] = []
    errors: list[BaseException] = []

    def worker(name: str) -> None:
        try:
            with Registry.open(registry_url) as own:
                while (row := own.claim(ids, name, lease_seconds=60)) is not None:
                    won.append((name, row.id))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sorted(row for _, row in won) == sorted({row for _, row in won}) and len(won) == 4


def test_expired_lease_is_taken_over_and_the_old_claimant_loses(registry_url: str, planned: list[PlannedShape]) -> None:
    with Registry.open(registry_url) as registry:
        registry.ensure_pending(planned[:1])
        ids = [planned[0].identity]
        first = registry.claim(ids, "dead", lease_seconds=60)
        assert first is not None
        assert registry.claim(ids, "other", lease_seconds=60) is None, "a live lease is respected"
        started = registry.clock()
        registry.clock = lambda: started + dt.timedelta(seconds=61)  # the dead worker's lease has run out
        second = registry.claim(ids, "other", lease_seconds=60)
        assert second is not None and second.id == first.id and second.attempts == 2
        assert not registry.renew_lease(first.id, "dead", 60)
        assert not registry.mark_compiled(first.id, "dead", compile_seconds=1, graphs_compiled=1)
        assert registry.renew_lease(second.id, "other", 60)


def test_failed_rows_are_retried_only_when_asked(registry_url: str, planned: list[PlannedShape]) -> None:
    with Registry.open(registry_url) as registry:
        registry.ensure_pending(planned[:1])
        ids = [planned[0].identity]
        row = registry.claim(ids, "w", 60)
        assert row is not None and registry.mark_failed(row.id, "w", "RuntimeError: boom")
        assert registry.rows()[0].error == "RuntimeError: boom"
        assert registry.claim(ids, "w", 60) is None
        again = registry.claim(ids, "w", 60, retry_failed=True)
        assert again is not None and again.error is None


def test_other_toolchains_read_as_stale(registry_url: str, planned: list[PlannedShape]) -> None:
    old = [
        dataclasses.replace(p, toolchain=dataclasses.replace(p.toolchain, packages=(("torch", "2.0.0"),)))
        for p in planned
    ]
    with Registry.open(registry_url) as registry:
        registry.ensure_pending(old[:2])
        statuses = registry.plan_status(planned)
        assert [s.status for s in statuses] == ["stale", "stale", "missing", "missing"]


def test_misses_are_summed_per_shape(registry_url: str) -> None:
    with Registry.open(registry_url) as registry:
        registry.record_misses([MissEvent("m", "generate", "float32", 3, 20, "padded", 4, 32, count=5)])
        registry.record_misses(
            [
                MissEvent("m", "generate", "float32", 3, 20, "padded", 4, 32, count=2),
                MissEvent("m", "generate", "float32", 9, 20, "refused"),
            ]
        )
        summary = registry.miss_summary("m")
        assert [(s["batch_size"], s["decision"], s["count"]) for s in summary] == [(3, "padded", 7), (9, "refused", 1)]


def test_unreachable_database_is_one_line(tmp_path) -> None:
    result = CliRunner().invoke(main, ["shapes", "--db", "postgresql://nobody@127.0.0.1:1/none"])
    assert result.exit_code == 3
    assert result.stderr.startswith("warmcache: error: registry") and result.stderr.count("\n") == 1


def test_the_orm_model_and_the_record_describe_the_same_row() -> None:
    """``ShapeRecord`` is the row's one description in code (bundles and snapshots derive from it): the table must
    match it."""
    from warmcache.registry.models import CompiledShape
    from warmcache.registry.records import COLUMNS

    hints = typing.get_type_hints(CompiledShape)
    mapped: dict[str, tuple[type, bool]] = {}
    for column in CompiledShape.__table__.columns:
        (annotation,) = typing.get_args(hints[column.name])  # Mapped[X] -> X
        members = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else (annotation,)
        (kind,) = [m for m in members if m is not type(None)]
        assert column.nullable == (type(None) in members), (
            f"{column.name}: the annotation and the column disagree on NULL"
        )
        mapped[column.name] = (typing.get_origin(kind) or kind, bool(column.nullable))
    assert mapped == COLUMNS


def test_a_claim_is_given_back_even_when_a_second_interrupt_lands_in_the_release(
    registry_url: str, planned: list[PlannedShape]
) -> None:
    """Ctrl-C reaches a --jobs worker and its parent, which then SIGTERMs the worker: no row of its batch may stay
    'compiling'."""
    from warmcache.warmup.claims import _give_back

    class InterruptedOnce:
        def __init__(self, registry: Registry) -> None:
            self.registry, self.calls = registry, 0

        def together(self) -> AbstractContextManager[None]:
            return self.registry.together()

        def release(self, row_id: int, worker: str) -> None:
            self.calls += 1
            if self.calls == 1:
                raise KeyboardInterrupt("signal 15")
            self.registry.release(row_id, worker)

    with Registry.open(registry_url) as registry:
        registry.ensure_pending(planned)
        claimed = registry.claim_batch([p.identity for p in planned], "w1", 600, 2)
        assert len(claimed) == 2
        interrupted = InterruptedOnce(registry)
        _give_back(interrupted, [], [c.id for c in claimed], "w1")  # type: ignore[arg-type]
        rows = registry.rows(identities=[c.identity for c in claimed])
        assert interrupted.calls == 3 and {(row.status, row.claimed_by) for row in rows} == {("pending", None)}
