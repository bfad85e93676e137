"""The precompiled routes' table: one route per manifest value, chosen by the kind a row recorded, never by a folder."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field

import pytest

from warmcache.artifacts.aot_compile import AOT_COMPILE
from warmcache.artifacts.aotinductor import AOTINDUCTOR
from warmcache.artifacts.kinds import ROUTES, precompiled, precompiled_entries, route_for, routes_of
from warmcache.cache.layout import AOTINDUCTOR_LIBRARY, INDUCTOR_CODE
from warmcache.registry.records import ArtifactRef
from warmcache.targets import PrecompileRoute

SHA = "ab" * 32


@dataclass
class _Row:
    """The one field of a registry row the table reads."""

    artifacts: list[ArtifactRef] = field(default_factory=list)


def test_every_precompile_value_but_false_selects_one_route_listed_under_its_kind() -> None:
    assert sorted(ROUTES) == sorted(r.artifact_kind for r in PrecompileRoute if r is not PrecompileRoute.NONE)
    for setting in PrecompileRoute:
        if setting is PrecompileRoute.NONE:
            with pytest.raises(ValueError, match="saves no artifacts"):
                route_for(setting)
            continue
        route = route_for(setting)
        assert route.setting is setting and route.kind == setting.artifact_kind and ROUTES[route.kind] is route


def test_a_rows_files_get_the_route_of_their_recorded_kind_whatever_their_folder() -> None:
    row = _Row(
        [
            ArtifactRef(AOTINDUCTOR.kind, f"precompiled/{SHA}"),  # a kind and a folder that disagree: the kind wins
            ArtifactRef(AOT_COMPILE.kind, f"precompiled/{'cd' * 32}"),
            ArtifactRef(AOTINDUCTOR_LIBRARY, f"aotinductor-lib/{SHA}"),  # recorded beside a package, loaded by it
            ArtifactRef(INDUCTOR_CODE, "ab/code.py"),
        ]
    )
    assert precompiled(row) == [(AOTINDUCTOR, f"precompiled/{SHA}"), (AOT_COMPILE, f"precompiled/{'cd' * 32}")]
    assert precompiled_entries(row) == [f"precompiled/{SHA}", f"precompiled/{'cd' * 32}"]
    assert routes_of(row) == [AOT_COMPILE, AOTINDUCTOR]
    assert AOTINDUCTOR.entries(row) == [f"precompiled/{SHA}"] and routes_of(_Row()) == []


def test_the_routes_import_neither_torch_nor_transformers() -> None:
    """A serving process imports the table and the loader; the export and the compiler are imported when run."""
    code = (
        "import sys, warmcache.artifacts.kinds, warmcache.artifacts.dispatch, warmcache.artifacts.trust; "
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out
