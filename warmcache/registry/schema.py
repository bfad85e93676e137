"""Schema revisions: the registry refuses to run on a database of another revision.

An empty database is brought to the head revision through the migrations (so
``migrations/`` stays the schema's only source); a database at an older revision
is an error that says how to upgrade, never a silent rewrite.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from sqlalchemy import Connection, Engine, inspect, text

from warmcache.errors import RegistryError, SchemaOutOfDateError, UsageError, shown

#: Serialises first-time initialisation and ``db upgrade`` of a PostgreSQL registry ("warm" in ASCII).
_INIT_LOCK_KEY = 0x7761726D


def migrations_dir() -> Path:
    """The migrations: shipped in the wheel as ``warmcache._migrations``; run from a checkout's source folder (``python
    -m warmcache`` in its root, no install), the checkout's top-level ``migrations/``, which the wheel maps there."""
    try:
        return Path(str(resources.files("warmcache._migrations")))
    except ModuleNotFoundError:
        checkout = Path(__file__).resolve().parents[2] / "migrations"
        if (checkout / "env.py").is_file():
            return checkout
        raise


def alembic_config(engine: Engine) -> Config:
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    config.set_main_option("sqlalchemy.url", engine.url.render_as_string(hide_password=False).replace("%", "%%"))
    return config


def head_revision(engine: Engine) -> str:
    head = ScriptDirectory.from_config(alembic_config(engine)).get_current_head()
    assert head is not None, "migrations/ holds no revision"
    return head


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(engine: Engine, revision: str = "head", *, display_url: str) -> tuple[str | None, str | None]:
    """Migrate to ``revision``; returns the revisions before and after, both read under the lock (so of several
    concurrent upgrades only the one that did the work reports a change). A database with tables but no warmcache
    revision is refused.

    Such a database belongs to another application: adding warmcache's tables to it
    would mix two schemas that every later command then refuses. There is no
    override: a PostgreSQL database is shared through a schema of warmcache's own.
    """
    with engine.begin() as conn:
        _lock_schema(conn)  # as first-use initialisation does: concurrent upgrades run one after another
        before = MigrationContext.configure(conn).get_current_revision()
        if before is None:
            tables = inspect(conn).get_table_names()
            if tables:
                raise _foreign(display_url, tables)
        try:
            _upgrade_on(conn, engine, revision)
        except CommandError as exc:
            raise UsageError(f"--revision {shown(revision)}: {exc}") from None
        return before, MigrationContext.configure(conn).get_current_revision()


def _upgrade_on(conn: Connection, engine: Engine, revision: str) -> None:
    config = alembic_config(engine)
    config.attributes["connection"] = conn
    command.upgrade(config, revision)


def _lock_schema(conn: Connection) -> None:
    """Hold the schema lock until ``conn``'s transaction ends (PostgreSQL: an advisory lock; SQLite's transactions
    lock already)."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _INIT_LOCK_KEY})


def require_search_path(engine: Engine, display_url: str) -> None:
    """Refuse a PostgreSQL ``search_path`` none of whose schemas exists: tables would be created nowhere (or a read
    would find "no schema"), where the fix is one ``CREATE SCHEMA``."""
    with engine.connect() as conn:
        current, search_path = conn.execute(text("SELECT current_schema(), current_setting('search_path')")).one()
    if current is None:
        first = next(
            (name.strip().strip('"') for name in search_path.split(",") if name.strip() and name.strip() != '"$user"'),
            search_path,
        )
        raise RegistryError(
            f"registry {display_url}: its search_path {shown(search_path)} names no schema that "
            "exists in this database; "
            f'create it first (CREATE SCHEMA "{first}";) or fix options=-csearch_path=... in the URL'
        )


def is_empty(engine: Engine) -> bool:
    return not inspect(engine).get_table_names()


def _foreign(display_url: str, tables: list[str]) -> SchemaOutOfDateError:
    names = ", ".join(sorted(tables)[:5]) + (f" and {len(tables) - 5} more" if len(tables) > 5 else "")
    return SchemaOutOfDateError(
        f"registry {display_url} has tables but no warmcache schema revision ({shown(names)}): it "
        "belongs to another application; "
        "refused: point --db at an empty or warmcache database (on PostgreSQL a schema of its "
        "own: ?options=-csearch_path=warmcache)"
    )


def ensure_current(engine: Engine, display_url: str) -> None:
    """Initialise an empty database; refuse one at another revision with the fix in the message.

    A fleet often starts all at once on a fresh database, so the check and the
    initialisation happen in one transaction that holds a lock (PostgreSQL: an
    advisory lock; SQLite: the write lock its transactions begin with): one
    process creates the schema, the others wait and then find it current.
    """
    head = head_revision(engine)
    if current_revision(engine) == head:
        return  # the common case takes no lock
    with engine.begin() as conn:
        _lock_schema(conn)
        current = MigrationContext.configure(conn).get_current_revision()
        if current == head:
            return
        if current is None and not inspect(conn).get_table_names():
            _upgrade_on(conn, engine, "head")
            return
    known = {rev.revision for rev in ScriptDirectory.from_config(alembic_config(engine)).walk_revisions()}
    if current is None:
        raise _foreign(display_url, inspect(engine).get_table_names())
    if current not in known:
        raise SchemaOutOfDateError(
            f"registry {display_url} is at schema revision {current}, written by a newer warmcache "
            f"(this one knows up to {head}); upgrade warmcache"
        )
    raise SchemaOutOfDateError(
        f"registry {display_url} is at schema revision {current} but this warmcache needs {head}; "
        f"run: warmcache db upgrade --db {display_url}"
    )
