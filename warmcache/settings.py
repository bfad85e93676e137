"""Settings resolved once, at the edge: each a typed value that remembers where it came from.

The commands (``cli/``) and the service take a setting from its flag, then its
environment variable, then the manifest, then the default, in this one module;
the code below them is handed the result and never reads the environment or
edits a URL as text. The precedence of every setting is the one table
:data:`~warmcache.settings_table.SETTINGS` (every ``WARMCACHE_*`` variable, with its flag
and manifest key where it has them), and an error about a value names its source (``--db``,
``$WARMCACHE_DB``, ``m.toml [registry] url``), so the user knows which to fix.
"""

from __future__ import annotations

import grp
import logging
import os
import pwd
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from warmcache.anchor import Anchor
from warmcache.bounds import path_problem
from warmcache.database_url import control_character_problem, printable_url
from warmcache.errors import RegistryError, UsageError, shown
from warmcache.settings_table import CACHE_DIR as CACHE_DIR
from warmcache.settings_table import DEFAULT as DEFAULT
from warmcache.settings_table import REGISTRY as REGISTRY
from warmcache.settings_table import SAFE_DIRECTORIES, environment_value
from warmcache.settings_table import SETTINGS as SETTINGS
from warmcache.settings_table import STORE as STORE
from warmcache.settings_table import TRUSTED_KEYS as TRUSTED_KEYS
from warmcache.settings_table import Chosen as Chosen
from warmcache.settings_table import Setting as Setting
from warmcache.settings_table import choose as choose  # the table lives below every reader of the environment

log = logging.getLogger(__name__)


# Registry locations: what ``--db``, ``$WARMCACHE_DB`` and a manifest's ``[registry] url`` may be. Checked
# before any database is touched, so a typo is an error naming the accepted forms instead of a new SQLite
# file in the current folder.

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
    Only :meth:`RegistryLocation.parse` calls this.
    """
    if not url.strip():
        raise UsageError(f"{source} is empty; give {ACCEPTED_FORMS}")
    problem = control_character_problem(url)
    if problem:  # before any parser: a newline would split this line, and libpq reads %00 as the value's end
        raise UsageError(f"{source} {shown(printable_url(url))}: {problem}")
    if "://" not in url:
        if "/" not in url and not url.endswith(_SQLITE_SUFFIXES):
            raise UsageError(
                f"{source} {shown(printable_url(url))} is neither a database URL nor a file path; give {ACCEPTED_FORMS}"
            )
        return f"sqlite:///{_checked_file(url, source, base)}"
    scheme, rest = url.split("://", 1)
    if scheme.split("+", 1)[0] not in _SCHEMES:
        raise UsageError(f"{source} {shown(printable_url(url))}: unknown scheme {shown(scheme)}; give {ACCEPTED_FORMS}")
    if scheme.split("+", 1)[0] in ("postgresql", "postgres"):
        _require_database(url, rest, source)
        return "postgresql+psycopg://" + rest
    path, mark, query = rest[1:].partition("?")
    if not rest.startswith("/") or path in ("", ":memory:"):
        # sqlite:// and sqlite:///:memory: are in-memory: every command would see an empty registry and keep nothing.
        raise UsageError(
            f"{source} {shown(printable_url(url))} names no database file (an in-memory SQLite registry keeps "
            f"nothing between commands); give {ACCEPTED_FORMS}"
        )
    return f"sqlite:///{_checked_file(path, source, base)}{mark}{query}"


def _require_database(url: str, rest: str, source: str) -> None:
    """A PostgreSQL URL must name its database: without one libpq silently picks the database named after the user."""
    location, _, query = rest.partition("?")
    database = location.partition("/")[2]
    if not database and "dbname=" not in query:
        raise UsageError(
            f"{source} {shown(printable_url(url))} names no database (libpq would fall back to a database named "
            "after the user, on the local socket "
            f"unless a host is given); give {ACCEPTED_FORMS}"
        )


def _checked_file(path: str, source: str, base: Path | None) -> Path:
    problem = path_problem(path)
    if problem:
        raise UsageError(f"{source} {shown(path)} {problem}")
    return (Anchor(base) if base else Anchor.here()).path(path)


@dataclass(frozen=True, slots=True)
class RegistryLocation:
    """A registry database, normalised once into a SQLAlchemy URL (psycopg 3 for PostgreSQL, an absolute SQLite path).

    Everything below the edge takes this value; :meth:`parse` is the one place a
    registry URL is checked and rewritten, and the helpers here are the only
    edits made to it afterwards (on the parsed URL, never on its text).
    """

    #: The URL with its password: only the database driver reads it (``repr`` and ``str`` show :attr:`display`).
    url: str
    source: str = "registry URL"

    @classmethod
    def parse(cls, text: str, source: str = "registry URL", base: Path | None = None) -> RegistryLocation:
        """Check ``text`` (a URL or a file path; a relative SQLite path anchors at ``base``) and normalise it."""
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        url = normalise_url(text, source, base)
        try:
            make_url(url)  # so that every later reading of it (display, file, bounds) succeeds
        except (ArgumentError, ValueError) as exc:  # neither quotes the URL (the port's text at most)
            raise UsageError(
                f"{source} {shown(printable_url(text))} is not a database URL ({exc}); give {ACCEPTED_FORMS}"
            ) from None
        return cls(url, source)

    @classmethod
    def of(cls, location: RegistryLocation | str) -> RegistryLocation:
        """A location as it is, or a library caller's URL text parsed."""
        return location if isinstance(location, RegistryLocation) else cls.parse(location)

    @property
    def is_postgresql(self) -> bool:
        return self.url.startswith("postgresql")

    @property
    def sqlite_file(self) -> Path | None:
        """The SQLite database file; ``None`` for PostgreSQL and in-memory databases."""
        from sqlalchemy.engine import make_url

        parsed = make_url(self.url)
        database = parsed.database
        return Path(database) if parsed.get_backend_name() == "sqlite" and database and database != ":memory:" else None

    @property
    def display(self) -> str:
        """The URL with every secret hidden (:func:`~warmcache.database_url.printable_url`), for messages."""
        return printable_url(self.url)

    def bounded(self, connect_timeout_s: int, statement_timeout_ms: int | None = None) -> RegistryLocation:
        """This PostgreSQL location with a connect timeout and, if given, a statement timeout (libpq waits forever by
        default).

        A value the URL already sets wins; the statement timeout joins libpq's
        ``options`` (which may already set a ``search_path``). SQLite is returned as is.
        """
        if not self.is_postgresql:
            return self
        from sqlalchemy.engine import make_url

        parsed = make_url(self.url)
        query = {key: value for key, value in parsed.query.items()}
        query.setdefault("connect_timeout", str(connect_timeout_s))
        if statement_timeout_ms is not None:
            options = query.get("options", "")
            options = " ".join(options) if isinstance(options, tuple) else options
            if "statement_timeout" not in options:
                query["options"] = f"{options} -c statement_timeout={statement_timeout_ms}".strip()
        return RegistryLocation(parsed.set(query=query).render_as_string(hide_password=False), self.source)

    def __str__(self) -> str:
        """:attr:`display`: a location formatted into a log line or an error must not carry its password."""
        return self.display

    def __repr__(self) -> str:
        return f"RegistryLocation({self.display!r}, source={self.source!r})"


