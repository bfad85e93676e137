"""``warmcache buckets suggest`` as users call it: inputs, errors, JSON, snippet, plot."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from warmcache_testkit.manifests import manifest_toml, model

from warmcache.cli import main
from warmcache.registry import MissEvent, Registry


def suggest(*args: str) -> Result:
    return CliRunner().invoke(main, ["buckets", "suggest", *args])


@pytest.fixture
def lengths_file(tmp_path: Path) -> Path:
    path = tmp_path / "lengths.txt"
    path.write_text(
        "# prompt lengths from last week\n" + "\n".join(str(n) for n in [5, 5, 5, 9, 9, 20, 31, 31, 64, 100]) + "\n\n"
    )
    return path


def test_json_report_shape(lengths_file: Path) -> None:
    result = suggest("--lengths", str(lengths_file), "--max-buckets", "3", "--batch", "2", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["source"] == {"kind": "lengths", "path": str(lengths_file)}
    assert report["lengths"] == {"count": 10, "distinct": 6, "min": 5, "max": 100, "mean": pytest.approx(27.9)}
    assert report["batch_size"] == 2 and "F(x)^2" in report["objective"]
    assert len(report["buckets"]) == 3 and report["buckets"][-1] == 100
    names = [s["name"] for s in report["strategies"]]
    assert names == ["optimal (DP)", "powers of two", "evenly spaced", "powers of two from 128"]
    plan = report["strategies"][0]
    assert plan["buckets"] == report["buckets"] and plan["buckets_to_match"] == 3
    for strategy in report["strategies"]:
        assert {
            "buckets",
            "num_buckets",
            "waste_percent",
            "padded_tokens_per_request",
            "padded_tokens_per_batch",
            "buckets_to_match",
        } <= strategy.keys()
        assert strategy["padded_tokens_per_batch"] == pytest.approx(2 * strategy["padded_tokens_per_request"])
        assert (
            plan["padded_tokens_per_request"] <= strategy["padded_tokens_per_request"] + 1e-9
            or strategy["num_buckets"] > 3
        )
    assert 0 < report["unavoidable"]["waste_percent"] < plan["waste_percent"]
    assert report["manifest_snippet"] is None


def test_text_report_and_csv_column(tmp_path: Path) -> None:
    csv_file = tmp_path / "requests.csv"
    csv_file.write_text("request_id,prompt_tokens\na,10\nb,10\nc,12\nd,40\n")
    result = suggest("--lengths", str(csv_file), "--column", "prompt_tokens", "--max-buckets", "2")
    assert result.exit_code == 0, result.output
    assert "4 lengths (3 distinct), 10-40 tokens" in result.output
    assert "strategy" in result.output and "powers of two" in result.output
    assert result.output.strip().splitlines()[-1] == "suggested buckets: 12, 40"


def test_compile_cost_decides_how_many_buckets(lengths_file: Path) -> None:
    cheap = json.loads(suggest("--lengths", str(lengths_file), "--compile-cost", "0", "--json").stdout)
    dear = json.loads(suggest("--lengths", str(lengths_file), "--compile-cost", "1e9", "--json").stdout)
    scaled = json.loads(
        suggest(
            "--lengths", str(lengths_file), "--compile-cost", "100", "--expected-requests", "1000000", "--json"
        ).stdout
    )
    assert cheap["buckets"] == [5, 9, 20, 31, 64, 100]
    assert dear["buckets"] == [100]
    assert scaled["buckets"] == cheap["buckets"]  # a million requests make every bucket worth a compile
    assert "1000000 requests" in scaled["objective"]


@pytest.mark.parametrize(
    ("content", "extra", "message"),
    [
        ("", [], "{file}: no lengths found (empty file)"),
        ("12\n\n7x\n", [], "{file}:3: not an integer: '7x'"),
        ("12,4\n", [], "{file}:1: not an integer: '12,4' (a CSV file? pass --column NAME)"),
        ("0\n", [], "{file}:1: length must be >= 1, got 0"),
        ("12\n600\n", ["--max-length", "512"], "{file}:2: length 600 exceeds the model maximum 512 (--max-length)"),
        ("a,b\n1,2\n", ["--column", "tokens"], "{file}: no column 'tokens' (columns: a, b)"),
        ("n\n5\nfive\n", ["--column", "n"], "{file}:3 column 'n': not an integer: 'five'"),
        ("12\n", ["--max-buckets", "0"], "--max-buckets: K must be >= 1, got 0"),
        ("12\n", ["--expected-requests", "5"], "--expected-requests only matters with --compile-cost"),
        ("12\n", ["--manifest-snippet"], "--manifest-snippet needs --model NAME"),
        ("12\n", ["--manifest-snippet", "--model", "m"], "--manifest-snippet for generate needs --max-cache-len"),
        (
            "12\n",
            ["--manifest-snippet", "--model", "m", "--max-cache-len", "12"],
            "--max-cache-len 12: the longest bucket 12 + 1 new token does not fit",
        ),
        (
            "12\n",
            ["--manifest-snippet", "--model", "m", "--max-cache-len", "64", "--batch-sizes", "1,two"],
            "--batch-sizes: not an integer: 'two'",
        ),
        (
            "12\n",
            ["--dataset", "x.jsonl"],
            "give exactly one source of lengths: --lengths, --dataset or --from-misses (got --lengths, --dataset)",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, content: str, extra: list[str], message: str) -> None:
    file = tmp_path / "lengths.txt"
    file.write_text(content)
    result = CliRunner().invoke(main, ["buckets", "suggest", "--lengths", str(file), *extra])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output
    assert lines[0].startswith("warmcache: error: " + message.format(file=file))


def test_missing_file_and_missing_source(tmp_path: Path) -> None:
    missing = suggest("--lengths", str(tmp_path / "nope.txt"))
    assert (
        missing.exit_code == 2
        and missing.output.strip() == f"warmcache: error: {tmp_path / 'nope.txt'}: file not found"
    )
    nothing = suggest()
    assert nothing.exit_code == 2 and "give exactly one source of lengths" in nothing.output


MANIFEST_HEAD = manifest_toml(model("tiny", backend="aot_eager"))  # the snippet under test adds the shapes


@pytest.mark.parametrize("workload", ["generate", "train"])
def test_snippet_pasted_into_a_manifest_passes_plan(
    workload: str, lengths_file: Path, write_manifest: Callable[..., Path], tmp_path: Path
) -> None:
    args = [
        "--lengths",
        str(lengths_file),
        "--max-buckets",
        "3",
        "--manifest-snippet",
        "--model",
        "tiny",
        "--workload",
        workload,
        "--batch-sizes",
        "4,1,2",
    ]
    if workload == "generate":
        args += ["--max-cache-len", "128"]
    result = suggest(*args)
    assert result.exit_code == 0, result.output
    snippet = result.output
    assert f"[[model.{workload}]]" in snippet and 'name = "tiny"' in snippet

    manifest = write_manifest(MANIFEST_HEAD + snippet)
    db = f"sqlite:///{tmp_path / 'registry.sqlite'}"
    Registry.open(db).close()  # an empty registry: plan only reads one
    planned = CliRunner().invoke(main, ["plan", str(manifest), "--db", db, "--json"])
    assert planned.exit_code == 0, planned.output
    shapes = json.loads(planned.stdout)
    buckets = json.loads(suggest("--lengths", str(lengths_file), "--max-buckets", "3", "--json").stdout)["buckets"]
    assert {(s["workload"], s["batch_size"], s["seq_len"]) for s in shapes} == {
        (workload, b, n) for b in (1, 2, 4) for n in buckets
    }
    if workload == "generate":
        assert {s["max_cache_len"] for s in shapes} == {128}


def test_from_misses_weights_each_length_by_its_count(registry_url: str) -> None:
    with Registry.open(registry_url) as registry:
        registry.record_misses(
            [
                MissEvent("chat", "generate", "float32", 1, 10, "padded", 1, 32, count=3),
                MissEvent("chat", "generate", "float32", 2, 20, "refused", count=1),
                MissEvent("chat", "generate", "float32", 1, 30, "refused", count=5),
                MissEvent("chat", "train", "float32", 8, 7, "refused", count=100),  # other workload
                MissEvent("other", "generate", "float32", 1, 5, "refused", count=100),  # other model
            ]
        )
        registry.record_misses([MissEvent("chat", "generate", "float32", 1, 10, "padded", 1, 32, count=2)])
    result = suggest("--from-misses", "--model", "chat", "--db", registry_url, "--max-buckets", "2", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["lengths"]["count"] == 11 and report["lengths"]["distinct"] == 3
    # (10, 30) pads one request by 10 tokens; (20, 30) would pad five by 10.
    assert report["buckets"] == [10, 30]
    assert report["source"]["kind"] == "misses" and report["source"]["model"] == "chat"

    too_long = suggest("--from-misses", "--model", "chat", "--db", registry_url, "--max-length", "25")
    assert (
        too_long.exit_code == 2 and "batch=1 seq=30: length 30 tokens exceeds the model maximum 25" in too_long.output
    )
    batched = suggest("--from-misses", "--model", "chat", "--db", registry_url, "--batch", "4")
    assert batched.exit_code == 2 and "--batch does not apply to --from-misses" in batched.output
    none = suggest("--from-misses", "--model", "nobody", "--db", registry_url)
    assert none.exit_code == 2 and "no recorded misses for model 'nobody' (workload generate)" in none.output


def test_dataset_lengths_come_from_the_models_tokenizer(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    texts = ["the compile cache", "warm shape batch token " * 5, "guard", "neuron graph model train serve " * 3]
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_text("".join(json.dumps({"text": t, "id": i}) + "\n" for i, t in enumerate(texts)))
    tokenizer = AutoTokenizer.from_pretrained(tiny_models["qwen3"])
    expected = sorted(len(tokenizer(t)["input_ids"]) for t in texts)

    result = suggest(
        "--dataset", str(dataset), "--tokenizer", str(tiny_models["qwen3"]), "--max-buckets", "8", "--json"
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["buckets"] == sorted(set(expected))  # 8 buckets >= 4 lengths: each length is a bucket
    assert report["lengths"]["count"] == 4 and report["lengths"]["max"] == expected[-1]
    assert f"tokenising {dataset}: 4/4" in result.stderr  # progress never mixes into the JSON on stdout


def test_dataset_errors_name_the_line(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    model = str(tiny_models["qwen3"])
    dataset = tmp_path / "d.jsonl"
    dataset.write_text('{"text": "guard"}\n{"prompt": "x"}\n')
    missing = suggest("--dataset", str(dataset), "--tokenizer", model)
    assert missing.exit_code == 2 and f"{dataset}:2: no field 'text' (found: prompt)" in missing.output
    dataset.write_text('{"text": "guard"}\nnot json\n')
    broken = suggest("--dataset", str(dataset), "--tokenizer", model)
    assert broken.exit_code == 2 and f"{dataset}:2: invalid JSON" in broken.output
    # The tiny model's config allows 512 positions; a longer prompt could never be compiled.
    dataset.write_text(json.dumps({"text": "guard " * 600}) + "\n")
    too_long = suggest("--dataset", str(dataset), "--tokenizer", model)
    assert (
        too_long.exit_code == 2
        and f"exceeds the model maximum 512 (max_position_embeddings of {model})" in too_long.output
    )
    no_tokenizer = suggest("--dataset", str(dataset))
    assert no_tokenizer.exit_code == 2 and "--dataset needs --tokenizer PATH" in no_tokenizer.output


def test_plot_is_a_png(lengths_file: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "buckets.png"
    result = suggest("--lengths", str(lengths_file), "--batch", "4", "--max-buckets", "3", "--plot", str(out))
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5000


def test_plot_without_matplotlib_names_the_extra(
    lengths_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what an install without the extra looks like
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    result = suggest("--lengths", str(lengths_file), "--plot", str(tmp_path / "x.png"))
    assert result.exit_code == 2
    assert result.output.strip() == "warmcache: error: --plot needs matplotlib: pip install 'warmcache[plot]'"


def test_suggest_from_a_lengths_file_does_not_import_torch(lengths_file: Path) -> None:
    code = textwrap.dedent(
        f"""
        import sys
        from warmcache.cli import main
        try:
            main(["buckets", "suggest", "--lengths", {str(lengths_file)!r}], standalone_mode=False)
        finally:
            print(sorted(m for m in ("torch", "transformers", "matplotlib") if m in sys.modules))
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip().splitlines()[-1] == "[]"
