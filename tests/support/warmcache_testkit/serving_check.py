"""A fresh production process started as warmcache intends, for the tests and tools that prove a route end to end.

``serve()`` runs :data:`SERVE` in a new interpreter: load the model, prime a
``ShapeGuard`` from the registry (Inductor cache, precompiled artifacts or
AOTInductor packages, whichever the rows recorded), send ragged requests that decode
to the bucket's full cache, judge every generated token against the model's own
eager logits (``warmcache.warmup.verify.agreement``: the criterion verify applies, so
bfloat16 near-ties may go either way), and report what was traced and compiled after
priming, in all, and which compiler modules the process imported.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from warmcache_testkit.measured_run import run_measured

COMPILER_MODULES = (
    "torch._inductor.compile_fx",
    "torch._inductor.lowering",
    "torch._inductor.graph",
    "torch._inductor.codecache",
)

SERVE = """
import json, sys, time
import torch
from transformers import AutoModelForCausalLM
from warmcache.modeling.generation import compile_config
from warmcache.runtime.guard import ShapeGuard
from warmcache.warmup.verify.agreement import eager_decode_logits, judge_decode

args = json.loads(sys.argv[1])
dtype = getattr(torch, args["dtype"])
model = AutoModelForCausalLM.from_pretrained(args["path"], dtype=dtype, device_map=args["device"]).eval()
guard = ShapeGuard.from_registry(args["url"], args["name"], telemetry=False)
from torch._dynamo.utils import counters
start = time.perf_counter()
report = guard.prime(model)
prime_seconds = time.perf_counter() - start
primed_graphs, primed_frames = int(counters["stats"]["unique_graphs"]), sum(counters["frames"].values())
results, seconds = [], []
for lengths in args["requests"]:
    batch = len(lengths)
    seeded = torch.Generator().manual_seed(batch * 100 + sum(lengths))
    ids = torch.randint(5, 300, (batch, max(lengths)), generator=seeded)
    mask = torch.zeros_like(ids)
    for row, length in enumerate(lengths):  # ragged: left-padded to the batch's longest prompt
        mask[row, -length:] = 1
        ids[row, :-length] = 0
    ids, mask = ids.to(args["device"]), mask.to(args["device"])
    new = args["max_cache_len"] - args["prompt"] + 1  # decode to the full cache of the bucket
    begin = time.perf_counter()
    out = guard.generate(model, input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new)
    seconds.append(time.perf_counter() - begin)
    generated = out[:, ids.shape[1]:]
    eager = eager_decode_logits(model, ids, mask, generated, pad_token_id=0)
    agreement = judge_decode(model, ids, mask, generated, eager)
    results.append({
        "agrees": agreement.agrees,
        "agreement": agreement.describe(),
        "worst": agreement.token_deficit,
        "new_tokens": generated.flatten().tolist(),
    })
decoder = model.get_compiled_call(compile_config(*[guard.target[i] for i in (1, 2, 0)]))
print(json.dumps({
    "artifacts_loaded": report.artifacts_loaded,
    "artifact_errors": report.artifact_errors,
    "prime_seconds": prime_seconds,
    "package_load_seconds": report.artifact_load_seconds,
    "request_seconds": seconds,
    "graphs": int(counters["stats"]["unique_graphs"]),
    "frames": sum(counters["frames"].values()),
    "graphs_after_priming": int(counters["stats"]["unique_graphs"]) - primed_graphs,
    "frames_after_priming": sum(counters["frames"].values()) - primed_frames,
    "package_calls": getattr(decoder, "calls", 0),
    "results": results,
    "compiler_modules": [m for m in args["compiler_modules"] if m in sys.modules],
}))
"""


def serve(
    root: Path,
    model_path: Path,
    requests: Sequence[Sequence[int]],
    *,
    prompt: int,
    max_cache_len: int,
    name: str = "m",
    dtype: str = "float32",
    device: str = "cpu",
) -> dict[str, Any]:
    """Run :data:`SERVE` on the registry in ``root``; ``requests`` are each row's prompt length, left-padded to the
    longest."""
    script = root / "serve.py"
    script.write_text(SERVE)
    args = {
        "url": f"sqlite:///{root}/registry.sqlite",
        "path": str(model_path),
        "name": name,
        "dtype": dtype,
        "device": device,
        "requests": [list(r) for r in requests],
        "prompt": prompt,
        "max_cache_len": max_cache_len,
        "compiler_modules": COMPILER_MODULES,
    }
    done = run_measured([sys.executable, str(script), json.dumps(args)])
    assert done.returncode == 0, done.stderr[-3000:]
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "peak_rss": done.peak_rss}


def assert_served_by_packages(served: dict[str, Any], *, packages: int, min_calls: int) -> None:
    """Every bucket served by its package, nothing traced or compiled, no compiler imported, every token agreeing
    with eager."""
    assert served["artifacts_loaded"] == packages and served["artifact_errors"] == []
    assert served["graphs"] == 0 and served["frames"] == 0, served
    assert served["compiler_modules"] == [], served
    assert served["package_calls"] >= min_calls, served
    assert all(r["agrees"] for r in served["results"]), [r["agreement"] for r in served["results"]]
    # A model that repeats one token would "agree" with a broken cache: its outputs must vary.
    assert len({t for r in served["results"] for t in r["new_tokens"]}) >= 20
