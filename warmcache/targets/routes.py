"""How a model's decode step reaches production: the one value the manifest's ``precompile`` key becomes.

``precompile = false`` (the default) serves every shape through ``torch.compile`` from the
warm cache; ``true`` also saves each generate bucket's decode step as an ``aot_compile``
artifact; ``"aotinductor"`` saves it as an AOTInductor package instead (no Dynamo, no
compiler at start-up). Only generate workloads have a decode step to save, so the rule
"which specs precompile" is :meth:`PrecompileRoute.applies_to`, asked here and nowhere
re-derived. Which targets can build which route is the target's answer
(:meth:`warmcache.targets.base.Target.precompile_problem`). How a route saves, loads,
proves and trusts its files is its module in :mod:`warmcache.artifacts`, found by
:attr:`PrecompileRoute.artifact_kind` (:func:`warmcache.artifacts.kinds.route_for`).
"""

from __future__ import annotations

import enum
from typing import Any


class PrecompileRoute(enum.Enum):
    """One model's precompile route; the value is the registry's artifact kind of what it saves."""

    #: Production compiles through ``torch.compile`` from the warm cache; nothing saved ahead.
    NONE = "none"
    #: ``precompile = true``: ``torch.compile(...).aot_compile`` artifacts (Dynamo's bytecode, guards dropped).
    AOT_COMPILE = "inductor-precompiled"
    #: ``precompile = "aotinductor"``: AOTInductor ``.pt2`` packages.
    AOTINDUCTOR = "aotinductor"

    @classmethod
    def from_toml(cls, value: Any) -> PrecompileRoute | None:
        """The route a manifest's ``precompile`` value names, or ``None`` when it names none."""
        if value is False:
            return cls.NONE
        if value is True:
            return cls.AOT_COMPILE
        return cls.AOTINDUCTOR if value == cls.AOTINDUCTOR.value else None

    @property
    def saves_artifacts(self) -> bool:
        """Whether warmup writes decode artifacts for this route (into an Inductor-layout cache folder)."""
        return self is not PrecompileRoute.NONE

    def applies_to(self, workload: str) -> bool:
        """Whether a spec of ``workload`` saves an artifact: only generate workloads have a decode step."""
        return self.saves_artifacts and workload == "generate"

    def decodes_eagerly(self, workload: str) -> bool:
        """Whether warmup's and verify's reference decode runs eagerly: an AOTInductor model's production never
        runs ``torch.compile``, so neither may its reference."""
        return self is PrecompileRoute.AOTINDUCTOR and workload == "generate"

    @property
    def artifacts(self) -> str:
        """What a message calls this route's artifacts."""
        return "AOTInductor packages" if self is PrecompileRoute.AOTINDUCTOR else "precompiled artifacts"

    @property
    def artifact_kind(self) -> str:
        """The registry's kind of the artifacts this route saves."""
        if self is PrecompileRoute.NONE:
            raise ValueError("precompile = false saves no artifacts")
        return self.value


#: What a manifest may write for ``precompile``, for its error message.
PRECOMPILE_VALUES = f"true, false or {PrecompileRoute.AOTINDUCTOR.value!r}"
