"""``warmcache_testkit.family_sweep``: every decoder family of the installed transformers, tiny, through the
matrix's cell.

The sweep is how a transformers upgrade's new families get tried before users bring
them; these tests keep its lists from rotting (a family renamed or dropped upstream, an
override its config class no longer takes) and run one family the support matrix does
not keep through the real cell.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
from warmcache_testkit.family_sweep import (
    DOCS_BEGIN,
    DOCS_END,
    FAMILY_OVERRIDES,
    MAX_TINY_PARAMETERS,
    NOT_DECODERS,
    families,
    markdown,
    read_rows,
    run_cell,
    tiny_config,
    update_docs,
)

from warmcache.examples.tiny_model import SLIDING_WINDOW


def test_every_family_the_sweep_names_is_one_transformers_registers() -> None:
    registered = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    assert NOT_DECODERS <= registered, sorted(NOT_DECODERS - registered)
    assert set(FAMILY_OVERRIDES) <= set(families()), sorted(set(FAMILY_OVERRIDES) - set(families()))


@pytest.mark.parametrize("family", sorted(FAMILY_OVERRIDES))
def test_each_override_makes_its_family_tiny(family: str) -> None:
    config = tiny_config(family)
    text = config.get_text_config(decoder=True)
    assert text.num_hidden_layers == 2
    assert text.vocab_size * text.hidden_size * 2 < MAX_TINY_PARAMETERS


@pytest.mark.slow
def test_deepseek_v3_which_the_matrix_does_not_keep_passes_the_cell(tmp_path: Path) -> None:
    """DeepSeek-V3's family (latent attention, routed and shared experts, a dense first layer): built from its config
    class alone, it warms, verifies, serves ragged requests as eager does and trains."""
    cell = run_cell("deepseek_v3", tmp_path)
    assert cell["generate"].startswith("pass: 0 graphs after priming"), cell
    assert cell["train"] == "pass", cell


@pytest.mark.slow
def test_recurrent_gemma_whose_first_decode_call_is_a_graph_of_its_own_serves_after_priming(tmp_path: Path) -> None:
    """RecurrentGemma keeps its conv state on its modules, laid out by its prefill otherwise than by its decode, so its
    first decode call and the steady one are two graphs. prime ran one decode call a bucket and loaded only the
    first: production's second token was refused as a recompile at every request."""
    cell = run_cell("recurrent_gemma", tmp_path)
    assert cell["generate"].startswith("pass: 0 graphs after priming"), cell
    assert cell["train"] == "pass", cell


@pytest.mark.parametrize(("family", "rounding"), [("hrm_text", True), ("lfm2-conv-bias", False)])
def test_only_float32_rounding_excuses_a_padded_row_that_differs_from_its_unpadded_run(
    family: str, rounding: bool, tmp_path: Path
) -> None:
    """The support matrix lets a padded row through that differs from its unpadded run only where transformers' own
    padded decode gives the same tokens and float64 shows the padding changes nothing. A pad that reaches the state
    (LFM2 with a trained conv bias) gives transformers' padded tokens too, and must stay a mismatch."""
    from types import SimpleNamespace

    import torch
    from transformers import AutoModelForCausalLM
    from warmcache_testkit.family_sweep import build_family_model
    from warmcache_testkit.support_matrix import _float32_rounding, _ragged

    from warmcache.examples.tiny_model import build_config

    if family == "hrm_text":
        path = build_family_model(family, tmp_path / family)
    else:
        torch.manual_seed(0)
        config = build_config("lfm2")
        config.conv_bias = True
        biased = AutoModelForCausalLM.from_config(config)
        with torch.no_grad():
            for name, parameter in biased.named_parameters():
                if name.endswith("in_proj.bias"):
                    parameter.normal_()  # a trained bias is not zero (transformers initialises it to zero)
        path = tmp_path / family
        biased.save_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids, mask = _ragged((5, 8), 1)
    padded = model.generate(
        input_ids=ids, attention_mask=mask, max_new_tokens=17, min_new_tokens=17, do_sample=False, pad_token_id=0
    )[0, 8:]  # the best a guard can give row 0: transformers' own decode of the padded batch
    fitted = SimpleNamespace(inputs={"input_ids": ids, "attention_mask": mask})
    assert _float32_rounding(path, model, fitted, 0, 5, padded) is rounding


def test_sliding_window_only_where_the_family_declares_one() -> None:
    """transformers' caches read ``sliding_window`` off any config without ``layer_types``: given to BLOOM, whose
    attention has no window, it windowed BLOOM's cache but not its mask, and verify disproved warmcache's (right)
    decode against transformers' (wrong) one."""
    assert not hasattr(tiny_config("bloom"), "sliding_window")
    assert tiny_config("mistral").sliding_window == SLIDING_WINDOW


def test_a_run_rewrites_the_docs_pass_list_and_table_between_the_markers() -> None:
    """A family that now passes leaves the table for the list, one that now fails leaves the list for the table
    with its verdict, a new passing one joins the list; families not run, and the text around, stay as they were."""
    docs = (
        f"before\n{DOCS_BEGIN}\n**2 of the 5 families pass every cell** (...): `llama`, `opt`.\n\nThe others, and "
        f"why:\n\n| family | what happened |\n| --- | --- |\n| `bloom` | disproven |\n| `rwkv` | refused |\n"
        f"{DOCS_END}\nafter\n"
    )
    passed = {"layers": "full", "generate": "pass: 0 graphs after priming", "train": "pass", "s": "9"}
    rows = [
        {**passed, "family": "bloom"},
        {**passed, "family": "gpt2"},
        {**passed, "family": "opt", "generate": "FAIL: verify: RuntimeError: overflow"},
    ]
    assert read_rows(markdown(rows, 1.0)) == rows  # what --out wrote is what --rows reads
    updated = update_docs(docs, rows, total=5)
    assert updated.startswith(f"before\n{DOCS_BEGIN}\n") and updated.endswith(f"{DOCS_END}\nafter\n")
    assert "**3 of the 5 families pass every cell**" in updated
    assert "): `bloom`, `gpt2`, `llama`.\n" in updated
    table = [line for line in updated.splitlines() if line.startswith("| `")]
    assert table == ["| `opt` | FAIL: verify: RuntimeError: overflow; train: pass |", "| `rwkv` | refused |"]
    assert update_docs(updated, rows, total=5) == updated  # the same rows again change nothing
