"""The query CLI: plan, shapes and check, as users call them."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from manifests import generate, manifest_toml, model, train
from registry_fill import mark_all_compiled

from warmcache.cli import main
from warmcache.identity.plan import plan_manifest
from warmcache.manifest import load_manifest
from warmcache.registry import Registry

ROOT = Path(__file__).resolve().parents[1]

MODEL = model(
    "m",
    generate=[generate(batch_sizes=[1, 2, 4], prompt_lengths=[16, 32], max_cache_len=64)],
    train=[train(seq_lengths=[32])],
)
MANIFEST = manifest_toml(MODEL)


def _compile_all(url: str, manifest_path: Path, keep=lambda p: True) -> None:
    """Mark shapes compiled through the registry's real claim path (no torch involved)."""
    mark_all_compiled(url, [p for p in plan_manifest(load_manifest(manifest_path)) if keep(p)])


def test_plan_json_lists_every_spec_with_status(registry_url: str, write_manifest) -> None:
    path = write_manifest(MANIFEST)
    _compile_all(registry_url, path, keep=lambda p: p.spec.batch_size == 1)
    result = CliRunner().invoke(main, ["plan", str(path), "--db", registry_url, "--json"])
    assert result.exit_code == 0, result.output
    items = json.loads(result.output)
    assert len(items) == 7
    for item in items:
        assert {"model", "workload", "batch_size", "seq_len", "max_cache_len", "dtype", "status"} <= item.keys()
    assert {(i["batch_size"], i["status"]) for i in items if i["workload"] == "generate"} == {
        (1, "compiled"),
        (2, "missing"),
        (4, "missing"),
    }


def test_plan_text_has_a_summary_line(registry_url: str, write_manifest) -> None:
    path = write_manifest(MANIFEST)
    Registry.open(registry_url).close()  # an empty registry (plan only reads one)
    result = CliRunner().invoke(main, ["plan", str(path), "--db", registry_url])
    assert result.exit_code == 0
    assert result.output.strip().splitlines()[-1] == "7 shapes: 7 missing"


def test_shapes_filters_and_json(registry_url: str, write_manifest) -> None:
    path = write_manifest(MANIFEST)
    _compile_all(registry_url, path)
    runner = CliRunner()
    rows = json.loads(runner.invoke(main, ["shapes", "--db", registry_url, "--json", "--workload", "train"]).output)
    assert [(r["model"], r["batch_size"], r["seq_len"], r["status"]) for r in rows] == [("m", 2, 32, "compiled")]
    text = runner.invoke(main, ["shapes", "--db", registry_url, "--status", "compiled"]).output
    assert text.strip().splitlines()[-2:] == [
        "7 shapes: 7 compiled",
        "7 compiled not proven yet: warmcache verify MANIFEST replays them in a fresh process and marks them verified",
    ]
    assert (
        json.loads(runner.invoke(main, ["shapes", "--db", registry_url, "--json", "--status", "failed"]).output) == []
    )


@pytest.mark.parametrize(
    ("args", "code", "expected"),
    [
        (["--batch", "2", "--seq", "32"], 0, "is compiled exactly"),
        (["--batch", "3", "--seq", "20"], 0, "pads to compiled batch=4 seq=32"),
        (["--batch", "3", "--seq", "20", "--exact"], 1, "not compiled"),
        (["--batch", "8", "--seq", "16"], 1, "nearest: batch=4 seq=16"),
        (["--batch", "1", "--seq", "33"], 1, "nearest: batch=1 seq=32"),
        (["--batch", "2", "--seq", "30", "--workload", "train"], 0, "pads to compiled batch=2 seq=32"),
    ],
)
def test_check_exit_codes(registry_url: str, write_manifest, args: list[str], code: int, expected: str) -> None:
    _compile_all(registry_url, write_manifest(MANIFEST))
    result = CliRunner().invoke(main, ["check", "--model", "m", *args, "--db", registry_url])
    assert result.exit_code == code, result.output
    assert expected in result.output


def test_check_json_and_usage_errors(tmp_path: Path, write_manifest) -> None:
    url = f"sqlite:///{tmp_path / 'r.sqlite'}"
    _compile_all(url, write_manifest(MANIFEST))
    runner = CliRunner()
    result = runner.invoke(main, ["check", "--model", "m", "--batch", "3", "--seq", "16", "--db", url, "--json"])
    data = json.loads(result.output)
    assert result.exit_code == 0 and data["decision"] == "pad" and data["target"] == {"batch_size": 4, "seq_len": 16}
    assert runner.invoke(main, ["check", "--model", "m", "--batch", "0", "--seq", "16", "--db", url]).exit_code == 2
    assert runner.invoke(main, ["check", "--model", "m", "--seq", "16", "--db", url]).exit_code == 2
    unknown = runner.invoke(main, ["check", "--model", "nope", "--batch", "1", "--seq", "16", "--db", url])
    assert unknown.exit_code == 1, unknown.output
    assert "not compiled: batch=1 seq=16: model 'nope' has no generate shapes" in unknown.stdout
    unknown_json = runner.invoke(
        main, ["check", "--model", "nope", "--batch", "1", "--seq", "16", "--db", url, "--json"]
    )
    assert unknown_json.exit_code == 1 and json.loads(unknown_json.stdout)["reason"].startswith(
        "model 'nope' has no generate shapes"
    )


