"""The support matrix on published configs: every config × route × dtype at real width, depth cut to 2 layers.

Run through ``python -m warmcache_testkit.support_matrix --real`` (``--config``, ``--dtype`` and ``--route``
narrow it). Each cell is what a user's deployment would run, through the CLI in fresh
processes, on its own registry and cache folder:

* ``inductor``: ``warmcache warmup`` (real Inductor compiles, decoding to the full cache,
  unpadded and left-padded), ``warmcache verify`` (zero cache misses in a fresh process), then
  a fresh serving process that primes a ``ShapeGuard`` and sends ragged requests
  (``warmcache_testkit.serving_check``): 0 graphs after priming, every token agreeing with the
  model's eager logits under the dtype's criterion (``warmcache.warmup.verify.agreement``);
* ``precompile``: the same with ``precompile = true`` (each bucket's decode step saved with
  ``aot_compile``; verify proves the artifact to the cache's end);
* ``aotinductor``: ``precompile = "aotinductor"``; the serving process must also trace no
  Dynamo frame and import no compiler module;
* ``train``: two real ``Trainer`` steps (unpadded, then right-padded), Inductor; the
  ``bfloat16`` column trains the float32 model under ``bf16`` mixed precision.

A cell ``plan`` refuses is shown with its reason: nothing compiled.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from warmcache_testkit.measured_run import run_measured
from warmcache_testkit.real_model import real_configs
from warmcache_testkit.serving_check import serve

ROUTES = ("inductor", "precompile", "aotinductor", "train")
DTYPES = ("float32", "bfloat16")
LAYERS = 2
BATCH, PROMPT, MAX_CACHE_LEN = 2, 8, 24
#: A single prompt padded onto the batch-2 bucket with a dummy row, and a left-padded pair.
REQUESTS = ((5,), (8, 3))
TRAIN_LENGTH = 16


@dataclass(frozen=True)
class Cell:
    """One config × dtype × route: passed, refused at plan time, or failed, and what was seen."""

    config: str
    dtype: str
    route: str
    outcome: str  # "pass" | "refused" | "FAIL"
    detail: str
    seconds: float
    peak_rss: int = 0
    """The largest resident memory of any process of the cell (warmup, verify, serving), bytes."""

    def text(self) -> str:
        said = f"{self.outcome}: {self.detail}" if self.detail else self.outcome
        return f"{said} ({self.seconds:.0f} s, {self.peak_rss / 1e9:.1f} GB)"


@dataclass(frozen=True)
class Built:
    """A config's depth-cut model as written by ``warmcache_testkit.real_model`` in its own process, with its cost."""

    path: Path
    layers: int
    seconds: float
    peak_rss: int


def _cli(command: str, manifest: Path, peaks: list[int]) -> tuple[int, Any, str]:
    done = run_measured([sys.executable, "-m", "warmcache", command, str(manifest), "--json"])
    peaks.append(done.peak_rss)
    try:
        report = json.loads(done.stdout) if done.stdout.strip() else None
    except json.JSONDecodeError:
        report = None
    return done.returncode, report, (done.stderr.strip().splitlines() or [""])[-1]


def _declared(model_path: Path, dtype: str, route: str) -> str:
    head = (
        '[registry]\nurl = "sqlite:///REGISTRY"\n[cache]\ndir = "CACHE"\n[[model]]\nname = '
        f'"m"\npath = "{model_path}"\nbackend = "inductor"\n'
    )
    if route == "train":
        return (
            head + f'dtype = "float32"\n[[model.train]]\nbatch_sizes = [{BATCH}]\nseq_lengths = '
            f"[{TRAIN_LENGTH}]\nbf16 = {'true' if dtype == 'bfloat16' else 'false'}\n"
        )
    precompile = {"inductor": "false", "precompile": "true", "aotinductor": '"aotinductor"'}[route]
    return (
        head + f'dtype = "{dtype}"\nprecompile = {precompile}\n[[model.generate]]\nbatch_sizes = '
        f"[{BATCH}]\nprompt_lengths = [{PROMPT}]\nmax_cache_len = {MAX_CACHE_LEN}\n"
    )


def run_cell(work: Path, config: str, model_path: Path, dtype: str, route: str) -> Cell:
    """Plan, warm, verify and serve one cell in its own folder."""
    start = time.perf_counter()
    root = work / f"{config}-{dtype}-{route}"
    root.mkdir(parents=True)
    manifest = root / "manifest.toml"
    manifest.write_text(
        _declared(model_path, dtype, route)
        .replace("REGISTRY", str(root / "registry.sqlite"))
        .replace("CACHE", str(root / "cache"))
    )

    peaks: list[int] = []

    def cell(outcome: str, detail: str) -> Cell:
        return Cell(config, dtype, route, outcome, detail, time.perf_counter() - start, max(peaks, default=0))

    # plan is read-only and refuses a registry that does not exist yet: create it first, as a pipeline would.
    created = run_measured(
        [sys.executable, "-m", "warmcache", "db", "upgrade", "--db", f"sqlite:///{root / 'registry.sqlite'}"]
    )
    if created.returncode:
        return cell("FAIL", f"db upgrade: {(created.stderr.strip().splitlines() or [''])[-1]}")
    code, _, last = _cli("plan", manifest, peaks)
    if code:
        return cell("refused", last)
    code, report, last = _cli("warmup", manifest, peaks)
    failed = [s["error"] for s in (report or {}).get("specs", []) if s["status"] != "compiled"]
    if code or failed:
        return cell("FAIL", f"warmup: {failed[0] if failed else last}")
    if route == "train":
        return cell("pass", "")
    code, report, last = _cli("verify", manifest, peaks)
    verdicts = [s for s in (report or {}).get("specs", [])]
    if code or any(v["verdict"] != "verified" for v in verdicts):
        return cell(
            "FAIL",
            f"verify: {next((v['reason'] or v['verdict'] for v in verdicts if v['verdict'] != 'verified'), last)}",
        )
    served = serve(root, model_path, REQUESTS, prompt=PROMPT, max_cache_len=MAX_CACHE_LEN, dtype=dtype)
    peaks.append(served["peak_rss"])
    problems = []
    if served["graphs_after_priming"] or served["artifact_errors"]:
        problems.append(f"{served['graphs_after_priming']} graphs after priming {served['artifact_errors']}")
    if route == "aotinductor" and (served["frames"] or served["compiler_modules"]):
        problems.append(f"{served['frames']} Dynamo frames, imported {served['compiler_modules']}")
    problems += [r["agreement"] for r in served["results"] if not r["agrees"]]
    if problems:
        return cell("FAIL", "; ".join(problems))
    from warmcache.warmup.verify.agreement import figure

    return cell("pass", figure(max(r["worst"] for r in served["results"])))  # 1.2e-06 in float32, not 0.00 %