def default_registry(environ: Mapping[str, str] | None = None) -> RegistryLocation:
    """``$XDG_CACHE_HOME/warmcache/registry.sqlite`` (``~/.cache/...`` when unset)."""
    environ = os.environ if environ is None else environ
    base = Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return RegistryLocation(f"sqlite:///{base / 'warmcache' / 'registry.sqlite'}", DEFAULT)


#: The registry a project keeps beside its manifests (the quickstart's): found from the working folder upward.
PROJECT_REGISTRY = Path(".warmcache") / "registry.sqlite"
#: The source of a registry found that way, as messages and ``--debug`` name it.
FOUND = "found from the working folder upward"
#: Project folders whose found registry is used whoever owns it (``os.pathsep``-separated; ``*``: any), as git's
#: ``safe.directory`` lists repositories of other owners.
SAFE_DIRECTORIES_ENV = SAFE_DIRECTORIES.env


def find_project_registry(start: Path | None = None) -> Path | None:
    """The nearest ``.warmcache/registry.sqlite`` file in ``start`` (the working folder) or a folder above it, as git
    finds ``.git``; ``None`` when there is none.

    It only looks: a folder without one is passed over, never given one, so a read that
    finds nothing falls through to the default (and is refused there if that is missing).
    Whether the one found may be used is :func:`require_trusted_registry`'s question.
    """
    here = _working_folder(start)
    if here is None:
        return None
    for folder in (here, *here.parents):
        candidate = folder / PROJECT_REGISTRY
        if os.path.isfile(candidate):  # False, not an error, for a folder it may not read
            return candidate
    return None


def _working_folder(start: Path | None) -> Path | None:
    try:
        return (start or Path.cwd()).resolve()
    except OSError:  # the working folder was removed under us: there is nothing to find from it
        return None


