"""Start to first token: a fresh process (or container) serving from packages, beside the eager floor and cold.

    python tools/bench/bench_start.py                       # Qwen3-0.6B, all 28 layers, float32, AOTInductor packages
    python tools/bench/bench_start.py --work DIR            # model, packages and key kept in DIR, reused later
    python tools/bench/bench_start.py --dtype bfloat16      # a bfloat16 checkpoint and its packages
    python tools/bench/bench_start.py --launcher 'podman run --rm -v {work}:{work}:ro -v {tools}:{tools}:ro {env} IMAGE'
    python tools/bench/bench_start.py --quick               # CI: tiny Qwen3, one run each; checks the script runs

The model is built from Qwen3-0.6B's published ``config.json`` at real width and depth with
random weights (``warmcache_testkit.real_model``), warmed once through the AOTInductor route
(``warmcache warmup``, ``precompile = "aotinductor"``) and exported as a signed guard
snapshot beside the packages, as a pod's image volume holds it (``tools/bench/bench_realistic.py``
does both). Then each scenario is a fresh process, timed from the moment the parent
launches it (interpreter start, or container start with ``--launcher``) to its first
generated token and to the end of its first full request:

* ``floor``: the eager model and nothing else: imports, weight load, one eager ``generate()``.
  No warmcache import: what any server pays before it can answer.
* ``packages``: what a pod pays: the same, plus importing warmcache, building the guard from
  the signed snapshot (reading it, checking its signature) and priming (loading each
  bucket's package and binding the weights); an empty Inductor cache, no compiler imported.
* ``mount``: the start from the mount alone (:func:`warmcache.runtime.mounted.serve_from_mount`):
  ``import torch``, the guard from the signed snapshot, the checkpoint's weights memory-mapped, every
  bucket's packaged prefill and decode loaded and bound, and warmcache's own decode loop. No
  transformers, no modeling code, no compiler, no Dynamo.
* ``cold``: an empty Inductor cache and ``torch.compile``: the first request compiles.

Then the proportional set size (PSS, ``/proc/PID/smaps_rollup``) of 1, 2 and 4 ``mount``
processes serving at once (``--pss``, default 1,2,4; ``--pss ''`` skips it): the mapped weights
are the page cache's, so N processes hold one copy of them.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TOOLS = Path(__file__).resolve().parent
SCENARIOS = ("floor", "packages", "mount", "cold")
#: Phases in the order a child stamps them; a scenario skips those it does not have.
PHASES = (
    ("python", "process start → Python running"),
    ("torch", "import torch"),
    ("transformers", "import transformers"),
    ("weights", "weight load (from_pretrained)"),
    ("warmcache", "import warmcache"),
    ("guard", "guard build (snapshot + signature)"),
    ("mapped", "weights mapped (mount)"),
    ("prime", "prime (package load + bind)"),
    ("first_token", "first token"),
    ("request", "rest of the first request"),
)
#: warmcache's own phases in a pod's start.
WARMCACHE_PHASES = ("warmcache", "guard", "prime")
#: Modules a start from the mount must not import: transformers (its modeling code above all) and the registry's
#: database layer.
MOUNT_FORBIDDEN = ("transformers", "sqlalchemy", "torch._dynamo")
COMPILER_MODULES = ("torch._inductor.compile_fx", "torch._inductor.lowering", "torch._inductor.graph")


class FirstToken:
    """A ``generate()`` streamer that stamps the first generated token (its first ``put`` is the prompt) and keeps
    the tokens, which the parent compares across scenarios."""

    def __init__(self) -> None:
        self.puts = 0
        self.at = 0.0
        self.tokens: list[int] = []

    def put(self, value: Any) -> None:
        self.puts += 1
        if self.puts == 2:
            self.at = time.time()
        if self.puts > 1:
            self.tokens.extend(int(token) for token in value.reshape(-1).tolist())

    def end(self) -> None:
        pass


def child(args: argparse.Namespace) -> None:
    """One fresh process: stamp each phase of its start, serve one request, print the stamps as JSON."""
    stamps = {"python": time.time()}
    import torch

    stamps["torch"] = time.time()
    dtype = getattr(torch, args.dtype)
    if args.child == "mount":
        request, vocab = mount_child(args, stamps)
    else:
        from transformers import AutoModelForCausalLM

        stamps["transformers"] = time.time()
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).eval()
        stamps["weights"] = time.time()
        request, vocab = eager_child(args, model, stamps), model.config.vocab_size
    # Drawn with torch alone, so the floor imports nothing of warmcache's.
    ids = torch.randint(1, min(1000, vocab), (1, args.prompt), generator=torch.Generator().manual_seed(0))
    first = FirstToken()
    request(ids, first)
    stamps["request"], stamps["first_token"] = time.time(), first.at
    # The same request again: what every request costs, against which the first one's extra shows.
    second = FirstToken()
    request(ids, second)
    again = {"second_first_token": second.at - stamps["request"], "second_request": time.time() - second.at}
    compiler = [m for m in COMPILER_MODULES if m in sys.modules]
    forbidden = sorted(
        {
            m.split(".")[0] if m.startswith(("transformers", "sqlalchemy")) else m
            for m in sys.modules
            if m.startswith(MOUNT_FORBIDDEN)
        }
    )
    frames = 0
    if "torch._dynamo" in sys.modules:
        from torch._dynamo.utils import counters

        frames = sum(counters["frames"].values())
    print(
        json.dumps(
            {
                "stamps": stamps,
                "again": again,
                "frames": frames,
                "compiler_modules": compiler,
                "imported": forbidden,
                "tokens": first.tokens,
            }
        ),
        flush=True,
    )
    if args.hold:  # a PSS measurement: stay up, serving nothing, until the parent closes stdin
        sys.stdin.read()


Request = Any  # (ids, streamer) -> None


def eager_child(args: argparse.Namespace, model: Any, stamps: dict[str, float]) -> Request:
    """The floor's, the packages' or the cold start's request, over a transformers model."""
    import torch

    new = args.new_tokens
    if args.child == "floor":

        def request(ids: Any, streamer: FirstToken) -> None:
            with torch.inference_mode():
                mask = torch.ones_like(ids)
                model.generate(
                    input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, streamer=streamer
                )

        return request
    if args.child == "packages":
        from warmcache import ShapeGuard

        stamps["warmcache"] = time.time()
        guard = ShapeGuard.from_snapshot(args.snapshot, "bench", trust=[args.trust])
        stamps["guard"] = time.time()
        guard.prime(model)
        stamps["prime"] = time.time()

        def request(ids: Any, streamer: FirstToken) -> None:
            mask = torch.ones_like(ids)
            guard.generate(
                model, input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, streamer=streamer
            )

        return request
    from warmcache.modeling.generation import compile_config, generate_kwargs
    from warmcache.shapes.workload_settings import GenerateSettings

    stamps["warmcache"] = time.time()
    config = compile_config(args.backend, "default", "cpu")

    def request(ids: Any, streamer: FirstToken) -> None:
        # Built per call: each generate() fills a fresh cache object.
        kwargs = generate_kwargs(
            GenerateSettings(args.max_cache_len), max_new_tokens=new, config=config, model_config=model.config
        )
        with torch.inference_mode():
            mask = torch.ones_like(ids)
            model.generate(
                input_ids=ids, attention_mask=mask, min_new_tokens=new, pad_token_id=0, streamer=streamer, **kwargs
            )

    return request


