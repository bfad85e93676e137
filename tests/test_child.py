"""The child-process protocol (warmcache.warmup.child): real child processes, real report files."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from warmcache.errors import UsageError, WarmcacheError
from warmcache.settings import RegistryLocation
from warmcache.warmup.child import (
    ChildError,
    ChildFailure,
    Launch,
    ReportReader,
    ReportWriter,
    decode,
    encode,
    raise_first_error,
    run_children,
)
from warmcache.warmup.progress import Outcome, SpecOutcome
from warmcache.warmup.summary import ClaimRequest, Shard, WarmupOptions, WarmupRequest
from warmcache.warmup.verify import ReplayResult


@dataclass(frozen=True, slots=True)
class Note:
    """A message these tests' children send."""

    index: int
    text: str


def test_messages_round_trip_with_tuples_and_only_into_the_kinds_named() -> None:
    result = ReplayResult("abc", 1.5, graphs=1, new_entries=("fxgraph/a", "fxgraph/b"), persistent_cache=True)
    assert decode(encode(result), [ReplayResult]) == result
    outcome = SpecOutcome("abc", "m generate batch=1 seq=8", Outcome.COMPILED, 2.0, graphs=1)
    assert decode(encode(outcome), [ReplayResult, SpecOutcome]) == outcome
    assert decode(encode(outcome), [SpecOutcome]).status is Outcome.COMPILED  # the enum, not the JSON text
    with pytest.raises(WarmcacheError, match="malformed message"):
        decode(encode(outcome).replace('"compiled"', '"half-done"'), [SpecOutcome])
    with pytest.raises(WarmcacheError, match="a 'SpecOutcome', expected ReplayResult") as refused:
        decode(encode(outcome), [ReplayResult])
    assert "\n" not in str(refused.value)
    for line in (
        "not json",
        "[]",
        json.dumps({"type": "Note", "index": 1}),
        json.dumps({"type": "Note", "index": 1, "text": "t", "extra": 2}),
    ):
        with pytest.raises(WarmcacheError, match="malformed message from a warmcache child process"):
            decode(line, [Note])
    with pytest.raises(TypeError):
        encode({"not": "a dataclass"})


def test_a_torchrun_request_carries_the_options_the_child_needs() -> None:
    options = WarmupOptions(
        RegistryLocation.parse("postgresql://u:secret@db/x", "--db"),
        "/cache",
        30.0,
        jobs=1,
        shard=Shard(2, 3),
        retry_failed=True,
    )
    request = decode(encode(WarmupRequest.of("m.toml", options)), [ClaimRequest, WarmupRequest])
    assert isinstance(request, WarmupRequest) and request.options() == options


def test_the_reader_waits_for_a_line_to_end_and_keeps_the_childs_failure(tmp_path: Path) -> None:
    report = tmp_path / "report.jsonl"
    reader = ReportReader(report, [Note])
    assert reader.new_messages() == []  # the child has not created its file yet
    line = encode(Note(1, "first"))
    report.write_text(line[:10])
    assert reader.new_messages() == []
    with report.open("a") as out:
        out.write(line[10:] + "\n" + encode(ChildFailure("registry x: unreachable", 3)) + "\n" + encode(Note(2, "cut")))
    assert reader.new_messages() == [Note(1, "first")]
    assert reader.failure == ChildFailure("registry x: unreachable", 3) and reader.received == 1


_CHILD = """
import os, sys, time
from warmcache.errors import UsageError
from warmcache.warmup.child import ReportWriter, read_request
from test_child import Note

request_path, report_path = sys.argv[-2:]
with ReportWriter(report_path) as reports, reports.failures_reported():
    plan = read_request(request_path, [Note])
    if plan.text == "hang":  # before the first message: the parent may terminate us as soon as it reads it
        import signal
        signal.signal(signal.SIGTERM, lambda *_: (open(os.environ["TERMINATED_MARK"], "w").close(), sys.exit(143)))
    for i in range(plan.index):
        reports.send(Note(i, "working"))
    if plan.text == "usage":
        raise UsageError("manifest m.toml: model[0].path: no such folder")
    if plan.text == "crash":
        raise SystemExit(7)
    if plan.text == "hang":
        time.sleep(60)
    if plan.text == "stubborn":  # ignores SIGTERM: only a kill stops it
        import signal
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        reports.send(Note(os.getpid(), "pid"))
        time.sleep(120)
"""


