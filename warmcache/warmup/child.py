"""The one protocol between warmcache and the processes it starts: a request file in, typed messages out.

warmcache starts three kinds of child process: the workers of ``warmup --jobs N``,
the torchrun a warmup of sharded models runs in, and verify's replay (a fresh
process, so nothing of the caller's can make a spec look warm). All three talk
the same way:

* The parent writes the child's **request**, a frozen dataclass, as one JSON
  file in a private temporary folder: not on the command line, where a registry
  password would show in ``ps``; and without the password, which travels in the
  child's environment (:mod:`warmcache.warmup.request_secrets`): a parent killed
  with ``kill -9`` leaves the folder behind.
* The child appends each **message** (a result, as soon as it has it) as one
  JSON line to its report file and flushes it. The parent reads the file as it
  grows, so progress is live; a child that crashes still leaves every result it
  had; a line cut off by a kill is never read half.
* A child that stops on a :class:`~warmcache.errors.WarmcacheError` sends a
  :class:`ChildFailure` (its line and exit code) instead of printing it; the
  parent raises it as its own. Only ``warmcache.cli`` prints.

Messages are frozen dataclasses whose fields are JSON values (tuples travel as
lists) or frozen dataclasses of them, such as a
:class:`~warmcache.settings.RegistryLocation`: it travels as its fields and arrives
as the same value, so a child never parses or normalises a registry URL again. Each line is tagged with its class name
and decoded only into the classes the reader names, so a message of another kind is an error, not a silently empty
result.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import signal
import site
import subprocess
import tempfile
import threading
import time
import typing
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType
from typing import IO, Any, Generic, TypeVar

from warmcache.errors import ExitCode, WarmcacheError, first_line, shown
from warmcache.warmup.request_secrets import with_secrets, without_secrets

M = TypeVar("M")

#: Every child warmcache starts runs ``python -m warmcache.warmup REQUEST REPORT`` (``warmcache/warmup/__main__.py``).
CHILD_MODULE = "warmcache.warmup"

#: How often the parent looks for new messages while its children run.
POLL_SECONDS = 0.2
#: How long an interrupted parent waits for a terminated child to give its claim back.
#: Longer than torchrun's own 30 s shutdown of its ranks (each in a session of its own):
#: killing the agent first would leave rank 0 running, renewing its lease.
TERMINATE_GRACE_SECONDS = 60.0
#: Where the ``warmcache`` package the parent runs lives: children import the same one.
_PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])
#: Children write to the parent's stderr: the parent's stdout may be ``--json`` output.
_STDERR_FD = 2


@dataclass(frozen=True, slots=True)
class ChildFailure:
    """A child stopped on a warmcache error: the error's text and the exit code it calls for."""

    message: str
    exit_code: int


class ChildError(WarmcacheError):
    """A child's :class:`ChildFailure`, raised in the parent with the child's exit code."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def encode(message: object) -> str:
    """One line of JSON: the dataclass's fields, tagged with its class name."""
    if not dataclasses.is_dataclass(message) or isinstance(message, type):
        raise TypeError(f"not a message: {message!r}")
    return json.dumps({"type": type(message).__name__, **_fields(message)}, default=_nested_fields)


def _fields(value: object) -> dict[str, Any]:
    return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}  # type: ignore[arg-type]