def config_file(name: str) -> Path:
    """A config kept in this package's ``realconfigs/`` by its stem, or any ``config.json`` by its path (configs the
    project never saw)."""
    known = real_configs()
    path = known[name] if name in known else Path(name)
    if not path.is_file():
        raise SystemExit(f"{name}: neither a config in warmcache_testkit/realconfigs ({', '.join(known)}) nor a file")
    return path


def build(config_path: Path, models: Path, layers: int, widen: bool, narrow: int = 1) -> Built:
    """The config's model at depth ``layers`` under ``models`` (kept there: a folder built before is reused), built
    in its own process so its time and peak memory are its own."""
    out = models / f"{config_path.stem}-{layers}l{'' if widen else '-exact'}{f'-narrow{narrow}' if narrow > 1 else ''}"
    start = time.perf_counter()
    argv = [sys.executable, "-m", "warmcache_testkit.real_model", str(config_path), str(out)]
    done = run_measured([*argv, "--layers", str(layers), "--narrow", str(narrow), *([] if widen else ["--no-widen"])])
    if done.returncode:
        raise SystemExit(f"{config_path}: building the model failed: {done.stderr.strip()[-2000:]}")
    kept = json.loads((out / "config.json").read_text())["num_hidden_layers"]
    return Built(out, kept, time.perf_counter() - start, done.peak_rss)


def run_matrix(
    work: Path,
    configs: Sequence[str],
    dtypes: Sequence[str],
    routes: Sequence[str],
    progress: Any = print,
    *,
    layers: int = LAYERS,
    widen: bool = True,
    narrow: int = 1,
    models: Path | None = None,
) -> tuple[list[Cell], dict[str, Built]]:
    """Every requested cell, one model built per config (weights saved once, loaded per cell in its dtype)."""
    cells, built = [], {}
    for config_path in map(config_file, configs):
        config = config_path.stem
        built[config] = build(config_path, models or work / "models", layers, widen, narrow)
        b = built[config]
        progress(f"{config}: built {b.layers} layers in {b.seconds:.0f} s, peak RSS {b.peak_rss / 1e9:.1f} GB")
        for dtype in dtypes:
            for route in routes:
                cell = run_cell(work, config, built[config].path, dtype, route)
                progress(f"{config} {dtype} {route}: {cell.text()}")
                cells.append(cell)
    return cells, built


def markdown(cells: Sequence[Cell], seconds: float, built: dict[str, Built]) -> str:
    routes = list(dict.fromkeys(c.route for c in cells))
    lines = [f"| config | dtype | {' | '.join(routes)} |", f"| --- | --- |{' --- |' * len(routes)}"]
    for config, dtype in dict.fromkeys((c.config, c.dtype) for c in cells):
        row = {c.route: c.text() for c in cells if (c.config, c.dtype) == (config, dtype)}
        lines.append(f"| {config} | {dtype} | {' | '.join(row.get(r, '') for r in routes)} |")
    lines += [
        "",
        "Built (`warmcache_testkit.real_model`, its own process): "
        + "; ".join(
            f"{name} {b.layers} layers in {b.seconds:.0f} s, peak RSS {b.peak_rss / 1e9:.1f} GB"
            for name, b in built.items()
        )
        + ". Each cell: its wall time and the largest peak RSS of its processes.",
    ]
    lines += [
        "",
        "pass (generate routes): warmup, `verify` (verified: 0 cache misses, any artifact proven to the cache's end), "
        "then a fresh serving process with 0 graphs compiled after priming (aotinductor: 0 Dynamo frames and no "
        "compiler module imported at all), every step judged by warmcache.warmup.verify.agreement; the figure is the "
        "largest distance of a served token's logit below the best, as a share of the step's logit RMS. "
        "train: two real Trainer steps.",
        f"Produced by `python -m warmcache_testkit.support_matrix --real` in {seconds:.0f} s "
        f"(depth cut, at real width, random weights, Inductor, CPU; batch {BATCH}, prompt {PROMPT}, "
        f"max_cache_len {MAX_CACHE_LEN}, "
        f"ragged requests {[list(r) for r in REQUESTS]}; train batch {BATCH} × {TRAIN_LENGTH}).",
    ]
    return "\n".join(lines)
