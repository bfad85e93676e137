"""What ``warmcache --debug`` (or ``WARMCACHE_DEBUG=1``) shows: every decision, and the traceback behind an error.

warmcache's modules log through ``logging.getLogger(__name__)``: DEBUG for each
decision (a claim taken, a lease renewed, a retry, a cache hit or miss, a skip),
WARNING for what an operator must see. A command prints the warnings on stderr; with
``--debug`` it prints the decisions too, and the traceback behind a one-line error,
its causes included: a ``raise ... from None`` keeps the cause out of the message and
out of a plain traceback, but Python still keeps it (``__context__``), and here it is
shown.

The command line configures this for its own process and sets ``WARMCACHE_DEBUG`` for
the processes it starts (``--jobs`` workers, torchrun ranks, verify's replays), whose
entry point configures it again from the environment: their decisions reach the same
stderr.
"""

from __future__ import annotations

import logging
import sys
import traceback
from collections.abc import Mapping
from types import TracebackType

from warmcache.settings_table import DEBUG, switch

#: The logger every warmcache module's logger descends from.
ROOT = logging.getLogger("warmcache")
#: Set to a true value (``1``, ``true``, ``yes``, ``on``) to log every decision, as ``--debug`` does; inherited by child
#: processes.
DEBUG_ENV = DEBUG.env

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
    """Writes to ``sys.stderr`` as it is when a record comes (a test's runner swaps it)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except Exception:  # noqa: BLE001 - logging must never break the command it reports on
            self.handleError(record)


_HANDLER = _Stderr()
_HANDLER.setFormatter(_Formatter())


def configure(debug: bool) -> None:
    """Send warmcache's log to stderr: warnings always, every decision and traceback with ``debug``."""
    _HANDLER.setLevel(logging.DEBUG if debug else logging.WARNING)
    # NOTSET without --debug: the level stays the application's (or pytest's) to choose, and DEBUG records are not even
    # made.
    ROOT.setLevel(logging.DEBUG if debug else logging.NOTSET)
    if _HANDLER not in ROOT.handlers:
        ROOT.addHandler(_HANDLER)


def debug_requested(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``$WARMCACHE_DEBUG`` asks for the decisions (:func:`~warmcache.settings_table.parse_switch`: a value
    that is neither true nor false is refused, naming the variable)."""
    return switch(DEBUG, environ)


def log_exception(log: logging.Logger) -> None:
    """At the exit-code boundary, before the one-line error: the whole traceback, shown with ``--debug`` only."""
    log.debug("Exception information:", exc_info=True)
