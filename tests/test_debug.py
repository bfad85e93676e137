"""``warmcache --debug``: the decisions behind a command and the traceback behind its one-line error.

Without it an error stays one line; with it (or ``WARMCACHE_DEBUG=1``) the DEBUG
decision lines and the whole traceback follow on stderr, including the cause a
``raise ... from None`` keeps out of the message.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from warmcache_testkit.manifests import generate, manifest_toml, model

from warmcache.cli import main
from warmcache.errors import RegistryError
from warmcache.warmup import claims


def _missing_registry(tmp_path: Path, *flags: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner(env=env).invoke(main, [*flags, "shapes", "--db", f"sqlite:///{tmp_path / 'nowhere' / 'r.sqlite'}"])


def test_an_error_is_one_line_without_debug(tmp_path: Path) -> None:
    result = _missing_registry(tmp_path)
    assert result.exit_code == 3
    assert result.stderr.splitlines() == [result.stderr.strip()] and result.stderr.startswith(
        "warmcache: error: registry "
    )
    assert "Traceback" not in result.output and "debug:" not in result.output


@pytest.mark.parametrize("how", ["--debug", "WARMCACHE_DEBUG=1"])
def test_debug_prints_the_decisions_and_the_traceback(tmp_path: Path, how: str) -> None:
    result = _missing_registry(
        tmp_path, *([how] if how == "--debug" else []), env={"WARMCACHE_DEBUG": "1"} if how != "--debug" else None
    )
    assert result.exit_code == 3
    lines = result.stderr.splitlines()
    assert any(line.startswith("warmcache: debug: registry.registry: opening registry sqlite:///") for line in lines), (
        result.stderr
    )
    assert "warmcache: debug: cli: Exception information:" in lines and "Traceback (most recent call last):" in lines
    assert "in _refuse_missing_sqlite_file" in result.stderr  # where it was raised
    # the one line, last
    assert lines[-1].startswith("warmcache: error: registry ") and lines[-1].endswith("(or a warmcache warmup)")


def test_debug_shows_the_cause_that_from_none_keeps_out_of_the_message(tmp_path: Path, write_manifest) -> None:
    folder = tmp_path / "broken-model"
    folder.mkdir()
    (folder / "config.json").write_text("{not json")
    manifest = write_manifest(manifest_toml(model("m", str(folder), backend="aot_eager", generate=[generate()])))
    plain = CliRunner().invoke(main, ["plan", str(manifest)])
    assert plain.exit_code == 2 and "unreadable config.json" in plain.stderr and "JSONDecodeError" not in plain.output
    debug = CliRunner().invoke(main, ["--debug", "plan", str(manifest)])
    assert debug.exit_code == 2 and "json.decoder.JSONDecodeError: Expecting property name" in debug.stderr
    assert "During handling of the above exception, another exception occurred:" in debug.stderr
    assert debug.stderr.splitlines()[-1] == plain.stderr.strip()


class _FlakyRegistry:
    """A registry whose lease renewals fail: what a heartbeat meets while the database restarts."""

    def __init__(self) -> None:
        self.renewals = 0
        self.failed = threading.Event()

    def renew_leases(self, row_ids: Sequence[int], worker: str, lease_seconds: float) -> set[int]:
        self.renewals += 1
        self.failed.set()
        raise RegistryError("registry sqlite:///r.sqlite: database is locked")

    def drop_connections(self) -> None:
        pass

    def release(self, row_id: int, worker: str, *, started: bool = True) -> None:
        raise RegistryError("registry sqlite:///r.sqlite: disk I/O error")

    def together(self) -> threading.Lock:
        return threading.Lock()


def test_a_failed_lease_renewal_is_logged_not_dropped(caplog: pytest.LogCaptureFixture) -> None:
    registry = _FlakyRegistry()
    caplog.set_level(logging.DEBUG, logger="warmcache.warmup.claims")
    with claims._LeaseRenewer(registry, [7], "host:1", lease_seconds=0.6):  # type: ignore[arg-type]
        assert registry.failed.wait(5)
        time.sleep(0.05)
    record = next(r for r in caplog.records if "could not renew leases" in r.getMessage())
    assert (
        record.levelno == logging.WARNING
        and "rows [7]" in record.getMessage()
        and "database is locked" in record.getMessage()
    )


def test_claims_that_cannot_be_given_back_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="warmcache.warmup.claims")
    claims._give_back(_FlakyRegistry(), [], [3, 4], "host:1")  # type: ignore[arg-type]
    (record,) = [r for r in caplog.records if r.name == "warmcache.warmup.claims"]
    assert (
        record.levelno == logging.WARNING
        and "could not give back claims [3, 4]" in record.getMessage()
        and "disk I/O error" in record.getMessage()
    )


def test_the_processes_a_debug_command_starts_log_their_decisions_too(tmp_path: Path) -> None:
    """``--jobs`` workers, torchrun ranks and verify's replays configure their logging from ``$WARMCACHE_DEBUG``."""
    from warmcache.diagnostics import debug_requested

    assert debug_requested({"WARMCACHE_DEBUG": "1"}) and debug_requested({"WARMCACHE_DEBUG": "true"})
    assert not debug_requested({"WARMCACHE_DEBUG": "0"}) and not debug_requested({})
    _missing_registry(tmp_path, "--debug")
    assert debug_requested()  # set for the children of that command (the test's environment is restored after it)
