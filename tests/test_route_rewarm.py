"""A precompile route set on a model after it was warmed: warmup warms its compiled rows again, so the route's files
exist (``warmcache.warmup.route_gaps``).

The route is not part of a row's identity (the compile is the same either way), so the rows
read as compiled and warmup used to skip them: production then found no artifact and was told
to warm the model again, which did nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from warmcache_testkit.inductor_host import warmcache_json
from warmcache_testkit.manifests import generate, manifest_toml, model

from warmcache.registry import Registry
from warmcache.targets.routes import PrecompileRoute


@pytest.mark.slow
def test_a_route_set_after_warmup_warms_the_compiled_rows_again(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    manifest, url = tmp_path / "manifest.toml", f"sqlite:///{tmp_path}/registry.sqlite"

    def warm(**route: object) -> dict[str, object]:
        declared = model("m", str(tiny_models["llama"]), backend="aot_eager", generate=[generate((2,))], **route)
        manifest.write_text(manifest_toml(declared, registry={"url": url}, cache={"dir": str(tmp_path / "cache")}))
        report: dict[str, object] = warmcache_json("warmup", str(manifest))
        return report

    def kinds() -> list[set[str]]:
        with Registry.open(url) as registry:
            return [{a.kind for a in r.artifacts} for r in registry.rows(model="m", with_artifacts=True)]

    assert warm()["compiled"] == 1
    saved = PrecompileRoute.AOT_COMPILE.artifact_kind
    assert all(saved not in row for row in kinds())
    planned = warmcache_json("warmup", str(manifest), "--dry-run")  # still the plain manifest: nothing to do
    assert planned["already_compiled"] == 1, planned

    report = warm(precompile=True)
    assert (report["compiled"], report["already_compiled"]) == (1, 0), report
    assert all(saved in row for row in kinds())
    with Registry.open(url) as registry:
        (row,) = registry.rows(model="m")
    assert row.attempts == 2  # one row, warmed twice: the route added no second identity
    assert warm(precompile=True)["already_compiled"] == 1  # and once its files exist, it is done
