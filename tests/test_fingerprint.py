"""Fingerprints: what must and must not change them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from warmcache.errors import UsageError
from warmcache.identity.fingerprint import config_hash, current_toolchain, model_config_hash
from warmcache.targets.neuron import normalise_neuron_cc_flags

CONFIG = {
    "model_type": "qwen3",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "rope_scaling": {"rope_type": "default", "factor": 1.0},
    "_name_or_path": "/tmp/a",
    "transformers_version": "5.24.0",
    "eos_token_id": 2,
    "torch_dtype": "float32",
}


def test_graph_irrelevant_keys_do_not_change_the_config_hash() -> None:
    other = dict(
        CONFIG,
        _name_or_path="/elsewhere",
        transformers_version="5.25.0",
        eos_token_id=7,
        pad_token_id=0,
        torch_dtype="bfloat16",
    )
    assert config_hash(other) == config_hash(CONFIG)


def test_key_order_does_not_change_the_config_hash() -> None:
    reordered = dict(reversed(list(CONFIG.items())))
    reordered["rope_scaling"] = {"factor": 1.0, "rope_type": "default"}
    assert config_hash(reordered) == config_hash(CONFIG)


@pytest.mark.parametrize(
    "change",
    [
        {"hidden_size": 128},
        {"num_hidden_layers": 3},
        {"rope_scaling": {"rope_type": "linear", "factor": 2.0}},
        {"model_type": "llama"},
    ],
)
def test_graph_relevant_keys_change_the_config_hash(change: dict) -> None:
    assert config_hash(dict(CONFIG, **change)) != config_hash(CONFIG)


def test_model_config_hash_reads_config_json_only(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    assert model_config_hash(str(tmp_path)) == config_hash(CONFIG)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(UsageError, match="config.json"):
        model_config_hash(str(tmp_path))


def test_a_loaded_config_hashes_as_its_file_with_infinite_floats(tmp_path: Path) -> None:
    """transformers writes ``float("inf")`` into config.json as ``{"__float__": "Infinity"}``: the guard hashes the
    loaded config, plan the file, and both must name the same rows (Granite-4.0-H's ``time_step_limit``)."""
    from transformers import AutoConfig, GraniteMoeHybridConfig

    GraniteMoeHybridConfig(num_hidden_layers=2, time_step_limit=(0.0, float("inf"))).save_pretrained(tmp_path)
    assert '"__float__": "Infinity"' in (tmp_path / "config.json").read_text()
    loaded = AutoConfig.from_pretrained(tmp_path).to_diff_dict()
    assert loaded["time_step_limit"] == [0.0, float("inf")]
    assert config_hash(loaded) == model_config_hash(str(tmp_path))
    assert config_hash(dict(loaded, time_step_limit=[0.0, 1e9])) != config_hash(loaded)


def test_missing_config_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="config.json not found"):
        model_config_hash(str(tmp_path))
    with pytest.raises(UsageError, match="not a local folder"):
        model_config_hash("nobody/no-such-model")


def test_neuron_cc_flags_are_normalised() -> None:
    a = normalise_neuron_cc_flags("--model-type transformer -O1 --cache_dir=/var/tmp/x")
    b = normalise_neuron_cc_flags("-O1  --model-type=transformer --cache_dir /other --retry_failed_compilation")
    assert a == b == "--model-type=transformer -O1"
    assert normalise_neuron_cc_flags("-O2") != normalise_neuron_cc_flags("-O1")
    assert normalise_neuron_cc_flags(None) == ""


def test_toolchain_depends_on_backend_mode_and_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    base = current_toolchain("cpu", "inductor")
    assert base.hash == current_toolchain("cpu", "inductor").hash
    assert base.hash != current_toolchain("cpu", "aot_eager").hash
    assert base.hash != current_toolchain("cpu", "inductor", "max-autotune").hash
    assert dict(base.packages)["torch"] is not None
    monkeypatch.setenv("NEURON_CC_FLAGS", "-O1")
    neuron_a = current_toolchain("neuron", "neuron").hash
    monkeypatch.setenv("NEURON_CC_FLAGS", "-O2")
    assert current_toolchain("neuron", "neuron").hash != neuron_a
    monkeypatch.setenv("NEURON_CC_FLAGS", "-O2 --cache_dir=/x")
    assert current_toolchain("neuron", "neuron").hash == current_toolchain("neuron", "neuron").hash


def test_toolchain_hash_is_stable_across_processes() -> None:
    code = (
        "from warmcache.identity.fingerprint import current_toolchain; print(current_toolchain('cpu','inductor').hash)"
    )
    out = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
        for _ in range(2)
    }
    assert out == {current_toolchain("cpu", "inductor").hash}


def test_fingerprinting_does_not_import_torch() -> None:
    code = (
        "import sys; from warmcache.identity.fingerprint import current_toolchain; current_toolchain('cpu','inductor');"
        "from warmcache.cli import main; print('torch' in sys.modules, 'transformers' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False False"


def test_malformed_neuron_cc_flags_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEURON_CC_FLAGS", '--model-type "transformer')
    with pytest.raises(UsageError, match="NEURON_CC_FLAGS=.*No closing quotation"):
        current_toolchain("neuron", "neuron")
