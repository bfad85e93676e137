"""What a Ctrl-C leaves: the one line a command ends with when interrupted (exit 130, the shell's 128 + SIGINT).

A command whose work is counted (warmup's specs) says, while it runs, how to describe
what an interruption would leave (:func:`note_left`); the exit-code boundary asks it
when the interrupt comes. A command that says nothing leaves what it finished, which
the line says too: every command records its work as it goes.
"""

from __future__ import annotations

from collections.abc import Callable

import click

_LEFT = "warmcache.left"


def note_left(describe: Callable[[], str]) -> None:
    """From now on, an interruption of the running command is described by ``describe()`` (called then)."""
    context = click.get_current_context(silent=True)
    if context is not None:
        context.find_root().meta[_LEFT] = describe


def interrupted_line(context: click.Context) -> str:
    """``warmcache: interrupted: <command> stopped: <what it left>``."""
    describe: Callable[[], str] | None = context.find_root().meta.get(_LEFT)
    left = describe() if describe else "what it finished is kept"
    command = context.invoked_subcommand or context.info_name or "warmcache"
    return f"warmcache: interrupted: {command} stopped: {left}"
