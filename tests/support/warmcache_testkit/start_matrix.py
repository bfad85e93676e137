"""Every start primes from the packages, whatever varies between pods: fresh serving processes, counted.

A published compile cache that keys on a path misses silently when a pod's HOME moves (vLLM #47573) and reuses
nothing across pods (aws-neuron-sdk #1368). This starts N fresh serving processes the way a replica starts, from a
signed guard snapshot folder holding a tiny model's AOTInductor packages, each under a different environment: the
Python prefix (a second venv, same pins), HOME, XDG_CACHE_HOME, TMPDIR, the working folder, the hostname, the uid
(``nobody`` through ``setpriv``) and where the snapshot folder lies (where it was written, copied, moved, behind a
symlink). A start hits when the prime loaded every bucket's package with no graph traced and no compiler module
imported, and a ragged request per bucket ran with none either. It prints the hit rate; each miss names its cause:
what the prime reported and ``warmcache explain`` run in that start's own environment.

    python -m warmcache_testkit.start_matrix --work /tmp/starts --starts 200 --python /other/venv/bin/python
    python -m warmcache_testkit.start_matrix --quick     # 6 starts over a one-bucket warmup: that it runs (about 2 min)

Exit 0 only when every start hit, 1 when any missed, 2 when none missed but some could not run: a start whose
interpreter cannot import torch, transformers and warmcache as its uid (a folder unreadable to it) is the tool's
failure, reported apart ("COULD NOT RUN") and left out of the hit rate. ``--python`` adds interpreters (each with
warmcache and the same pins); a venv linked to this one's packages, at another prefix, is always one of them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

#: The model's name in the manifest, registry and snapshot.
MODEL = "m"
PROMPT = 8
MAX_CACHE_LEN = 16
COMPILER_MODULES = ("torch._inductor.compile_fx", "torch._inductor.codecache", "torch._inductor.graph")

#: A replica's start: the guard from the snapshot folder, prime, one ragged request per bucket, what it cost.
SERVE = """
import json, os, socket, sys
import torch
from transformers import AutoModelForCausalLM
from warmcache.runtime.guard import ShapeGuard

folder, model_path, key, compiler_modules = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split(",")
model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
guard = ShapeGuard.from_snapshot(folder, "m", trust=[key], telemetry_url=None)
report = guard.prime(model)
for batch, _ in guard.buckets:
    lengths = [max(1, 8 - row) for row in range(batch)]
    ids = torch.randint(5, 300, (batch, max(lengths)), generator=torch.Generator().manual_seed(batch))
    mask = torch.zeros_like(ids)
    for row, length in enumerate(lengths):
        mask[row, -length:] = 1
        ids[row, :-length] = 0
    guard.generate(model, input_ids=ids, attention_mask=mask, max_new_tokens=4, min_new_tokens=4)
