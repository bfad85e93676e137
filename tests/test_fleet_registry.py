"""A fleet's hosts share one registry database from their first second on."""

from __future__ import annotations

import threading

from warmcache.registry import Registry


def test_a_fleet_starting_at_once_initialises_a_fresh_registry_once(registry_url: str) -> None:
    """Every host opens the empty database at the same moment: one creates the schema, none fails."""
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def open_registry() -> None:
        barrier.wait()
        try:
            Registry.open(registry_url).close()
        except BaseException as exc:  # noqa: BLE001 - collected and reported below
            errors.append(exc)

    threads = [threading.Thread(target=open_registry, daemon=True) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "initialisation deadlocked"
    assert not errors, [str(e) for e in errors]
    with Registry.open(registry_url) as registry:
        assert registry.rows() == []
