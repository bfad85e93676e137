"""Manifest validation: every rule has a bad input, its message and its exit code."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from warmcache.cli import main
from warmcache.errors import ManifestError
from warmcache.manifest import load_manifest, loads

#: Validation reads no model: the folder named here need not exist.
GOOD = """
[[model]]
name = "m"
path = "/models/tiny-qwen3"
[[model.generate]]
batch_sizes = [1, 2]
prompt_lengths = [8, 16]
max_cache_len = 32
[[model.train]]
batch_sizes = [2]
seq_lengths = [16]
"""


def test_good_manifest_expands_to_specs(write_manifest) -> None:
    manifest = load_manifest(write_manifest(GOOD))
    specs = manifest.specs()
    assert [(s.workload, s.batch_size, s.seq_len) for s in specs] == [
        ("generate", 1, 8),
        ("generate", 1, 16),
        ("generate", 2, 8),
        ("generate", 2, 16),
        ("train", 2, 16),
    ]
    model = manifest.models[0]
    assert (model.device, model.backend, model.dtype, model.mode) == ("cpu", "inductor", "float32", "default")
    assert specs[0].family.max_cache_len == 32 and specs[-1].family.max_cache_len is None
    assert len({s.shape_hash for s in specs}) == len(specs)


def test_defaults_per_device_and_relative_paths(write_manifest, tmp_path: Path) -> None:
    path = write_manifest(
        """
        [registry]
        url = "sqlite:///reg.sqlite"
        [cache]
        dir = "cache"
        [[model]]
        name = "n"
        path = "./not-downloaded"
        device = "neuron"
        dtype = "bf16"
        [[model.generate]]
        batch_sizes = 1
        prompt_lengths = [4]
        max_cache_len = 8
        """
    )
    manifest = load_manifest(path)
    model = manifest.models[0]
    assert model.backend == "neuron" and model.dtype == "bfloat16"
    assert model.path == str(tmp_path / "not-downloaded")
    assert manifest.registry and manifest.registry.url == f"sqlite:///{tmp_path / 'reg.sqlite'}"
    assert manifest.cache_dir == tmp_path / "cache"


def test_a_plain_registry_path_resolves_against_the_manifest_folder(write_manifest, tmp_path: Path) -> None:
    path = write_manifest('[registry]\nurl = "reg.sqlite"\n' + GOOD)
    registry = load_manifest(path).registry
    assert registry and (registry.url, registry.source) == (
        f"sqlite:///{tmp_path / 'reg.sqlite'}",
        f"{path} [registry] url",
    )


def test_hub_ids_stay_hub_ids(write_manifest) -> None:
    path = write_manifest(
        '[[model]]\nname = "q"\npath = "Qwen/Qwen3-0.6B"\n[[model.train]]\nbatch_sizes = [1]\nseq_lengths = [8]\n'
    )
    assert load_manifest(path).models[0].path == "Qwen/Qwen3-0.6B"


BAD_CASES = {
    "unknown top key": ('[registy]\nurl = "x"\n' + GOOD, "registy: unknown key (did you mean 'registry'?)"),
    "unknown model key": (
        GOOD.replace('name = "m"', 'name = "m"\ndtyp = "bf16"'),
        "model[0].dtyp: unknown key (did you mean 'dtype'?)",
    ),
    "unknown generate key": (
        GOOD.replace("max_cache_len = 32", "max_cache_len = 32\nnum_beam = 2"),
        "model[0].generate[0].num_beam: unknown key (did you mean 'num_beams'?)",
    ),
    "wrong type": (
        GOOD.replace("batch_sizes = [1, 2]", 'batch_sizes = ["1"]'),
        "model[0].generate[0].batch_sizes[0]: must be an integer, got '1' (str)",
    ),
    "bool is not an int": (
        GOOD.replace("max_cache_len = 32", "max_cache_len = true"),
        "model[0].generate[0].max_cache_len: must be an integer, got True (bool)",
    ),
    "size zero": (
        GOOD.replace("batch_sizes = [1, 2]", "batch_sizes = [1, 0]"),
        "model[0].generate[0].batch_sizes[1]: must be > 0, got 0",
    ),
    "negative size": (
        GOOD.replace("seq_lengths = [16]", "seq_lengths = [-16]"),
        "model[0].train[0].seq_lengths[0]: must be > 0, got -16",
    ),
    "empty list": (
        GOOD.replace("batch_sizes = [2]", "batch_sizes = []"),
        "model[0].train[0].batch_sizes: must be a non-empty list of integers",
    ),
    "missing key": (GOOD.replace("max_cache_len = 32", ""), "model[0].generate[0].max_cache_len: missing required key"),
    "prompt overflows cache": (
        GOOD.replace("max_cache_len = 32", "max_cache_len = 16"),
        "model[0].generate[0].prompt_lengths: prompt length 16 + 1 new token exceeds max_cache_len 16",
    ),
    "unknown dtype": (GOOD.replace('name = "m"', 'name = "m"\ndtype = "fp8"'), "model[0].dtype: unknown dtype 'fp8'"),
    "device auto": (
        GOOD.replace('name = "m"', 'name = "m"\ndevice = "auto"'),
        "model[0].device: 'auto' is refused: with device_map='auto' a Neuron model silently loads on CPU",
    ),
    "unknown device": (
        GOOD.replace('name = "m"', 'name = "m"\ndevice = "cdua"'),
        "model[0].device: unknown value 'cdua' (allowed: neuron, cpu, cuda); did you mean 'cuda'?",
    ),
    # Spelling alone would answer "gpu" with "cpu", one letter away: the opposite of what was meant.
    "gpu means cuda": (
        GOOD.replace('name = "m"', 'name = "m"\ndevice = "gpu"'),
        "model[0].device: unknown value 'gpu' (allowed: neuron, cpu, cuda); did you mean 'cuda'?",
    ),
    "trainium means neuron": (
        GOOD.replace('name = "m"', 'name = "m"\ndevice = "Trainium"'),
        "model[0].device: unknown value 'Trainium' (allowed: neuron, cpu, cuda); did you mean 'neuron'?",
    ),
    "another case": (
        GOOD.replace('name = "m"', 'name = "m"\ndevice = "CPU"'),
        "model[0].device: unknown value 'CPU' (allowed: neuron, cpu, cuda); did you mean 'cpu'?",
    ),
    "backend for wrong device": (
        GOOD.replace('name = "m"', 'name = "m"\nbackend = "neuron"'),
        "model[0].backend: backend 'neuron' does not compile for device 'cpu'",
    ),
    "duplicate model": (GOOD + GOOD, "model[1].name: duplicate model name 'm' (first used by model[0])"),
    "bad name": (
        GOOD.replace('name = "m"', 'name = "my model"'),
        "model[0].name: 'my model' must start with a letter or digit",
    ),
    "no workload": ('[[model]]\nname = "m"\npath = "x"\n', "model[0]: model 'm' declares no workload"),
    "no model": ('[registry]\nurl = "sqlite:///x.db"\n', "model: no [[model]] entries"),
    "tp size zero": (
        GOOD.replace('name = "m"', 'name = "m"\ndistributed = { tp_size = 0 }'),
        "model[0].distributed.tp_size: must be > 0, got 0",
    ),
    "num_return_sequences": (
        GOOD.replace("max_cache_len = 32", "max_cache_len = 32\nnum_return_sequences = 2"),
        "model[0].generate[0].num_return_sequences: 2 exceeds num_beams 1",
    ),
    "invalid toml": ("[[model]\nname=", "invalid TOML"),
}


@pytest.mark.parametrize("case", sorted(BAD_CASES), ids=sorted(BAD_CASES))
def test_bad_manifest_names_file_key_and_value(case: str, write_manifest, tmp_path: Path) -> None:
    text, expected = BAD_CASES[case]
    path = write_manifest(text)
    with pytest.raises(ManifestError) as info:
        load_manifest(path)
    assert expected in str(info.value)
    assert str(path) in str(info.value)

    db = tmp_path / "reg.sqlite"
    result = CliRunner().invoke(main, ["plan", str(path), "--db", f"sqlite:///{db}"])
    assert result.exit_code == 2, result.output
    assert f"warmcache: error: {path}" in result.stderr
    assert expected in result.stderr
    assert "Traceback" not in result.output
    assert not db.exists(), "a bad manifest must not touch the registry"


def test_each_table_lists_the_keys_its_dataclass_declares() -> None:
    """The allowed keys come from the schema's fields (a renamed or added field changes these lines)."""
    text = "zz = 1\n[registry]\nzz = 1\n[cache]\nzz = 1\n[store]\nzz = 1\n[trust]\nzz = 1\n" + GOOD.replace(
        'name = "m"', 'name = "m"\nzz = 1\ndistributed = { zz = 1 }'
    ).replace("max_cache_len = 32", "max_cache_len = 32\nzz = 1").replace(
        "seq_lengths = [16]", "seq_lengths = [16]\nzz = 1"
    )
    with pytest.raises(ManifestError) as info:
        loads(text, "m.toml")
    assert info.value.problems == [
        "m.toml: zz: unknown key (allowed: registry, cache, store, trust, model)",
        "m.toml: registry.zz: unknown key (allowed: url, lease_seconds)",
        "m.toml: cache.zz: unknown key (allowed: dir)",
        "m.toml: trust.zz: unknown key (allowed: keys)",
        "m.toml: store.zz: unknown key (allowed: url, endpoint_url, push, max_pull_size, sign_key)",
        "m.toml: model 'm': model[0].zz: unknown key (allowed: name, path, revision, dtype, "
        "device, backend, mode, attn_implementation, precompile, package_prefill, distributed, generate, train)",
        "m.toml: model 'm': model[0].distributed.zz: unknown key (allowed: tp_size, fsdp_size)",
        "m.toml: model 'm': model[0].generate[0].zz: unknown key (allowed: batch_sizes, "
        "prompt_lengths, max_cache_len, num_beams, num_return_sequences, do_sample, "
        "prefill_chunk_size, cache_implementation)",
        "m.toml: model 'm': model[0].train[0].zz: unknown key (allowed: batch_sizes, "
        "seq_lengths, bf16, gradient_checkpointing)",
    ]


