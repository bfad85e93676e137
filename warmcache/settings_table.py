"""Every ``WARMCACHE_*`` environment variable warmcache reads, in one table, and the one way each is read.

A row names the variable, the flag that overrides it and the manifest key it overrides,
where the setting has them (``--debug`` has no manifest key; ``$WARMCACHE_SAFE_DIRECTORIES``
has neither). Code that honours a variable reads it through its row (:func:`choose`,
:func:`environment_value`, :func:`switch`), so the precedence, the one reading of a
true/false value and the ``--debug`` line saying which source a setting came from are
the same for all; ``docs/reference/settings.md`` lists the same rows, and a test keeps
the two equal and finds every ``WARMCACHE_`` name in the package source in the table.

This module sits below everything that reads the environment: it imports only the errors.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from warmcache.errors import UsageError, shown

DEFAULT = "default"

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Setting:
    """One row of the table: where a value may come from, first to last (flag, variable, manifest key, default)."""

    name: str
    env: str
    default: str  # what applies when none is given, in words
    flag: str | None = None  # None: no flag sets it
    manifest_key: str | None = None  # the manifest's table and key, e.g. "[registry] url"; None: no manifest key
    meaning: str = ""  # what it changes, in words (the docs' table)

    def sources(self, manifest_path: Path | str | None = None) -> tuple[str, str, str, str]:
        """The four sources in precedence order, named as errors name them; ``""`` for one the setting lacks."""
        manifest = f"{manifest_path or 'manifest'} {self.manifest_key}" if self.manifest_key else ""
        return (self.flag or "", f"${self.env}", manifest, DEFAULT)


REGISTRY = Setting(
    "registry",
    "WARMCACHE_DB",
    "the nearest .warmcache/registry.sqlite in the working folder or above it (if only you or root can change it), "
    "else $XDG_CACHE_HOME/warmcache/registry.sqlite (~/.cache when unset)",
    flag="--db",
    manifest_key="[registry] url",
    meaning="the registry database (a URL or a SQLite file path)",
)
CACHE_DIR = Setting(
    "cache folder",
    "WARMCACHE_CACHE_DIR",
    "the compiler's own folder",
    flag="--cache-dir",
    manifest_key="[cache] dir",
    meaning="the compile cache folder commands fill and read",
)
STORE = Setting(
    "store",
    "WARMCACHE_STORE",
    "none: push and pull need one",
    flag="--store",
    manifest_key="[store] url",
    meaning="the artifact store (s3://, oci://, a folder)",
)
TRUSTED_KEYS = Setting(
    "trusted keys",
    "WARMCACHE_TRUSTED_KEYS",
    "none: signatures are not checked",
    flag="--trust",
    manifest_key="[trust] keys",
    meaning="public keys (ed25519:... or .pub files, comma-separated) whose signatures are accepted",
)
ALLOW_UNSIGNED = Setting(
    "allow unsigned",
    "WARMCACHE_ALLOW_UNSIGNED",
    "false: installing a cache no trusted key checks is refused",
    flag="--allow-unsigned",
    meaning="install a compile cache without trusted keys (true/false); a guard honours it too",
)
DEBUG = Setting(
    "debug",
    "WARMCACHE_DEBUG",
    "false",
    flag="--debug",
    meaning="log every decision and the traceback behind an error (true/false); inherited by child processes",
)
SAFE_DIRECTORIES = Setting(
    "safe directories",
    "WARMCACHE_SAFE_DIRECTORIES",
    "none: a found registry is used only if you or root own it",
    meaning="project folders (os.pathsep-separated; * for any) whose found registry is used whoever owns it",
)
TOKEN = Setting(
    "bearer token",
    "WARMCACHE_TOKEN",
    "none: the service refuses writes, a guard sends no misses",
    flag="--token-file",
    meaning="the service's bearer token for writes (serve's --token-file names a file holding it instead), "
    "and what a guard sends with its misses",
)
STATE_DIR = Setting(
    "state folder",
    "WARMCACHE_STATE_DIR",
    "$XDG_STATE_HOME/warmcache (~/.local/state when unset)",
    flag="--state-dir",
    meaning="where this host remembers the newest version of each signed oci:// tag",
)
MIN_TAG_VERSION = Setting(
    "least tag version",
    "WARMCACHE_MIN_TAG_VERSION",
    "none",
    flag="--min-tag-version",
    meaning="the least signed tag version a pull accepts",
)
TAG_EXPIRES = Setting(
    "tag validity",
    "WARMCACHE_TAG_EXPIRES",
    "30d",
    flag="--expires",
    meaning="how long a signed oci:// tag a push writes stays valid",
)
STORE_TIMEOUT = Setting(
    "store timeout",
    "WARMCACHE_STORE_TIMEOUT",
    "3h in all",
    flag="--timeout",
    meaning="how long a command's store operations may take in all",
)
MAX_UNPACK_SIZE = Setting(
    "unpack limit",
    "WARMCACHE_MAX_UNPACK_SIZE",
    "64 GiB",
    flag="--max-size",
    meaning="the most a bundle unpack or a pull may write",
)
PROGRESS_EVERY = Setting(
    "progress interval",
    "WARMCACHE_PROGRESS_EVERY",
    "30 seconds",
    flag="--progress-every",
    meaning="how often plain output (CI logs) repeats a running spec's phase",
)
CHILD_REGISTRY_URLS = Setting(
    "child registry URLs",
    "WARMCACHE_CHILD_REGISTRY_URLS",
    "set by warmcache for the processes it starts; not for users",
    meaning="the registry URLs with their secrets, handed from a command to its workers and removed on reading",
)

#: Every ``WARMCACHE_*`` variable warmcache reads: the first four also from a manifest.
SETTINGS = (
    REGISTRY,
    CACHE_DIR,
    STORE,
    TRUSTED_KEYS,
    ALLOW_UNSIGNED,
    DEBUG,
    SAFE_DIRECTORIES,
    TOKEN,
    STATE_DIR,
    MIN_TAG_VERSION,
    TAG_EXPIRES,
    STORE_TIMEOUT,
    MAX_UNPACK_SIZE,
    PROGRESS_EVERY,
    CHILD_REGISTRY_URLS,
)


@dataclass(frozen=True, slots=True)
class Chosen:
    """A setting's raw text and the source it came from (``--db``, ``$WARMCACHE_DB``, ``m.toml [registry] url``)."""

    text: str
    source: str


