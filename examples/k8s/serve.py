"""Serve generate() from a warm cache mounted read-only (a Kubernetes image volume of a warmcache tag).

    python serve.py CACHE MODEL_NAME TRUSTED_KEY.pub --model-path /models/qwen3-8b [--port 8080]
    python serve.py --check CACHE MODEL_NAME TRUSTED_KEY.pub     # verify the mount and exit

The mount is a guard snapshot folder: ``CACHE/warmcache-guard.json`` (signed) beside the cache
entries its rows name. The guard refuses a snapshot that key did not sign or that another
toolchain compiled, loads every bucket once (``prime``), and then keeps each request on a
compiled bucket: POST ``{"input_ids": [[...]], "max_new_tokens": N}`` to ``/generate`` (a shape no bucket
serves: 422). ``GET /stats`` says what the process compiled since start (Dynamo graphs and frames) and which
Inductor compiler modules it imported: none, when it serves from the packages.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from warmcache.errors import WarmcacheError
from warmcache.runtime.guard import ShapeGuard

#: Inductor's compiler: a process that serves from AOTInductor packages never imports these.
COMPILER_MODULES = (
    "torch._inductor.compile_fx",
    "torch._inductor.lowering",
    "torch._inductor.graph",
    "torch._inductor.codecache",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cache")
    parser.add_argument("model_name")
    parser.add_argument("trusted_key")
    parser.add_argument("--model-path")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--check", action="store_true", help="only verify the mount's signature and toolchain")
    args = parser.parse_args()
    try:
        guard = ShapeGuard.from_snapshot(args.cache, args.model_name, trust=[args.trusted_key], telemetry_url=None)
    except WarmcacheError as exc:
        sys.exit(f"serve: {exc}")  # one line: another key, another toolchain, no compiled shapes
    if args.check:
        print(f"{args.cache}: {len(guard.buckets)} compiled buckets for {guard.family.describe()}, signature verified")
        return
    # Importing torch._dynamo creates Inductor's cache folder (an empty /tmp/torchinductor_<user>): name the mounted
    # cache, which exists, so serving leaves nothing behind (the package loader's scratch in $TMPDIR is removed).
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.abspath(args.cache))
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # a refusal stays one line in the log
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(args.model_path or args.model_name, dtype=getattr(torch, guard.family.dtype)).eval()
    try:
        report = guard.prime(model)  # checks each package's bytes against its signed sha256 before loading it
    except WarmcacheError as exc:
        sys.exit(f"serve: {exc}")  # one line: a package whose bytes are not the ones signed
    from torch._dynamo.utils import counters

    print(f"primed {len(report.buckets)} buckets ({report.artifacts_loaded} precompiled) from {args.cache} in {report.seconds:.1f}s", flush=True)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/stats":
                compiler = sorted(m for m in COMPILER_MODULES if m in sys.modules)
                graphs, frames = int(counters["stats"]["unique_graphs"]), sum(counters["frames"].values())
                self._answer(200, {"graphs": graphs, "frames": frames, "compiler_modules": compiler})
                return
            self._answer(200 if self.path == "/healthz" else 404, {"ok": self.path == "/healthz"})

        def do_POST(self) -> None:
            request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            ids = torch.tensor(request["input_ids"])
            try:
                out = guard.generate(model, input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=int(request.get("max_new_tokens", 32)))
            except WarmcacheError as exc:  # a shape no bucket serves: refused, never compiled
                self._answer(422, {"error": str(exc)})
                return
            self._answer(200, {"output_ids": out.tolist()})

        def _answer(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    # As a container's PID 1 the process has no default SIGTERM action: without this, every rollout waits out the
    # grace period and kills it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    ThreadingHTTPServer(("0.0.0.0", args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
