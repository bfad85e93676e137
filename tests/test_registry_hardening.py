"""The registry under a fleet's first start: concurrent ``db upgrade`` runs of an empty database all end well on one schema."""

from __future__ import annotations

import threading

import pytest

from warmcache.registry import schema
from warmcache.registry.engine import create_registry_engine


@pytest.mark.parametrize("trial", range(3))  # the race was lost in 5 of 8 trials before the lock
def test_concurrent_db_upgrades_of_an_empty_postgresql_database_end_with_one_schema(postgres_url: str, trial: int) -> None:
    barrier, failures = threading.Barrier(4), []

    def upgrade() -> None:
        engine = create_registry_engine(postgres_url)
        try:
            barrier.wait()
            schema.upgrade(engine)
        except Exception as exc:  # noqa: BLE001 - surfaced by the assertion below
            failures.append(exc)
        finally:
            engine.dispose()

    threads = [threading.Thread(target=upgrade) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    engine = create_registry_engine(postgres_url)
    try:
        assert schema.current_revision(engine) == schema.head_revision(engine)
    finally:
        engine.dispose()
