"""First ``generate()`` latency in a fresh process: empty Inductor cache vs a cache warmed by warmcache.

    python tools/bench/bench_coldstart.py [--model DIR] [--batches 1,4] [--layers 4] [--prompt 8] [--max-cache-len 32]
    python tools/bench/bench_coldstart.py --quick      # CI: aot_eager, batch 1, 2 layers; that it runs, not its figures

Every child runs with ``OMP_NUM_THREADS`` set (``--threads``, default 1): on a shared
machine two OpenMP threads made decode steps jump from 0.3 ms to 130-300 ms.

Each measurement is a fresh Python process (``--child``), so nothing of an earlier
compile survives in memory, on a tiny model on CPU with Inductor. Scenarios:

* ``cold``: an empty ``TORCHINDUCTOR_CACHE_DIR``: the first call compiles everything.
* ``warm``: the folder ``warmcache warmup`` filled for this exact shape.
* ``mega``: an empty folder plus ``torch.compiler.load_cache_artifacts()`` of the
  portable "mega-cache" saved by a warm process (what ships without the cache dir).
* ``precompiled``: the warm folder, served through ``ShapeGuard.prime()``, which loads
  each bucket's precompiled decode artifact (``precompile = true``) instead of tracing.
  Its "first token" is prime (artifact load + the first decode call) plus the first
  guarded request, broken down into importing Dynamo, the artifact load (with the
  imports deserialising needs), and the first call.
* ``aotinductor``: ``precompile = "aotinductor"``, served through ``ShapeGuard.prime()``
  from an empty Inductor cache folder: each bucket's AOTInductor package is loaded by
  the C++ loader and the model's weights are bound to it. Broken down into imports,
  model load, the registry read, package load + weight binding, prime, the first
  request and its first decode step; then a "compile overhead" line: the first request (prime included)
  against a steady-state request of the same process. Skipped by ``--quick`` (each
  package is a 20-40 s Inductor compile; ``tests/test_aotinductor.py`` covers it).

For each it prints the first ``generate()`` latency, the steady-state latency of
the next call, and where the first call's time went according to Dynamo's
compilation metrics: Dynamo tracing (frame compile minus backend), the backend
(AOTAutograd + Inductor: on a cache hit that is loading the cached graph and its
compiled C++), and the rest (eager prefill, generate() bookkeeping).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def child(args: argparse.Namespace) -> None:
    """One fresh process: import, load, optionally load a mega-cache, generate twice, report."""
    if args.precompiled:
        precompiled_child(args)
        return
    started = time.perf_counter()
    import torch
    from transformers import AutoModelForCausalLM

    from warmcache.modeling.compile_counter import CompileCounter
    from warmcache.modeling.generation import DECODE_TOKENS, compile_config, generate_kwargs, max_new_tokens_that_fit
    from warmcache.shapes.workload_settings import GenerateSettings
    from warmcache.warmup.workloads import token_ids

    imported = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    loaded = time.perf_counter()
    mega_s = 0.0
    if args.load_mega:
        begin = time.perf_counter()
        torch.compiler.load_cache_artifacts(Path(args.load_mega).read_bytes())
        mega_s = time.perf_counter() - begin
    ids = token_ids(model, args.batch, args.prompt)
    new = min(DECODE_TOKENS, max_new_tokens_that_fit(args.prompt, args.max_cache_len))

    def generate() -> float:
        # Built per call: each generate() fills a fresh cache object.
        kwargs = generate_kwargs(
            GenerateSettings(args.max_cache_len),
            max_new_tokens=new,
            config=compile_config(args.backend, "default", "cpu"),
            model_config=model.config,
        )
        begin = time.perf_counter()
        with torch.inference_mode():
            model.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), min_new_tokens=new, pad_token_id=0, **kwargs
            )
        return time.perf_counter() - begin

    with CompileCounter() as counter:
        first = generate()
    second = generate()
    metrics = torch._dynamo.utils.get_compilation_metrics()
    frame = sum(m.entire_frame_compile_time_s or 0.0 for m in metrics)
    backend = sum(m.backend_compile_time_s or 0.0 for m in metrics)
    if args.save_mega:
        artifacts = torch.compiler.save_cache_artifacts()
        if artifacts is not None:
            Path(args.save_mega).write_bytes(artifacts[0])
    print(
        json.dumps(
            {
                "import_s": imported - started,
                "load_s": loaded - imported,
                "mega_load_s": mega_s,
                "first_generate_s": first,
                "second_generate_s": second,
                "dynamo_trace_s": frame - backend,
                "backend_s": backend,
                "other_s": first - frame,
                "graphs": counter.graphs,
                "cache_hits": counter.cache_hits,
                "cache_misses": counter.cache_misses,
            }
        )
    )


def guarded_request_seconds(guard: Any, model: Any, ids: Any) -> float:
    """Seconds of one guarded ``generate()`` of ``DECODE_TOKENS`` new tokens (the request every scenario times)."""
    import torch

    from warmcache.modeling.generation import DECODE_TOKENS

    begin = time.perf_counter()
    guard.generate(
        model,
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=DECODE_TOKENS,
        min_new_tokens=DECODE_TOKENS,
    )
    return time.perf_counter() - begin


def precompiled_child(args: argparse.Namespace) -> None:
    """One fresh production process: import, load, prime from precompiled artifacts, serve one request."""
    started = time.perf_counter()
    import torch
    from transformers import AutoModelForCausalLM

    from warmcache.runtime.guard import ShapeGuard
    from warmcache.warmup.workloads import token_ids

    imported = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    guard = ShapeGuard.from_registry(args.registry, "bench", telemetry=False)
    loaded = time.perf_counter()
    # Dynamo's runtime (prime's sentinel and deserialising need it), timed on its own;
    # Inductor's compiler is not imported by a process that artifacts serve wholly.
    import torch._dynamo

    dynamo_imported = time.perf_counter()
    report = guard.prime(model)
    primed = time.perf_counter()
    ids = token_ids(model, args.batch, args.prompt)
    first = guarded_request_seconds(guard, model, ids)
    second = guarded_request_seconds(guard, model, ids)
    from torch._dynamo.utils import counters

    print(
        json.dumps(
            {
                "import_s": imported - started,
                "load_s": loaded - imported,
                "dynamo_import_s": dynamo_imported - loaded,
                "artifact_load_s": report.artifact_load_seconds,
                "prime_call_s": report.seconds - report.artifact_load_seconds,
                "artifacts": report.artifacts_loaded,
                "first_generate_s": first,
                "first_token_s": (dynamo_imported - loaded) + (primed - dynamo_imported) + first,
                "second_generate_s": second,
                "dynamo_frames": sum(counters["frames"].values()),
            }
        )
    )


def aotinductor_child(args: argparse.Namespace) -> None:
    """One fresh production process served by AOTInductor packages: import, load, prime, serve."""
    started = time.perf_counter()
    import torch
    from transformers import AutoModelForCausalLM

    from warmcache.artifacts.aoti_loader import PackagedDecodeStep
    from warmcache.runtime.guard import ShapeGuard
    from warmcache.warmup.workloads import token_ids

    imported = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    loaded = time.perf_counter()
    guard = ShapeGuard.from_registry(args.registry, "bench", telemetry=False)
    registry_read = time.perf_counter()
    first_step: list[float] = []
    step = PackagedDecodeStep.__call__

    def timed_step(self: PackagedDecodeStep, model: Any, /, **kwargs: Any) -> Any:
        begin = time.perf_counter()
        out = step(self, model, **kwargs)
        if not first_step:
            first_step.append(time.perf_counter() - begin)
        return out

    PackagedDecodeStep.__call__ = timed_step  # type: ignore[method-assign]  # timing only: the first package call
    report = guard.prime(model)
    primed = time.perf_counter()
    ids = token_ids(model, args.batch, args.prompt)
    first = guarded_request_seconds(guard, model, ids)
    steady = sorted(guarded_request_seconds(guard, model, ids) for _ in range(7))[3]
    from torch._dynamo.utils import counters

    compiler = (
        "torch._inductor.compile_fx",
        "torch._inductor.lowering",
        "torch._inductor.graph",
        "torch._inductor.codecache",
    )
    print(
        json.dumps(
            {
                "import_s": imported - started,
                "load_s": loaded - imported,
                "package_load_s": report.artifact_load_seconds,
                "packages": report.artifacts_loaded,
                "first_step_s": first_step[0] if first_step else float("nan"),
                "registry_s": registry_read - loaded,
                "prime_s": primed - registry_read,
                "first_generate_s": first,
                "first_request_s": (primed - registry_read) + first,
                "steady_s": steady,
                "dynamo_frames": sum(counters["frames"].values()),
                "compiler_modules": [m for m in compiler if m in sys.modules],
            }
        )
    )


def measure(args: argparse.Namespace, cache_dir: Path, *extra: str) -> dict[str, Any]:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache_dir), "OMP_NUM_THREADS": str(args.threads)}
    command = [
        sys.executable, __file__, "--child", "--model", str(args.model),
        "--batch", str(args.batch), "--prompt", str(args.prompt), "--max-cache-len", str(args.max_cache_len),
        "--backend", args.backend, *extra,
    ]  # fmt: skip
    result = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def warm_with_warmcache(
    args: argparse.Namespace,
    work: Path,
    cache_dir: Path,
    registry: str = "registry.sqlite",
    backend: str = "",
    precompile: str = "true",
) -> None:
    manifest = work / f"bench-{registry}.toml"
    manifest.write_text(
        f'[registry]\nurl = "sqlite:///{work / registry}"\n[cache]\ndir = "{cache_dir}"\n'
        f'[[model]]\nname = "bench"\npath = "{args.model}"\nbackend = '
        f'"{backend or args.backend}"\nprecompile = {precompile}\n'
        f"[[model.generate]]\nbatch_sizes = {args.batches}\nprompt_lengths = "
        f"[{args.prompt}]\nmax_cache_len = {args.max_cache_len}\n"
    )
    subprocess.run(
        [sys.executable, "-m", "warmcache", "warmup", str(manifest)], check=True, capture_output=True, text=True
    )


def show_aotinductor(r: dict[str, Any], cold: dict[str, Any]) -> None:
    compiler = ", ".join(r["compiler_modules"]) or "none"
    print(
        f"aoti  first request {r['first_request_s']:6.3f}s after model load  (package load + bind "
        f"{r['package_load_s'] * 1000:.1f} ms for {r['packages']}, "
        f"first decode step {r['first_step_s'] * 1000:.1f} ms, prime {r['prime_s']:.3f}s, first "
        f"request {r['first_generate_s']:.3f}s; "
        f"{r['dynamo_frames']} Dynamo frames, compiler modules imported: {compiler})  steady "
        f"request {r['steady_s']:.3f}s  "
        f"[import {r['import_s']:.1f}s, load {r['load_s']:.1f}s, registry read {r['registry_s']:.2f}s]"
    )
    print(
        "cold/aotinductor first request (after model load, prime included): "
        f"{cold['first_generate_s'] / r['first_request_s']:.0f}x; "
        "compile overhead: first request (prime included) / steady request "
        f"{r['first_request_s'] / r['steady_s']:.1f}x "
        f"(first request alone {r['first_generate_s'] / r['steady_s']:.1f}x)"
    )


def show(name: str, r: dict[str, Any]) -> None:
    if "artifact_load_s" in r:
        print(
            f"{name:<5} first token {r['first_token_s']:6.2f}s  (import dynamo {r['dynamo_import_s']:5.2f}s, "
            f"artifact load {r['artifact_load_s']:5.2f}s for {r['artifacts']}, prime call {r['prime_call_s']:5.2f}s, "
            f"first request {r['first_generate_s']:5.3f}s; {r['dynamo_frames']} Dynamo frames)  next "
            f"call {r['second_generate_s']:.3f}s  "
            f"[import {r['import_s']:.1f}s, load {r['load_s']:.1f}s]"
        )
        return
    print(
        f"{name:<5} first generate() {r['first_generate_s']:6.2f}s  (dynamo trace {r['dynamo_trace_s']:5.2f}s, "
        f"backend {r['backend_s']:5.2f}s, other {r['other_s']:5.2f}s; {r['cache_misses']} cache "
        f"misses, {r['cache_hits']} hits)  "
        f"next call {r['second_generate_s']:.3f}s  [import {r['import_s']:.1f}s, load {r['load_s']:.1f}s"
        + (f", mega-cache load {r['mega_load_s']:.2f}s]" if r["mega_load_s"] else "]")
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None, help="A causal LM folder (default: build a tiny Qwen3).")
    parser.add_argument(
        "--batches", default="1,4", help="Comma-separated batch sizes, each measured in its own processes."
    )
    parser.add_argument(
        "--layers", type=int, default=4, help="Layers of the tiny Qwen3 built when --model is not given."
    )
    parser.add_argument("--prompt", type=int, default=8)
    parser.add_argument("--max-cache-len", type=int, default=32)
    parser.add_argument("--backend", default="inductor", choices=("inductor", "aot_eager"))
    parser.add_argument("--quick", action="store_true", help="CI mode: aot_eager, batch 1, 2 layers, no mega-cache.")
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of every measured process.")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--aotinductor", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--precompiled", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--registry", help=argparse.SUPPRESS)
    parser.add_argument("--save-mega", help=argparse.SUPPRESS)
    parser.add_argument("--load-mega", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.backend = "eager"
    if args.child:
        aotinductor_child(args) if args.aotinductor else child(args)
        return
    if args.quick:
        args.backend, args.batches, args.layers = "aot_eager", "1", 2
    args.batches = [int(b) for b in str(args.batches).split(",")]
    with tempfile.TemporaryDirectory(prefix="warmcache-bench-") as tmp:
        work = Path(tmp)
        if args.model is None:
            from warmcache.examples.tiny_model import build_tiny_model

            args.model = build_tiny_model("qwen3", work / "tiny-qwen3", layers=args.layers)
        registry = f"sqlite:///{work / 'registry.sqlite'}"
        colds = {}
        for batch in args.batches:
            args.batch = batch
            colds[batch] = measure(args, work / f"cold-cache-{batch}")
        warm_with_warmcache(args, work, work / "warm-cache")
        if not args.quick:
            warm_with_warmcache(args, work, work / "aoti-cache", "aoti-registry.sqlite", "inductor", '"aotinductor"')
        print(
            f"tiny model {args.model.name} ({args.layers} layers), prompt={args.prompt} "
            f"max_cache_len={args.max_cache_len}, {args.backend} on CPU "
            f"({os.cpu_count()} cores, OMP_NUM_THREADS={args.threads})"
        )
        for batch in args.batches:
            args.batch, cold = batch, colds[batch]
            warm = measure(args, work / "warm-cache", "--save-mega", str(work / "mega.bin"))
            pre = measure(args, work / "warm-cache", "--precompiled", "--registry", registry)
            print(f"batch {args.batch}:")
            show("cold", cold)
            show("warm", warm)
            ratios = f"cold/warm first-call ratio: {cold['first_generate_s'] / warm['first_generate_s']:.1f}x"
            if not args.quick and (work / "mega.bin").is_file():
                mega = measure(args, work / f"mega-cache-{args.batch}", "--load-mega", str(work / "mega.bin"))
                show("mega", mega)
                ratios += f"; cold/mega: {cold['first_generate_s'] / mega['first_generate_s']:.1f}x"
            show("pre", pre)
            ratios += (
                "; cold/precompiled (first token incl. artifact load): "
                f"{cold['first_generate_s'] / pre['first_token_s']:.1f}x"
            )
            print(ratios)
            if pre["dynamo_frames"]:
                raise SystemExit(f"precompiled scenario compiled {pre['dynamo_frames']} Dynamo frames; expected none")
            if not args.quick:
                aoti = measure(
                    args,
                    work / f"aoti-empty-cache-{batch}",
                    "--aotinductor",
                    "--registry",
                    f"sqlite:///{work / 'aoti-registry.sqlite'}",
                )
                show_aotinductor(aoti, cold)
                if aoti["dynamo_frames"] or aoti["compiler_modules"]:
                    raise SystemExit(
                        f"aotinductor scenario traced {aoti['dynamo_frames']} frames / imported "
                        f"{aoti['compiler_modules']}; expected none"
                    )


if __name__ == "__main__":
    main()