def require_trusted_registry(found: Path, start: Path | None = None, environ: Mapping[str, str] | None = None) -> None:
    """Refuse a found registry that someone else put there or can change: git's ``safe.directory`` rule
    (CVE-2022-24765), since nobody named it.

    The file, its folder and every folder from the project's down to the working folder
    must belong to this user or root and be writable by no one else (a group of this
    user alone, as a user-private-group umask of 002 makes, counts as no one else).
    Otherwise a user who can write in a parent folder (a shared ``/tmp``, a checkout's
    parent) decides the rows every command below it reads, which ``cache prune`` deletes
    by and ``warmup`` writes this host's paths into. A project listed in
    ``$WARMCACHE_SAFE_DIRECTORIES`` is used whoever owns it. Raises :class:`RegistryError`
    naming the path, its owner and the three ways to name the registry deliberately.
    """
    environ = os.environ if environ is None else environ
    project = found.parent.parent
    listed = environment_value(SAFE_DIRECTORIES, environ)
    if listed is not None and _is_allowed(project, listed.text):
        return
    here = _working_folder(start) or project
    below = [here, *here.parents]
    between = below[: below.index(project) + 1] if project in below else []  # the working folder up to the project
    chain = [found, found.parent, *between]
    real = Path(os.path.realpath(found))
    for path in dict.fromkeys([*chain, real, real.parent]):  # in order, each once
        problem = _ownership_problem(path)
        if problem:
            raise RegistryError(
                f"registry {found} ({FOUND}) refused: {path} {problem}, so another user decides what it says "
                f"(as git refuses a repository of dubious ownership); name it deliberately with --db {found} or "
                f"${REGISTRY.env}, or list {project} in ${SAFE_DIRECTORIES_ENV}"
            )


def _is_allowed(project: Path, listed: str) -> bool:
    """``project`` is among the ``os.pathsep``-separated folders of ``$WARMCACHE_SAFE_DIRECTORIES``, or that says
    ``*``."""
    entries = [entry for entry in listed.split(os.pathsep) if entry.strip()]
    return "*" in entries or any(_same_folder(Path(entry).expanduser(), project) for entry in entries)


def _same_folder(entry: Path, project: Path) -> bool:
    try:
        return entry.resolve() == project.resolve()
    except OSError:
        return False


def _ownership_problem(path: Path) -> str | None:
    """What makes ``path`` another user's to change, in words; ``None`` when it is this user's (or root's) alone."""
    try:
        info = os.stat(path)
    except OSError as exc:
        return f"cannot be checked ({exc.strerror})"
    me, mode = os.geteuid(), stat.S_IMODE(info.st_mode)
    if info.st_uid not in (me, 0):
        allowed = f"you (uid {me}, {_name_of(pwd.getpwuid, me)})" + ("" if me == 0 else " or root")
        return f"is owned by uid {info.st_uid} ({_name_of(pwd.getpwuid, info.st_uid)}), not by {allowed}"
    if mode & stat.S_IWOTH:
        return f"is writable by every user (mode {mode:04o})"
    if mode & stat.S_IWGRP and not _is_private_group(info.st_gid, me):
        return f"is writable by group {info.st_gid} ({_name_of(grp.getgrgid, info.st_gid)}) (mode {mode:04o})"
    return None


def _is_private_group(gid: int, uid: int) -> bool:
    """``gid`` is ``uid``'s user-private group (its own primary group, of its name, with no other member)."""
    try:
        user, group = pwd.getpwuid(uid), grp.getgrgid(gid)
    except KeyError:
        return False
    return user.pw_gid == gid and group.gr_name == user.pw_name and set(group.gr_mem) <= {user.pw_name}


def _name_of(lookup: Callable[[int], tuple[object, ...]], number: int) -> str:
    """The name ``lookup`` (``pwd.getpwuid``, ``grp.getgrgid``) gives a user or group id; one with no entry says so."""
    try:
        return str(lookup(number)[0])
    except KeyError:
        return "no name"


def resolve_registry(
    flag: str | None,
    manifest_location: RegistryLocation | None = None,
    environ: Mapping[str, str] | None = None,
    start: Path | None = None,
) -> RegistryLocation:
    """``--db``, then ``$WARMCACHE_DB``, then the manifest's ``[registry] url`` (parsed when the manifest was), then
    the nearest project registry from ``start`` (the working folder) upward, if this user owns it, then the default;
    logged with its source."""
    chosen = choose(REGISTRY, flag, environ=environ)
    if chosen is not None:
        location = RegistryLocation.parse(chosen.text, chosen.source)
    elif manifest_location is not None:
        location = manifest_location
    else:
        found = find_project_registry(start)
        if found is not None:
            require_trusted_registry(found, start, environ)
        location = RegistryLocation.parse(str(found), FOUND) if found else default_registry(environ)
    log.debug("registry %s (%s)", location.display, location.source)
    return location


@dataclass(frozen=True, slots=True)
class CacheFolder:
    """A cache folder named by ``--cache-dir`` or ``$WARMCACHE_CACHE_DIR`` (the manifest's and the target's own are
    resolved per model)."""

    path: Path
    source: str

    def __str__(self) -> str:
        return str(self.path)


def resolve_cache_folder(flag: str | None, environ: Mapping[str, str] | None = None) -> CacheFolder | None:
    """``--cache-dir``, then ``$WARMCACHE_CACHE_DIR``; ``None`` leaves the choice to the manifest, then the target's
    default."""
    chosen = choose(CACHE_DIR, flag, environ=environ)
    if chosen is None:
        return None
    if not chosen.text.strip():
        raise UsageError(f"{chosen.source} is empty; unset it or name a folder")
    return CacheFolder(Path(chosen.text).expanduser().resolve(), chosen.source)
