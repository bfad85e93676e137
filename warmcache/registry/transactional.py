"""What the Registry's parts (its row queries, its miss log) share: a transaction, and lists cut to statement size.

The facade (:class:`warmcache.registry.registry.Registry`) opens the database and
defines :meth:`Transactional.session`; each part is a base class of it that runs
its statements through that one method, so every read and write keeps the
facade's error handling (one line, never a driver traceback).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

from sqlalchemy.orm import Session


class Transactional(ABC):
    """A part of the Registry: it asks the facade for its transactions."""

    @abstractmethod
    def session(self) -> AbstractContextManager[Session]:
        """One transaction: committed on success, rolled back on any error."""


def chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    """``items`` in lists of at most ``size``: a statement names a bounded number of values."""
    for start in range(0, len(items), size):
        yield items[start : start + size]
