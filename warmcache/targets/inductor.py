"""``torch.compile`` on CPU and CUDA: Inductor, plus the cache-less eager/aot_eager backends.

Inductor keeps its persistent cache in ``TORCHINDUCTOR_CACHE_DIR`` (default
``<tmp>/torchinductor_<user>``), read when it first compiles, so the runner sets
the variable before torch compiles anything. ``eager`` and ``aot_eager`` trace
with Dynamo but generate no code: they have no persistent cache, which makes
them fast for tests and means a fresh process has nothing to load.
"""

from __future__ import annotations

import getpass
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from warmcache.errors import TargetUnavailableError
from warmcache.targets.base import Target
from warmcache.targets.flavors import CacheFlavor

CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"


def inductor_default_cache_dir() -> Path:
    """torch's own default, computed without importing torch."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return Path(tempfile.gettempdir()) / ("torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))


@dataclass(frozen=True, slots=True)
class InductorTarget(Target):
    """``device`` is ``cpu`` or ``cuda``; ``backend`` is ``inductor``, ``aot_eager`` or ``eager``."""

    @property
    def cache_flavor(self) -> CacheFlavor | None:
        return "inductor" if self.backend == "inductor" else None

    def default_cache_dir(self) -> Path:
        env = os.environ.get(CACHE_ENV)
        return Path(env) if env else inductor_default_cache_dir()

    def point_cache_at(self, root: Path) -> None:
        os.environ[CACHE_ENV] = str(root)

    def check_available(self) -> None:
        if self.device != "cuda":
            return
        import torch

        if not torch.cuda.is_available():
            raise TargetUnavailableError(f"device 'cuda' ({self.describe()}): torch {torch.__version__} sees no CUDA device on this machine")

    def load_kwargs(self) -> dict[str, Any]:
        return {"device_map": "cuda"} if self.device == "cuda" else {}

    def input_device(self) -> str:
        return self.device
