"""What ``bundle pack``, ``push`` and ``pull`` move: a manifest's shapes and the one cache folder holding their entries.

The three take one :class:`ShipmentScope` and choose their rows the same way
(:func:`records_to_ship`), so a bundle and a store hold the same shapes of a manifest.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from warmcache.cache.locate import CacheLocation
from warmcache.errors import CacheError
from warmcache.identity.plan import plan_manifest
from warmcache.manifest import Manifest
from warmcache.registry import Registry, ShapeRecord
from warmcache.registry.statuses import DONE_STATUSES, Status
from warmcache.trust import SigningKey


@dataclass(frozen=True, slots=True)
class ShipmentScope:
    """A manifest's shapes (one model's, with ``model_name``) and the cache folder their entries are read from or
    installed into."""

    manifest: Manifest
    location: CacheLocation
    model_name: str | None = None


@dataclass(frozen=True, slots=True)
class PushRequest:
    """What a push ships, and how: the scope's compiled shapes (only verified ones with ``verified_only``; only
    ``identities`` if given, as warmup --push ships each shape as it compiles), each index signed with
    ``signing_key`` if given."""

    scope: ShipmentScope
    verified_only: bool = False
    identities: frozenset[str] | None = None
    signing_key: SigningKey | None = None

    def records(self, registry: Registry) -> tuple[list[ShapeRecord], int]:
        """The rows this push ships, and how many declared shapes lack one (:func:`records_to_ship`)."""
        return records_to_ship(registry, self.scope, self.verified_only, self.identities)


def records_to_ship(
    registry: Registry, scope: ShipmentScope, verified_only: bool, identities: Iterable[str] | None = None
) -> tuple[list[ShapeRecord], int]:
    """The rows a bundle or a push ships: this toolchain's compiled (or only verified) shapes of the manifest, and how
    many declared shapes lack one.

    ``identities`` narrows the choice (warmup --push ships each shape as it compiles).
    Nothing to ship is an error naming the registry and the command that fills it.
    """
    statuses = (Status.VERIFIED,) if verified_only else DONE_STATUSES
    planned = registry.plan_status(plan_manifest(scope.manifest, scope.model_name))
    done = [s.planned.identity for s in planned if s.status in statuses]
    records = [r for r in registry.rows(identities=done, with_artifacts=True) if r.status in statuses]
    not_compiled = len(planned) - len(records)
    if identities is not None:
        wanted = set(identities)
        records = [r for r in records if r.identity in wanted]
    if not records:
        what, run = ("verified", "verify") if verified_only else ("compiled", "warmup")
        raise CacheError(
            f"{scope.manifest.path}: no {what} shapes for this machine's toolchain in registry "
            f"{registry.location.display}; run warmcache {run} first"
        )
    return records, not_compiled
