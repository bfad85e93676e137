"""The architecture support matrix: every popular decoder family through warmup, verify and the guard.

Per architecture (tiny random-weight configs from ``warmcache/examples/tiny_model.py``, aot_eager on CPU unless
``--backend inductor``):

* **generate**: ``warmcache warmup`` (which decodes to a full cache and fails a
  shape whose decode compiles again at a later position), ``warmcache verify``
  (the same in a fresh process), then ``ShapeGuard.prime`` and ragged requests
  decoding past the sliding window, which must compile 0 graphs and give each row the
  greedy tokens transformers' own eager ``generate()`` gives it alone, unpadded;
* **train**: the warmup's real ``Trainer`` steps (unpadded and padded batch).

``tests/test_architectures.py`` asserts every cell; this script prints the
support table of docs/measurements/architectures.md from the same run:

    python -m warmcache_testkit.support_matrix                 # markdown table on stdout (minutes)
    python -m warmcache_testkit.support_matrix --arch gemma2 --arch llama --out table.md
    python -m warmcache_testkit.support_matrix --arch qwen3-next --backend inductor
    python -m warmcache_testkit.support_matrix --real          # published configs at real width, every route and dtype
    (warmcache_testkit.real_matrix; hours)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from warmcache.examples.tiny_model import ARCHITECTURES, build_tiny_model
from warmcache_testkit.real_matrix import DTYPES, LAYERS, ROUTES, run_matrix
from warmcache_testkit.real_matrix import markdown as real_markdown
from warmcache_testkit.real_model import real_configs

#: One compiled batch size (the guard pads 1 to 2) and two prompt buckets sharing its decode graph.
BATCH_SIZES = (2,)
PROMPT_LENGTHS = (4, 8)
#: Room for 17 new tokens after an 8-token prompt: decodes run well past the window.
MAX_CACHE_LEN = 24
TRAIN_LENGTH = 8
#: How far a padded row's float64 logits may be from the row alone's, as a share of their std, for a differing float32
#: row to count as rounding (hrm_text's: 0, to the bit; a pad that reaches the state, LFM2 with a conv bias: 6e-3).
FLOAT64_AGREEMENT = 1e-9
#: Ragged requests: prompt lengths per row (left-padded to the longest) and new tokens.
REQUESTS: tuple[tuple[tuple[int, ...], int], ...] = (((3,), 20), ((5, 8), 17), ((2, 4), 20))


def _manifest(models: dict[str, Path], workload: str, backend: str) -> str:
    tables = []
    for arch, path in models.items():
        head = f'[[model]]\nname = "{arch}"\npath = "{path}"\nbackend = "{backend}"\n'
        if workload == "generate":
            body = (
                f"[[model.generate]]\nbatch_sizes = {list(BATCH_SIZES)}\nprompt_lengths = "
                f"{list(PROMPT_LENGTHS)}\nmax_cache_len = {MAX_CACHE_LEN}\n"
            )
        else:
            body = f"[[model.train]]\nbatch_sizes = {list(BATCH_SIZES)}\nseq_lengths = [{TRAIN_LENGTH}]\n"
        tables.append(head + body)
    return "\n".join(tables)


@dataclass
class Prepared:
    """Models built, both manifests warmed and the generate one verified, in ``root``."""

    root: Path
    models: dict[str, Path]
    registry_url: str
    generate: dict[str, list[str]] = field(default_factory=dict)
    """Per architecture: the warmup/verify failure lines of its generate shapes (empty: all passed)."""
    train: dict[str, list[str]] = field(default_factory=dict)
    """Per architecture: the warmup failure lines of its training shape (empty: passed)."""
    verified: dict[str, list[str]] = field(default_factory=dict)
    """Per architecture: verify's verdicts of its generate shapes."""