def _launch(tmp_path: Path, name: str, count: int, then: str) -> Launch:
    script = tmp_path / "child_script.py"
    script.write_text(textwrap.dedent(_CHILD))
    env = {
        "PYTHONPATH": str(Path(__file__).parent),
        "PATH": "/usr/bin:/bin",
        "TERMINATED_MARK": str(tmp_path / "terminated"),
    }
    return Launch(name, [sys.executable, str(script)], Note(count, then), env)


def test_results_arrive_and_each_child_says_how_it_ended(tmp_path: Path) -> None:
    got: list[tuple[int, str]] = []
    exits = run_children(
        [
            _launch(tmp_path, "clean", 2, ""),
            _launch(tmp_path, "refused", 1, "usage"),
            _launch(tmp_path, "crashed", 3, "crash"),
        ],
        [Note],
        lambda note: got.append((note.index, note.text)),
    )
    assert sorted(got) == [
        (0, "working"),
        (0, "working"),
        (0, "working"),
        (1, "working"),
        (1, "working"),
        (2, "working"),
    ]
    clean, refused, crashed = exits
    assert (clean.returncode, clean.messages, clean.error()) == (0, 2, None)
    error = refused.error()
    assert isinstance(error, ChildError) and error.exit_code == UsageError.exit_code == refused.returncode
    assert str(error) == "refused: manifest m.toml: model[0].path: no such folder"
    assert str(crashed.error()) == "crashed exited with code 7 after 3 result(s); see its output above"
    with pytest.raises(ChildError, match="^refused: "):
        raise_first_error(exits)
    # a child's own error (and exit code) wins over a crash listed before it
    with pytest.raises(ChildError, match="^refused: "):
        raise_first_error([crashed, refused])


def test_an_interrupted_parent_terminates_its_children_and_waits_for_them(tmp_path: Path) -> None:
    def interrupt(note: Note) -> None:
        raise KeyboardInterrupt

    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        run_children([_launch(tmp_path, "hanging", 1, "hang")], [Note], interrupt)
    assert time.monotonic() - started < 30  # not the child's 60 s sleep
    # The child ran its SIGTERM handler (a warmup worker gives its claim back there) before the parent went on.
    assert (tmp_path / "terminated").exists()