from torch._dynamo.utils import counters
import warmcache
print(json.dumps({
    "buckets": len(guard.buckets),
    "artifacts_loaded": report.artifacts_loaded,
    "artifact_errors": report.artifact_errors,
    "graphs": int(counters["stats"]["unique_graphs"]),
    "frames": sum(counters["frames"].values()),
    "compiler_modules": [m for m in compiler_modules if m in sys.modules],
    "prefix": sys.prefix, "warmcache": warmcache.__file__, "uid": os.getuid(), "hostname": socket.gethostname(),
}))
"""


@dataclasses.dataclass(frozen=True)
class Start:
    """What one start varies: each field a way pods differ."""

    python: str
    home: str  # "fresh" | "missing" (a HOME that does not exist)
    xdg_cache: str  # "unset" | "fresh"
    tmpdir: str  # "unset" | "fresh" | "missing" (names a folder that does not exist)
    cwd: str  # "fresh" | "root" (/)
    snapshot: str  # "written" | "copied" | "moved" | "symlink"
    hostname: str | None
    uid: int | None

    def describe(self) -> str:
        who = f"uid {self.uid if self.uid is not None else os.getuid()}"
        return (
            f"{self.python} HOME={self.home} XDG_CACHE_HOME={self.xdg_cache} TMPDIR={self.tmpdir} cwd={self.cwd} "
            f"snapshot={self.snapshot} hostname={self.hostname or 'same'} {who}"
        )


def can(command: list[str]) -> bool:
    """Whether this machine lets us run ``command`` (a namespace, another uid)."""
    try:
        return subprocess.run(command, capture_output=True, timeout=30).returncode == 0
    except OSError:
        return False


def plan_starts(count: int, pythons: list[str]) -> list[Start]:
    """``count`` starts cycling each dimension with its own period, so that the combinations keep changing."""
    other_uid = 65534 if can(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "true"]) else None
    hostnames = can(["unshare", "--uts", "hostname", "pod-probe"])
    starts = []
    for i in range(count):
        uid = other_uid if i % 3 == 2 else None
        snapshot = ("written", "copied", "moved", "symlink")[i % 4]
        if uid is not None and snapshot == "written":  # a test's tmp folder is root's alone: a pod's mount is not
            snapshot = "copied"
        starts.append(
            Start(
                python=pythons[i % len(pythons)],
                home=("fresh", "missing")[i % 5 == 4],
                xdg_cache=("unset", "fresh")[(i // 2) % 2],
                tmpdir=("fresh", "unset", "fresh", "missing")[i % 4 if i % 7 in (1, 3) else 0],
                cwd=("fresh", "root")[(i // 3) % 2],
                snapshot=snapshot,
                hostname=f"pod-{i}" if hostnames and i % 2 else None,
                uid=uid,
            )
        )
    return starts


def linked_venv(at: Path) -> str:
    """A venv at another prefix whose ``site-packages`` adds this one's: a second install with the same pins, without
    a second download. Returns its python."""
    if not (at / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(at)], check=True)
        target = Path(sysconfig.get_path("purelib", vars={"base": str(at), "platbase": str(at)}))
        # addsitedir, not a bare path: it also runs this venv's .pth files (an editable install's finder among them)
        (target / "_same_pins.pth").write_text(f"import site; site.addsitedir({site.getsitepackages()[0]!r})\n")
    return str(at / "bin" / "python")


def warm(root: Path, model_path: Path, batches: list[int]) -> Path:
    """The real ``warmcache warmup`` of ``precompile = "aotinductor"`` buckets into ``root``; returns the manifest."""
    manifest = root / "manifest.toml"
    manifest.write_text(
        f'[registry]\nurl = "sqlite:///{root}/registry.sqlite"\n\n[cache]\ndir = "{root}/cache"\n\n'
        f'[[model]]\nname = "{MODEL}"\npath = "{model_path}"\ndevice = "cpu"\ndtype = "float32"\n'
        f'backend = "inductor"\nprecompile = "aotinductor"\n\n'
        f"[[model.generate]]\nbatch_sizes = {batches}\nprompt_lengths = [{PROMPT}]\nmax_cache_len = {MAX_CACHE_LEN}\n"
    )
    done = subprocess.run([sys.executable, "-m", "warmcache", "warmup", str(manifest)], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"warmup failed: {done.stderr[-2000:]}")
    return manifest


def export_snapshot(root: Path) -> tuple[Path, Path]:
    """Sign the registry's rows into ``root/cache`` (the snapshot folder a pod mounts); returns it and the public
    key."""
    from warmcache.trust import generate_key

    key = root / "build-key"
    if not key.exists():
        generate_key(key)
    out = root / "cache"
    command = ["guard", "export", "--model", MODEL, "--out", str(out), "--sign", str(key)]
    db = ["--db", f"sqlite:///{root}/registry.sqlite"]
    subprocess.run([sys.executable, "-m", "warmcache", *command, *db], check=True, capture_output=True)
    return out, key.with_name(key.name + ".pub")


class Scratch:
    """A world-readable folder (another uid reads it) holding the serve script, the model, the key, the snapshot's
    copies and each start's private folders."""

    def __init__(self, root: Path, model_path: Path, public_key: Path, manifest: Path) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="warmcache-starts-"))
        self.root.chmod(0o755)
        self.script = self.root / "serve.py"
        self.script.write_text(SERVE)
        self.model = self.root / "model"
        shutil.copytree(model_path, self.model)
        for file in self.model.iterdir():  # save_pretrained writes the weights 0600: a model volume is readable
            file.chmod(0o644)
        self.key = self.root / public_key.name
        shutil.copy(public_key, self.key)
        self.manifest, self.registry = manifest, root / "registry.sqlite"

    def place(self, snapshot: Path, how: str, i: int) -> Path:
        """Where start ``i`` finds the snapshot folder."""
        if how == "written":
            return snapshot
        copy = self.root / f"copy-{i}" / "cache"
        shutil.copytree(snapshot, copy)
        if how == "copied":
            return copy
        if how == "moved":
            moved = self.root / f"moved-{i}" / "mnt" / "warm"
            moved.parent.mkdir(parents=True)
            return copy.rename(moved)
        link = self.root / f"link-{i}"
        link.symlink_to(copy, target_is_directory=True)
        return link

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def environment(start: Start, i: int, scratch: Scratch) -> tuple[dict[str, str], Path]:
    """The start's environment (nothing inherited but PATH and LANG) and working folder, its folders owned by its
    uid."""
    private = scratch.root / f"start-{i}"
    private.mkdir()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1"}
    env["HOME"] = str(private / ("home" if start.home == "fresh" else "no-such-home"))
    if start.xdg_cache == "fresh":
        env["XDG_CACHE_HOME"] = str(private / "xdg-cache")
    if start.tmpdir != "unset":
        env["TMPDIR"] = str(private / ("tmp" if start.tmpdir == "fresh" else "no-such-tmp"))
    for name in ("HOME", "XDG_CACHE_HOME", "TMPDIR"):
        if name in env and "no-such" not in env[name]:
            Path(env[name]).mkdir()
    cwd = private / "work" if start.cwd == "fresh" else Path("/")
    cwd.mkdir(exist_ok=True)
    if start.uid is not None:
        for path in [private, *private.rglob("*")]:
            os.chown(path, start.uid, start.uid)
    return env, cwd


