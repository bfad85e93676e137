"""A start from the mount (``warmcache.serve_from_mount``): packaged prefill and decode, mapped weights, our own decode
loop, no transformers.

Built on the suite's one AOTInductor warmup (``packaged``: tiny llama, buckets batch 1 and 4 at prompt 8, each with
its packaged decode and prefill), exported as a signed snapshot beside a copy of its cache, as a pod's image volume
holds it.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from test_aotinductor import MAX_CACHE_LEN, PROMPT, REQUESTS

from warmcache.cache.layout import AOTINDUCTOR
from warmcache.errors import TrustError, UsageError, WarmcacheError

ROOT = Path(__file__).resolve().parents[1]
#: Modules a start from the mount never imports.
FORBIDDEN = (
    "transformers",
    "sqlalchemy",
    "torch._dynamo",
    "torch._inductor.compile_fx",
    "torch._inductor.lowering",
    "torch._inductor.graph",
    "torch._inductor.codecache",
)


def _warmcache(*args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "warmcache", *args], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.fixture(scope="module")
def mount(packaged: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A copy of the packages' cache with a signed snapshot in it, the key that signed it, and another key."""
    root = tmp_path_factory.mktemp("mount")
    cache = root / "cache"
    shutil.copytree(packaged / "cache", cache)
    _warmcache("keys", "generate", str(root / "build-key"))
    _warmcache("keys", "generate", str(root / "other-key"))
    _warmcache(
        "guard", "export", "--model", "m", "--out", str(cache), "--sign", str(root / "build-key"),
        "--db", f"sqlite:///{packaged}/registry.sqlite",
    )  # fmt: skip
    return {"cache": cache, "key": root / "build-key.pub", "other": root / "other-key.pub"}


def _requests() -> list[tuple[Any, Any]]:
    """The ragged requests of the package tests: each row's prompt left-padded to the batch's longest."""
    import torch

    out = []
    for lengths in REQUESTS:
        batch = len(lengths)
        ids = torch.randint(
            5, 300, (batch, max(lengths)), generator=torch.Generator().manual_seed(batch + sum(lengths))
        )
        mask = torch.zeros_like(ids)
        for row, length in enumerate(lengths):
            mask[row, -length:] = 1
            ids[row, :-length] = 0
        out.append((ids, mask))
    return out


SERVE_FROM_MOUNT = """
import json, sys
import torch
from warmcache.runtime.mounted import serve_from_mount

args = json.loads(sys.argv[1])
served = serve_from_mount(args["cache"], "m", trust=[args["key"]], weights=args["weights"])
outputs = []
for ids, mask in args["requests"]:
    ids, mask = torch.tensor(ids), torch.tensor(mask)
    streamed = []
    out = served.generate(ids, mask, max_new_tokens=args["new"], on_token=streamed.append)
    outputs.append({"ids": out.tolist(), "streamed": len(streamed)})
print(json.dumps({
    "outputs": outputs,
    "ready": served.ready,
    "imported": sorted(m for m in sys.modules if m == "transformers" or m.startswith(("transformers.", "sqlalchemy"))
        or m in args["forbidden"]),
}))
"""


