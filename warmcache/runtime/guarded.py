"""What padding, serving and training ask of a guard, as a protocol.

:class:`~warmcache.runtime.guard.ShapeGuard` is the facade that offers ``fit``,
``generate``, ``prime``, ``collator`` and ``callback`` by calling into
:mod:`~warmcache.runtime.padding`, :mod:`~warmcache.runtime.serving` and
:mod:`~warmcache.runtime.training`. Those modules name this protocol instead of
the class, so they sit below the guard and never import it back.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

from warmcache.artifacts.trust import ArtifactTrust
from warmcache.registry.records import ShapeRecord
from warmcache.runtime.telemetry import MissTelemetry
from warmcache.shapes import Decision, ShapeFamily

Policy = Literal["pad", "refuse", "warn"]
POLICIES: tuple[Policy, ...] = ("pad", "refuse", "warn")


class Guard(Protocol):
    """The compiled buckets of one shape family, the policy for the rest, and where misses go."""

    policy: Policy
    family: ShapeFamily
    telemetry: MissTelemetry
    #: Whether the rows may name code ``prime`` loads, and from which folder.
    artifact_trust: ArtifactTrust
    #: Set once every compiled bucket has been loaded (see ``serving.prime``).
    primed: bool

    @property
    def records(self) -> list[ShapeRecord]: ...

    @property
    def buckets(self) -> list[tuple[int, int]]: ...

    @property
    def target(self) -> tuple[str, str, str]: ...

    def check_model_config(self, config: dict[str, Any], attn_implementation: str | None = None) -> None: ...

    def claim_compile_folder(self) -> None: ...

    def decide(self, batch_size: int, seq_len: int) -> Decision: ...

    def require_exact(self, batch_size: int, seq_len: int) -> Decision: ...

    def bucket(self, batch_size: int, seq_len: int) -> Decision: ...

    def longest_length(self, batch_size: int) -> int | None: ...

    def unseen_message(self, decision: Decision, reason: str) -> str: ...
