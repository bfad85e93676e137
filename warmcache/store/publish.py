"""``warmup --push``: publish each shape the moment warmup records it compiled.

A fleet's hosts each compile part of a manifest; publishing per shape (instead of
once at the end) means a host that dies late loses nothing it finished, and pods
can pull shapes while the rest still compile. A failed push does not stop the
warmup (the compile is recorded and can be pushed later with ``warmcache push``);
it is reported and makes the run exit non-zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from warmcache.cache.locate import single_location
from warmcache.errors import ExitCode, WarmcacheError
from warmcache.manifest import Manifest
from warmcache.registry import Registry
from warmcache.settings import CacheFolder, RegistryLocation
from warmcache.shipping.shipment import PushRequest, ShipmentScope
from warmcache.store.interface import Store
from warmcache.trust import SigningKey


@dataclass
class ShapePublisher:
    """Called with each compiled identity; keeps count of what went up and what failed."""

    manifest: Manifest
    registry: RegistryLocation
    store: Store
    cache_dir: CacheFolder | None = None
    signing_key: SigningKey | None = None
    pushed: int = 0
    bytes_uploaded: int = 0
    failures: list[str] = field(default_factory=list)

    def __call__(self, identity: str) -> None:
        try:
            with Registry.open(self.registry) as registry:
                [record] = registry.rows(identities=[identity])
                scope = ShipmentScope(
                    self.manifest, single_location(self.manifest, self.cache_dir, record.model_name), record.model_name
                )
                request = PushRequest(scope, identities=frozenset([identity]), signing_key=self.signing_key)
                result = self.store.push(request, registry)
        except WarmcacheError as exc:
            self.failures.append(f"{identity[:16]}: {exc}")
            return
        self.pushed += result.shapes
        self.bytes_uploaded += result.bytes_uploaded

    @property
    def exit_code(self) -> ExitCode:
        return ExitCode.NOT_DONE if self.failures else ExitCode.OK

    def as_json(self) -> dict[str, Any]:
        return {
            "store": self.store.url,
            "pushed": self.pushed,
            "bytes_uploaded": self.bytes_uploaded,
            "failures": self.failures,
        }

    def lines(self) -> list[str]:
        return [f"push: {self.pushed} shapes published to {self.store.url}"] + [
            f"push failed: {line}" for line in self.failures
        ]