def choose(
    setting: Setting,
    flag: str | None,
    manifest_value: str | None = None,
    manifest_path: Path | str | None = None,
    environ: Mapping[str, str] | None = None,
) -> Chosen | None:
    """The first of ``setting``'s flag, environment variable and manifest value that is given; ``None`` means the
    default. Logged (the source, never the value: it may hold a password) at DEBUG.

    A flag or variable that is given but empty is chosen all the same (and refused by
    the setting's parser, naming it), not a reason to fall back: ``--db
    "$UNSET_VARIABLE"`` must not quietly mean the default registry.
    """
    environ = os.environ if environ is None else environ
    flag_source, env_source, manifest_source, _ = setting.sources(manifest_path)
    for text, source in (
        (flag, flag_source),
        (environ.get(setting.env), env_source),
        (manifest_value, manifest_source),
    ):
        if text is not None:
            log.debug("%s: from %s", setting.name, source)
            return Chosen(text, source)
    return None


def environment_value(setting: Setting, environ: Mapping[str, str] | None = None) -> Chosen | None:
    """``setting``'s variable as set (an empty value included), ``None`` when unset: for a setting whose flag the
    caller has already found absent."""
    return choose(setting, None, environ=environ)


#: The words a true/false variable may hold, as click reads a boolean flag (case and surrounding space ignored).
TRUE_WORDS = ("1", "true", "t", "yes", "y", "on")
FALSE_WORDS = ("0", "false", "f", "no", "n", "off", "")


def parse_switch(text: str, source: str) -> bool:
    """The one reading of a true/false value: :data:`TRUE_WORDS` or :data:`FALSE_WORDS` (empty is false); anything
    else is refused in one line naming ``source``, not taken as false: ``WARMCACHE_ALLOW_UNSIGNED=ture`` must not
    quietly mean the opposite of what was meant."""
    word = text.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise UsageError(
        f"{source}: {shown(text)} is neither true nor false; give one of {', '.join(TRUE_WORDS)} "
        f"or {', '.join(w for w in FALSE_WORDS if w)}"
    )


def switch(setting: Setting, environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``setting``'s variable is set to a true value (unset is false); :class:`UsageError` for a value that is
    neither."""
    chosen = environment_value(setting, environ)
    return parse_switch(chosen.text, chosen.source) if chosen is not None else False