def test_every_problem_is_reported_one_per_line(write_manifest) -> None:
    text = GOOD.replace("batch_sizes = [1, 2]", "batch_sizes = [0]").replace(
        'name = "m"', 'name = "m"\ndevice = "auto"'
    )
    with pytest.raises(ManifestError) as info:
        load_manifest(write_manifest(text))
    assert len(info.value.problems) == 2
    assert all("\n" not in p for p in info.value.problems)


def test_missing_manifest_file(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["plan", str(tmp_path / "nope.toml")])
    assert result.exit_code == 2
    assert f"{tmp_path / 'nope.toml'}: manifest not found" in result.stderr


def test_example_manifest_validates() -> None:
    root = Path(__file__).resolve().parents[1]
    manifest = load_manifest(root / "examples" / "tiny-cpu.toml")
    assert {m.name for m in manifest.models} == {"tiny-qwen3", "tiny-llama"}


@pytest.mark.parametrize(
    ("path_value", "expected"),
    [
        ("./not-downloaded", "is not a folder"),
        ("/no/such/model/folder", "is not a folder"),
        ("org/name/extra", "is neither a folder nor a valid hub id"),
        ("not-in-the-hf-cache", "not a local folder and its config.json is not in the Hugging Face cache"),
    ],
)
def test_an_unreachable_model_path_is_one_line_naming_file_key_and_value(
    path_value: str, expected: str, tmp_path: Path
) -> None:
    manifest = tmp_path / "manifest.toml"
    manifest.write_text(GOOD.replace('path = "/models/tiny-qwen3"', f'path = "{path_value}"'))
    db = tmp_path / "reg.sqlite"
    result = CliRunner().invoke(main, ["plan", str(manifest), "--db", f"sqlite:///{db}"])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"warmcache: error: {manifest}: model 'm': model[0].path: ")
    assert path_value.lstrip("./") in lines[0] and expected in lines[0]
    assert "Traceback" not in result.output


