"""Which of transformers' experts implementations compiles whole, and how fast each decode step runs, per model.

transformers runs a mixture of experts' expert layer through one of ``experts_implementation``
(``eager``: a Python loop over the experts a batch hit; ``batched_mm``: each token's experts'
weights gathered and multiplied in one batched matmul; ``grouped_mm``: tokens sorted by expert and
``torch._grouped_mm``, the default). warmcache compiles the decode step whole, so an implementation
whose shapes depend on the routing (which experts were hit) cannot serve a compiled bucket. Per
implementation: whether one static-cache decode step compiles with ``fullgraph=True`` (Inductor),
the compile time, and the steady step time compiled and eager:

    python tools/bench/bench_experts.py .warmcache/models/Qwen__Qwen3-30B-A3B-1l --dtype bfloat16
    python tools/bench/bench_experts.py MODEL --dtype bfloat16 --implementation grouped_mm --layer-error
    python tools/bench/bench_experts.py --quick   # a tiny qwen3-moe built on the spot, transformers' default
                                                  # implementation only unless named: that the benchmark runs
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

IMPLEMENTATIONS = ("eager", "batched_mm", "grouped_mm")
#: transformers' own choice when a config names none.
DEFAULT_IMPLEMENTATION = "grouped_mm"
BATCH, PROMPT, MAX_CACHE_LEN, STEPS = 2, 8, 32, 8


def measure(path: Path, implementation: str, dtype: str) -> dict[str, Any]:
    """Prefill eagerly, then compile one decode step and time ``STEPS`` steps compiled and eager."""
    import torch
    from transformers import AutoModelForCausalLM, StaticCache

    torch._dynamo.reset()
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=getattr(torch, dtype), experts_implementation=implementation
    ).eval()
    cache = StaticCache(config=model.config, max_cache_len=MAX_CACHE_LEN)
    ids = torch.randint(5, 300, (BATCH, PROMPT), generator=torch.Generator().manual_seed(0))

    def step(token: Any, position: Any) -> Any:  # position a tensor: one graph for every step
        return model(input_ids=token, past_key_values=cache, cache_position=position).logits

    compiled = torch.compile(step, fullgraph=True, backend="inductor")
    out: dict[str, Any] = {"implementation": implementation, "dtype": dtype}
    with torch.no_grad():
        model(input_ids=ids, past_key_values=cache, cache_position=torch.arange(PROMPT))
        token = ids[:, -1:]
        begin = time.perf_counter()
        try:
            compiled(token, torch.tensor([PROMPT]))
        except Exception as error:  # noqa: BLE001 - the verdict is the measurement
            out["compiles"] = f"no: {type(error).__name__}: {str(error).splitlines()[0][:200]}"
            return out
        out["compiles"] = "yes"
        out["compile_s"] = round(time.perf_counter() - begin, 1)
        for name, run in (("compiled", compiled), ("eager", step)):
            begin = time.perf_counter()
            for position in range(PROMPT + 1, PROMPT + 1 + STEPS):
                run(token, torch.tensor([position]))
            out[f"{name}_step_ms"] = round((time.perf_counter() - begin) / STEPS * 1000, 1)
    return out


def layer_error(path: Path, implementation: str, dtype: str) -> dict[str, Any]:
    """The last layer's MoE block on one random decode batch: its largest output error against the same block in
    float32, relative to that output's largest value, eager, Inductor and AOTInductor in ``dtype``."""
    import tempfile

    import torch
    from transformers import AutoModelForCausalLM

    torch._dynamo.reset()
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=getattr(torch, dtype), experts_implementation=implementation
    ).eval()

    class Block(torch.nn.Module):
        def __init__(self, mlp: torch.nn.Module) -> None:
            super().__init__()
            self.mlp = mlp

        def forward(self, x: Any) -> Any:
            out = self.mlp(x)
            return out[0] if isinstance(out, tuple) else out  # some MoE blocks also return router logits

    block = Block(model.model.layers[-1].mlp).eval()
    block_dtype = getattr(torch, dtype)
    seeded = torch.Generator().manual_seed(0)
    x = torch.randn(BATCH, 1, model.config.hidden_size, generator=seeded).to(block_dtype)
    with torch.no_grad(), tempfile.TemporaryDirectory() as tmp:
        outputs = {
            "eager": block(x),
            "inductor": torch.compile(block, backend="inductor", fullgraph=True)(x),
        }
        package = torch._inductor.aoti_compile_and_package(
            torch.export.export(block, (x,)), package_path=f"{tmp}/block.pt2"
        )
        outputs["aotinductor"] = torch._inductor.aoti_load_package(package)(x)
        reference = block.float()(x.float())
    scale = reference.abs().max()
    errors = {name: round(float((out.float() - reference).abs().max() / scale), 4) for name, out in outputs.items()}
    return {"implementation": implementation, "dtype": dtype, **errors}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path, nargs="?", help="A model folder (warmcache_testkit.real_model).")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--implementation", choices=IMPLEMENTATIONS, action="append")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="Build a tiny qwen3-moe and measure it, the default implementation only unless named (CI's smoke run).",
    )
    parser.add_argument(
        "--layer-error",
        action="store_true",
        help="Instead: the last MoE block's error against float32, eager vs Inductor vs AOTInductor.",
    )
    args = parser.parse_args()
    if args.quick:
        # Every implementation runs the same code here, each an Inductor compile (about 20 s apiece on 2 cores).
        args.implementation = args.implementation or [DEFAULT_IMPLEMENTATION]
        with tempfile.TemporaryDirectory() as scratch:
            from warmcache.examples.tiny_model import build_tiny_model

            report(build_tiny_model("qwen3-moe", Path(scratch) / "moe"), args)
        return
    if args.model is None:
        parser.error("a model folder is required (or --quick)")
    report(args.model, args)


def report(model: Path, args: argparse.Namespace) -> None:
    """One JSON line per implementation, the compiled step's speed beside eager's as a ratio."""
    for implementation in args.implementation or IMPLEMENTATIONS:
        run = layer_error if args.layer_error else measure
        out = run(model, implementation, args.dtype)
        if "compiled_step_ms" in out:
            out["eager_over_compiled"] = round(out["eager_step_ms"] / max(out["compiled_step_ms"], 1e-3), 2)
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
