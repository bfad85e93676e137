"""The query CLI: plan, shapes and check, as users call them."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from warmcache_testkit.manifests import generate, manifest_toml, model, train
from warmcache_testkit.registry_fill import mark_all_compiled

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
    assert unknown.exit_code == 2, unknown.output
    assert "--model 'nope': no rows of this model in registry" in unknown.stderr
    assert "(models there: m)" in unknown.stderr and unknown.stderr.count("\n") == 1
    no_train = runner.invoke(
        main, ["check", "--model", "m", "--batch", "1", "--seq", "16", "--db", url, "--workload", "train", "--json"]
    )
    assert no_train.exit_code == 0, no_train.output


def test_check_names_the_model_a_typo_meant(tmp_path: Path, write_manifest) -> None:
    """``tiny-qwen`` exited 1 like "not compiled": a gate read a typo as a cold shape. Now it is malformed input (2),
    naming the known name it is nearest to; the empty registry says it has no rows yet."""
    url = f"sqlite:///{tmp_path / 'r.sqlite'}"
    Registry.open(url).close()
    runner = CliRunner()
    args = ["--batch", "1", "--seq", "16", "--db", url]
    empty = runner.invoke(main, ["check", "--model", "tiny-qwen", *args])
    assert empty.exit_code == 2 and "has no rows yet" in empty.stderr, empty.output
    _compile_all(
        url,
        write_manifest(
            manifest_toml(model("tiny-qwen3", generate=[generate()]), model("tiny-llama", generate=[generate()]))
        ),
    )
    for command in ("check", "explain"):
        typo = runner.invoke(main, [command, "--model", "tiny-qwen", *args])
        assert typo.exit_code == 2, typo.output
        assert "did you mean 'tiny-qwen3'?" in typo.stderr, typo.stderr


def test_check_help_names_no_manifest_for_db() -> None:
    """check takes no manifest: its --db help sent readers looking for the manifest's [registry] url."""
    text = CliRunner().invoke(main, ["check", "--help"]).output
    assert "--db" in text and "manifest's" not in text and "[registry]" not in text


def test_nearest_shapes_come_in_the_order_a_request_pads_to(tmp_path: Path, write_manifest) -> None:
    """batch 8 seq 12 pads seq to 16: ``seq=16`` buckets are nearer than the ``seq=8`` one the same distance away."""
    url = f"sqlite:///{tmp_path / 'r.sqlite'}"
    _compile_all(
        url,
        write_manifest(
            manifest_toml(model("m", generate=[generate(batch_sizes=[1, 2], prompt_lengths=[8, 16], max_cache_len=32)]))
        ),
    )
    result = CliRunner().invoke(main, ["check", "--model", "m", "--batch", "8", "--seq", "12", "--db", url])
    assert result.exit_code == 1
    assert "nearest: batch=2 seq=16, batch=1 seq=16, batch=2 seq=8" in result.output


def test_explain_answers_one_request_as_check_asks_it(tmp_path: Path, write_manifest) -> None:
    """explain took only a manifest, and exited 0 saying "1 of 1 shapes not usable here": now --model --batch --seq
    asks it, and a no exits 1 (a pipeline step gates on it)."""
    url = f"sqlite:///{tmp_path / 'r.sqlite'}"
    path = write_manifest(MANIFEST)
    with Registry.open(url) as registry:
        registry.ensure_pending(plan_manifest(load_manifest(path)))
    _compile_all(url, path, keep=lambda p: p.spec.batch_size != 4)
    runner = CliRunner()

    def explain(*args: str) -> tuple[int, str]:
        result = runner.invoke(main, ["explain", *args, "--db", url])
        return result.exit_code, result.stdout

    code, text = explain("--model", "m", "--batch", "8", "--seq", "20")
    assert code == 1, text
    assert text.splitlines() == [
        "m/generate batch=8 seq=20: missing: no row for batch=8 seq=20; nearest compiled batch=2 seq=32, "
        "batch=1 seq=32, batch=2 seq=16",
        "1 of 1 shapes not usable here",
    ]
    code, text = explain("--model", "m", "--batch", "2", "--seq", "20")
    assert code == 0 and text.splitlines() == [
        "ok: batch=2 seq=20 pads to compiled batch=2 seq=32 (m/generate float32 max_cache_len=64)",
        "0 of 1 shapes not usable here",
    ]
    code, text = explain("--model", "m", "--batch", "4", "--seq", "16", "--exact", "--json")
    assert code == 1 and [e["status"] for e in json.loads(text)] == ["pending"]
    # The manifest form says no with the same code.
    code, text = explain(str(path))
    assert code == 1 and text.splitlines()[-1] == "2 of 7 shapes not usable here"
    assert explain(str(path), "--batch", "2")[0] == 2
    assert explain("--model", "m", "--batch", "2")[0] == 2


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
    main(["explain", *sys.argv[1:]])
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

    def probe(*args: str) -> tuple[dict, list[str]]:
        done = subprocess.run(
            [sys.executable, "-c", EXPLAIN_PROBE, *args], capture_output=True, text=True, timeout=300, check=False
        )
        return json.loads(done.stderr.strip().splitlines()[-1]), done.stdout.strip().splitlines()

    assert probe(str(manifest)) == ({"exit": 0, "imported": []}, [f"0 of {len(planned)} shapes not usable here"])
    # A missing bucket of a warmed model took 10 s (400 MB): it imported transformers and torch to re-check the
    # model's support, which warmup checked under this config and toolchain. Now one registry query, ~1 s.
    wider = project / "examples" / "wider.toml"
    wider.write_text(
        manifest.read_text().replace("batch_sizes = [1, 2]", "batch_sizes = [8]").replace("[8, 16]", "[12]", 1)
    )
    missing = "missing: no row for batch=8 seq=12; nearest compiled batch=2 seq=16"
    said, lines = probe(str(wider), "--model", "tiny-qwen3")
    assert said == {"exit": 1, "imported": []} and missing in lines[0], lines
    said, lines = probe("--model", "tiny-qwen3", "--batch", "8", "--seq", "12", "--db", str(parsed.registry))
    assert said == {"exit": 1, "imported": []} and missing in lines[0], lines
