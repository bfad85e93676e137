"""Which precompiled artifacts a guard may load: files its rows vouch for, inside the cache folder it was given.

A precompiled artifact is code: an AOTInductor package is a ``.so`` that is
``dlopen``-ed (its constructors run at that moment), an ``aot_compile`` artifact is
a pickle that carries bytecode. Its bytes are checked against the sha256 in its
name before anything in it runs, but that name, and the folder it is read from,
come from the guard's rows. So the rows must come from a source an attacker cannot
forge:

* the registry: written by warmup on the fleet's own hosts and by pulls and unpacks
  that checked signatures (a database the operator named is the local authority);
* a guard snapshot (a file, a folder, or ``warmcache serve``'s answer) whose
  signature a trusted key verified, or whose caller explicitly allowed unsigned code.

A snapshot's ``cache_root`` is never followed: it names a folder on the host that
exported it. Its artifacts load from the cache folder configured here (``cache_dir=``,
the snapshot folder, ``$WARMCACHE_CACHE_DIR``, then Inductor's own folder), and an
entry that is not a plain ``<folder>/<sha256>`` file of that folder, in the folder of the
route whose kind the row recorded for it (``precompiled/`` for ``aot_compile``,
``aotinductor/`` for AOTInductor; a link out of it included), is refused. Every refusal here is a
:class:`~warmcache.errors.TrustError`, raised under every guard policy.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from warmcache.errors import TrustError, shown
from warmcache.settings import resolve_cache_folder
from warmcache.targets.inductor import CACHE_ENV, inductor_default_cache_dir
from warmcache.trust import ALLOW_UNSIGNED_ENV, TRUSTED_KEYS_ENV, unsigned_allowed_by_environment

if TYPE_CHECKING:
    from warmcache.artifacts.route import PrecompiledRoute
    from warmcache.registry.records import ShapeRecord

_HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True, slots=True)
class ArtifactTrust:
    """What a guard's rows are worth as a licence to load the code they name.

    ``signed_by``: ``None`` for rows read from the registry; otherwise the id of the
    trusted key that verified the snapshot, or ``""`` when nobody checked it.
    """

    source: str
    signed_by: str | None = None
    allow_unsigned: bool = False
    #: A snapshot folder's own cache (the default place its artifacts load from).
    folder: Path | None = None

    @classmethod
    def registry(cls, source: str) -> ArtifactTrust:
        return cls(source)

    @property
    def from_snapshot(self) -> bool:
        return self.signed_by is not None

    def require_trusted_rows(self) -> None:
        """Refuse (before any file is read) to load artifacts named by a snapshot nobody verified, unless the caller
        opted out (``allow_unsigned=True``, or ``$WARMCACHE_ALLOW_UNSIGNED=1`` as the refusal says)."""
        if self.signed_by == "" and not (self.allow_unsigned or unsigned_allowed_by_environment()):
            raise TrustError(
                f"{self.source}: guard snapshot not verified (no trusted keys configured), and its "
                "precompiled artifacts are native code; refused: "
                f"pass trust=[KEY.pub] (or set ${TRUSTED_KEYS_ENV}), or allow_unsigned=True "
                f"(${ALLOW_UNSIGNED_ENV}=1) to load them unverified"
            )

    def root(self, record: ShapeRecord, override: Path | None) -> Path | None:
        """The cache folder ``record``'s artifacts load from: ``override``, else the rows' own (registry) or the
        configured one (snapshot)."""
        if override is not None:
            return override
        if not self.from_snapshot:
            return Path(record.cache_root) if record.cache_root else None
        return self.folder or configured_cache_folder()

    def confined(self, root: Path, entry: str, route: PrecompiledRoute) -> Path:
        """``root / entry``, refused unless ``entry`` is one ``<folder>/<sha256>`` file of ``route`` (the route of the
        kind its row recorded) that stays inside ``root``."""
        folder, _, name = entry.rpartition("/")
        if folder != route.folder or len(name) != 64 or not set(name) <= _HEX:
            raise TrustError(
                f"{self.source}: precompiled artifact {shown(entry)} is not a <sha256> file of {route.folder}/, "
                f"where its recorded kind {route.kind} lies; refused"
            )
        path = root / entry
        real, inside = os.path.realpath(path), os.path.realpath(root)
        if os.path.commonpath([real, inside]) != inside:
            raise TrustError(f"{path}: precompiled artifact leads outside the cache folder {root} (to {real}); refused")
        return path


def configured_cache_folder() -> Path:
    """Where a snapshot's artifacts load from when no folder is given: ``$WARMCACHE_CACHE_DIR``,
    ``$TORCHINDUCTOR_CACHE_DIR``, then Inductor's default."""
    chosen = resolve_cache_folder(None)
    if chosen is not None:
        return chosen.path
    inductor = os.environ.get(CACHE_ENV)
    return Path(inductor) if inductor else inductor_default_cache_dir()