def test_registry_location_precedence(tmp_path: Path, write_manifest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Flag, then environment, then manifest, then the default: each named by the read that finds it missing (and
    creates none)."""
    in_manifest = tmp_path / "from-manifest.sqlite"
    path = write_manifest(manifest_toml(MODEL, registry={"url": f"sqlite:///{in_manifest}"}))
    runner = CliRunner()

    def missing(*args: str) -> str:
        result = runner.invoke(main, list(args))
        assert result.exit_code == 3 and "does not exist" in result.stderr, result.output
        return result.stderr

    assert str(in_manifest) in missing("plan", str(path))
    env_db = tmp_path / "from-env.sqlite"
    monkeypatch.setenv("WARMCACHE_DB", f"sqlite:///{env_db}")
    assert str(env_db) in missing("plan", str(path))
    flag_db = tmp_path / "from-flag.sqlite"
    assert str(flag_db) in missing("plan", str(path), "--db", f"sqlite:///{flag_db}")
    monkeypatch.delenv("WARMCACHE_DB")
    assert str(tmp_path / "xdg-cache" / "warmcache" / "registry.sqlite") in missing("shapes")
    assert not [p for p in tmp_path.rglob("*.sqlite")]


def test_python_dash_m_runs_the_cli() -> None:
    result = subprocess.run([sys.executable, "-m", "warmcache", "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "plan" in result.stdout


def test_check_says_why_when_nothing_is_usable(tmp_path: Path, write_manifest) -> None:
    url = f"sqlite:///{tmp_path / 'r.sqlite'}"
    with Registry.open(url) as registry:
        registry.ensure_pending(plan_manifest(load_manifest(write_manifest(MANIFEST))))
    result = CliRunner().invoke(main, ["check", "--model", "m", "--batch", "1", "--seq", "16", "--db", url])
    assert result.exit_code == 1
    assert "no usable compiled generate shape on this machine (registry rows: 6 pending)" in result.output


def test_a_file_that_is_not_a_database_is_one_line(tmp_path: Path) -> None:
    bogus = tmp_path / "notes.sqlite"
    bogus.write_text("this is not a database, it is a shopping list\n" * 100)
    result = CliRunner().invoke(main, ["shapes", "--db", f"sqlite:///{bogus}"])
    assert result.exit_code == 3
    assert result.stderr.startswith("warmcache: error: registry") and result.stderr.count("\n") == 1
    assert "Traceback" not in result.output


def test_shapes_says_why_compiled_rows_are_not_verified(tmp_path: Path, write_manifest) -> None:
    """Right after verify, "2 compiled, 1 verified" reads like a verify that missed two shapes: the next lines say
    which cannot be proven (nothing on disk) and which are not proven yet."""
    url = f"sqlite:///{tmp_path / 'r.sqlite'}"
    inductor = model("m", generate=[generate(batch_sizes=[1, 2])])
    eager = model("e", backend="aot_eager", generate=[generate()])
    planned = plan_manifest(load_manifest(write_manifest(manifest_toml(inductor, eager))))
    with Registry.open(url) as registry:
        registry.ensure_pending(planned)
        for shape in planned:  # as warmup records them: an Inductor shape with its cache folder, an aot_eager one none
            row = registry.claim([shape.identity], "test", 60)
            assert row is not None
            cache_root = str(tmp_path / "cache") if shape.model.backend == "inductor" else None
            registry.mark_compiled(row.id, "test", compile_seconds=1.0, graphs_compiled=1, cache_root=cache_root)
        registry.mark_verified([planned[0].identity])
    text = CliRunner().invoke(main, ["shapes", "--db", url]).output
    assert text.strip().splitlines()[-3:] == [
        "3 shapes: 2 compiled, 1 verified",
        "1 of the compiled ran on aot_eager, which keeps no compile cache on disk: verify replays them but has nothing "
        "to prove, so they stay compiled",
        "1 compiled not proven yet: warmcache verify MANIFEST replays them in a fresh process and marks them verified",
    ]


EXPLAIN_PROBE = """
import json, sys
from warmcache.cli import main
try:
    main(["explain", sys.argv[1]])
except SystemExit as exit:
    imported = sorted(name for name in ("torch", "transformers") if name in sys.modules)
    print(json.dumps({"exit": exit.code, "imported": imported}), file=sys.stderr)
"""


def test_explain_on_the_quickstart_registry_imports_neither_torch_nor_transformers(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    """It took 15 s on 2 cores to print one line: it imported transformers, torch and each model's code to check the
    support of models warmed long ago. A warm manifest's answer is one registry query (the CLI's imports: ~2 s)."""
    project = tmp_path / "clone"
    (project / "examples").mkdir(parents=True)
    manifest = Path(shutil.copy(ROOT / "examples" / "tiny-cpu.toml", project / "examples"))
    models = project / ".warmcache" / "models"
    models.mkdir(parents=True)
    for arch, path in tiny_models.items():
        (models / f"tiny-{arch}").symlink_to(path)
    parsed = load_manifest(manifest)
    planned = plan_manifest(parsed)
    mark_all_compiled(str(parsed.registry), planned)  # what the quickstart's warmup leaves, through the real claims
    done = subprocess.run(
        [sys.executable, "-c", EXPLAIN_PROBE, str(manifest)], capture_output=True, text=True, timeout=300, check=False
    )
    assert json.loads(done.stderr.strip().splitlines()[-1]) == {"exit": 0, "imported": []}, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == f"0 of {len(planned)} shapes not usable here"
