"""Start to first token: a fresh process (or container) serving from packages, beside the eager floor and cold.

    python tools/bench_start.py                       # Qwen3-0.6B, all 28 layers, float32, AOTInductor packages
    python tools/bench_start.py --work DIR            # keep the model, packages and key in DIR: later runs reuse them
    python tools/bench_start.py --launcher 'podman run --rm -v {work}:{work}:ro -v {tools}:{tools}:ro {env} IMAGE'
    python tools/bench_start.py --quick               # CI: tiny Qwen3, aot_eager, one run; checks the script runs

The model is built from Qwen3-0.6B's published ``config.json`` at real width and depth with
random weights (``tools/real_model.py``), warmed once through the AOTInductor route
(``warmcache warmup``, ``precompile = "aotinductor"``) and exported as a signed guard
snapshot beside the packages, as a pod's image volume holds it (``tools/bench_realistic.py``
does both). Then each scenario is a fresh process, timed from the moment the parent
launches it (interpreter start, or container start with ``--launcher``) to its first
generated token and to the end of its first full request:

* ``floor``: the eager model and nothing else: imports, weight load, one eager ``generate()``.
  No warmcache import: what any server pays before it can answer.
* ``packages``: what a pod pays: the same, plus importing warmcache, building the guard from
  the signed snapshot (reading it, checking its signature) and priming (loading each
  bucket's package and binding the weights); an empty Inductor cache, no compiler imported.
* ``cold``: an empty Inductor cache and ``torch.compile``: the first request compiles.

The child stamps wall-clock time after each phase (Python start, ``import torch``,
``import transformers``, weight load, warmcache import, guard build, prime, first token,
the rest of the request); the table shows each phase's seconds and the totals, the median
of ``--runs`` fresh processes. warmcache's share is the packages' first token minus the
floor's, and its own phases (import + guard + prime) measured inside the process.

``--launcher`` is a command prefix the child's ``python`` line is appended to, with
``{work}``, ``{tools}`` (folders the child must see at the same paths) and ``{env}``
(``-e NAME=VALUE`` for each variable the child needs) filled in.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TOOLS = Path(__file__).resolve().parent
SCENARIOS = ("floor", "packages", "cold")
#: Phases in the order a child stamps them; a scenario skips those it does not have.
PHASES = (
    ("python", "process start → Python running"),
    ("torch", "import torch"),
    ("transformers", "import transformers"),
    ("weights", "weight load"),
    ("warmcache", "import warmcache"),
    ("guard", "guard build (snapshot + signature)"),
    ("prime", "prime (package load + bind)"),
    ("first_token", "first token"),
    ("request", "rest of the first request"),
)
#: warmcache's own phases in a pod's start.
WARMCACHE_PHASES = ("warmcache", "guard", "prime")
COMPILER_MODULES = ("torch._inductor.compile_fx", "torch._inductor.lowering", "torch._inductor.graph")


class FirstToken:
    """A ``generate()`` streamer that stamps the first generated token (its first ``put`` is the prompt)."""

    def __init__(self) -> None:
        self.puts = 0
        self.at = 0.0

    def put(self, value: Any) -> None:
        self.puts += 1
        if self.puts == 2:
            self.at = time.time()

    def end(self) -> None:
        pass


def child(args: argparse.Namespace) -> None:
    """One fresh process: stamp each phase of its start, serve one request, print the stamps as JSON."""
    stamps = {"python": time.time()}
    import torch

    stamps["torch"] = time.time()
    from transformers import AutoModelForCausalLM

    stamps["transformers"] = time.time()
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    stamps["weights"] = time.time()
    # Drawn with torch alone, so the floor imports nothing of warmcache's.
    ids = torch.randint(
        1, min(1000, model.config.vocab_size), (1, args.prompt), generator=torch.Generator().manual_seed(0)
    )
    mask, new = torch.ones_like(ids), args.new_tokens
    if args.child == "floor":

        def request(streamer: FirstToken) -> None:
            with torch.inference_mode():
                model.generate(
                    input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, streamer=streamer
                )

    elif args.child == "packages":
        from warmcache import ShapeGuard

        stamps["warmcache"] = time.time()
        guard = ShapeGuard.from_snapshot(args.snapshot, "bench", trust=[args.trust])
        stamps["guard"] = time.time()
        guard.prime(model)
        stamps["prime"] = time.time()

        def request(streamer: FirstToken) -> None:
            guard.generate(
                model, input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, streamer=streamer
            )

    else:
        from warmcache.modeling.generation import compile_config, generate_kwargs
        from warmcache.shapes.workload_settings import GenerateSettings

        stamps["warmcache"] = time.time()
        config = compile_config(args.backend, "default", "cpu")

        def request(streamer: FirstToken) -> None:
            # Built per call: each generate() fills a fresh cache object.
            kwargs = generate_kwargs(
                GenerateSettings(args.max_cache_len), max_new_tokens=new, config=config, model_config=model.config
            )
            with torch.inference_mode():
                model.generate(
                    input_ids=ids, attention_mask=mask, min_new_tokens=new, pad_token_id=0, streamer=streamer, **kwargs
                )

    first = FirstToken()
    request(first)
    stamps["request"], stamps["first_token"] = time.time(), first.at
    # The same request again: what every request costs, against which the first one's extra shows.
    second = FirstToken()
    request(second)
    again = {"second_first_token": second.at - stamps["request"], "second_request": time.time() - second.at}
    from torch._dynamo.utils import counters

    frames = sum(counters["frames"].values())
    compiler = [m for m in COMPILER_MODULES if m in sys.modules]
    print(json.dumps({"stamps": stamps, "again": again, "frames": frames, "compiler_modules": compiler}))


def phases(launched: float, stamps: dict[str, float]) -> dict[str, float]:
    """Seconds of each phase a child went through, from its stamps and the moment it was launched."""
    order = [name for name, _ in PHASES if name in stamps]
    seconds, previous = {}, launched
    for name in order:
        at = stamps[name]  # the first token lands inside the request: the request's phase is what follows it
        seconds[name] = at - previous
        previous = at
    seconds["to_first_token"] = stamps["first_token"] - launched
    seconds["to_request"] = stamps["request"] - launched
    return seconds


def launch(args: argparse.Namespace, scenario: str, work: Path, snapshot: Path, trust: Path) -> dict[str, Any]:
    """Run one fresh child of ``scenario`` (through ``--launcher`` if given); its phases, frames and compiler
    modules."""
    with tempfile.TemporaryDirectory(prefix="warmcache-start-cache-", dir=work) as inductor_cache:
        env = {"OMP_NUM_THREADS": str(args.threads), "TORCHINDUCTOR_CACHE_DIR": inductor_cache}
        python = [args.python, str(Path(__file__).resolve()), "--child", scenario, "--model", str(work / "model")]
        python += ["--snapshot", str(snapshot), "--trust", str(trust), "--backend", args.backend]
        python += ["--prompt", str(args.prompt), "--new-tokens", str(args.new_tokens)]
        python += ["--max-cache-len", str(args.max_cache_len)]
        prefix: list[str] = []
        if args.launcher:
            flags = " ".join(f"-e {name}={value}" for name, value in env.items())
            prefix = shlex.split(args.launcher.format(work=work, tools=TOOLS, env=flags))
        launched = time.time()
        result = subprocess.run(prefix + python, env={**os.environ, **env}, capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(f"{scenario} child failed ({result.returncode}): {result.stderr[-3000:]}")
    out = json.loads(result.stdout.strip().splitlines()[-1])
    out["phases"] = {**phases(launched, out["stamps"]), **out["again"]}
    return dict(out)


def prepare(args: argparse.Namespace, work: Path) -> tuple[Path, Path, str]:
    """The model, its warmed route and a signed snapshot in ``work`` (each reused when already there); returns the
    snapshot folder, the public key and the model's label."""
    from bench_realistic import export_snapshot, run_measured, warm
    from real_model import build_real_model, real_configs
    from tiny_model import build_tiny_model

    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    if args.quick:
        build_tiny_model("qwen3", work / "model")
        label = "tiny Qwen3 (--quick), aot_eager, guard primed by tracing"
    else:
        build_real_model(real_configs()["Qwen__Qwen3-0.6B"], work / "model", layers=0)
        layers = json.loads((work / "model" / "config.json").read_text())["num_hidden_layers"]
        label = f"Qwen3-0.6B ({layers} layers, real width, random weights), float32, AOTInductor packages"
    route = args.route
    if not (work / route / "registry.sqlite").is_file():
        warm(args, route, work / "model", work, env)
    key = work / "signing-key"
    if not key.is_file():
        run_measured([sys.executable, "-m", "warmcache", "keys", "generate", str(key)], env)
    snapshot = export_snapshot(work / route, key, env)
    if args.launcher:
        readable_to_others(work, keep_private=key)
    return snapshot, key.with_name(key.name + ".pub"), label


