"""The higher-precision reference verify judges decodes against (``warmcache.warmup.verify.reference``), on the one
thing a one-pass forward over a padded batch can get wrong: a left-padded row."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from warmcache.examples.tiny_model import build_tiny_model
from warmcache.warmup.verify.reference import reference_logits


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_left_padded_row_has_the_reference_it_has_alone(dtype: torch.dtype, tmp_path: Path) -> None:
    """Gemma 2's eager attention softmaxes in float32, so a float64 reference's all-masked padding row was NaN, and
    0 x NaN carried it into the real positions of every later layer: gemma-2-2b's float32 packages were judged
    against NaN (found at real width by warmcache_testkit.support_matrix)."""
    model = AutoModelForCausalLM.from_pretrained(build_tiny_model("gemma2", tmp_path / "gemma2"), dtype=dtype).eval()
    assert model.config._attn_implementation == "eager"
    ids = torch.randint(5, 300, (2, 8), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :5], ids[1, :5] = 0, 0  # row 1: a 3-token prompt, left-padded to 8
    generated = torch.randint(5, 300, (2, 6), generator=torch.Generator().manual_seed(1))
    padded = reference_logits(model, ids, mask, generated)
    alone = reference_logits(model, ids[1:, 5:], mask[1:, 5:], generated[1:])
    assert padded.isfinite().all()
    # The same sums in another batch shape: float64's rounding for a float32 model, float32's for bfloat16.
    tolerance = 1e-9 if dtype == torch.float32 else 1e-4
    torch.testing.assert_close(padded[1:], alone, rtol=tolerance, atol=tolerance)


def test_a_float64_copy_runs_modeling_code_that_makes_tensors_in_the_default_dtype() -> None:
    """transformers' XGLM clamps its masked scores with ``torch.full((), finfo(scores.dtype).min)`` in the default
    dtype: a float64 copy's minimum overflowed float32 ("value cannot be converted to type float without overflow"),
    so verify failed every float32 XGLM bucket (the family sweep's one error row). The reference and the cache proof
    run the copy with its dtype as torch's default; the caller's default is back afterwards."""
    from transformers import XGLMConfig, XGLMForCausalLM

    config = XGLMConfig(vocab_size=128, d_model=32, num_layers=1, attention_heads=2, ffn_dim=64)
    model = XGLMForCausalLM(config).eval()
    ids = torch.randint(5, 128, (2, 6), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    generated = torch.randint(5, 128, (2, 3), generator=torch.Generator().manual_seed(1))
    logits = reference_logits(model, ids, mask, generated)
    assert logits.shape == (2, 3, 128) and logits.isfinite().all()
    assert torch.get_default_dtype() == torch.float32