def _nested_fields(value: object) -> dict[str, Any]:
    """A field that is itself a frozen dataclass travels as its fields."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _fields(value)
    raise TypeError(f"{type(value).__name__} is not a JSON value")


def decode(line: str, kinds: Sequence[type[M]]) -> M:
    """The message ``line`` encodes, which must be one of ``kinds``."""
    try:
        fields = json.loads(line)
        name = fields.pop("type")
        kind = next((k for k in kinds if k.__name__ == name), None)
        if kind is None:
            raise ValueError(f"a {name!r}, expected {' or '.join(k.__name__ for k in kinds)}")
        return kind(**{key: _field_value(kind, key, value) for key, value in fields.items()})
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise WarmcacheError(
            f"malformed message from a warmcache child process ({first_line(exc)}): {shown(line)}"
        ) from None


def _field_value(kind: type, key: str, value: Any) -> Any:
    """A decoded field as its declared value: a list as a tuple, an object as the dataclass the field declares."""
    if isinstance(value, list):
        return tuple(value)
    if isinstance(value, dict):
        nested = _dataclass_fields(kind).get(key)
        if nested is None:
            raise ValueError(f"field {key!r} holds an object, which {kind.__name__} does not declare")
        return nested(**value)
    return value


@functools.cache
def _dataclass_fields(kind: type) -> dict[str, type]:
    """The fields of ``kind`` declared as a dataclass (or a dataclass or ``None``)."""
    found: dict[str, type] = {}
    for name, hint in typing.get_type_hints(kind).items():
        for option in typing.get_args(hint) or (hint,):
            if dataclasses.is_dataclass(option) and isinstance(option, type):
                found[name] = option
    return found


def read_request(path: str | Path, kinds: Sequence[type[M]]) -> M:
    """The child's side: the request its parent wrote (its registry passwords come from the environment)."""
    return with_secrets(decode(Path(path).read_text(encoding="utf-8"), kinds))


class ReportWriter:
    """The child's end of the report file; ``None`` for a process that reports nothing (a torchrun follower)."""

    def __init__(self, path: str | Path | None) -> None:
        # closed by close()
        self._file: IO[str] | None = open(path, "a", encoding="utf-8") if path is not None else None

    def send(self, message: object) -> None:
        if self._file is not None:
            self._file.write(encode(message) + "\n")
            self._file.flush()

    @contextmanager
    def failures_reported(self) -> Iterator[None]:
        """A warmcache error ends the child as a :class:`ChildFailure` and its exit code; Ctrl-C as exit 130."""
        try:
            yield
        except KeyboardInterrupt:
            raise SystemExit(ExitCode.INTERRUPTED) from None
        except WarmcacheError as exc:
            self.send(ChildFailure(str(exc), exc.exit_code))
            raise SystemExit(exc.exit_code) from None

    def close(self) -> None:
        if self._file is not None:
            self._file.close()

    def __enter__(self) -> ReportWriter:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()


class ReportReader(Generic[M]):
    """The parent's end: the complete lines appended since the last read, decoded."""

    def __init__(self, path: Path, kinds: Sequence[type[M]]) -> None:
        self._path = path
        self._kinds: tuple[type[Any], ...] = (*kinds, ChildFailure)
        self._offset = 0
        self.failure: ChildFailure | None = None
        self.received = 0

    def new_messages(self) -> list[M]:
        try:
            with self._path.open("rb") as report:
                report.seek(self._offset)
                data = report.read()
        except FileNotFoundError:
            return []
        complete = data[: data.rfind(b"\n") + 1]  # a line still being written waits for its end
        self._offset += len(complete)
        messages: list[M] = []
        for line in complete.split(b"\n")[:-1]:
            message = decode(line.decode("utf-8"), self._kinds)
            if isinstance(message, ChildFailure):
                self.failure = message
            else:
                messages.append(message)
        self.received += len(messages)
        return messages


@dataclass(frozen=True, slots=True)
class Launch:
    """One child to start: ``command`` gets the request and report paths appended."""

    name: str
    """What error lines call the child: ``warmup worker 2``, ``torchrun warmup of m (2 ranks)``."""
    command: list[str]
    request: object
    env: dict[str, str] | None = None


@dataclass(frozen=True, slots=True)
class ChildExit:
    """How one child ended, once all its messages were delivered."""

    name: str
    returncode: int
    failure: ChildFailure | None
    messages: int

    def error(self) -> WarmcacheError | None:
        """The child's own failure, or one line for an abnormal exit; ``None`` for a clean exit."""
        if self.failure is not None:
            return ChildError(f"{self.name}: {self.failure.message}", self.failure.exit_code)
        if self.returncode:
            return WarmcacheError(
                f"{self.name} exited with code {self.returncode} after {self.messages} result(s); see its output above"
            )
        return None


