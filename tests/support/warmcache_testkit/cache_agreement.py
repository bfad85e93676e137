"""Whose cache is at fault: a family's greedy decode through each cache against one forward pass, in float64.

Verify's cache proof compares warmcache's static-cache decode with transformers' own
decode; when it disproves a family, either cache may be the wrong one. This decodes a
tiny random-weight model of the family (``warmcache_testkit.family_sweep``'s config) with
``generate()`` through transformers' dynamic cache, transformers' static cache and
warmcache's :class:`warmcache.modeling.kv_cache.PositionTensorCache`, each with an
all-ones attention mask and with none (what production sends when a model drops an
all-ones mask), and compares every step's logits with one cache-free forward pass over
the same tokens: the model's own definition of the answer. The figure is the largest
``|logit - reference| / std(reference)`` over the decode; ``generate()`` hands its
logits back in float32, so about 1e-7 is agreement.

    python -m warmcache_testkit.cache_agreement --family bloom --family gpt_neo
    python -m warmcache_testkit.cache_agreement --family bloom --config sliding_window=8   # the sweep's old stray key

The figures of the last run are in docs/measurements/architectures.md.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from warmcache_testkit.family_sweep import tiny_config

CACHES = ("dynamic", "transformers static", "warmcache")


def agreement(
    family: str, overrides: dict[str, Any], prompt: int = 8, new_tokens: int = 16, max_cache_len: int = 32
) -> dict[str, float]:
    """``{"<cache>, mask <ones|none>": max |Δ logit| / std}`` for each cache and mask."""
    import torch
    from transformers import AutoModelForCausalLM

    from warmcache.modeling.kv_cache import PositionTensorCache

    config = tiny_config(family)
    for key, value in overrides.items():
        setattr(config, key, value)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval().to(torch.float64)
    ids = torch.randint(3, 300, (1, prompt), generator=torch.Generator().manual_seed(1))
    cache_kwargs: dict[str, Any] = {
        "dynamic": lambda: {},
        "transformers static": lambda: {"cache_implementation": "static"},
        "warmcache": lambda: {"cache": PositionTensorCache(config, max_cache_len), "cache_implementation": None},
    }
    figures = {}
    for cache in CACHES:
        for mask in ("ones", "none"):
            out = model.generate(
                ids,
                **({"attention_mask": torch.ones_like(ids)} if mask == "ones" else {}),
                **cache_kwargs[cache](),
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=0,
                output_logits=True,
                return_dict_in_generate=True,
            )
            with torch.no_grad():
                reference = model(input_ids=out.sequences, use_cache=False).logits[0, prompt - 1 : -1]
            decoded = torch.stack(out.logits)[:, 0].to(torch.float64)
            figures[f"{cache}, mask {mask}"] = float((decoded - reference).abs().max() / reference.std())
    return figures


def _override(text: str) -> tuple[str, Any]:
    key, _, value = text.partition("=")
    return key, json.loads(value)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", action="append", required=True, help="Family (model_type) to decode.")
    parser.add_argument(
        "--config", action="append", type=_override, default=[], help="KEY=JSON set on the tiny config."
    )
    parser.add_argument("--max-cache-len", type=int, default=32, help="warmcache's and transformers' static length.")
    args = parser.parse_args()
    from transformers.utils.logging import disable_progress_bar, set_verbosity_error

    disable_progress_bar()
    set_verbosity_error()
    print("| family | " + " | ".join(f"{c}, mask {m}" for c in CACHES for m in ("ones", "none")) + " |")
    print("| --- |" + " --- |" * 2 * len(CACHES))
    for family in args.family:
        figures = agreement(family, dict(args.config), max_cache_len=args.max_cache_len)
        print(f"| {family} | " + " | ".join(f"{v:.3g}" for v in figures.values()) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
