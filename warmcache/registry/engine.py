"""Engines for the two supported databases, with the settings each one needs.

SQLite (the embedded default) runs in WAL mode with a busy timeout so several
warmup processes on one host can share it; write transactions begin
``IMMEDIATE`` so two writers never deadlock upgrading a read snapshot.
PostgreSQL (the fleet registry) is reached through psycopg 3.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, create_engine, event

from warmcache.errors import RegistryError
from warmcache.registry.readonly import in_read_only_folder, read_only_sqlite_engine
from warmcache.settings import RegistryLocation

BUSY_TIMEOUT_MS = 30_000


def create_registry_engine(
    location: RegistryLocation, *, hold_connections: bool = True, read_only: bool = False
) -> Engine:
    """An engine for ``location``; ``hold_connections=False`` pools at most one PostgreSQL connection, ``read_only``
    opens a SQLite file so that nothing is written to it (:mod:`warmcache.registry.readonly`).

    The location was checked where it was given (:meth:`RegistryLocation.parse`, at the
    command's or the library's edge) and is not checked again here.

    A warmup worker touches the database for milliseconds between compiles that take
    minutes: it keeps one connection while it talks to the registry and closes it
    before each compile (:meth:`Registry.drop_connections`), so N workers do not hold
    N connections meanwhile (256 workers would exceed PostgreSQL's default
    ``max_connections`` of 100). A connection lost in between is reported as
    unavailable and retried, so no ping precedes each use.
    """
    if location.is_postgresql:
        if not hold_connections:
            return create_engine(location.url, pool_size=1, max_overflow=1)
        return create_engine(location.url, pool_pre_ping=True, pool_size=2, max_overflow=4)
    return _sqlite_engine(location, read_only)


def _sqlite_engine(location: RegistryLocation, read_only: bool) -> Engine:
    database = location.sqlite_file
    if database is not None and (read_only or in_read_only_folder(str(database))):
        return read_only_sqlite_engine(str(database), BUSY_TIMEOUT_MS / 1000)
    if database is not None:
        try:
            database.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RegistryError(
                f"registry {location.display}: cannot create folder {database.parent}: {exc.strerror}"
            ) from None
    engine = create_engine(location.url, connect_args={"timeout": BUSY_TIMEOUT_MS / 1000})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event own transaction start (pysqlite's own is lazy and wrong).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        mode = conn.get_execution_options().get("sqlite_begin", "IMMEDIATE")
        conn.exec_driver_sql(f"BEGIN {mode}")

    return engine
