"""Serve generate() from a warm cache mounted read-only (a Kubernetes image volume of a warmcache tag).

    python serve.py CACHE MODEL_NAME TRUSTED_KEY.pub --model-path /models/qwen3-8b [--port 8080]
    python serve.py --check CACHE MODEL_NAME TRUSTED_KEY.pub     # verify the mount and exit

The mount is a guard snapshot folder: ``CACHE/warmcache-guard.json`` (signed) beside the cache
entries its rows name. The guard refuses a snapshot that key did not sign or that another
toolchain compiled. A snapshot of AOTInductor packages starts with
``warmcache.serve_from_mount``: the checkpoint's weights memory-mapped, every bucket's packaged
prefill and decode loaded, no transformers and no model code imported. Any other snapshot
(Neuron, the Inductor cache) loads the model with transformers and primes the guard. Then each
request is kept on a compiled bucket: POST ``{"input_ids": [[...]], "max_new_tokens": N}`` to
``/generate`` (a shape no bucket serves: 422).

``GET /healthz`` answers 200 as soon as the process listens (liveness); ``GET /readyz`` answers 503
until every bucket is loaded and primed, then 200 (readiness: send no traffic before). A refusal
while loading (a package whose bytes are not the ones signed) ends the process with one line.
``GET /stats`` says what the process compiled since start (Dynamo graphs and frames) and which
Inductor compiler modules it imported: none, when it serves from the packages.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from warmcache.errors import WarmcacheError
from warmcache.runtime.guard import ShapeGuard
from warmcache.runtime.mounted import MountedModel, serve_from_mount

#: Inductor's compiler: a process that serves from AOTInductor packages never imports these.
COMPILER_MODULES = (
    "torch._inductor.compile_fx",
    "torch._inductor.lowering",
    "torch._inductor.graph",
    "torch._inductor.codecache",
)

#: ``(input_ids, max_new_tokens) -> output ids``: how this process answers /generate, once ready.
Generate = Callable[[Any, int], Any]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cache")
    parser.add_argument("model_name")
    parser.add_argument("trusted_key")
    parser.add_argument("--model-path")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--check", action="store_true", help="only verify the mount's signature and toolchain")
    args = parser.parse_args()
    # Importing torch._dynamo creates Inductor's cache folder (an empty /tmp/torchinductor_<user>): name the mounted
    # cache, which exists, so serving leaves nothing behind.
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.abspath(args.cache))
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # a refusal stays one line in the log
    try:
        if args.check:
            guard = ShapeGuard.from_snapshot(args.cache, args.model_name, trust=[args.trusted_key], telemetry_url=None)
            print(
                f"{args.cache}: {len(guard.buckets)} compiled buckets for {guard.family.describe()}, signature verified"
            )
            return
        served = serve_from_mount(
            args.cache,
            args.model_name,
            trust=[args.trusted_key],
            weights=args.model_path or args.model_name,
            load=False,
        )
    except WarmcacheError as exc:
        sys.exit(f"serve: {exc}")  # one line: another key, another toolchain, no compiled shapes
    ready: list[Generate] = []  # empty until every bucket is primed
    server = ThreadingHTTPServer(("0.0.0.0", args.port), handler(ready))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    # As a container's PID 1 the process has no default SIGTERM action: without this, every rollout waits out the
    # grace period and kills it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        generate = start(served, args) if served.servable() is None else start_with_transformers(served.guard, args)
    except WarmcacheError as exc:
        sys.exit(f"serve: {exc}")  # one line: a package whose bytes are not the ones signed
    ready.append(generate)
    threading.Event().wait()


def start(served: MountedModel, args: argparse.Namespace) -> Generate:
    """The start from the mount: packages and mapped weights, no transformers."""
    import torch

    served.load()  # checks each package's bytes against its signed sha256 before loading it
    print(
        f"primed {len(served.steps)} buckets ({len(served.steps)} precompiled) from {args.cache} in "
        f"{served.map_seconds + served.load_seconds:.1f}s, no model code",
        flush=True,
    )
    return lambda ids, new: served.generate(ids, torch.ones_like(ids), max_new_tokens=new)


def start_with_transformers(guard: ShapeGuard, args: argparse.Namespace) -> Generate:
    """A snapshot the mount cannot serve alone (Neuron, the Inductor cache): the model loaded with transformers."""
    import torch
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, guard.family.dtype)
    model = AutoModelForCausalLM.from_pretrained(args.model_path or args.model_name, dtype=dtype).eval()
    report = guard.prime(model)  # checks each package's bytes against its signed sha256 before loading it
    print(
        f"primed {len(report.buckets)} buckets ({report.artifacts_loaded} precompiled) from {args.cache} in "
        f"{report.seconds:.1f}s",
        flush=True,
    )
    return lambda ids, new: guard.generate(
        model, input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new
    )


def handler(ready: list[Generate]) -> type[BaseHTTPRequestHandler]:
    """The HTTP API: /healthz (alive), /readyz (every bucket primed), /stats and /generate."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/stats":
                self._answer(200, stats())
            elif self.path == "/readyz":
                self._answer(200 if ready else 503, {"ready": bool(ready)})
            else:
                self._answer(200 if self.path == "/healthz" else 404, {"ok": self.path == "/healthz"})

        def do_POST(self) -> None:
            import torch

            if not ready:
                self._answer(503, {"error": "not ready: the buckets are still loading"})
                return
            request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            try:
                out = ready[0](torch.tensor(request["input_ids"]), int(request.get("max_new_tokens", 32)))
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

        def log_message(self, format: str, *args: Any) -> None:
            pass  # probes every few seconds would drown the log

    return Handler


def stats() -> dict[str, Any]:
    """Dynamo graphs and frames since start (0 without importing Dynamo, when it was never imported) and the compiler
    modules imported."""
    graphs = frames = 0
    if "torch._dynamo" in sys.modules:
        from torch._dynamo.utils import counters

        graphs, frames = int(counters["stats"]["unique_graphs"]), sum(counters["frames"].values())
    compiler = sorted(m for m in COMPILER_MODULES if m in sys.modules)
    return {"graphs": graphs, "frames": frames, "compiler_modules": compiler}


if __name__ == "__main__":
    main()