def mount_child(args: argparse.Namespace, stamps: dict[str, float]) -> tuple[Request, int]:
    """The start from the mount: no transformers, the packages' prefill and decode over the mapped weights."""
    import torch

    from warmcache.runtime.mounted import serve_from_mount

    stamps["warmcache"] = time.time()
    served = serve_from_mount(args.snapshot, "bench", trust=[args.trust], weights=args.model)
    stamps["prime"] = time.time()
    stamps["mapped"] = stamps["prime"] - served.load_seconds
    stamps["guard"] = stamps["mapped"] - served.map_seconds
    new = args.new_tokens

    def request(ids: Any, streamer: FirstToken) -> None:
        streamer.put(ids)
        # No stop token: the same number of tokens as the floor's min_new_tokens request.
        served.generate(ids, torch.ones_like(ids), max_new_tokens=new, stop_token_ids=(), on_token=streamer.put)

    vocab = json.loads((Path(args.model) / "config.json").read_text())["vocab_size"]
    return request, int(vocab)


def phases(launched: float, stamps: dict[str, float]) -> dict[str, float]:
    """Seconds of each phase a child went through, from its stamps and the moment it was launched."""
    # In the order the child stamped them: a scenario skips phases, and the mount maps its weights after the guard.
    order = sorted((name for name, _ in PHASES if name in stamps), key=stamps.__getitem__)
    seconds, previous = {}, launched
    for name in order:
        at = stamps[name]  # the first token lands inside the request: the request's phase is what follows it
        seconds[name] = at - previous
        previous = at
    seconds["to_first_token"] = stamps["first_token"] - launched
    seconds["to_request"] = stamps["request"] - launched
    return seconds


