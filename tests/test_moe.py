"""Mixtures of experts with the structure of the published configs, in seconds: what would break the MoE path.

The three published MoE configs (``tests/support/warmcache_testkit/realconfigs``) are kept whole but for their widths
(``warmcache_testkit.real_model --narrow``: hidden, intermediate, head and latent dims divided by 32): Qwen3-30B-A3B's
128 experts with 8 routed per token, DeepSeek-V2-Lite's multi-head latent attention (keys and values of
different head dims), its dense first layer, shared experts and YaRN, gpt-oss-20b's attention sinks, expert
biases and alternating sliding and full layers. Each goes through the support matrix's generate route with
aot_eager (warmup decoding to a full cache, verify in a fresh process, a guard serving ragged requests with
0 graphs after priming and every row's tokens equal to its unpadded eager ``generate()``) and its training
step. At real width every route is ``warmcache_testkit.support_matrix --real`` (docs/measurements/architectures.md).
"""

from __future__ import annotations

import pytest
from warmcache_testkit.real_model import build_real_model, real_configs
from warmcache_testkit.support_matrix import PROMPT_LENGTHS, Prepared, prepare, serve

MOE_CONFIGS = ("Qwen__Qwen3-30B-A3B", "deepseek-ai__DeepSeek-V2-Lite", "openai__gpt-oss-20b")
NARROW = 32


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Prepared:
    root = tmp_path_factory.mktemp("moe")
    built = {
        name: build_real_model(real_configs()[name], root / "models" / name, layers=2, narrow=NARROW)
        for name in MOE_CONFIGS
    }
    return prepare(root, (), built=built)


@pytest.mark.slow
def test_narrow_cut_keeps_every_count_of_the_published_config(prepared: Prepared) -> None:
    from transformers import AutoConfig

    qwen = AutoConfig.from_pretrained(prepared.models["Qwen__Qwen3-30B-A3B"])
    assert (qwen.num_experts, qwen.num_experts_per_tok, qwen.hidden_size) == (128, 8, 64)
    deepseek = AutoConfig.from_pretrained(prepared.models["deepseek-ai__DeepSeek-V2-Lite"])
    assert (deepseek.n_routed_experts, deepseek.n_shared_experts, deepseek.first_k_dense_replace) == (64, 2, 1)
    assert deepseek.qk_nope_head_dim + deepseek.qk_rope_head_dim != deepseek.v_head_dim  # keys wider than values
    gpt_oss = AutoConfig.from_pretrained(prepared.models["openai__gpt-oss-20b"])
    assert gpt_oss.layer_types == ["sliding_attention", "full_attention"]
    assert getattr(gpt_oss, "quantization_config", None) is None  # random weights are not MXFP4


@pytest.mark.slow
@pytest.mark.parametrize("name", MOE_CONFIGS)
def test_moe_warms_verifies_and_serves_ragged_requests_without_compiling(prepared: Prepared, name: str) -> None:
    assert prepared.generate[name] == []
    assert prepared.verified[name] == ["replay-only"] * len(PROMPT_LENGTHS)
    served = serve(prepared, name)
    assert served.primed_graphs >= 1
    assert served.graphs_after_priming == 0
    assert served.mismatches == []
    assert served.tokens_compared > 0


@pytest.mark.slow
@pytest.mark.parametrize("name", MOE_CONFIGS)
def test_moe_training_step_warms(prepared: Prepared, name: str) -> None:
    assert prepared.train[name] == []


def test_narrowing_keeps_widths_grouped_mm_can_take_and_no_widen_keeps_exactly_the_depth() -> None:
    from warmcache_testkit.real_model import kept_layers, narrowed

    published = {"hidden_size": 2880, "head_dim": 64, "moe_intermediate_size": 1408, "num_local_experts": 32}
    narrow = narrowed(published, 32)
    assert narrow == {"hidden_size": 88, "head_dim": 8, "moe_intermediate_size": 40, "num_local_experts": 32}
    assert all(narrow[key] % 8 == 0 for key in ("hidden_size", "head_dim", "moe_intermediate_size"))
    kinds = ["sliding_attention", "full_attention"] * 12
    assert kept_layers(kinds, 24, 1) == [0, 1]  # widened: each attention kind kept
    assert kept_layers(kinds, 24, 1, widen=False) == [0]  # gpt-oss-20b in float32: one layer is what fits
