"""warmcache on a decoder of real proportions: compile time, cache size, memory, guard overhead, cold vs warm.

    python tools/bench_realistic.py                  # 16 layers, hidden 1024, 32k vocab (~0.25B params), Inductor
    python tools/bench_realistic.py --layers 24 --hidden 2048
    python tools/bench_realistic.py --quick          # tiny sizes, aot_eager: checks the script works (CI)

A Llama-shaped model is built from a config with random weights (no download)
and warmed by ``warmcache warmup`` (a subprocess) on CPU. Printed, side by side
from one run:

* compile seconds per shape and the cache size on disk that warmup wrote;
* the warmup process's peak resident memory;
* the guard's own work per request (bucket decision, left padding, unpadding)
  as a fraction of one decode step of the primed model;
* the first ``generate()`` in a fresh process with an empty cache (cold) and
  with warmup's cache (warm), via ``tools/bench_coldstart.py``'s child.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_coldstart import measure  # noqa: E402


def build_model(args: argparse.Namespace, out: Path) -> Path:
    """Save a Llama-shaped causal LM of the requested size with random weights."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 11 // 4,
        num_hidden_layers=args.layers,
        num_attention_heads=args.hidden // 64,
        num_key_value_heads=max(1, args.hidden // 256),
        max_position_embeddings=4096,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config.pad_token_id = 0
    model.save_pretrained(out)
    return out


def warm(args: argparse.Namespace, model: Path, work: Path) -> dict[str, Any]:
    """``warmcache warmup`` in a subprocess: per-shape seconds, peak memory, cache size."""
    cache = work / "cache"
    manifest = work / "bench.toml"
    manifest.write_text(
        f'[registry]\nurl = "sqlite:///{work / "registry.sqlite"}"\n[cache]\ndir = "{cache}"\n'
        f'[[model]]\nname = "bench"\npath = "{model}"\nbackend = "{args.backend}"\n'
        f"[[model.generate]]\nbatch_sizes = {args.batch_sizes}\nprompt_lengths = [{args.prompt}]\nmax_cache_len = {args.max_cache_len}\n"
    )
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    result = subprocess.run([sys.executable, "-m", "warmcache", "warmup", str(manifest), "--json"], capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(f"warmup failed ({result.returncode}): {result.stderr[-2000:]}")
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    summary = json.loads(result.stdout)
    size = sum(p.stat().st_size for p in cache.rglob("*") if p.is_file()) if cache.exists() else 0
    return {
        "manifest": manifest,
        "cache": cache,
        "shapes": {s["spec"]: s["seconds"] for s in summary["specs"]},
        "seconds": summary["seconds"],
        # ru_maxrss is the largest child so far (KiB on Linux); warmup is the first child.
        "peak_gib": max(peak_kib, before) / 2**20,
        "cache_mib": size / 2**20,
    }


def guard_overhead(args: argparse.Namespace, model_dir: Path, registry_url: str, repeats: int) -> dict[str, float]:
    """The guard's per-request work vs one decode step of the primed model (same process, warm cache)."""
    import torch
    from transformers import AutoModelForCausalLM

    from warmcache.runtime.guard import ShapeGuard

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    guard = ShapeGuard.from_registry(registry_url, "bench", telemetry=False)
    try:
        guard.prime(model)
        ids = torch.randint(3, args.vocab, (1, args.prompt - 1))  # one short of the bucket: the guard pads
        inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        begin = time.perf_counter()
        for _ in range(repeats):
            fitted = guard.fit(inputs, 0)
            fitted.unpad(fitted.inputs["input_ids"])
        guard_s = (time.perf_counter() - begin) / repeats

        def generate(new_tokens: int) -> float:
            start = time.perf_counter()
            guard.generate(model, **inputs, max_new_tokens=new_tokens, min_new_tokens=new_tokens)
            return time.perf_counter() - start

        steps = min(8, args.max_cache_len - args.prompt)
        generate(steps)  # steady state
        step_s = (generate(steps + 1) - generate(1)) / steps
    finally:
        guard.close()
    return {"guard_s": guard_s, "decode_step_s": step_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--batch-sizes", type=lambda text: [int(b) for b in text.split(",")], default=[1, 4], help="e.g. 1,4")
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--max-cache-len", type=int, default=256)
    parser.add_argument("--backend", default="inductor", choices=("inductor", "aot_eager", "eager"))
    parser.add_argument("--quick", action="store_true", help="Tiny sizes and aot_eager: seconds, to check the script works.")
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of every measured process (as bench_coldstart).")
    args = parser.parse_args()
    if args.quick:
        args.layers, args.hidden, args.vocab, args.batch_sizes, args.prompt, args.max_cache_len, args.backend = 2, 128, 512, [1], 8, 16, "aot_eager"
    with tempfile.TemporaryDirectory(prefix="warmcache-realistic-") as tmp:
        work = Path(tmp)
        model = build_model(args, work / "model")
        params = sum(p.stat().st_size for p in (work / "model").glob("*.safetensors")) / 4 / 1e6
        warmed = warm(args, model, work)
        overhead = guard_overhead(args, model, f"sqlite:///{work / 'registry.sqlite'}", repeats=50 if args.quick else 1000)
        # First request in a fresh process, batch 1: an empty cache folder vs warmup's.
        first = argparse.Namespace(model=model, batch=args.batch_sizes[0], prompt=args.prompt, max_cache_len=args.max_cache_len, backend=args.backend, threads=args.threads)
        cold = measure(first, work / "empty-cache")
        warm_first = measure(first, warmed["cache"])
    print(
        f"decoder: {args.layers} layers, hidden {args.hidden}, vocab {args.vocab} ({params:.0f}M params, float32), "
        f"backend {args.backend}, CPU {os.cpu_count()} cores; batch sizes {args.batch_sizes}, prompt {args.prompt}, max_cache_len {args.max_cache_len}"
    )
    for spec, seconds in warmed["shapes"].items():
        print(f"  compile {seconds:7.1f}s  {spec}")
    print(f"  warmup total {warmed['seconds']:.1f}s, peak memory {warmed['peak_gib']:.2f} GiB, cache on disk {warmed['cache_mib']:.1f} MiB")
    fraction = overhead["guard_s"] / overhead["decode_step_s"]
    print(
        f"  guard per request {overhead['guard_s'] * 1e6:.0f} us vs one decode step {overhead['decode_step_s'] * 1e3:.1f} ms "
        f"(batch {args.batch_sizes[0]}): {fraction:.2%} of a step"
    )
    print(
        f"  first generate() in a fresh process: cold {cold['first_generate_s']:.1f}s, warm {warm_first['first_generate_s']:.1f}s "
        f"({cold['first_generate_s'] / warm_first['first_generate_s']:.1f}x); import {warm_first['import_s']:.1f}s, load {warm_first['load_s']:.1f}s"
    )


if __name__ == "__main__":
    main()