def child_command(args: argparse.Namespace, scenario: str, prepared: Prepared) -> list[str]:
    """The ``python`` line of one child (without ``--launcher``'s prefix): the mount maps a checkpoint saved in the
    served dtype, the others load the model's own."""
    model, snapshot, trust = (
        prepared.mapped if scenario == "mount" else prepared.model,
        prepared.snapshot,
        prepared.trust,
    )
    backend = args.cold_backend if scenario == "cold" else args.backend
    python = [args.python, str(Path(__file__).resolve()), "--child", scenario, "--model", str(model)]
    python += ["--snapshot", str(snapshot), "--trust", str(trust), "--backend", backend, "--dtype", args.dtype]
    python += ["--prompt", str(args.prompt), "--new-tokens", str(args.new_tokens)]
    return python + ["--max-cache-len", str(args.max_cache_len)]


def child_env(args: argparse.Namespace, inductor_cache: str) -> dict[str, str]:
    return {"OMP_NUM_THREADS": str(args.threads), "TORCHINDUCTOR_CACHE_DIR": inductor_cache}


def launcher_prefix(args: argparse.Namespace, work: Path, env: dict[str, str]) -> list[str]:
    if not args.launcher:
        return []
    flags = " ".join(f"-e {name}={value}" for name, value in env.items())
    return shlex.split(args.launcher.format(work=work, tools=TOOLS, env=flags))


def launch(args: argparse.Namespace, scenario: str, work: Path, prepared: Prepared) -> dict[str, Any]:
    """Run one fresh child of ``scenario`` (through ``--launcher`` if given); its phases, frames and compiler
    modules."""
    with tempfile.TemporaryDirectory(prefix="warmcache-start-cache-", dir=work) as inductor_cache:
        env = child_env(args, inductor_cache)
        python = child_command(args, scenario, prepared)
        launched = time.time()
        result = subprocess.run(
            launcher_prefix(args, work, env) + python, env={**os.environ, **env}, capture_output=True, text=True
        )
    if result.returncode:
        raise SystemExit(f"{scenario} child failed ({result.returncode}): {result.stderr[-3000:]}")
    out = json.loads(result.stdout.strip().splitlines()[-1])
    out["phases"] = {**phases(launched, out["stamps"]), **out["again"]}
    return dict(out)


