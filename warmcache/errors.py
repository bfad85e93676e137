"""One exception family for everything warmcache refuses to do.

Every error carries a single-line message that names the file, key or value at
fault, and the process exit code the CLI should use. The CLI prints
``warmcache: error: <message>`` and exits with ``exit_code``; it never shows a
traceback for these.
"""

from __future__ import annotations

import reprlib
from enum import IntEnum

#: How much of a value an error line echoes; a hostile input can be megabytes long.
MAX_SHOWN_CHARS = 200


class ExitCode(IntEnum):
    """What a ``warmcache`` command's exit status means (``docs/reference/exit-codes.md``); each error class below
    carries one, and a command returns one."""

    OK = 0
    #: The work is not done: a shape failed, would compile, or is missing from the store.
    NOT_DONE = 1
    #: The invocation or its input is malformed (:class:`UsageError`, :class:`ManifestError`).
    USAGE = 2
    #: The registry cannot be used (:class:`RegistryError`).
    REGISTRY = 3
    #: The compile target cannot run here (:class:`TargetUnavailableError`).
    TARGET_UNAVAILABLE = 4
    #: A cache, bundle, snapshot or store content is refused (:class:`CacheError`, :class:`TrustError`).
    CACHE = 5
    #: The artifact store failed (:class:`StoreError`).
    STORE = 6
    #: An error warmcache did not expect (a bug, or one it should explain): one line naming ``--debug``; the value is
    #: sysexits' ``EX_SOFTWARE``.
    UNEXPECTED = 70
    #: Interrupted (Ctrl-C, SIGINT): the shell's 128 + 2.
    INTERRUPTED = 130


def first_line(error: BaseException | str | None) -> str:
    """The first non-empty line of an error (or its text): what a one-line report has room for.

    An exception without text reads as its type name; empty text reads as ``""``.
    """
    text = error if isinstance(error, str) or error is None else str(error)
    for line in (text or "").splitlines():
        if line.strip():
            return line.strip()
    return type(error).__name__ if isinstance(error, BaseException) else ""


def _bounded_repr() -> reprlib.Repr:
    bounded = reprlib.Repr()
    bounded.maxlevel, bounded.maxstring, bounded.maxother = 3, MAX_SHOWN_CHARS, MAX_SHOWN_CHARS
    bounded.maxlist = bounded.maxtuple = bounded.maxdict = bounded.maxset = 8
    return bounded


_REPR = _bounded_repr()


def shown(value: object) -> str:
    """``repr(value)`` fit for a one-line error: cut to about 200 characters, saying how long it was.

    Echoing a 50 MB value makes a 50 MB "one line"; repr of a structure nested
    thousands deep never returns. reprlib bounds both (depth, items, characters).
    """
    text = _REPR.repr(value)
    if isinstance(value, (str, bytes)) and len(value) > MAX_SHOWN_CHARS:
        return f"{text} ({len(value)} characters)"
    return text


def error_line(exc: BaseException) -> str:
    """A spec's error as the registry stores it: warmcache's own message, else ``Type: first line``."""
    first = first_line(str(exc))
    if isinstance(exc, WarmcacheError) and first:
        return first[:500]
    return f"{type(exc).__name__}: {first[:500]}" if first else type(exc).__name__


class WarmcacheError(Exception):
    """Base class: a clear, single-line, user-facing failure."""

    exit_code: int = ExitCode.NOT_DONE

    def __init__(self, message: str) -> None:
        # Keep messages on one line so they survive log scrapers and CI annotations.
        super().__init__(" ".join(str(message).split()))

    @property
    def message(self) -> str:
        return str(self)


class UsageError(WarmcacheError):
    """The caller asked for something malformed (bad flag value, unknown model)."""

    exit_code = ExitCode.USAGE


class SpecFailure(WarmcacheError):
    """A spec's workload broke in torch or transformers: the phase it was in and the underlying error, one line."""


class ManifestError(UsageError):
    """The manifest file is unreadable or fails validation.

    Validation reports every problem at once, one line each, so a user fixes a
    manifest in one pass instead of one error per run.
    """

    def __init__(self, problems: list[str] | str) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        Exception.__init__(self, "\n".join(" ".join(p.split()) for p in self.problems))


class SchemaOutOfDateError(WarmcacheError):
    """The registry database was written by another schema revision."""

    exit_code = ExitCode.REGISTRY


class RegistryError(WarmcacheError):
    """The registry database cannot be opened or written."""

    exit_code = ExitCode.REGISTRY


class RegistryUnavailableError(RegistryError):
    """The database was unreachable or dropped the connection (restart, failover, too many clients).

    Worth retrying, unlike a refused login or a wrong schema: a fleet's workers wait
    for the database to come back instead of dying with a compile in hand.
    """


class TargetUnavailableError(WarmcacheError):
    """A compile target (neuron, cuda) was requested where it cannot run."""

    exit_code = ExitCode.TARGET_UNAVAILABLE


class UnseenShapeError(WarmcacheError):
    """A request's shape was never compiled and the policy forbids compiling it."""

    exit_code = ExitCode.NOT_DONE


class DecodeRecompileError(WarmcacheError):
    """A decode step after the first compiled a graph: production would compile at every position.

    The message names the Dynamo guard that failed (what changed between steps).
    """

    exit_code = ExitCode.NOT_DONE


class CacheError(WarmcacheError):
    """A compile-cache directory or bundle is unusable (bad hash, unsafe member)."""

    exit_code = ExitCode.CACHE


class TrustError(CacheError):
    """A signature is missing, malformed, by a key not trusted, or does not match what it signs."""


class StoreError(WarmcacheError):
    """The artifact store is unreachable, refuses us, or holds something unusable."""

    exit_code = ExitCode.STORE
