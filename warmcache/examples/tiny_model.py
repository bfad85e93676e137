"""Build tiny, random-weight causal LMs with a real tokenizer, saved like a hub checkpoint.

The quickstart's models: no model hub is needed, so the quickstart, the tests, the
examples and the benchmarks build their models here from a config (Qwen3, Llama, ...)
and a BPE tokenizer trained on a small generated corpus, save them with
``save_pretrained`` and load them back through the real ``from_pretrained`` path.
Shipped with the wheel, so an install without the source tree runs it:

    python -m warmcache.examples.tiny_model .warmcache/models        # tiny-qwen3 and tiny-llama (the quickstart's)
    python -m warmcache.examples.tiny_model .warmcache/models --arch gemma2 --arch cohere2

:data:`ARCHITECTURES` is the support matrix (``tests/test_architectures.py``,
``warmcache_testkit.support_matrix``): one tiny config per popular decoder family, with a
sliding window of :data:`SLIDING_WINDOW` tokens where the family has one, so a
short decode already runs past the window.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PretrainedConfig

#: Where a family has sliding-window layers: small, so a short decode already runs past it.
SLIDING_WINDOW = 8
#: Per architecture: the transformers config class and what it needs beyond the common sizes.
#: Hybrid families (Gemma-2/3, Cohere-2) get one sliding and one full layer.
_HYBRID = {"sliding_window": SLIDING_WINDOW, "layer_types": ["sliding_attention", "full_attention"]}
#: Mamba-2 mixers at this width: 4 heads of 32 (expand 2 × hidden 64), a 16-wide state, chunks of 8 tokens.
_MAMBA = {"mamba_n_heads": 4, "mamba_d_head": 32, "mamba_d_state": 16, "mamba_chunk_size": 8}
_CONFIGS: dict[str, tuple[str, dict[str, object]]] = {
    "qwen3": ("Qwen3Config", {"head_dim": 16}),
    "llama": ("LlamaConfig", {"head_dim": 16}),
    "mistral": ("MistralConfig", {"head_dim": 16, "sliding_window": None}),
    "mistral-sliding": ("MistralConfig", {"head_dim": 16, "sliding_window": SLIDING_WINDOW}),
    "qwen2": ("Qwen2Config", {}),
    "qwen3-moe": (
        "Qwen3MoeConfig",
        {"head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32},
    ),
    "gemma2": ("Gemma2Config", {"head_dim": 16, **_HYBRID}),
    "gemma3-text": ("Gemma3TextConfig", {"head_dim": 16, **_HYBRID}),
    "phi3": ("Phi3Config", {}),
    "gpt-neox": ("GPTNeoXConfig", {}),
    "olmo2": ("Olmo2Config", {}),
    "granite": ("GraniteConfig", {}),
    "cohere2": ("Cohere2Config", {"head_dim": 16, **_HYBRID}),
    "smollm3": ("SmolLM3Config", {}),
    # Recurrent state: one conv or Mamba-2 / gated-delta layer beside one attention layer (Falcon-H1: both in
    # every layer). Mamba chunks of 8 tokens, so prompts and verify's one-pass reference span several chunks.
    "lfm2": ("Lfm2Config", {"layer_types": ["conv", "full_attention"]}),
    "granitemoehybrid": (
        "GraniteMoeHybridConfig",
        {"layer_types": ["linear_attention", "full_attention"], **_MAMBA, "num_local_experts": 4},
    ),
    "falcon-h1": ("FalconH1Config", {**_MAMBA, "mamba_d_head": 16, "mamba_d_ssm": 64, "head_dim": 16}),
    "bamba": ("BambaConfig", {"attn_layer_indices": [1], **_MAMBA}),
    "qwen3-next": (
        "Qwen3NextConfig",
        {
            "layer_types": ["linear_attention", "full_attention"],
            "head_dim": 16,
            "linear_key_head_dim": 16,
            "linear_value_head_dim": 16,
            "linear_num_key_heads": 2,
            "linear_num_value_heads": 4,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 32,
        },
    ),
}
ARCHITECTURES = tuple(_CONFIGS)
#: What ``python -m warmcache.examples.tiny_model ROOT`` builds: the quickstart's models.
DEFAULT_ARCHITECTURES = ("qwen3", "llama")
VOCAB_SIZE = 384
_WORDS = (
    "the a compile cache warm shape batch token neuron graph model train serve guard pad bucket "
    "fast slow first next every prompt length decode prefill step loss tensor device core chip"
).split()


def _corpus(lines: int = 400) -> list[str]:
    # Deterministic pseudo-sentences: enough variety for a few hundred BPE merges.
    return [" ".join(_WORDS[(i * 7 + j * 13 + i * j) % len(_WORDS)] for j in range(6 + i % 9)) for i in range(lines)]


def build_tokenizer(out_dir: Path) -> None:
    """Train a byte-level BPE tokenizer of :data:`VOCAB_SIZE` tokens on a generated corpus and save it in ``out_dir``
    (``<pad>`` is id 0, padding on the left, as a decoder-only model generates)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=["<pad>", "<s>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        padding_side="left",
    )
    fast.save_pretrained(out_dir)


