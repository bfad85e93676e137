"""Build a model from a published ``config.json`` at its real width, depth cut, random weights, saved like a checkpoint.

Compile cost and compiled graphs depend on the config (widths, head_dim, rope
variant, softcapping, attention kinds, vocabulary, dtype), not on the weights'
values, so a model built here compiles exactly like the published checkpoint of
the same depth. Depth is what a test can afford to cut: ``--layers N`` keeps N
decoder layers, and a hybrid model (sliding and full attention layers) keeps at
least one layer of each kind, so every attention path is still compiled.

    python -m warmcache_testkit.real_model Qwen__Qwen3-0.6B .warmcache/models/qwen3-0.6b-2l
    python -m warmcache_testkit.real_model CONFIG.json OUT --layers 0       # every published layer
    python -m warmcache_testkit.real_model CONFIG.json OUT --init-std 0.2    # weights drawn wider than the config's

The folder gets ``config.json`` (the published one, depth cut), weights in the
published ``torch_dtype`` and a small BPE tokenizer (``warmcache/examples/tiny_model.py``), and
loads back through the real ``from_pretrained``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from warmcache.examples.tiny_model import build_tokenizer

#: Published configs kept in the project (``SOURCES.md`` there says where each came from).
#: The published configs kept in this package (their sources: ``realconfigs/SOURCES.md``).
REAL_CONFIGS = Path(__file__).resolve().parent / "realconfigs"
#: Weight spread that makes random-weight greedy decoding depend on the prompt at real
#: widths (with the published 0.02 many configs repeat one token whatever the input,
#: and a proof that compares tokens would compare constants).
DEFAULT_INIT_STD = 0.2


def projection_std(init_std: float, fan_in: int) -> float:
    """A projection's spread: ``init_std`` at fan-in 64, shrunk as ``1/sqrt(fan_in)`` so activations keep their scale
    at any width."""
    return init_std * (64 / max(64, fan_in)) ** 0.5


def real_configs() -> dict[str, Path]:
    """``{stem: path}`` of every published config kept in the project."""
    return {path.stem: path for path in sorted(REAL_CONFIGS.glob("*.json"))}


#: The config keys that set a width (not a count, a length or a vocabulary): ``--narrow`` divides these, so a test can
#: afford a model with every structural choice of the published one (expert count and top-k, latent attention's
#: split head dims, attention sinks, which layers are dense or sliding, rope scaling) in seconds.
WIDTH_KEYS = (
    "hidden_size",
    "intermediate_size",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
    "head_dim",
    "kv_lora_rank",
    "q_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
)


def narrowed(values: dict[str, Any], factor: int) -> dict[str, Any]:
    """``values`` with every width of :data:`WIDTH_KEYS` divided by ``factor``, every count (experts, routed per
    token, heads, layers) and the vocabulary as published.

    Widths stay multiples of 8, at least 8, as every published one is: ``torch._grouped_mm`` (transformers'
    default experts kernel) refuses rows whose stride is not a multiple of 16 bytes, so a width of 90 fails
    where 2880 runs."""
    out = dict(values)
    for key in WIDTH_KEYS:
        if isinstance(out.get(key), int):
            out[key] = max(8, out[key] // factor // 8 * 8)
    return out


def kept_layers(layer_types: list[str] | None, total: int, layers: int, *, widen: bool = True) -> list[int]:
    """Indices of the layers to keep: the first ``layers``, widened (unless ``widen`` is off) so each attention kind
    appears at least once."""
    if layers <= 0 or layers >= total:
        return list(range(total))
    keep = set(range(layers))
    if layer_types and widen:
        for kind in dict.fromkeys(layer_types):
            if not any(layer_types[i] == kind for i in keep):
                keep.add(layer_types.index(kind))
    return sorted(keep)


def cut_config(config_path: Path, layers: int, *, widen: bool = True, narrow: int = 1) -> Any:
    """The published config with its depth cut to ``layers`` (0: all), every per-layer list cut alike.

    A ``quantization_config`` is left out: it describes how the published weights are stored (gpt-oss's MXFP4),
    and kept, transformers would quantize the random float weights (or refuse them without its kernels)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(config_path)
    total = config.num_hidden_layers
    keep = kept_layers(getattr(config, "layer_types", None), total, layers, widen=widen)
    values = config.to_dict()
    values.pop("quantization_config", None)
    if narrow > 1:
        values = narrowed(values, narrow)
    for key, value in values.items():
        if isinstance(value, list) and len(value) == total and key != "architectures":
            values[key] = [value[i] for i in keep]
    values["num_hidden_layers"] = len(keep)
    return type(config).from_dict(values)


def random_model(
    config_path: Path,
    *,
    layers: int = 2,
    widen: bool = True,
    narrow: int = 1,
    seed: int = 0,
    init_std: float = DEFAULT_INIT_STD,
) -> Any:
    """The depth-cut model of ``config_path`` with random weights (drawn in float32) in the published dtype, in memory:
    what :func:`build_real_model` saves, for a test that needs no checkpoint on disk."""
    import torch
    from transformers import AutoModelForCausalLM

    config = cut_config(Path(config_path), layers, widen=widen, narrow=narrow)
    published_dtype = config.dtype or torch.float32
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.dim() > 1:  # norms and biases keep the model's own init
                parameter.normal_(0.0, init_std if "embed" in name else projection_std(init_std, parameter.shape[-1]))
    if model.generation_config.pad_token_id is None and config.pad_token_id is None:
        model.generation_config.pad_token_id = 0  # the tokenizer's <pad>
    return model.to(published_dtype)


def build_real_model(
    config_path: Path,
    out_dir: Path,
    *,
    layers: int = 2,
    widen: bool = True,
    narrow: int = 1,
    seed: int = 0,
    init_std: float = DEFAULT_INIT_STD,
) -> Path:
    """Write the depth-cut model of ``config_path`` into ``out_dir``; an existing complete folder is left as it is."""

    out_dir = Path(out_dir)
    marker = out_dir / "warmcache-real.json"
    recipe = {
        "config": Path(config_path).name,
        "layers": layers,
        "widen": widen,
        "narrow": narrow,
        "seed": seed,
        "init_std": init_std,
    }
    if marker.is_file() and json.loads(marker.read_text()) == recipe:
        return out_dir
    random_model(config_path, layers=layers, widen=widen, narrow=narrow, seed=seed, init_std=init_std).save_pretrained(
        out_dir
    )
    build_tokenizer(out_dir)
    marker.write_text(json.dumps(recipe))
    return out_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "config", help="A published config.json, or the stem of one in warmcache_testkit/realconfigs (Qwen__Qwen3-0.6B)"
    )
    parser.add_argument("out_dir", type=Path)
    parser.add_argument(
        "--layers",
        type=int,
        default=2,
        help="Decoder layers to keep (0: all; a hybrid model keeps one of each attention kind).",
    )
    parser.add_argument(
        "--no-widen",
        action="store_true",
        help="Keep exactly the first --layers layers, even if an attention kind is then missing (a model whose "
        "layers are too large to keep two, e.g. gpt-oss-20b in float32).",
    )
    parser.add_argument(
        "--narrow",
        type=int,
        default=1,
        help="Divide every width (hidden, intermediate, head and latent dims) by this, counts kept (tests).",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--init-std", type=float, default=DEFAULT_INIT_STD)
    args = parser.parse_args()
    from transformers.utils.logging import disable_progress_bar

    disable_progress_bar()  # transformers' per-file bars ("Writing model shards", "Loading weights") are noise here
    known = real_configs()
    path = known[args.config] if args.config in known else Path(args.config)
    if not path.is_file():
        parser.error(f"{args.config}: not a file, nor one of {', '.join(known)}")
    print(
        build_real_model(
            path,
            args.out_dir,
            layers=args.layers,
            widen=not args.no_widen,
            narrow=args.narrow,
            seed=args.seed,
            init_std=args.init_std,
        )
    )


if __name__ == "__main__":
    main()