def wrapped(start: Start, command: list[str]) -> list[str]:
    """``command`` under the start's uid (no capabilities) and in its own UTS namespace named after it."""
    if start.uid is not None:
        command = ["setpriv", f"--reuid={start.uid}", f"--regid={start.uid}", "--clear-groups", "--inh-caps=-all"] + [
            *command
        ]
    if start.hostname:
        command = ["unshare", "--uts", "sh", "-c", f'hostname {start.hostname} && exec "$@"', "sh", *command]
    return command


def run_start(start: Start, i: int, snapshot: Path, scratch: Scratch) -> dict[str, Any]:
    """One fresh serving process; its report, ``hit`` and, on a miss, ``cause``."""
    folder = scratch.place(snapshot, start.snapshot, i)
    env, cwd = environment(start, i, scratch)
    argv = [start.python, str(scratch.script), str(folder), str(scratch.model), str(scratch.key)]
    began = time.perf_counter()
    done = subprocess.run(
        wrapped(start, [*argv, ",".join(COMPILER_MODULES)]), env=env, cwd=cwd, capture_output=True, text=True
    )
    seconds = time.perf_counter() - began
    try:
        report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        report = {"exit": done.returncode, "stderr": done.stderr.strip().splitlines()[-3:]}
    report["seconds"] = round(seconds, 2)
    report["hit"] = (
        done.returncode == 0
        and report.get("buckets", 0) > 0
        and report["artifacts_loaded"] == report["buckets"]
        and not report["artifact_errors"]
        and report["graphs"] == 0
        and report["frames"] == 0
        and not report["compiler_modules"]
    )
    if not report["hit"]:
        unable = None if "buckets" in report else cannot_run(start, env, cwd)
        if unable:
            report["could_not_run"] = unable
        else:
            report["cause"] = explain(start, i, scratch, env, cwd)
    shutil.rmtree(scratch.root / f"start-{i}", ignore_errors=True)
    for leftover in (f"copy-{i}", f"moved-{i}"):
        shutil.rmtree(scratch.root / leftover, ignore_errors=True)
    (scratch.root / f"link-{i}").unlink(missing_ok=True)
    return report


#: What a replica's process imports before warmcache does anything: a start whose interpreter cannot is not a start.
IMPORTS_PROBE = "import torch, transformers, warmcache"


def cannot_run(start: Start, env: dict[str, str], cwd: Path) -> str | None:
    """Why the start's interpreter, as its uid and in its environment, cannot even import what a replica imports (a
    folder of the tool's own unreadable to that uid, say): the tool failed to set the start up, warmcache did not
    miss. ``None`` when it can, so a start that failed is warmcache's miss."""
    done = subprocess.run(
        wrapped(start, [start.python, "-c", IMPORTS_PROBE]), env=env, cwd=cwd, capture_output=True, text=True
    )
    if done.returncode == 0:
        return None
    said = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
    return f"{start.python} as uid {start.uid if start.uid is not None else os.getuid()}: {said}"