def prepare(
    root: Path, archs: Sequence[str], backend: str = "aot_eager", built: dict[str, Path] | None = None
) -> Prepared:
    """Build the tiny models, warm generate and train, verify generate in a fresh process; compile with ``backend``.

    ``built`` adds models written elsewhere (``warmcache_testkit.real_model``), by name, to those of ``archs``."""
    from warmcache.cli.progress import LineProgress
    from warmcache.manifest import load_manifest
    from warmcache.settings import RegistryLocation
    from warmcache.warmup.runner import WarmupOptions, run_warmup
    from warmcache.warmup.verify import run_verify

    models = {arch: build_tiny_model(arch, root / "models" / arch) for arch in archs} | (built or {})
    archs = list(models)
    prepared = Prepared(root, models, f"sqlite:///{root / 'registry.sqlite'}")
    options = WarmupOptions(registry=RegistryLocation.parse(prepared.registry_url), cache_dir=str(root / "cache"))
    for workload, failures in (("generate", prepared.generate), ("train", prepared.train)):
        path = root / f"{workload}.toml"
        path.write_text(_manifest(models, workload, backend))
        manifest = load_manifest(path)
        summary = run_warmup(manifest, options, lambda total: LineProgress(total))
        for arch in archs:
            failures[arch] = [f"warmup: {o.error}" for o in summary.failed if o.description.startswith(f"{arch}/")]
        if workload == "generate":
            verdicts = run_verify(manifest, options.registry, options.cache_dir).verdicts
            for arch in archs:
                mine = [v for v in verdicts if v.description.startswith(f"{arch}/")]
                prepared.verified[arch] = [v.verdict for v in mine]
                failures[arch] += [f"verify: {v.reason}" for v in mine if v.failed]
    return prepared


@dataclass
class Served:
    """What one architecture's guard did with the ragged requests."""

    primed_graphs: int
    graphs_after_priming: int
    tokens_compared: int
    mismatches: list[str]
    #: Rows that differ from their unpadded run exactly as transformers' own eager decode of the guard's padded batch
    #: does, where float64 shows the padding changes nothing: float32 rounding (:func:`_float32_rounding`).
    rounding: list[str] = field(default_factory=list)


def _ragged(lengths: Iterable[int], seed: int) -> tuple[Any, Any]:
    """Left-padded ``input_ids``/``attention_mask`` of rows with the given lengths (never a special token)."""
    import torch

    lengths = list(lengths)
    width = max(lengths)
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 300, (len(lengths), width), generator=generator)
    mask = torch.ones_like(ids)
    for row, length in enumerate(lengths):
        ids[row, : width - length] = 0
        mask[row, : width - length] = 0
    return ids, mask


def serve(prepared: Prepared, arch: str) -> Served:
    """Prime a guard on the warmed registry, replay :data:`REQUESTS`, compare each row with its own unpadded eager run.

    The guard pads every request (rows of different lengths, a prompt onto its bucket, a dummy row
    onto the batch): each real row must still get the greedy tokens transformers' eager
    ``generate()`` gives that row alone, unpadded. EOS is forbidden on both sides, so rows decode
    the same number of steps. A row that differs is a mismatch unless :func:`_float32_rounding`
    shows transformers itself gives those tokens to the padded batch, and the padding nothing in float64.
    """
    import torch
    from transformers import AutoModelForCausalLM

    from warmcache.modeling.compile_counter import CompileCounter
    from warmcache.runtime.guard import ShapeGuard

    torch._dynamo.reset()  # as a fresh serving process has it
    model = AutoModelForCausalLM.from_pretrained(prepared.models[arch], dtype=torch.float32).eval()
    guard = ShapeGuard.from_registry(prepared.registry_url, arch, telemetry=False)
    try:
        primed = guard.prime(model)
        differing: list[tuple[Any, Any, int, Any, Any]] = []
        compared = 0
        # No inference_mode here: prime() loads the buckets without it, and a different
        # grad mode changes the parameters' dispatch keys, a guard failure (a recompile).
        with CompileCounter() as after:
            for seed, (lengths, new_tokens) in enumerate(REQUESTS):
                ids, mask = _ragged(lengths, seed)
                guarded = guard.generate(
                    model, input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens
                )[:, ids.shape[1] :]
                for row, length in enumerate(lengths):
                    alone = model.generate(
                        input_ids=ids[row : row + 1, ids.shape[1] - length :],
                        max_new_tokens=guarded.shape[1],
                        min_new_tokens=guarded.shape[1],
                        do_sample=False,
                        pad_token_id=0,
                        disable_compile=True,
                    )[0, length:]
                    compared += alone.numel()
                    if not torch.equal(guarded[row], alone):
                        differing.append((ids, mask, row, guarded[row], alone))
        served = Served(primed.graphs, after.graphs, compared, [])
        for ids, mask, row, guarded_row, alone in differing:
            length = int(mask[row].sum())
            seen = f"lengths {tuple(int(n) for n in mask.sum(1))}, row {row}: guarded {guarded_row.tolist()}"
            if _float32_rounding(
                prepared.models[arch],
                model,
                guard.fit({"input_ids": ids, "attention_mask": mask}),
                row,
                length,
                guarded_row,
            ):
                served.rounding.append(f"{seen} = transformers' padded eager; float64 padded = unpadded")
            else:
                served.mismatches.append(f"{seen} != eager unpadded {alone.tolist()}")
        return served
    finally:
        guard.close()