def pss_kib(pid: int) -> int:
    """The proportional set size of one process: its private pages, and its share of each page it maps with others."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    raise SystemExit(f"/proc/{pid}/smaps_rollup has no Pss line")


def measure_pss(args: argparse.Namespace, scenario: str, count: int, work: Path, prepared: Prepared) -> list[int]:
    """PSS (KiB) of each of ``count`` processes of ``scenario`` serving at once, each after its first two requests."""
    with tempfile.TemporaryDirectory(prefix="warmcache-start-cache-", dir=work) as inductor_cache:
        env = {**os.environ, **child_env(args, inductor_cache)}
        command = child_command(args, scenario, prepared) + ["--hold"]
        children = [
            subprocess.Popen(command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            for _ in range(count)
        ]
        try:
            for process in children:
                assert process.stdout is not None
                if not process.stdout.readline():
                    raise SystemExit(f"{scenario} child for PSS failed ({process.wait()})")
            return [pss_kib(process.pid) for process in children]
        finally:
            for process in children:
                if process.stdin is not None:
                    process.stdin.close()
                process.wait()


@dataclass(frozen=True)
class Prepared:
    """What every child starts from: the checkpoint, the signed snapshot beside its packages, and the trusted key."""

    model: Path
    snapshot: Path
    trust: Path
    label: str
    #: The checkpoint saved in the served dtype, which the mount maps (a conversion would be a private copy).
    mapped: Path


def prepare(args: argparse.Namespace, work: Path) -> Prepared:
    """The model, its warmed route and a signed snapshot in ``work`` (each reused when already there; another dtype
    than float32 in ``work/<dtype>``, its checkpoint saved in that dtype so that it maps without a conversion)."""
    from warmcache_testkit.real_model import build_real_model, real_configs
    from warmcache_testkit.route_warmup import export_snapshot, run_measured, warm

    from warmcache.examples.tiny_model import build_tiny_model

    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    if args.quick:
        build_tiny_model("qwen3", work / "model")
        name = "tiny Qwen3 (--quick)"
    else:
        build_real_model(real_configs()["Qwen__Qwen3-0.6B"], work / "model", layers=0)
        layers = json.loads((work / "model" / "config.json").read_text())["num_hidden_layers"]
        name = f"Qwen3-0.6B ({layers} layers, real width, random weights)"
    home = work if args.dtype == "float32" else work / args.dtype
    if home != work and not (home / "model" / "config.json").is_file():
        save_in_dtype(work / "model", home / "model", args.dtype)
    route = args.route
    if not (home / route / "registry.sqlite").is_file():
        home.mkdir(exist_ok=True)
        warm(args, route, home / "model", home, env)
    key = work / "signing-key"
    if not key.is_file():
        run_measured([sys.executable, "-m", "warmcache", "keys", "generate", str(key)], env)
    snapshot = export_snapshot(home / route, key, env)
    if args.launcher:
        readable_to_others(work, keep_private=key)
    label = f"{name}, {args.dtype}, AOTInductor packages (prefill and decode)"
    mapped = home / "model"
    if checkpoint_dtype(mapped) != args.dtype:
        mapped = home / f"model-{args.dtype}"
        if not (mapped / "config.json").is_file():
            save_in_dtype(home / "model", mapped, args.dtype)
    return Prepared(home / "model", snapshot, key.with_name(key.name + ".pub"), label, mapped)


def checkpoint_dtype(folder: Path) -> str:
    """The dtype a checkpoint's first safetensors file holds its first tensor in (``float32``, ``bfloat16``...)."""
    from safetensors import safe_open

    with safe_open(next(folder.glob("*.safetensors")), "pt") as tensors:
        return str(tensors.get_tensor(next(iter(tensors.keys()))).dtype).removeprefix("torch.")


