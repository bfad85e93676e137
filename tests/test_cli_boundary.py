"""The command line's one boundary (warmcache/cli/__init__.py) and the settings table (warmcache/settings_table.py).

Ctrl-C is one line saying what was left and exit 130; a bug is one line naming --debug and exit 70, its traceback
behind --debug; every WARMCACHE_* variable the package reads is a row of the table, listed in
docs/reference/settings.md, and every true/false one is read by one parser that refuses what it does not understand.
"""

from __future__ import annotations

import ast
import importlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import warmcache
from warmcache.cli import main
from warmcache.cli.progress import spec_progress
from warmcache.diagnostics import debug_requested
from warmcache.errors import ExitCode, UsageError
from warmcache.settings_table import SETTINGS, Setting, parse_switch
from warmcache.trust import unsigned_allowed_by_environment

PACKAGE = Path(warmcache.__file__).parent
#: In the checkout beside the tests: the suite runs the installed wheel, which ships no docs.
DOCS_PAGE = Path(__file__).resolve().parents[1] / "docs" / "reference" / "settings.md"


# The one reader of true/false values.


@pytest.mark.parametrize("word", ["1", "true", "T", "yes", "Y", " on "])
def test_a_true_word_is_true_for_every_switch(word: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WARMCACHE_DEBUG", word)
    monkeypatch.setenv("WARMCACHE_ALLOW_UNSIGNED", word)
    assert parse_switch(word, "x") and debug_requested() and unsigned_allowed_by_environment()


@pytest.mark.parametrize("word", ["0", "false", "F", "no", "N", "off", ""])
def test_a_false_word_is_false_for_every_switch(word: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WARMCACHE_DEBUG", word)
    monkeypatch.setenv("WARMCACHE_ALLOW_UNSIGNED", word)
    assert not (parse_switch(word, "x") or debug_requested() or unsigned_allowed_by_environment())


@pytest.mark.parametrize("word", ["ture", "2", "enabled", "yes please"])
def test_a_word_that_is_neither_is_refused_naming_the_variable(word: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WARMCACHE_ALLOW_UNSIGNED", word)
    with pytest.raises(UsageError, match=r"^\$WARMCACHE_ALLOW_UNSIGNED: .* is neither true nor false"):
        unsigned_allowed_by_environment()
    monkeypatch.setenv("WARMCACHE_DEBUG", word)
    with pytest.raises(UsageError, match=r"^\$WARMCACHE_DEBUG: "):
        debug_requested()


def test_the_command_line_refuses_an_unreadable_debug_variable_in_one_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["status", str(tmp_path / "m.toml")], env={"WARMCACHE_DEBUG": "maybe"})
    assert result.exit_code == ExitCode.USAGE
    assert result.stderr.splitlines() == [
        "warmcache: error: $WARMCACHE_DEBUG: 'maybe' is neither true nor false; give one of 1, true, t, yes, y, on "
        "or 0, false, f, no, n, off"
    ]


# The settings table: every variable, in the docs.


def test_every_warmcache_variable_in_the_source_is_a_row_of_the_table() -> None:
    named = {
        name
        for path in PACKAGE.rglob("*.py")
        for name in re.findall(r"WARMCACHE_[A-Z0-9_]*[A-Z0-9]", path.read_text(encoding="utf-8"))
    }
    assert len(named) >= 14, "the search found too few names to be searching the package"
    assert named - {s.env for s in SETTINGS} == set()
    assert len({s.env for s in SETTINGS}) == len(SETTINGS)


def _cell(value: str | None) -> str:
    return f"`{value}`" if value else "none"


def settings_rows(settings: tuple[Setting, ...] = SETTINGS) -> str:
    """The table docs/reference/settings.md holds, as :data:`SETTINGS` says it."""
    lines = ["| variable | flag | manifest key | default | what it sets |", "| --- | --- | --- | --- | --- |"]
    for s in settings:
        lines.append(f"| `{s.env}` | {_cell(s.flag)} | {_cell(s.manifest_key)} | {s.default} | {s.meaning} |")
    return "\n".join(lines)


def test_the_settings_page_is_the_table() -> None:
    expected = settings_rows()
    assert expected in DOCS_PAGE.read_text(encoding="utf-8"), (
        f"{DOCS_PAGE} does not hold the settings table as warmcache/settings_table.py says it; put this there:\n"
        f"{expected}"
    )


# Commands return codes; the boundary alone exits.


def test_no_command_exits_by_itself() -> None:
    raising = [
        f"{path.name}:{number}"
        for path in sorted((PACKAGE / "cli").glob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"SystemExit\(|sys\.exit\(", line)
    ]
    assert raising == []


def test_every_exit_code_a_result_gives_is_a_named_member() -> None:
    """A result's ``exit_code`` (pull's, store check's, warmup --push's publisher's) returns ``ExitCode`` members,
    never a bare 1 or 5 whose meaning only exit-codes.md knows."""
    bare = [
        f"{path.relative_to(PACKAGE)}:{node.lineno}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for function in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(function, ast.FunctionDef) and function.name == "exit_code"
        for returned in ast.walk(function)
        if isinstance(returned, ast.Return)
        for node in ast.walk(returned)
        if isinstance(node, ast.Constant) and type(node.value) is int
    ]
    assert bare == []


def test_a_bug_is_one_line_naming_debug_and_its_own_exit_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("the list index went wrong\nand a second line nobody needs")

    monkeypatch.setattr(importlib.import_module("warmcache.cli.status"), "load_manifest", broken)
    runner = CliRunner()
    plain = runner.invoke(main, ["status", str(tmp_path / "m.toml")])
    assert plain.exit_code == ExitCode.UNEXPECTED == 70
    assert plain.stderr.splitlines() == [
        "warmcache: error: unexpected RuntimeError: the list index went wrong (a bug in warmcache; run again with "
        "--debug for the traceback)"
    ]
    debug = runner.invoke(main, ["--debug", "status", str(tmp_path / "m.toml")])
    assert debug.exit_code == ExitCode.UNEXPECTED
    assert "Traceback (most recent call last)" in debug.stderr
    assert 'raise RuntimeError("the list index went wrong' in debug.stderr
    assert debug.stderr.rstrip().endswith("run again with --debug for the traceback)")


def test_a_returned_code_is_the_exit_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a command returns is the process's status; ``None`` is success."""
    monkeypatch.setitem(main.commands, "five", click.Command("five", callback=lambda: ExitCode.CACHE))
    monkeypatch.setitem(main.commands, "nothing", click.Command("nothing", callback=lambda: None))
    assert CliRunner().invoke(main, ["five"]).exit_code == 5
    assert CliRunner().invoke(main, ["nothing"]).exit_code == 0


# Ctrl-C.


@dataclass(frozen=True)
class _Compiled:
    description: str
    failed: bool = False

    def message(self) -> str:
        return "compiled in 1.0s"


@pytest.mark.parametrize("terminal", [False, True], ids=["lines", "bar"])
def test_an_interrupted_run_says_how_many_specs_it_left(terminal: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """What warmup and verify show their specs through says, when Ctrl-C comes, what is done and what is not."""

    def run() -> None:
        shown = spec_progress(5, terminal=terminal, label="warmup")
        try:  # as the runner does: its bar is closed on the way out
            for name in ("a", "b"):
                shown.advance(_Compiled(name))
            raise KeyboardInterrupt
        finally:
            shown.close()

    monkeypatch.setitem(main.commands, "run", click.Command("run", callback=run))
    result = CliRunner().invoke(main, ["run"])
    assert result.exit_code == ExitCode.INTERRUPTED
    assert result.stderr.splitlines()[-1] == (
        "warmcache: interrupted: run stopped: 2 of 5 specs finished and recorded, 3 left; run it again to go on"
    )
    assert "Aborted!" not in result.output


def _started(*args: str, folder: Path) -> subprocess.Popen[str]:
    """``python -m warmcache ARGS`` in ``folder``, with no WARMCACHE_ variable or registry credentials of this
    machine's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARMCACHE_")}
    env["DOCKER_CONFIG"] = str(folder)
    return subprocess.Popen(
        [sys.executable, "-m", "warmcache", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=folder,
    )


def test_ctrl_c_is_one_line_saying_what_was_left_and_exit_130(tmp_path: Path) -> None:
    """A store listing blocked on a registry that accepts and never answers, interrupted as a terminal's Ctrl-C does."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(60)
        port = listener.getsockname()[1]
        command = _started("store", "ls", "--store", f"oci+http://127.0.0.1:{port}/repo", folder=tmp_path)
        try:
            connection, _ = listener.accept()  # the command now waits for an answer
            with connection:
                command.send_signal(signal.SIGINT)
                out, err = command.communicate(timeout=60)
        finally:
            if command.poll() is None:
                command.kill()
    assert command.returncode == ExitCode.INTERRUPTED == 130
    assert err.splitlines() == ["warmcache: interrupted: store stopped: what it finished is kept"], err
    assert out == ""


def test_ctrl_c_stops_serve_in_one_line_and_exit_130(tmp_path: Path) -> None:
    """uvicorn takes SIGINT, shuts down, and raises it again: the boundary's line, not uvicorn's or a traceback."""
    registry = f"sqlite:///{tmp_path / 'r.sqlite'}"
    assert CliRunner().invoke(main, ["db", "upgrade", "--db", registry]).exit_code == 0
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = _started("serve", "--db", registry, "--port", str(port), folder=tmp_path)
    try:
        deadline = time.monotonic() + 60
        while True:  # serving: uvicorn's own SIGINT handler is in place
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                assert command.poll() is None and time.monotonic() < deadline, "serve never answered"
                time.sleep(0.1)
        command.send_signal(signal.SIGINT)
        out, err = command.communicate(timeout=60)
    finally:
        if command.poll() is None:
            command.kill()
    assert command.returncode == ExitCode.INTERRUPTED, err
    assert err.splitlines()[1:] == [
        f"warmcache: interrupted: serve stopped: no longer serving http://127.0.0.1:{port}/"
    ]
    assert err.startswith("warmcache serve: registry") and out == "", err


def test_debug_shows_each_store_retry_and_where_a_setting_came_from(tmp_path: Path) -> None:
    """A registry that refuses connections: each of the five attempts but the last is a DEBUG line with its wait."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # bound, never listening: connections are refused
        result = CliRunner().invoke(
            main,
            ["--debug", "store", "ls"],
            env={"WARMCACHE_STORE": f"oci+http://127.0.0.1:{port}/repo", "DOCKER_CONFIG": str(tmp_path)},
        )
    assert result.exit_code == ExitCode.STORE, result.stderr
    assert "debug: settings_table: store: from $WARMCACHE_STORE" in result.stderr
    waits = re.findall(r"attempt (\d) of 5 failed \(.*\); trying again in ([\d.]+) s", result.stderr)
    assert waits == [("1", "0.2"), ("2", "0.4"), ("3", "0.8"), ("4", "1.6")], result.stderr
