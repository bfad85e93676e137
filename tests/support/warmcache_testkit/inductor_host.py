"""The suite's one real Inductor warmup, as a value tests share (conftest's ``inductor_warmup`` fixture builds it).

A cold Inductor compile of the tiny model costs tens of seconds on 2 cores; the
bundle and store round trips need the same kind of cache, so they start from one
warmup instead of three.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from warmcache_testkit.manifests import Table, generate, manifest_toml, model

#: The one real Inductor warmup of the suite: tiny Qwen3, batch 1 and 2 (two decode graphs), prompts of 8 and 12
#: (sharing them).
INDUCTOR_MODEL = "tiny-qwen3"
BATCH_SIZES = (1, 2)
PROMPT_LENGTHS = (8, 12)
INDUCTOR_BUCKET = "fleet-cache"


@dataclass(frozen=True)
class InductorWarmup:
    """A registry and cache filled by one real ``warmcache warmup`` on Inductor, pushed to S3 as each shape compiled.

    Tests that change the build (prune, forget, move) work on :meth:`copy`; tests that
    only read it (push, pull) use it as it is.
    """

    root: Path
    model_path: Path  # the tiny Qwen3 checkpoint it warmed
    report: dict[str, Any]  # the warmup's --json summary
    s3_store: tuple[str, ...]  # the --store/--endpoint-url the warmup pushed to

    @property
    def manifest(self) -> Path:
        return self.root / "manifest.toml"

    @property
    def cache(self) -> Path:
        return self.root / "cache"

    @property
    def db(self) -> str:
        return f"sqlite:///{self.root / 'registry.sqlite'}"

    def model(
        self, batch_sizes: tuple[int, ...] = BATCH_SIZES, prompt_lengths: tuple[int, ...] = PROMPT_LENGTHS
    ) -> Table:
        """The warmed model's ``[[model]]`` over some of its shapes: a manifest of it plans identities the build
        holds."""
        return model(
            INDUCTOR_MODEL, str(self.model_path), backend="inductor", generate=[generate(batch_sizes, prompt_lengths)]
        )

    def manifest_for(
        self, path: Path, batch_sizes: tuple[int, ...] = BATCH_SIZES, prompt_lengths: tuple[int, ...] = PROMPT_LENGTHS
    ) -> Path:
        """Write a manifest of some of the build's shapes, naming its cache folder, to ``path``."""
        path.write_text(manifest_toml(self.model(batch_sizes, prompt_lengths), cache={"dir": str(self.cache)}))
        return path

    def copy(self, target: Path) -> InductorWarmup:
        """The build copied under ``target``, its manifest naming the copy's cache."""
        shutil.copytree(self.root, target)
        manifest = target / "manifest.toml"
        manifest.write_text(manifest.read_text().replace(str(self.root), str(target)))
        return InductorWarmup(target, self.model_path, self.report, self.s3_store)


def warmcache_json(*args: str, ok_codes: tuple[int, ...] = (0,)) -> Any:
    """Run the CLI in a fresh process (as a pipeline would) and parse its --json output."""
    result = subprocess.run(
        [sys.executable, "-m", "warmcache", *args, "--json"], capture_output=True, text=True, timeout=600
    )
    assert result.returncode in ok_codes, (
        f"warmcache {' '.join(args)} exited {result.returncode}:\n{result.stdout}\n{result.stderr[-3000:]}"
    )
    return json.loads(result.stdout)