def readable_to_others(folder: Path, keep_private: Path) -> None:
    """Let a container's own user (the image runs as uid 1000) read ``folder``'s files mounted into it: the saved
    weights are written owner-only. ``keep_private`` (the signing key) stays as it is."""
    for path in [folder, *folder.rglob("*")]:
        if path != keep_private and not path.is_symlink():
            path.chmod(path.stat().st_mode | (0o055 if path.is_dir() else 0o044))


def median_phases(runs: list[dict[str, Any]]) -> dict[str, float]:
    names = runs[0]["phases"].keys()
    return {name: statistics.median(r["phases"][name] for r in runs) for name in names}


def report(label: str, args: argparse.Namespace, results: dict[str, list[dict[str, Any]]]) -> None:
    medians = {scenario: median_phases(runs) for scenario, runs in results.items()}
    print(
        f"{label}; CPU {os.cpu_count()} cores, OMP_NUM_THREADS={args.threads}; prompt {args.prompt}, "
        f"{args.new_tokens} new tokens; launcher: {args.launcher or 'a plain process'}; "
        f"median of {', '.join(f'{len(r)} {s}' for s, r in results.items())} runs"
    )
    print(f"{'phase (s)':<38}" + "".join(f"{s:>10}" for s in results))
    for name, title in PHASES:
        cells = [f"{m[name]:10.3f}" if name in m else f"{'-':>10}" for m in medians.values()]
        print(f"{title:<38}" + "".join(cells))
    totals = (
        ("to_first_token", "start → first token"),
        ("to_request", "start → first full request"),
        ("second_first_token", "second request: first token"),
        ("second_request", "second request: the rest"),
    )
    for name, title in totals:
        print(f"{title:<38}" + "".join(f"{m[name]:10.3f}" for m in medians.values()))
    floor, packaged = medians["floor"], medians["packages"]
    own = sum(packaged[name] for name in WARMCACHE_PHASES)
    print(
        f"warmcache's share over the floor: first token {packaged['to_first_token'] - floor['to_first_token']:+.3f}s, "
        f"first full request {packaged['to_request'] - floor['to_request']:+.3f}s; its own phases in the process "
        f"(import {packaged['warmcache']:.3f}s + guard {packaged['guard']:.3f}s + prime {packaged['prime']:.3f}s) "
        f"{own:.3f}s"
    )
    again = sum(packaged[n] - floor[n] for n in ("second_first_token", "second_request"))
    print(f"a second request (same process, what every request costs) differs by {again:+.3f}s from the floor's")
    if "cold" in medians:
        cold = medians["cold"]
        ratio = cold["to_request"] / packaged["to_request"]
        print(f"cold: start → first full request {cold['to_request']:.1f}s, {ratio:.1f}x the packages'")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--work", type=Path, help="Keep the model, packages and key here and reuse them (default: a temporary folder)."
    )
    parser.add_argument(
        "--runs", type=int, default=3, help="Fresh processes of floor and packages each (the median is shown)."
    )
    parser.add_argument(
        "--cold-runs", type=int, default=1, help="Fresh cold processes (each compiles the whole model)."
    )
    parser.add_argument(
        "--launcher", default="", help="A command prefix the child runs under, e.g. a `podman run` line (see above)."
    )
    parser.add_argument(
        "--python", default=sys.executable, help="The child's interpreter (inside the container with --launcher)."
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="OMP_NUM_THREADS of every child (1: steady on a shared machine)."
    )
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--max-cache-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument(
        "--quick", action="store_true", help="A tiny Qwen3, aot_eager, one run each: checks the script runs."
    )
    parser.add_argument("--child", choices=SCENARIOS, help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--snapshot", help=argparse.SUPPRESS)
    parser.add_argument("--trust", help=argparse.SUPPRESS)
    parser.add_argument("--backend", default="inductor", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    sys.path.insert(0, str(TOOLS))
    # bench_realistic's warm() reads these: one bucket, batch 1, float32.
    args.dtype, args.batch, args.route = "float32", 1, "aotinductor"
    if args.quick:
        args.backend, args.route, args.runs, args.cold_runs = "aot_eager", "inductor", 1, 1
        args.prompt, args.max_cache_len, args.new_tokens = 8, 16, 4
    with tempfile.TemporaryDirectory(prefix="warmcache-start-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        snapshot, trust, label = prepare(args, work)
        results: dict[str, list[dict[str, Any]]] = {s: [] for s in SCENARIOS}
        for _ in range(args.runs):
            # Interleaved, so a change in the machine's load falls on both alike.
            for scenario in ("floor", "packages"):
                results[scenario].append(launch(args, scenario, work, snapshot, trust))
        for _ in range(args.cold_runs):
            results["cold"].append(launch(args, "cold", work, snapshot, trust))
    report(label, args, {s: r for s, r in results.items() if r})
    for run in results["packages"]:
        if not args.quick and (run["frames"] or run["compiler_modules"]):
            raise SystemExit(
                f"packages: {run['frames']} Dynamo frames, compiler {run['compiler_modules']}; expected none"
            )


if __name__ == "__main__":
    main()