def explain(start: Start, i: int, scratch: Scratch, env: dict[str, str], cwd: Path) -> str:
    """``warmcache explain`` in the start's own environment (its toolchain, its paths) over a copy of the registry."""
    registry = scratch.root / f"start-{i}" / "registry.sqlite"
    shutil.copy(scratch.registry, registry)
    if start.uid is not None:
        os.chown(registry, start.uid, start.uid)
    command = [start.python, "-m", "warmcache", "explain", str(scratch.manifest), "--db", f"sqlite:///{registry}"]
    done = subprocess.run(wrapped(start, command), env=env, cwd=cwd, capture_output=True, text=True)
    return (done.stdout + done.stderr).strip()


def run_matrix(snapshot: Path, scratch: Scratch, starts: list[Start], echo: bool = True) -> list[dict[str, Any]]:
    """Every start, in order; prints a line per miss (and a dot per hit) as it goes."""
    reports = []
    for i, start in enumerate(starts):
        report = run_start(start, i, snapshot, scratch)
        reports.append(report)
        if echo:
            if report["hit"]:
                print(".", end="", flush=True)
            else:
                label = "COULD NOT RUN" if "could_not_run" in report else "MISS"
                print(f"\n{label} start {i} ({start.describe()}): {json.dumps(report)}", flush=True)
    if echo:
        print()
    return reports


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=None, help="Folder for the model and warmup (kept, reused).")
    parser.add_argument("--starts", type=int, default=200, help="How many fresh starts.")
    parser.add_argument("--python", action="append", default=[], help="Another interpreter to start with.")
    parser.add_argument("--quick", action="store_true", help="6 starts over a one-bucket warmup: that it runs.")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="start-matrix-"))
    work.mkdir(parents=True, exist_ok=True)
    from warmcache.examples.tiny_model import build_tiny_model

    model_path = build_tiny_model("llama", work / "tiny-llama")
    began = time.perf_counter()
    manifest = work / "manifest.toml"
    if not (work / "registry.sqlite").exists():
        manifest = warm(work, model_path, [1] if args.quick else [1, 4])
        print(f"warmup: {time.perf_counter() - began:.0f} s")
    snapshot, public_key = export_snapshot(work)
    scratch = Scratch(work, model_path, public_key, manifest)
    try:
        # In the world-readable scratch folder, not --work (a mkdtemp folder, mode 700): as uid 65534 a second venv
        # there found no site-packages, and those starts read as misses ("No module named warmcache").
        pythons = [sys.executable, linked_venv(scratch.root / "second-venv"), *args.python]
        starts = plan_starts(6 if args.quick else args.starts, pythons)
        reports = run_matrix(snapshot, scratch, starts)
    finally:
        scratch.close()
    print(summary(reports, len(pythons)))
    for dimension in ("python", "home", "xdg_cache", "tmpdir", "cwd", "snapshot", "uid"):
        values = sorted({str(getattr(s, dimension)) for s in starts})
        counts = {v: sum(1 for s in starts if str(getattr(s, dimension)) == v) for v in values}
        print(f"  {dimension}: {', '.join(f'{v} x{n}' for v, n in counts.items())}")
    named = sum(1 for s in starts if s.hostname)
    print(f"  hostname: own UTS namespace x{named}, the machine's x{len(starts) - named}")
    return exit_code(reports)


def summary(reports: list[dict[str, Any]], interpreters: int) -> str:
    """The hit rate over the starts that ran; those the tool could not set up are counted apart, never as misses."""
    ran = [r for r in reports if "could_not_run" not in r]
    hits = sum(r["hit"] for r in ran)
    seconds = sorted(r["seconds"] for r in ran) or [0.0]
    rate = f"hit rate {100 * hits / len(ran):.1f} %" if ran else "no start ran"
    unable = len(reports) - len(ran)
    apart = f"; {unable} could not run (the tool's setup, not warmcache: see COULD NOT RUN above)" if unable else ""
    return (
        f"{len(ran)} fresh starts over {interpreters} interpreters: {hits} primed every bucket from its package with 0 "
        f"compiles ({rate}); start-to-served median {seconds[len(seconds) // 2]:.1f} s{apart}"
    )


def exit_code(reports: list[dict[str, Any]]) -> int:
    """0 when every start hit, 1 when any missed, 2 when none missed but the tool could not run some."""
    if any(not r["hit"] and "could_not_run" not in r for r in reports):
        return 1
    return 2 if any("could_not_run" in r for r in reports) else 0


if __name__ == "__main__":
    raise SystemExit(main())