def test_a_problem_in_a_named_model_says_which_model_it_is() -> None:
    """In a manifest of many models an index alone is hard to find: once an entry's name is read, its problems carry
    it."""
    text = GOOD + GOOD.replace('name = "m"', 'name = "tiny-llama"').replace(
        "prompt_lengths = [8, 16]", "prompt_lengths = [8, 40]"
    )
    with pytest.raises(ManifestError) as info:
        loads(text + '[[model]]\nname = "bad name"\npath = "x"\n', "m.toml")
    assert info.value.problems == [
        "m.toml: model 'tiny-llama': model[1].generate[0].prompt_lengths: prompt length 40 + 1 "
        "new token exceeds max_cache_len 32",
        "m.toml: model[2].name: 'bad name' must start with a letter or digit and use only "
        "letters, digits, '.', '_' and '-'",  # no name to give
    ]


@pytest.mark.parametrize("text", ["s3://bucket/prefix", "file:///srv/store", "oci://registry.example/team/cache:v1"])
def test_a_store_url_is_the_same_location_from_the_manifest_and_from_the_flag(text: str, write_manifest) -> None:  # type: ignore[no-untyped-def]
    from warmcache.store import store_location

    manifest = load_manifest(write_manifest(f'[store]\nurl = "{text}"\n' + GOOD))
    assert manifest.store.url is not None and manifest.store.url.url == text
    assert store_location(text).url == store_location(None, manifest).url == text


def test_a_plain_store_path_is_a_folder_from_the_manifest_and_from_the_flag(
    write_manifest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """A folder path is accepted by both; the manifest's anchors at its folder, the flag's at the working folder."""
    from warmcache.store import store_location

    monkeypatch.delenv("WARMCACHE_STORE", raising=False)
    path = write_manifest('[store]\nurl = "shared/store"\n' + GOOD)
    assert store_location(None, load_manifest(path)).url == (path.parent / "shared/store").resolve().as_uri()
    monkeypatch.chdir(tmp_path)
    assert store_location("here/store").url == (tmp_path / "here/store").resolve().as_uri()


def test_an_unknown_store_scheme_is_refused_alike_by_the_manifest_and_the_flag(write_manifest) -> None:  # type: ignore[no-untyped-def]
    from warmcache.errors import UsageError
    from warmcache.store import store_location
    from warmcache.store_location import ACCEPTED_FORMS

    with pytest.raises(ManifestError) as manifest_error:
        load_manifest(write_manifest('[store]\nurl = "gs://bucket"\n' + GOOD))
    with pytest.raises(UsageError) as flag_error:
        store_location("gs://bucket")
    assert "store.url: 'gs://bucket': unknown scheme 'gs'" in str(manifest_error.value)
    assert str(flag_error.value) == f"--store 'gs://bucket': unknown scheme 'gs'; give {ACCEPTED_FORMS}"
    assert ACCEPTED_FORMS in str(manifest_error.value)
