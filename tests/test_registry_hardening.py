"""The registry under a fleet's first start: concurrent ``db upgrade`` runs of an empty database all end well on one
schema."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
import test_bundle
from test_bundle import Built

from warmcache.registry import schema
from warmcache.registry.engine import create_registry_engine
from warmcache.settings import RegistryLocation

built = test_bundle.built  # a SQLite registry with two compiled rows (a fixture)
#: ``setpriv`` to the ``nobody`` user, where this runs as root.
UNPRIVILEGED = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if os.getuid() == 0 else []


@pytest.mark.parametrize("trial", range(3))  # the race was lost in 5 of 8 trials before the lock
def test_concurrent_db_upgrades_of_an_empty_postgresql_database_end_with_one_schema(
    postgres_url: str, trial: int
) -> None:
    barrier, failures, changes = threading.Barrier(4), [], []

    def upgrade() -> None:
        engine = create_registry_engine(RegistryLocation.parse(postgres_url))
        try:
            barrier.wait()
            changes.append(schema.upgrade(engine, display_url="test registry"))
        except Exception as exc:  # noqa: BLE001 - surfaced by the assertion below
            failures.append(exc)
        finally:
            engine.dispose()

    threads = [threading.Thread(target=upgrade, daemon=True) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    # racing DDL could also wait on itself forever
    assert failures == [] and not any(thread.is_alive() for thread in threads)
    engine = create_registry_engine(RegistryLocation.parse(postgres_url))
    try:
        head = schema.head_revision(engine)
        assert schema.current_revision(engine) == head
    finally:
        engine.dispose()
    # Only the upgrade that did the work says "empty -> head": the others read the revision under the lock, after it.
    assert sorted(changes, key=lambda change: change[0] is not None) == [(None, head)] + [(head, head)] * 3


READ_ONLY_READS = """
import json, sys
from click.testing import CliRunner
from warmcache.cli import main
from warmcache.runtime.guard import ShapeGuard
url = sys.argv[1]
shapes = CliRunner().invoke(main, ["shapes", "--db", url, "--json"])
check = CliRunner().invoke(main, ["check", "--model", "neuron-m", "--batch", "1", "--seq", "16", "--db", url])
guard = ShapeGuard.from_registry(url, "neuron-m", telemetry=False)
print(json.dumps({"shapes": [shapes.exit_code, len(json.loads(shapes.stdout or "[]")), shapes.output[-300:]],
                  "check": [check.exit_code, check.output[-300:]], "guard": len(guard.records)}))
"""


def test_a_sqlite_registry_in_a_read_only_folder_answers_every_read(built: Built) -> None:
    """Run as an unprivileged user (root ignores folder modes): WAL would need to create its -shm file beside the
    database."""
    folder = Path(tempfile.mkdtemp(prefix="warmcache-ro-"))
    try:
        shutil.copyfile(built.url.removeprefix("sqlite:///"), folder / "registry.sqlite")
        (folder / "registry.sqlite").chmod(0o644)
        folder.chmod(0o555)
        home = Path(tempfile.mkdtemp(prefix="warmcache-home-"))
        home.chmod(0o777)
        command = [*UNPRIVILEGED, sys.executable, "-c", READ_ONLY_READS, f"sqlite:///{folder / 'registry.sqlite'}"]
        env = {**os.environ, "HOME": str(home), "XDG_CACHE_HOME": str(home)}
        result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120, check=False)
        assert result.returncode == 0, result.stderr[-2000:]
        answer = json.loads(result.stdout.splitlines()[-1])
        assert answer["shapes"][:2] == [0, 2] and answer["check"][0] == 0 and answer["guard"] == 2, answer
        assert sorted(p.name for p in folder.iterdir()) == ["registry.sqlite"]
    finally:
        folder.chmod(0o755)
        shutil.rmtree(folder, ignore_errors=True)
