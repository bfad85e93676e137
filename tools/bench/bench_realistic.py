"""warmcache on a published model config at full size: every route's warmup, verify and production start, from one run.

    python tools/bench/bench_realistic.py                                   # Qwen3-0.6B, all 28 layers, float32
    python tools/bench/bench_realistic.py --config meta-llama__Llama-3.2-1B --layers 4 --dtype bfloat16
    python tools/bench/bench_realistic.py --routes aotinductor --new-tokens 32
    python tools/bench/bench_realistic.py --quick                        # CI: tiny Qwen3, aot_eager; checks the script
    runs

The model is built from the published ``config.json`` (``tests/support/warmcache_testkit/realconfigs``) at its
real width with random weights (``warmcache_testkit.real_model``; compile cost depends on the
config, not on the weights' values). Each route warms its own cache folder and registry
with ``warmcache warmup`` and proves it with ``warmcache verify`` (subprocesses), then a
fresh production process starts from it as a pod would: from a signed guard snapshot
(``warmcache guard export --sign``) beside the cache entries, no registry database. Routes:

* ``inductor``: plain ``torch.compile`` warmup; production primes the guard from the Inductor cache;
* ``precompile``: ``precompile = true``, each bucket's decode step saved with ``aot_compile``;
* ``aotinductor``: ``precompile = "aotinductor"``, each bucket's decode step an AOTInductor
  package, loaded by the C++ loader (no compiler in the production process).

Printed side by side: per route, warmup seconds, the warmup process's peak RSS, bytes
written to its cache folder, verify seconds; per production start (fresh processes, timed
after the model is loaded): the start (reading and checking the snapshot, ``ShapeGuard.prime``), the first request, the
steady request of the same size in the same process (median of 3), and the first
request's compile overhead (start + first - steady), in wall seconds and in CPU seconds
(the process's and its compile workers': unlike wall time, not inflated by whatever else
the machine runs), against ``cold``: a fresh process with an empty cache
whose first ``generate()`` compiles. Last, the AOTInductor package build against the
plain Inductor warmup of the same bucket.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from warmcache_testkit.real_model import build_real_model, real_configs
from warmcache_testkit.route_warmup import ROUTES, Warmed, export_snapshot, run_measured, warm

from warmcache.examples.tiny_model import build_tiny_model

COMPILER_MODULES = (
    "torch._inductor.compile_fx",
    "torch._inductor.lowering",
    "torch._inductor.graph",
    "torch._inductor.codecache",
)
#: Steady requests timed after the first; the median is reported.
STEADY_REPEATS = 3
#: The smallest overhead a ratio divides by (seconds): below it, or the steady spread, only a bound is printed.
RESOLUTION_S = 0.01


def parameters(model: Path) -> int:
    """Parameters saved in a checkpoint folder, read from the safetensors headers (no weights loaded)."""
    from safetensors import safe_open

    total = 0
    for path in model.glob("*.safetensors"):
        with safe_open(path, "pt") as tensors:
            total += sum(math.prod(tensors.get_slice(name).get_shape()) for name in tensors.keys())
    return total


def start(
    args: argparse.Namespace,
    route: str,
    model: Path,
    env: dict[str, str],
    snapshot: Path | None,
    trusted: Path | None,
    inductor_cache: Path,
) -> dict[str, Any]:
    """A fresh production process (``--child``): its start, first and steady request, and what it compiled."""
    command = [
        sys.executable,
        __file__,
        "--child",
        route,
        "--model",
        str(model),
        "--dtype",
        args.dtype,
        "--batch",
        str(args.batch),
    ]
    command += [
        "--prompt",
        str(args.prompt),
        "--max-cache-len",
        str(args.max_cache_len),
        "--new-tokens",
        str(args.new_tokens),
        "--backend",
        args.backend,
    ]
    command += ["--snapshot", str(snapshot), "--trust", str(trusted)] if snapshot and trusted else []
    _, _, out = run_measured(command, {**env, "TORCHINDUCTOR_CACHE_DIR": str(inductor_cache)})
    return dict(json.loads(out.strip().splitlines()[-1]))


def cpu_seconds() -> float:
    """CPU seconds this process and its finished children (Inductor's compile workers) used: what a request costs,
    whatever else the machine runs."""
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def child(args: argparse.Namespace) -> None:
    """One production process: load the model, start (prime, or nothing when cold), time the first and steady
    requests."""
    import torch
    from transformers import AutoModelForCausalLM

    from warmcache.modeling.compile_counter import CompileCounter
    from warmcache.modeling.generation import compile_config, generate_kwargs
    from warmcache.runtime.guard import ShapeGuard
    from warmcache.shapes.workload_settings import GenerateSettings
    from warmcache.warmup.workloads import token_ids

    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=getattr(torch, args.dtype)).eval()
    ids = token_ids(model, args.batch, args.prompt)
    mask = torch.ones_like(ids)
    new = args.new_tokens
    begin, begin_cpu = time.perf_counter(), cpu_seconds()
    if args.child == "cold":
        config = compile_config(args.backend, "default", "cpu")

        def request() -> None:
            kwargs = generate_kwargs(
                GenerateSettings(args.max_cache_len), max_new_tokens=new, config=config, model_config=model.config
            )
            with torch.inference_mode():
                model.generate(input_ids=ids, attention_mask=mask, min_new_tokens=new, pad_token_id=0, **kwargs)

    else:
        guard = ShapeGuard.from_snapshot(args.snapshot, "bench", trust=[args.trust])
        guard.prime(model)

        def request() -> None:
            guard.generate(model, input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new)

    started, started_cpu = time.perf_counter(), cpu_seconds()
    with CompileCounter() as counter:
        request()
    first, first_cpu = time.perf_counter(), cpu_seconds()
    steady, steady_cpu = [], []
    for _ in range(STEADY_REPEATS):
        tick, tick_cpu = time.perf_counter(), cpu_seconds()
        request()
        steady.append(time.perf_counter() - tick)
        steady_cpu.append(cpu_seconds() - tick_cpu)
    from torch._dynamo.utils import counters

    result = {
        "start_s": started - begin,
        "start_cpu_s": started_cpu - begin_cpu,
        "first_s": first - started,
        "first_cpu_s": first_cpu - started_cpu,
        "steady_s": sorted(steady)[len(steady) // 2],
        "steady_cpu_s": sorted(steady_cpu)[len(steady_cpu) // 2],
        "steady_spread_s": max(steady) - min(steady),
        "steady_spread_cpu_s": max(steady_cpu) - min(steady_cpu),
        "graphs": counter.graphs,
        "frames": sum(counters["frames"].values()),
        "compiler_modules": [m for m in COMPILER_MODULES if m in sys.modules],
    }
    print(json.dumps(result))


def overhead(r: dict[str, Any], clock: str = "") -> float:
    """What the first request cost beyond a steady one, the start included (``clock="cpu"``: in CPU seconds)."""
    suffix = "_cpu_s" if clock == "cpu" else "_s"
    return float(r["start" + suffix] + r["first" + suffix] - r["steady" + suffix])


def versus_cold(cold: dict[str, Any], r: dict[str, Any], clock: str = "") -> str:
    """Cold's overhead over ``r``'s, as ``"237x"``; ``"≥4615x"`` when ``r``'s is within its steady requests' spread.

    An overhead that small (even negative: start + first request faster than the median
    steady one) cannot be told apart from run-to-run noise, so the ratio is only bounded,
    by the spread (at least :data:`RESOLUTION_S`), never divided by a near-zero difference.
    """
    suffix = "_cpu_s" if clock == "cpu" else "_s"
    noise = max(float(r.get("steady_spread" + suffix, 0.0)), RESOLUTION_S)
    mine = overhead(r, clock)
    return f"{overhead(cold, clock) / mine:.0f}x" if mine > noise else f"≥{overhead(cold, clock) / noise:.0f}x"


def shown_route(route: str, backend: str) -> str:
    """A route as the report's rows name it: the plain ``torch.compile`` route (``--routes inductor``) by the backend
    it ran (the header said ``aot_eager`` and its row ``inductor``)."""
    return backend if route == "inductor" else route


def report(args: argparse.Namespace, warmed: list[Warmed], starts: dict[str, dict[str, Any]], params_m: float) -> None:
    print(
        f"{args.label}: {params_m:.0f}M parameters, {args.dtype}, backend {args.backend}, CPU "
        f"{os.cpu_count()} cores (OMP_NUM_THREADS={args.threads}); "
        f"batch {args.batch}, prompt {args.prompt}, max_cache_len {args.max_cache_len}, requests "
        f"of {args.new_tokens} new tokens"
    )
    print(f"{'route':<12} {'warmup':>8} {'peak RSS':>9} {'written':>10} {'verify':>8}")
    for w in warmed:
        print(
            f"{shown_route(w.route, args.backend):<12} {w.warmup_s:7.1f}s {w.peak_rss_gib:7.2f}GiB "
            f"{w.bytes_written / 2**20:8.1f}MiB "
            f"{w.verify_s:7.1f}s{'' if w.verified else '  NOT VERIFIED'}"
        )
    cold = starts["cold"]
    print(
        f"{'start':<12} {'start':>8} {'first':>8} {'steady':>8} {'overhead':>9} {'vs cold':>8} "
        f"{'CPU overhead':>13} {'vs cold':>8}  compiled in production"
    )
    for name, r in starts.items():
        versus = "" if name == "cold" else versus_cold(cold, r)
        versus_cpu = "" if name == "cold" else versus_cold(cold, r, "cpu")
        modules = ", ".join(r["compiler_modules"]) or "none"
        compiled = f"{r['graphs']} graphs, {r['frames']} Dynamo frames, compiler modules: {modules}"
        print(
            f"{shown_route(name, args.backend):<12} {r['start_s']:7.2f}s {r['first_s']:7.2f}s {r['steady_s']:7.2f}s "
            f"{overhead(r):8.2f}s {versus:>8} {overhead(r, 'cpu'):12.2f}s {versus_cpu:>8}  {compiled}"
        )
    by_route = {w.route: w for w in warmed}
    if "aotinductor" in by_route and "inductor" in by_route:
        package, plain = by_route["aotinductor"].spec_s, by_route["inductor"].spec_s
        print(
            f"package build {package:.1f}s vs plain Inductor warmup of the same bucket {plain:.1f}s "
            f"({package / plain:.2f}x)"
        )
    if "aotinductor" in starts:
        packaged = starts["aotinductor"]
        print(
            f"aotinductor: first-request compile overhead {overhead(packaged):.3f}s "
            f"(steady requests spread {packaged['steady_spread_s']:.3f}s): cold's {overhead(cold):.1f}s is "
            f"{versus_cold(cold, packaged)} that (CPU: {versus_cold(cold, packaged, 'cpu')}); "
            f"packaged first request {packaged['first_s'] / packaged['steady_s']:.2f}x a steady request"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--config",
        default="Qwen__Qwen3-0.6B",
        help="A published config.json, or the stem of one in tests/support/warmcache_testkit/realconfigs.",
    )
    parser.add_argument("--layers", type=int, default=0, help="Decoder layers to keep (0: all the config has).")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--max-cache-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=16, help="New tokens of each timed request.")
    parser.add_argument("--routes", default=",".join(ROUTES), help=f"Comma-separated, of {', '.join(ROUTES)}.")
    parser.add_argument("--backend", default="inductor", choices=("inductor", "aot_eager"))
    # Two OpenMP threads on a shared machine made requests 2-8x slower and erratic (spin-waits on a busy core): one is
    # steady.
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="OMP_NUM_THREADS of every measured process (default 1: steady on a shared machine).",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="A tiny Qwen3, aot_eager, the inductor route only: checks the script runs, not its figures.",
    )
    parser.add_argument("--child", choices=("cold", *ROUTES), help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--snapshot", help=argparse.SUPPRESS)
    parser.add_argument("--trust", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    routes = [r.strip() for r in args.routes.split(",")]
    unknown = sorted(set(routes) - set(ROUTES))
    if unknown:
        parser.error(f"--routes: unknown {', '.join(unknown)} (known: {', '.join(ROUTES)})")
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    with tempfile.TemporaryDirectory(prefix="warmcache-realistic-") as tmp:
        work = Path(tmp)
        if args.quick:
            routes, args.backend, args.prompt, args.max_cache_len, args.new_tokens = ["inductor"], "aot_eager", 8, 16, 4
            model, args.label = build_tiny_model("qwen3", work / "model"), "tiny Qwen3 (--quick)"
        else:
            known = real_configs()
            config = known[args.config] if args.config in known else Path(args.config)
            model = build_real_model(config, work / "model", layers=args.layers)
            layers = json.loads((model / "config.json").read_text())["num_hidden_layers"]
            args.label = f"{config.stem} ({layers} layers, real width, random weights)"
        params_m = parameters(model) / 1e6
        warmed = [warm(args, route, model, work, env) for route in routes]
        starts = {"cold": start(args, "cold", model, env, None, None, work / "cold-cache")}
        key = work / "signing-key"
        run_measured([sys.executable, "-m", "warmcache", "keys", "generate", str(key)], env)
        for w in warmed:
            # The package route needs no Inductor cache at all: its process gets an empty one.
            inductor_cache = w.root / "cache" if w.route != "aotinductor" else work / "empty-cache"
            starts[w.route] = start(
                args,
                w.route,
                model,
                env,
                export_snapshot(w.root, key, env),
                key.with_name(key.name + ".pub"),
                inductor_cache,
            )
    report(args, warmed, starts, params_m)
    if not all(w.verified for w in warmed):
        raise SystemExit("a route did not verify")


if __name__ == "__main__":
    main()