def test_the_child_entry_point_reports_a_malformed_request_as_one_failure(tmp_path: Path) -> None:
    request, report = tmp_path / "request.json", tmp_path / "report.jsonl"
    request.write_text(encode(Note(1, "not a request warmcache knows")))
    done = subprocess.run(
        [sys.executable, "-m", "warmcache.warmup", str(request), str(report)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1 and done.stdout == "" and "Traceback" not in done.stderr, done.stderr
    reader = ReportReader(report, [ReplayResult])
    assert reader.new_messages() == []
    assert (
        reader.failure is not None
        and "a 'Note', expected ClaimRequest or WarmupRequest or ReplayRequest" in reader.failure.message
    )


def test_a_writer_for_no_one_sends_nothing(tmp_path: Path) -> None:
    with ReportWriter(None) as quiet:
        quiet.send(Note(1, "dropped"))  # a torchrun follower: rank 0 reports for the group
    assert list(tmp_path.iterdir()) == []


def test_a_second_interrupt_kills_children_that_ignore_the_first(tmp_path: Path) -> None:
    """Ctrl-C twice: no child outlives the parent, none is left writing into the deleted temp folder."""
    import os
    import signal

    pids: list[int] = []

    def interrupt_once_the_child_is_stubborn(note: Note) -> None:
        if note.text == "pid":
            pids.append(note.index)
            signal.setitimer(signal.ITIMER_REAL, 1.0)  # the second Ctrl-C, while the parent waits out the grace
            raise KeyboardInterrupt

    def second_interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, second_interrupt)
    started = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            run_children([_launch(tmp_path, "stubborn", 0, "stubborn")], [Note], interrupt_once_the_child_is_stubborn)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert time.monotonic() - started < 30  # not the 60 s grace, nor the child's 120 s sleep
    with pytest.raises(ProcessLookupError):  # killed and reaped
        os.kill(pids[0], 0)


def test_children_import_the_warmcache_their_parent_runs() -> None:
    """A child runs the parent's warmcache: an installed one (site-packages) is found by any interpreter of the
    environment and stays off ``PYTHONPATH``; one run from a source folder is put first on it."""
    import os
    import site

    import warmcache
    from warmcache.warmup.child import _importing_this_warmcache

    package_parent = Path(warmcache.__file__).resolve().parent.parent
    installed = package_parent in {Path(folder).resolve() for folder in site.getsitepackages()}
    paths = _importing_this_warmcache({"PYTHONPATH": "/elsewhere"})["PYTHONPATH"].split(os.pathsep)
    assert paths == (["/elsewhere"] if installed else [str(package_parent), "/elsewhere"])
    probe = subprocess.run(
        [sys.executable, "-c", "import warmcache; print(warmcache.__file__)"],
        env=_importing_this_warmcache({"PYTHONPATH": "/elsewhere", "PATH": os.environ.get("PATH", "")}),
        cwd="/",
        capture_output=True,
        text=True,
        check=True,
    )
    assert Path(probe.stdout.strip()).resolve() == Path(warmcache.__file__).resolve()


#: A parent that starts one child and waits; the child writes the registry URL its request gave it, then waits too.
_PARENT = """
import sys
from warmcache.settings import RegistryLocation
from warmcache.warmup.child import Launch, run_children
from warmcache.warmup.summary import ClaimRequest

child = (
    "import os, sys, time\\n"
    "from warmcache.warmup.child import read_request\\n"
    "from warmcache.warmup.summary import ClaimRequest\\n"
    "request = read_request(sys.argv[1], [ClaimRequest])\\n"
    f"open({sys.argv[1]!r}, 'w').write(f'{{os.getpid()}} {{request.registry.url}} '\\n"
    "    f'{os.environ.get(\\"WARMCACHE_CHILD_REGISTRY_URLS\\")}')\\n"
    "time.sleep(120)\\n"
)
request = ClaimRequest("m.toml", RegistryLocation.parse(sys.argv[2]), None, ("a",), 60.0, (None,))
run_children([Launch("probe", [sys.executable, "-c", child], request)], [ClaimRequest], print)
"""


def test_a_parent_killed_with_minus_9_leaves_no_registry_password_on_disk(tmp_path: Path) -> None:
    """The request folder outlives a parent killed with -9; the password was never in it (it travels in the child's
    environment)."""
    import os
    import signal

    url = "postgresql://warm:s3cret-pw@db.example:5432/reg"
    got, temporary = tmp_path / "got.txt", tmp_path / "tmp"
    temporary.mkdir()
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT, str(got), url], env={**os.environ, "TMPDIR": str(temporary)}
    )
    deadline = time.monotonic() + 60
    while not got.exists() or not got.read_text():
        assert time.monotonic() < deadline and parent.poll() is None, "the child never read its request"
        time.sleep(0.1)
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    pid, received, remembered = got.read_text().split(" ", 2)
    os.kill(int(pid), signal.SIGKILL)
    # whole in the child, then forgotten by its environment
    assert received == RegistryLocation.parse(url).url and remembered == "None"
    (left,) = temporary.glob("warmcache-child-*")  # what kill -9 leaves
    request = (left / "request-0.json").read_text()
    assert "s3cret-pw" not in request and "warm:***@db.example" in request


def test_a_sigterm_that_lands_in_a_finalizer_still_interrupts(tmp_path: Path) -> None:
    """SIGTERM became a KeyboardInterrupt inside whatever ran, once inside a ``__del__`` during garbage collection
    (the ``regex`` package's): Python ignored it there and the warmup went on to exit 0 (1 run in 26)."""
    script = tmp_path / "finalizer.py"
    script.write_text(
        textwrap.dedent(
            """
            import gc, os, signal, sys, time
            from warmcache.warmup.child import sigterm_as_interrupt

            class Slow:
                def __del__(self):
                    os.kill(os.getpid(), signal.SIGTERM)  # delivered while this finalizer runs
                    end = time.monotonic() + 0.3
                    while time.monotonic() < end:
                        pass

            with sigterm_as_interrupt():
                try:
                    Slow()  # collected at once: its __del__ runs here
                    gc.collect()
                    end = time.monotonic() + 5
                    while time.monotonic() < end:
                        time.sleep(0.01)
                    print("not interrupted")
                except KeyboardInterrupt as exc:
                    print(f"interrupted: {exc}")
            """
        )
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == f"interrupted: signal {int(signal.SIGTERM)}", (done.stdout, done.stderr)
    assert "Exception ignored" not in done.stderr, done.stderr
