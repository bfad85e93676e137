"""A SQLite registry opened read-only: by a command that only reads, and wherever this process cannot write.

A query opens the file with SQLite's ``mode=ro``: the usual engine's first act on a
connection is ``PRAGMA journal_mode=WAL``, which turns an empty file into a database and
rewrites another application's file header, so a read given the wrong file would change
it. Read-only, SQLite reads the file as it is and any write fails with its own
"readonly database" error.

A WAL database needs its ``-shm`` file beside it even to read, and SQLite creates
that file on first open: in a read-only folder (a baked image, a read-only mount,
another user's registry) every read then fails with "unable to open database file".
Opened as ``immutable`` as well, SQLite reads the file without locks or a ``-shm``
file: right for a folder nobody here can write into, wrong anywhere else (a writer
there would go unseen), so it is chosen only then.
"""

from __future__ import annotations

import os
import sqlite3
import urllib.parse
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event


def in_read_only_folder(database: str) -> bool:
    """An existing database file whose folder this process cannot create files in."""
    path = Path(database)
    return path.is_file() and not os.access(path.parent, os.W_OK)


def read_only_sqlite_engine(database: str, timeout_s: float) -> Engine:
    """An engine that reads ``database`` and can write nothing to it (``immutable`` too in a read-only folder)."""
    immutable = "&immutable=1" if in_read_only_folder(database) else ""
    uri = f"file:{urllib.parse.quote(str(Path(database).resolve()))}?mode=ro{immutable}"
    engine = create_engine(
        "sqlite://", creator=lambda: sqlite3.connect(uri, uri=True, timeout=timeout_s, check_same_thread=False)
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # SQLAlchemy's "begin" event starts transactions

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN DEFERRED")  # IMMEDIATE would take a write lock a read-only file cannot give

    return engine
