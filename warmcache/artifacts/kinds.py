"""Every precompiled route, by the registry's kind of its files: the one table anything chooses a route from.

Warmup asks :func:`route_for` with the manifest's ``precompile`` value and records each file
under the route's kind; the loader, verify and trust look the row's recorded kind up in
:data:`ROUTES`. Adding a route means adding its module (a :class:`PrecompiledRoute`) and
listing it here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from warmcache.artifacts.aot_compile import AOT_COMPILE
from warmcache.artifacts.aotinductor import AOTINDUCTOR
from warmcache.artifacts.route import PrecompiledRoute
from warmcache.targets.routes import PrecompileRoute

if TYPE_CHECKING:
    from warmcache.registry import ShapeRecord

#: ``{artifact kind: route}`` of every route.
ROUTES: dict[str, PrecompiledRoute] = {route.kind: route for route in (AOT_COMPILE, AOTINDUCTOR)}


def route_for(setting: PrecompileRoute) -> PrecompiledRoute:
    """The route a manifest's ``precompile`` value selects (``PrecompileRoute.NONE`` selects none: ``ValueError``)."""
    return ROUTES[setting.artifact_kind]


def precompiled(record: ShapeRecord) -> list[tuple[PrecompiledRoute, str]]:
    """The row's precompiled files, each with the route of the kind the row recorded for it."""
    return [(ROUTES[a.kind], a.path) for a in record.artifacts if a.kind in ROUTES]


def precompiled_entries(record: ShapeRecord) -> list[str]:
    """The row's precompiled files of every route."""
    return [entry for _, entry in precompiled(record)]


def routes_of(record: ShapeRecord) -> list[PrecompiledRoute]:
    """The routes the row recorded files of, each once, in :data:`ROUTES`' order."""
    kinds = {a.kind for a in record.artifacts}
    return [route for kind, route in ROUTES.items() if kind in kinds]