#: The sizes every tiny config shares: 64 wide, 4 heads of 16 over 2 KV heads, a 384-token vocabulary.
TINY_SIZES: dict[str, object] = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    tie_word_embeddings=True,
    # Large enough that greedy decoding of random weights varies with the prompt,
    # so "padded output == unpadded output" is a real check, not a constant.
    initializer_range=0.5,
)


def build_config(arch: str, layers: int = 2) -> PretrainedConfig:
    """The transformers config of a tiny ``arch`` model of ``layers`` layers (:data:`TINY_SIZES` and the family's own
    keys); an architecture outside :data:`ARCHITECTURES` raises :class:`ValueError` naming the known ones."""
    common = {**TINY_SIZES, "num_hidden_layers": layers}
    if arch not in _CONFIGS:
        raise ValueError(f"unknown architecture {arch!r} (known: {', '.join(ARCHITECTURES)})")
    import transformers

    class_name, extra = _CONFIGS[arch]
    config: PretrainedConfig = getattr(transformers, class_name)(**common, **extra)
    return config


def build_tiny_model(arch: str, out_dir: Path, seed: int = 0, layers: int = 2) -> Path:
    """Write ``config.json``, weights and tokenizer of a tiny ``arch`` model into ``out_dir``; return ``out_dir``.

    ``seed`` seeds the random weights, ``layers`` is the depth. Idempotent: an existing complete folder (its
    ``warmcache-tiny.json`` marker written last) is left as it is.
    """
    import torch
    from transformers import AutoModelForCausalLM

    out_dir = Path(out_dir)
    marker = out_dir / "warmcache-tiny.json"
    if marker.is_file():
        return out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(build_config(arch, layers))
    model.generation_config.pad_token_id = 0
    model.save_pretrained(out_dir)
    build_tokenizer(out_dir)
    marker.write_text(json.dumps({"arch": arch, "seed": seed, "layers": layers}))
    return out_dir


def main() -> None:
    """``python -m warmcache.examples.tiny_model OUT_ROOT [--arch ARCH ...]``: one ``tiny-<arch>`` folder per model."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_root", type=Path, help="Folder that receives one sub-folder per model (tiny-<arch>).")
    parser.add_argument(
        "--arch", choices=ARCHITECTURES, action="append", help="Architecture(s) to build (default: qwen3 and llama)."
    )
    args = parser.parse_args()
    from transformers.utils.logging import disable_progress_bar

    disable_progress_bar()  # transformers' per-file bars ("Writing model shards", "Loading weights") are noise here
    for arch in args.arch or DEFAULT_ARCHITECTURES:
        path = build_tiny_model(arch, args.out_root / f"tiny-{arch}")
        print(f"tiny-{arch}: {path}")


if __name__ == "__main__":
    main()
