"""What ``warmcache --debug`` (or ``WARMCACHE_DEBUG=1``) shows: every decision, and the traceback behind an error.

warmcache's modules log through ``logging.getLogger(__name__)``: DEBUG for each
decision (a claim taken, a lease renewed, a retry, a cache hit or miss, a skip),
WARNING for what an operator must see. A command prints the warnings on stderr; with
``--debug`` it prints the decisions too, and the traceback behind a one-line error,
its causes included: a ``raise ... from None`` keeps the cause out of the message and
out of a plain traceback, but Python still keeps it (``__context__``), and here it is
shown.
"""

from __future__ import annotations

import logging
import traceback
from types import TracebackType

import click

#: The logger every warmcache module's logger descends from.
ROOT = logging.getLogger("warmcache")

_ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None] | tuple[None, None, None]


class _Formatter(logging.Formatter):
    """``warmcache: debug: <logger>: message`` (``warning:``, ...), and whole tracebacks."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        name = record.name.removeprefix("warmcache.")
        return f"warmcache: {record.levelname.lower()}: {name}: {record.getMessage()}"

    def formatException(self, ei: _ExcInfo) -> str:
        _, exc, _ = ei
        if exc is None:
            return ""
        chain = traceback.TracebackException.from_exception(exc)
        shown: traceback.TracebackException | None = chain
        while shown is not None:  # what ``from None`` hid from the message is what --debug is for
            shown.__suppress_context__ = False
            shown = shown.__cause__ or shown.__context__
        return "".join(chain.format()).rstrip("\n")


class _Stderr(logging.Handler):
    """Writes to the command's stderr as click knows it at the time (a test's runner swaps it)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            click.echo(self.format(record), err=True)
        except Exception:  # noqa: BLE001 - logging must never break the command it reports on
            self.handleError(record)


_HANDLER = _Stderr()
_HANDLER.setFormatter(_Formatter())


def configure(debug: bool) -> None:
    """Send warmcache's log to stderr: warnings always, every decision and traceback with ``debug``."""
    _HANDLER.setLevel(logging.DEBUG if debug else logging.WARNING)
    # NOTSET without --debug: the level stays the application's (or pytest's) to choose, and DEBUG records are not even made.
    ROOT.setLevel(logging.DEBUG if debug else logging.NOTSET)
    if _HANDLER not in ROOT.handlers:
        ROOT.addHandler(_HANDLER)


def log_exception(log: logging.Logger) -> None:
    """At the exit-code boundary, before the one-line error: the whole traceback, shown with ``--debug`` only."""
    log.debug("Exception information:", exc_info=True)
