"""A model whose code changed after warmup, in a CLI process only: each MLP of a transformers family adds 5 % more.

What a monkeypatch does in production (a fused-kernel library, a local fix): the
checkpoint and config are the same, the computation is not. A ``sitecustomize`` on
``PYTHONPATH`` applies it in every Python process the command starts (verify's replay
child too) and nowhere else.
"""

from __future__ import annotations

import os
from pathlib import Path

_PATCH = """
import importlib

_module = importlib.import_module("transformers.models.{family}.modeling_{family}")
_mlp = getattr(_module, "{mlp}")
_forward = _mlp.forward
_mlp.forward = lambda self, x: _forward(self, x) * 1.05
"""


def mlp_scaled_env(folder: Path, family: str, mlp: str) -> dict[str, str]:
    """The environment of a process whose ``family``'s ``mlp`` class (``"llama"``, ``"LlamaMLP"``) scales its output by
    1.05; the patch is written under ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(_PATCH.format(family=family, mlp=mlp))
    return {**os.environ, "PYTHONPATH": str(folder)}
