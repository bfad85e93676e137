"""The agreement criterion's figures on one published config: a right compiled decode, the eager decode, wrong ones.

For ``verify``'s criterion (``warmcache/warmup/verify/agreement.py``) to be chosen from
measurements: on a real-width model cut to ``--layers``, in ``--dtype``, under whatever
``ATEN_CPU_CAPABILITY`` this process runs with, greedy-decode to a static cache's end
through Inductor (``generate()``'s own compiled decode: what a right package computes),
then measure against the higher-precision one-pass reference on the same tokens (as verify does:
``judge_decode``, router near-ties of a mixture of experts included):

* the eager decode in the model's dtype (the criterion's calibration);
* the compiled decode (must pass);
* the eager decode of the same config with other weights, with one layer's MLP
  output scaled by 1.05, and with each decode step's keys and values written one slot
  early in the first attention layer's cache (each must fail).

Prints one JSON line: each decode's largest and mean per-step logit RMS distance over the step's RMS, and
each as a ratio to the eager decode's (the criterion bounds the first by ``FACTOR``, the second by ``MEAN_FACTOR``).

    ATEN_CPU_CAPABILITY=avx2 python tools/sweeps/criterion_figures.py Qwen__Qwen3-0.6B --dtype bfloat16 --layers 2
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from warmcache_testkit.real_model import build_real_model, real_configs

BATCH, PROMPT, MAX_CACHE_LEN = 2, 8, 24


def _scaled_mlp(model: Any, factor: float) -> Any:
    """Scale what the first decoder layer's MLP (or mixture of experts) adds to the residual by ``factor``: a 5 % wrong
    layer. Where a norm follows the MLP (Gemma 2's ``post_feedforward_layernorm``), its output: a norm would undo a
    scaled MLP output (gemma-2-2b measured the same distance with and without it). Returns the hook's handle."""
    layer = model.model.layers[0]
    block = (
        getattr(layer, "post_feedforward_layernorm", None)
        or getattr(layer, "mlp", None)
        or getattr(layer, "feed_forward", None)
        or layer.block_sparse_moe
    )
    return block.register_forward_hook(
        lambda _m, _i, out: tuple(o * factor for o in out) if isinstance(out, tuple) else out * factor
    )


def _early_cache_write(cache: Any) -> None:
    """Make the first attention layer of ``cache`` write each decode step's keys and values one slot early, over the
    previous token's: a wrong cache write (an off-by-one write position), the layer's other steps untouched."""
    from transformers.cache_utils import StaticLayer

    layer = next(layer for layer in cache.layers if isinstance(layer, StaticLayer))
    update = layer.update

    def early(key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> Any:
        if not layer.is_initialized or key_states.shape[-2] != 1:
            return update(key_states, value_states, *args, **kwargs)
        layer.cumulative_length.sub_(1)
        written = update(key_states, value_states, *args, **kwargs)
        layer.cumulative_length.add_(1)
        return written

    layer.update = early


def main() -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from warmcache.modeling.generation import compile_config, generate_kwargs, max_new_tokens_that_fit
    from warmcache.shapes.workload_settings import GenerateSettings
    from warmcache.warmup.verify.agreement import eager_decode_logits, judge_decode
    from warmcache.warmup.verify.reference import routed_reference

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--models", type=Path, default=Path(tempfile.gettempdir()) / "warmcache-criterion-models")
    parser.add_argument("--no-compile", action="store_true", help="Skip the Inductor decode (eager figures only).")
    args = parser.parse_args()
    known = {**{p.stem: p for p in Path("/work/shared/realconfigs").glob("*.json")}, **real_configs()}
    path = known.get(args.config, Path(args.config))
    dtype = getattr(torch, args.dtype)
    started = time.perf_counter()
    folders = {
        seed: build_real_model(path, args.models / f"{path.stem}-{args.layers}l-s{seed}", layers=args.layers, seed=seed)
        for seed in (0, 1)
    }
    right = AutoModelForCausalLM.from_pretrained(folders[0], dtype=dtype).eval()
    ids = torch.randint(5, 300, (BATCH, PROMPT), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    new = max_new_tokens_that_fit(PROMPT, MAX_CACHE_LEN)
    config = compile_config("inductor", "default", "cpu")

    def fresh() -> dict[str, Any]:  # a static cache object per call
        return generate_kwargs(
            GenerateSettings(MAX_CACHE_LEN), max_new_tokens=new, config=config, model_config=right.config
        )

    kwargs = fresh()
    with torch.no_grad():
        out = right.generate(
            input_ids=ids,
            attention_mask=mask,
            min_new_tokens=new,
            pad_token_id=0,
            output_logits=True,
            return_dict_in_generate=True,
            **({**kwargs, "disable_compile": True} if args.no_compile else kwargs),
        )
    tokens = out.sequences[:, PROMPT:]
    served = torch.stack(out.logits, dim=1)
    routed = routed_reference(right, ids, mask, tokens)  # one reference for every decode judged below
    eager = eager_decode_logits(right, ids, mask, tokens, pad_token_id=0, **fresh())
    figures: dict[str, Any] = {
        "config": path.stem,
        "dtype": args.dtype,
        "layers": args.layers,
        "capability": os.environ.get("ATEN_CPU_CAPABILITY") or torch.backends.cpu.get_cpu_capability(),
        "compiled": not args.no_compile,
    }
    # One copy of the model at a time beside the right one (a mixture of experts at real width fills a machine):
    # the 5 % wrong layer is the right model with a hook, the other weights are loaded for their decode alone.
    hook = _scaled_mlp(right, 1.05)
    scaled = eager_decode_logits(right, ids, mask, tokens, pad_token_id=0, **fresh())
    hook.remove()
    early = fresh()
    _early_cache_write(early["cache"])
    early_write = eager_decode_logits(right, ids, mask, tokens, pad_token_id=0, **early)
    other = AutoModelForCausalLM.from_pretrained(folders[1], dtype=dtype).eval()
    other_logits = eager_decode_logits(other, ids, mask, tokens, pad_token_id=0, **fresh())
    del other
    decodes = {"right": served, "other_weights": other_logits, "mlp_x1.05": scaled, "cache_write_early": early_write}
    for name, logits in decodes.items():
        verdict = judge_decode(right, ids, mask, tokens, eager, logits, routed)
        figures[name] = {
            "error": verdict.logit_error,
            "mean": verdict.mean_logit_error,
            "agrees": verdict.agrees,
            "rerouted": verdict.rerouted_steps,
            "ratio": (verdict.logit_error or 0) / verdict.eager_logit_error,
            "mean_ratio": (verdict.mean_logit_error or 0) / verdict.eager_mean_logit_error,
        }
        figures["eager"] = verdict.eager_logit_error
        figures["eager_mean"] = verdict.eager_mean_logit_error
        figures["allowed"] = verdict.allowed_logit_error
        figures["allowed_mean"] = verdict.allowed_mean_logit_error
        figures["floor"] = verdict.floor
    figures["seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