def run_children(
    launches: Sequence[Launch], kinds: Sequence[type[M]], on_message: Callable[[M], None]
) -> list[ChildExit]:
    """Start every child, hand each message to ``on_message`` as it arrives, return how each ended.

    An interruption of the parent (Ctrl-C, or SIGTERM turned into
    ``KeyboardInterrupt``) terminates the children with SIGTERM, so each gives
    back the claim it holds, and waits for them before it propagates.
    """
    with tempfile.TemporaryDirectory(prefix="warmcache-child-") as tmp:
        started: list[tuple[Launch, subprocess.Popen[bytes], ReportReader[M]]] = []
        try:
            for index, launch in enumerate(launches):
                request, report = Path(tmp) / f"request-{index}.json", Path(tmp) / f"report-{index}.jsonl"
                written, secrets = without_secrets(launch.request)  # a parent killed with -9 leaves the file behind
                request.write_text(encode(written), encoding="utf-8")
                env = {**_importing_this_warmcache(launch.env), **secrets}
                process = subprocess.Popen([*launch.command, str(request), str(report)], stdout=_STDERR_FD, env=env)
                started.append((launch, process, ReportReader(report, kinds)))
            while True:
                running = any(process.poll() is None for _, process, _ in started)
                for _, _, reader in started:  # read after polling, so nothing a child wrote before exiting is missed
                    for message in reader.new_messages():
                        on_message(message)
                if not running:
                    break
                time.sleep(POLL_SECONDS)
        except BaseException:
            _stop(process for _, process, _ in started)
            raise
        return [
            ChildExit(launch.name, process.returncode, reader.failure, reader.received)
            for launch, process, reader in started
        ]


def raise_first_error(exits: Sequence[ChildExit]) -> None:
    """Raise a child's failure (with its exit code) before an abnormal exit; every child's own output is above."""
    for ended in sorted(exits, key=lambda e: e.failure is None):
        if (error := ended.error()) is not None:
            raise error


#: How soon a SIGTERM that landed in a finalizer is sent again.
SIGNAL_RETRY_SECONDS = 0.05


def _in_finalizer(frame: FrameType | None) -> bool:
    """Whether a ``__del__`` is running in ``frame`` or any frame that called it."""
    while frame is not None:
        if frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM behaves like Ctrl-C inside the block, so a claim in hand is given back and children are stopped.

    A signal that arrives while a finalizer (``__del__``, run by garbage collection
    anywhere) is on the stack is sent again shortly instead: Python ignores an
    exception raised there ("Exception ignored in ..."), and the warmup would go on.
    """

    def interrupt(signum: int, frame: FrameType | None) -> None:
        if _in_finalizer(frame):
            threading.Timer(SIGNAL_RETRY_SECONDS, os.kill, (os.getpid(), signum)).start()
            return
        raise KeyboardInterrupt(f"signal {signum}")

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _importing_this_warmcache(env: dict[str, str] | None) -> dict[str, str]:
    """``env`` (or ours), where a child imports the warmcache its parent runs.

    An installed warmcache is found by any interpreter of this environment; one
    run from a source folder (a checkout on ``sys.path``) is put on ``PYTHONPATH``.
    A site-packages folder is never added there: it would come before the standard library.
    """
    env = dict(os.environ if env is None else env)
    if _PACKAGE_PARENT not in {str(Path(folder).resolve()) for folder in site.getsitepackages()}:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_PARENT, env.get("PYTHONPATH")) if p)
    return env


def _stop(processes: Iterator[subprocess.Popen[bytes]]) -> None:
    """SIGTERM every live child and wait for each to give its claim back; kill what outlasts the grace, or all of
    them on a second Ctrl-C."""
    alive = [p for p in processes if p.poll() is None]
    for process in alive:
        process.terminate()
    deadline = time.monotonic() + TERMINATE_GRACE_SECONDS
    try:
        for process in alive:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    except KeyboardInterrupt:  # impatient: no child outlives us, nor writes into a deleted folder
        for process in alive:
            if process.poll() is None:
                process.kill()
            process.wait()
        raise
