"""Where a guard's rows come from: the registry, an exported snapshot (signed or not), or ``warmcache serve``.

Each source is a :class:`RowSource`: how to (re)load the rows, the name errors cite,
and what the rows vouch for (:class:`~warmcache.artifacts.trust.ArtifactTrust`:
whether :meth:`~warmcache.runtime.guard.ShapeGuard.prime` may load the precompiled
code they name). The guard's constructors pick one; the guard itself only reads rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from warmcache.artifacts.trust import ArtifactTrust
from warmcache.registry.records import ShapeRecord
from warmcache.runtime.snapshot import read_snapshot, snapshot_file
from warmcache.settings import RegistryLocation
from warmcache.shapes import Workload
from warmcache.trust import TrustedKeys


@dataclass(frozen=True)
class RowSource:
    """How a guard loads its rows, the name its errors cite, and what those rows vouch for."""

    load: Callable[[], list[ShapeRecord]]
    name: str
    artifact_trust: ArtifactTrust


def registry_source(location: RegistryLocation, model: str, workload: Workload) -> RowSource:
    """The registry's rows of ``model``: a read path that never creates or migrates a schema."""

    def load() -> list[ShapeRecord]:
        from warmcache.registry.registry import Registry

        # A typo in the URL is an error, not a new registry.
        with Registry.open(location, create=False) as registry:
            # Artifacts too: the precompiled ones are what prime() loads.
            return registry.rows(model=model, workload=workload, with_artifacts=True)

    return RowSource(load, location.display, ArtifactTrust.registry(location.display))


@dataclass(frozen=True)
class SnapshotTrust:
    """Which keys a snapshot's rows must be signed by, and whether unsigned rows may still prime: one value for the
    snapshot and service sources alike."""

    keys: TrustedKeys
    allow_unsigned: bool

    @classmethod
    def of(cls, trust: TrustedKeys | Sequence[str] | str | None, allow_unsigned: bool) -> SnapshotTrust:
        """``trust=`` as given (keys or ``.pub`` files; one string is one entry), else ``$WARMCACHE_TRUSTED_KEYS``,
        else none."""
        if isinstance(trust, TrustedKeys):
            return cls(trust, allow_unsigned)
        entries = [trust] if isinstance(trust, str) else list(trust or ())
        keys = TrustedKeys.load(entries, "trust=") if entries else TrustedKeys.resolve(())
        return cls(keys, allow_unsigned)

    def vouching(self, source: str, folder: Path | None = None) -> ArtifactTrust:
        """What a snapshot's rows vouch for: every load that returns was verified when keys are configured (any
        other raises)."""
        keys = self.keys
        verified_by = f"{keys.source}: {', '.join(k.key_id for k in keys.keys)}" if keys.configured else ""
        return ArtifactTrust(source, signed_by=verified_by, allow_unsigned=self.allow_unsigned, folder=folder)


def snapshot_source(path: str | Path, model: str, workload: Workload, trust: SnapshotTrust) -> RowSource:
    """The rows of an exported snapshot file, or of the ``warmcache-guard.json`` in a folder of cache entries."""
    given = Path(path)
    snapshot = snapshot_file(given)

    def load() -> list[ShapeRecord]:
        read = read_snapshot(snapshot, trust.keys)
        return [r for r in read.records if r.model_name == model and r.workload == workload]

    folder = given if snapshot != given else None
    return RowSource(load, str(snapshot), trust.vouching(str(snapshot), folder))


def service_source(
    service_url: str, model: str, workload: Workload, trust: SnapshotTrust, *, timeout: float
) -> RowSource:
    """The rows ``warmcache serve`` answers for ``model`` (``GET /v1/guard/{model}``, with ETags)."""
    from warmcache.runtime.remote import SnapshotSource

    source = SnapshotSource(service_url, model, workload, timeout=timeout, trusted=trust.keys)
    return RowSource(source.load, source.url, trust.vouching(source.url))