def _float32_rounding(path: Path, model: Any, fitted: Any, row: int, length: int, guarded: Any) -> bool:
    """Whether a guarded row that differs from its unpadded eager run is float32 rounding, not the padding:
    transformers' own eager ``generate()`` of the guard's padded batch gives the guarded tokens, and in float64 the
    padded row's logits are the row alone's at every step (within :data:`FLOAT64_AGREEMENT` of their std).

    A left-padded row runs its matrix products at another shape than the row alone, so float32 sums in another order;
    a tiny random-weight model can grow that into another greedy token (``hrm_text``: 5e-3 of the logits at the
    prefill, another token 14 steps later, where float64 agrees to the bit). A pad that reaches the model's state
    (:mod:`warmcache.modeling.padding_probe`) moves the float64 logits too (LFM2 with a conv bias: by 6e-3 of
    their std, too little to change its greedy tokens), and stays a mismatch.
    """
    import torch
    from transformers import AutoModelForCausalLM

    new_tokens = len(guarded)
    call = dict(
        max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0, disable_compile=True
    )
    width = fitted.inputs["input_ids"].shape[1]
    if not torch.equal(model.generate(**fitted.inputs, **call)[row, width:], guarded):
        return False
    precise = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64).eval()
    scored = {**call, "output_logits": True, "return_dict_in_generate": True}
    padded = precise.generate(**fitted.inputs, **scored).logits
    alone = precise.generate(input_ids=fitted.inputs["input_ids"][row : row + 1, width - length :], **scored).logits
    return all(
        float((p[row] - a[0]).abs().max()) <= FLOAT64_AGREEMENT * float(a[0].std()) for p, a in zip(padded, alone)
    )


@dataclass
class Row:
    arch: str
    layers: str
    generate: str
    train: str

    @property
    def ok(self) -> bool:
        return self.generate.startswith("pass") and self.train.startswith("pass")


def _layers(path: Path) -> str:
    """The decoder's cache layer kinds, counted: ``full``, ``sliding (window 8)``, ``1 conv + 1 full_attention``..."""
    from collections import Counter

    from transformers import AutoConfig
    from transformers.cache_utils import get_layer_types_and_kwargs

    config = AutoConfig.from_pretrained(path).get_text_config(decoder=True)
    kinds, _ = get_layer_types_and_kwargs(config)
    counted = Counter(kinds)
    window = getattr(config, "sliding_window", None)
    if set(counted) == {"full_attention"}:
        return "full"
    if set(counted) == {"sliding_attention"}:
        return f"sliding (window {window})"
    if set(counted) == {"sliding_attention", "full_attention"}:
        sliding, full = counted["sliding_attention"], counted["full_attention"]
        return f"hybrid ({sliding} sliding + {full} full, window {window})"
    return " + ".join(f"{count} {kind}" for kind, count in counted.items())


