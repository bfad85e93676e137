"""A SQLite registry in a folder this process cannot write: opened read-only, so reads still work.

A WAL database needs its ``-shm`` file beside it even to read, and SQLite creates
that file on first open: in a read-only folder (a baked image, a read-only mount,
another user's registry) every read then fails with "unable to open database file".
Opened as ``immutable`` instead, SQLite reads the file as it is, without locks or a
``-shm`` file: right for a folder nobody here can write into, wrong anywhere else,
so it is chosen only then. Writes through such an engine fail with SQLite's own
"readonly database" error.
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
    uri = f"file:{urllib.parse.quote(str(Path(database).resolve()))}?mode=ro&immutable=1"
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
