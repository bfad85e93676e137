"""Registry locations: what ``--db``, ``$WARMCACHE_DB`` and a manifest's ``[registry] url`` may be.

Checked before any database is touched, so a typo is an error naming the accepted
forms instead of a new SQLite file in the current folder. Kept apart from the
engine so the manifest checker can use it without importing the registry.
"""

from __future__ import annotations

from pathlib import Path

from warmcache.anchor import Anchor
from warmcache.bounds import path_problem
from warmcache.errors import UsageError, shown

#: What a registry location may be; every refused one is answered with this list.
ACCEPTED_FORMS = "sqlite:///PATH, a file path (with a '/' or ending in .sqlite, .sqlite3 or .db) or postgresql://[USER@]HOST[:PORT]/DATABASE"
_SQLITE_SUFFIXES = (".sqlite", ".sqlite3", ".db")
_SCHEMES = ("sqlite", "postgresql", "postgres")


def normalise_url(url: str, source: str = "registry URL", base: Path | None = None) -> str:
    """Check a registry location and make it a SQLAlchemy URL (psycopg 3 for PostgreSQL, absolute SQLite paths).

    ``source`` names where the value came from (``--db``, ``$WARMCACHE_DB``) in the
    error; a relative SQLite path anchors at ``base`` (a manifest's folder), else at
    the current folder. A bare word is refused rather than taken as a file name:
    ``--db not-a-url`` would otherwise create a database named ``not-a-url`` in the
    current folder, and an empty value would silently mean the default registry.
    Only :meth:`warmcache.settings.RegistryLocation.parse` calls this.
    """
    if not url.strip():
        raise UsageError(f"{source} is empty; give {ACCEPTED_FORMS}")
    if "://" not in url:
        if "/" not in url and not url.endswith(_SQLITE_SUFFIXES):
            raise UsageError(f"{source} {shown(url)} is neither a database URL nor a file path; give {ACCEPTED_FORMS}")
        return f"sqlite:///{_checked_file(url, source, base)}"
    scheme, rest = url.split("://", 1)
    if scheme.split("+", 1)[0] not in _SCHEMES:
        raise UsageError(f"{source} {shown(url)}: unknown scheme {shown(scheme)}; give {ACCEPTED_FORMS}")
    if scheme.split("+", 1)[0] in ("postgresql", "postgres"):
        _require_database(url, rest, source)
        return "postgresql+psycopg://" + rest
    path, mark, query = rest[1:].partition("?")
    if not rest.startswith("/") or path in ("", ":memory:"):
        # sqlite:// and sqlite:///:memory: are in-memory: every command would see an empty registry and keep nothing.
        raise UsageError(f"{source} {shown(url)} names no database file (an in-memory SQLite registry keeps nothing between commands); give {ACCEPTED_FORMS}")
    return f"sqlite:///{_checked_file(path, source, base)}{mark}{query}"


def _require_database(url: str, rest: str, source: str) -> None:
    """A PostgreSQL URL must name its database: without one libpq silently picks the database named after the user."""
    location, _, query = rest.partition("?")
    database = location.partition("/")[2]
    if not database and "dbname=" not in query:
        raise UsageError(
            f"{source} {shown(url)} names no database (libpq would fall back to a database named after the user, on the local socket "
            f"unless a host is given); give {ACCEPTED_FORMS}"
        )


def _checked_file(path: str, source: str, base: Path | None) -> Path:
    problem = path_problem(path)
    if problem:
        raise UsageError(f"{source} {shown(path)} {problem}")
    return (Anchor(base) if base else Anchor.here()).path(path)