def save_in_dtype(source: Path, target: Path, dtype: str) -> None:
    """The checkpoint in ``source`` saved again with its weights in ``dtype`` (tokenizer and configs copied)."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(source, dtype=getattr(torch, dtype)).save_pretrained(target)
    for extra in source.glob("tokenizer*"):
        shutil.copy(extra, target / extra.name)


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
    if "mount" in medians:
        mount = medians["mount"]
        ratio = mount["to_first_token"] / floor["to_first_token"]
        print(
            f"mount: start → first token {mount['to_first_token']:.3f}s, {ratio:.2f}x the floor's (goal ≤ 0.5x); "
            f"first full request {mount['to_request'] / floor['to_request']:.2f}x"
        )
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


def check_tokens(results: dict[str, list[dict[str, Any]]]) -> None:
    """Every packages and mount run must give the packaged decode's tokens (the mount's own loop and compiled prefill
    change how fast the first token comes, not which); the floor's eager decode and cold's compile are reported
    beside them, not held to them (another kernel may break a near-tie)."""
    expected = results["packages"][0]["tokens"]
    for scenario in ("packages", "mount"):
        for run in results[scenario]:
            if run["tokens"] != expected:
                raise SystemExit(f"{scenario}: tokens {run['tokens']} differ from the packages' {expected}")
    others = "; ".join(
        f"{scenario}'s {sum(a == b for a, b in zip(runs[0]['tokens'], expected))} of {len(expected)} equal"
        for scenario, runs in results.items()
        if scenario in ("floor", "cold") and runs
    )
    print(f"tokens: every packages and mount run gave the same {len(expected)} tokens; {others}")


def report_pss(pss: dict[int, list[int]]) -> None:
    """The PSS table: total and per process for each count, and the total's ratio to one process's."""
    if not pss:
        return
    one = sum(pss[min(pss)])
    print(
        "PSS of N mount processes serving at once (MiB): "
        + "; ".join(
            f"{n}: total {sum(v) / 1024:.0f} ({', '.join(f'{k / 1024:.0f}' for k in v)}), {sum(v) / one:.2f}x one"
            for n, v in sorted(pss.items())
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--work", type=Path, help="Keep the model, packages and key here and reuse them (default: a temporary folder)."
    )
    parser.add_argument(
        "--runs", type=int, default=3, help="Fresh processes of floor, packages and mount each (the median is shown)."
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
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument(
        "--pss", default="1,2,4", help="Counts of mount processes whose PSS is measured at once ('' skips it)."
    )
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--max-cache-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument(
        "--quick", action="store_true", help="A tiny Qwen3, one run each, cold on aot_eager: checks the script runs."
    )
    parser.add_argument("--child", choices=SCENARIOS, help=argparse.SUPPRESS)
    parser.add_argument("--hold", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--snapshot", help=argparse.SUPPRESS)
    parser.add_argument("--trust", help=argparse.SUPPRESS)
    parser.add_argument("--backend", default="inductor", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    # route_warmup's warm() reads these: one bucket, batch 1.
    args.batch, args.route, args.cold_backend = 1, "aotinductor", args.backend
    if args.quick:
        args.cold_backend, args.runs, args.cold_runs, args.pss = "aot_eager", 1, 1, "1,2"
        args.prompt, args.max_cache_len, args.new_tokens = 8, 16, 4
    counts = [int(n) for n in args.pss.split(",") if n.strip()]
    with tempfile.TemporaryDirectory(prefix="warmcache-start-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        prepared = prepare(args, work)
        results: dict[str, list[dict[str, Any]]] = {s: [] for s in SCENARIOS}
        for _ in range(args.runs):
            # Interleaved, so a change in the machine's load falls on each alike.
            for scenario in ("floor", "packages", "mount"):
                results[scenario].append(launch(args, scenario, work, prepared))
        for _ in range(args.cold_runs):
            results["cold"].append(launch(args, "cold", work, prepared))
        pss = {n: measure_pss(args, "mount", n, work, prepared) for n in counts if not args.launcher}
    if results["floor"]:  # --runs 0 only prepares (warms) the model and its packages
        report(prepared.label, args, {s: r for s, r in results.items() if r})
        check_tokens(results)
    report_pss(pss)
    for scenario in ("packages", "mount"):
        for run in results[scenario]:
            if not args.quick and (run["frames"] or run["compiler_modules"]):
                raise SystemExit(
                    f"{scenario}: {run['frames']} Dynamo frames, compiler {run['compiler_modules']}; expected none"
                )
    for run in results["mount"]:
        if run["imported"] or run["frames"] or run["compiler_modules"]:
            raise SystemExit(f"mount: imported {run['imported']}, compiler {run['compiler_modules']}; expected none")


if __name__ == "__main__":
    main()