def row(prepared: Prepared, arch: str) -> Row:
    """One table row: the warmup/verify failures, else what the guard measured."""
    if prepared.generate[arch]:
        generate = "FAIL: " + prepared.generate[arch][0]
    else:
        served = serve(prepared, arch)
        if served.graphs_after_priming or served.mismatches:
            generate = (
                f"FAIL: {served.graphs_after_priming} graphs after priming, {len(served.mismatches)} "
                "request(s) differ from eager"
            )
        else:
            generate = (
                f"pass: 0 graphs after priming; {served.tokens_compared} greedy tokens = eager unpadded, "
                "past the window"
            )
            if served.rounding:
                generate += (
                    f", except {len(served.rounding)} padded row(s) that get transformers' own eager tokens for the "
                    "padded batch (float32 rounding: float64's padded logits = unpadded)"
                )
    train = "FAIL: " + prepared.train[arch][0] if prepared.train[arch] else "pass"
    return Row(arch, _layers(prepared.models[arch]), generate, train)


def markdown(rows: Sequence[Row], seconds: float, backend: str = "aot_eager") -> str:
    lines = [
        "| architecture | cache layers | generate (warmup, verify, guard) | train |",
        "| --- | --- | --- | --- |",
        *(f"| {r.arch} | {r.layers} | {r.generate} | {r.train} |" for r in rows),
        "",
        f"Produced by `python -m warmcache_testkit.support_matrix` in {seconds:.0f} s "
        f"(2 layers, hidden 64, {backend}, CPU; "
        f"batch {list(BATCH_SIZES)}, prompts {list(PROMPT_LENGTHS)}, max_cache_len {MAX_CACHE_LEN}).",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", choices=ARCHITECTURES, action="append", help="Architecture(s) to run (default: all).")
    parser.add_argument(
        "--backend",
        choices=("aot_eager", "inductor"),
        default="aot_eager",
        help="Compile backend of the tiny matrix (default aot_eager: seconds; inductor: what production runs).",
    )
    parser.add_argument(
        "--real",
        action="store_true",
        help="Published configs at real width through every route and dtype (warmcache_testkit.real_matrix).",
    )
    parser.add_argument(
        "--config",
        action="append",
        help=f"With --real: config(s) to run, by stem ({', '.join(sorted(real_configs()))}) or path "
        "(default: all kept).",
    )
    parser.add_argument("--dtype", choices=DTYPES, action="append", help="With --real: dtype(s) (default: both).")
    parser.add_argument("--route", choices=ROUTES, action="append", help="With --real: route(s) (default: all).")
    parser.add_argument(
        "--layers", type=int, default=LAYERS, help=f"With --real: decoder layers to keep (default {LAYERS})."
    )
    parser.add_argument(
        "--no-widen",
        action="store_true",
        help="With --real: keep exactly --layers layers, even if an attention kind is then missing (memory).",
    )
    parser.add_argument(
        "--narrow",
        type=int,
        default=1,
        help="With --real: divide every width by this, counts kept (a route that does not fit at real width).",
    )
    parser.add_argument(
        "--models",
        type=Path,
        help="With --real: build the models in this folder and keep them (a model built there before is reused).",
    )
    parser.add_argument("--out", type=Path, help="Also write the markdown table to this file.")
    args = parser.parse_args()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="warmcache-matrix-") as tmp:
        if args.real:
            cells, built = run_matrix(
                Path(tmp),
                args.config or sorted(real_configs()),
                args.dtype or DTYPES,
                args.route or ROUTES,
                lambda line: print(line, file=sys.stderr, flush=True),
                layers=args.layers,
                widen=not args.no_widen,
                narrow=args.narrow,
                models=args.models.resolve() if args.models else None,
            )
            table = real_markdown(cells, time.perf_counter() - start, built)
            ok = all(c.outcome != "FAIL" for c in cells)
        else:
            prepared = prepare(Path(tmp), args.arch or ARCHITECTURES, args.backend)
            rows = [row(prepared, arch) for arch in prepared.models]
            table, ok = markdown(rows, time.perf_counter() - start, args.backend), all(r.ok for r in rows)
    print(table)
    if args.out:
        args.out.write_text(table + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