@pytest.mark.slow
def test_a_fresh_process_serves_the_packaged_decodes_tokens_without_modeling_code(
    mount: dict[str, Path], packaged: Path, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    """Greedy tokens equal ``ShapeGuard.generate``'s over the same packages (batch 1, and batch 4 with padded, ragged
    and dummy rows), and the process imported no transformers, no registry database layer, no Dynamo, no compiler."""
    import torch
    from transformers import AutoModelForCausalLM

    from warmcache.runtime.guard import ShapeGuard

    new = MAX_CACHE_LEN - PROMPT + 1  # to the cache's end
    requests = _requests()
    args = {
        "cache": str(mount["cache"]),
        "key": str(mount["key"]),
        "weights": str(tiny_models["llama"]),
        "new": new,
        "forbidden": list(FORBIDDEN),
        "requests": [(ids.tolist(), mask.tolist()) for ids, mask in requests],
    }
    script = tmp_path / "serve_from_mount.py"
    script.write_text(SERVE_FROM_MOUNT)
    done = subprocess.run([sys.executable, str(script), json.dumps(args)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    served = json.loads(done.stdout.strip().splitlines()[-1])
    assert served["imported"] == [] and served["ready"], served

    model = AutoModelForCausalLM.from_pretrained(tiny_models["llama"], dtype=torch.float32).eval()
    guard = ShapeGuard.from_registry(f"sqlite:///{packaged}/registry.sqlite", "m", telemetry=False)
    assert guard.prime(model).artifacts_loaded == 2  # the decode packages: generate() runs its own prefill
    for (ids, mask), out in zip(requests, served["outputs"]):
        expected = guard.generate(model, input_ids=ids, attention_mask=mask, max_new_tokens=new)
        assert out["ids"] == expected.tolist(), (ids.shape, out["ids"], expected.tolist())
        assert out["streamed"] == expected.shape[1] - ids.shape[1]
    # A model that repeats one token would "agree" with a broken cache: its outputs must vary.
    assert len({t for out in served["outputs"] for row in out["ids"] for t in row[-new:]}) >= 20


@pytest.fixture(scope="module")
def served(mount: dict[str, Path], tiny_models: dict[str, Path]) -> Any:
    from warmcache.runtime.mounted import serve_from_mount

    return serve_from_mount(mount["cache"], "m", trust=[str(mount["key"])], weights=tiny_models["llama"])


@pytest.mark.slow
def test_stop_tokens_sampling_and_refusals_in_the_decode_loop(served: Any) -> None:
    import torch

    from warmcache.runtime.decode_loop import Sampling

    assert served.ready and sorted(served.steps) == [(1, PROMPT), (4, PROMPT)]
    ids = torch.randint(5, 300, (2, PROMPT), generator=torch.Generator().manual_seed(3))
    greedy = served.generate(ids, max_new_tokens=6, stop_token_ids=())
    assert greedy.shape == (2, PROMPT + 6)
    # A row stops at its stop token and is padded after it; the loop ends when every row stopped.
    stop = int(greedy[0, PROMPT + 1])
    stopped = served.generate(ids, max_new_tokens=6, stop_token_ids=[stop])
    assert stopped[0, PROMPT + 1] == stop and (stopped[0, PROMPT + 2 :] == served.tokens.pad_token_id).all()
    assert torch.equal(stopped[1, : stopped.shape[1]], greedy[1, : stopped.shape[1]]) or stop in greedy[1].tolist()
    # top_k=1 sampling is greedy; a seeded draw repeats itself.
    assert torch.equal(
        served.generate(ids, max_new_tokens=6, stop_token_ids=(), sampling=Sampling(True, top_k=1)), greedy
    )
    drawn = [
        served.generate(
            ids,
            max_new_tokens=6,
            stop_token_ids=(),
            sampling=Sampling(True, 0.8, 0, 0.9, torch.Generator().manual_seed(7)),
        )
        for _ in range(2)
    ]
    assert torch.equal(*drawn)
    with pytest.raises(UsageError, match="temperature=0"):
        Sampling(True, temperature=0)
    # The guard's refusals: a batch no bucket holds, a right-padded batch; one line each, nothing run.
    for bad, match in (
        ({"input_ids": torch.ones((5, 2), dtype=torch.long)}, "fits no compiled shape"),
        (
            {"input_ids": torch.ones((1, 4), dtype=torch.long), "attention_mask": torch.tensor([[1, 1, 1, 0]])},
            "right-padded",
        ),
    ):
        with pytest.raises(WarmcacheError, match=match) as refused:
            served.generate(**bad)
        assert "\n" not in str(refused.value)


@pytest.mark.slow
def test_another_key_or_a_tampered_package_is_refused_before_serving(
    mount: dict[str, Path], tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    from warmcache.runtime.mounted import serve_from_mount

    with pytest.raises(WarmcacheError, match="not trusted|signed by") as refused:
        serve_from_mount(mount["cache"], "m", trust=[str(mount["other"])], weights=tiny_models["llama"])
    assert "\n" not in str(refused.value)
    # An altered prefill package: refused on its sha256 before any package runs.
    copy = tmp_path / "cache"
    shutil.copytree(mount["cache"], copy)
    snapshot = json.loads((copy / "warmcache-guard.json").read_text())
    packages = {a["path"] for row in snapshot["records"] for a in row["artifacts"] if a["kind"] == AOTINDUCTOR}
    assert packages, snapshot.keys()
    for entry in sorted(packages):
        data = bytearray((copy / entry).read_bytes())
        if b'"step": "prefill"' in data[:100_000]:
            data[-100] ^= 0xFF
            (copy / entry).write_bytes(bytes(data))
            break
    else:
        pytest.fail("no packaged prefill in the snapshot")
    with pytest.raises(TrustError, match="sha256") as refused:
        serve_from_mount(copy, "m", trust=[str(mount["key"])], weights=tiny_models["llama"])
    assert "\n" not in str(refused.value)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.mark.slow
def test_the_example_server_is_ready_only_once_every_bucket_is_primed(
    mount: dict[str, Path], tiny_models: dict[str, Path]
) -> None:
    port = _free_port()
    command = [sys.executable, str(ROOT / "examples/k8s/serve.py"), str(mount["cache"]), "m", str(mount["key"])]
    process = subprocess.Popen(
        [*command, "--model-path", str(tiny_models["llama"]), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        seen: set[int] = set()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                assert _get(f"http://127.0.0.1:{port}/healthz")[0] == 200
                status, _ = _get(f"http://127.0.0.1:{port}/readyz")
            except (urllib.error.URLError, ConnectionError):
                assert process.poll() is None, process.communicate()
                time.sleep(0.05)
                continue
            seen.add(status)
            if status == 200:
                break
            time.sleep(0.01)
        assert 200 in seen, seen
        body = json.dumps({"input_ids": [[5, 6, 7], [8, 9, 10]], "max_new_tokens": 4}).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/generate", body, {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            rows = json.loads(answer.read())["output_ids"]
        # Two rows of the prompt and up to 4 new tokens each (fewer where both stopped early).
        assert len(rows) == 2 and len(rows[0]) == len(rows[1]) and 4 <= len(rows[0]) <= 7, rows
        assert _get(f"http://127.0.0.1:{port}/stats") == (200, {"graphs": 0, "frames": 0, "compiler_modules": []})
    finally:
        process.terminate()
        out, _ = process.communicate(timeout=30)
    assert "primed 2 buckets (2 precompiled)" in out, out


def test_a_weight_held_in_another_dtype_is_converted_once_for_every_package(tmp_path: Path) -> None:
    """A float32 bucket over a bfloat16 checkpoint: each weight is converted once, and every package binds that copy
    (converting per package held one private copy of the model per package: 5.9 GB for Qwen3-0.6B's two)."""
    import torch
    from safetensors.torch import save_file

    from warmcache.runtime.mapped_weights import MappedCheckpoint

    save_file({"model.embed.weight": torch.ones((4, 2), dtype=torch.bfloat16)}, str(tmp_path / "model.safetensors"))
    checkpoint = MappedCheckpoint.open(tmp_path)
    header = {
        "checkpoint_names": {"model.model.embed.weight": ["model.embed.weight"]},
        "constants": {"model.model.embed.weight": [[4, 2], "torch.float32"]},
        "buffers": {},
    }
    prefill, decode = (checkpoint.bind(tmp_path / name, header, "cpu") for name in ("prefill", "decode"))
    (first,), (second,) = prefill.values(), decode.values()
    assert first.dtype == torch.float32 and first.data_ptr() == second.data_ptr()
    assert list(checkpoint.converted) == ["model.model.embed.weight"]
    with pytest.raises(UsageError, match="holds none of"):
        checkpoint.bind(tmp_path / "other", {**header, "checkpoint_names": {"model.model.embed.weight": ["x"]}}, "cpu")


def test_a_decode_whose_inputs_need_the_models_code_gets_no_packaged_prefill() -> None:
    """Recurrent state and sliding-window masks are built by the model's own code: warmup packages no prefill for them
    (and a start from the mount refuses their buckets), where an attention-only decode gets one."""
    from warmcache.artifacts.prefill_inputs import prefill_unsupported

    attention = ["input_ids", "position_ids", "attention_mask.full_attention"]
    attention += [f"cache.layers[0].{part}" for part in ("keys", "values", "cumulative_length")]
    assert prefill_unsupported(attention) is None
    assert "sliding_attention" in (prefill_unsupported([*attention, "attention_mask.sliding_attention"]) or "")
    assert "conv_states" in (prefill_unsupported([*attention, "cache.layers[1].conv_states[0]"]) or "")
    # BLOOM's unpadded decode: generate() dropped its all-ones mask, and the model builds its bias from the key length
    unmasked = [name for name in attention if not name.startswith("attention_mask")]
    assert "no attention mask" in (prefill_unsupported(unmasked) or "")
