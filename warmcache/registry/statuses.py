"""The one definition of a compiled shape's status.

A ``StrEnum`` so a status compares equal to its stored text (``Status.COMPILED ==
"compiled"``): the database, JSON output and bundles keep plain strings, while code
names members and a typo is an ``AttributeError`` instead of a silent mismatch.
This module imports nothing; it lives with the registry, whose status column it names,
below every layer that reads or shows a status (reports, warmup, cache, service).
"""

from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    """A registry row's status, in lifecycle order, plus the two it can only *read* as."""

    PENDING = "pending"
    COMPILING = "compiling"
    COMPILED = "compiled"
    VERIFIED = "verified"
    FAILED = "failed"
    #: Never stored: a row of another toolchain or model config reads as stale.
    STALE = "stale"
    #: Never stored: a declared shape with no row.
    MISSING = "missing"


#: What the registry stores, in lifecycle order.
STORED_STATUSES: tuple[Status, ...] = (
    Status.PENDING,
    Status.COMPILING,
    Status.COMPILED,
    Status.VERIFIED,
    Status.FAILED,
)
#: A row in one of these has a usable compiled artifact in the cache.
DONE_STATUSES: tuple[Status, ...] = (Status.COMPILED, Status.VERIFIED)
#: Everything ``plan`` and ``shapes`` can show, in the order they show it.
PLAN_STATUSES: tuple[Status, ...] = (Status.MISSING, *STORED_STATUSES, Status.STALE)
