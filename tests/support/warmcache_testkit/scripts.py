"""A script under ``tools/`` loaded as a module, for a test of one of its functions.

The benchmarks and the documentation hook are scripts, not a package: ``python tools/bench/bench_guard.py`` runs them
and ``mkdocs`` loads ``tools/docs/mkdocs_hooks.py`` from its file. A test loads them the way ``mkdocs`` does, from
the file (``importlib``), adding nothing to the import path: what a script imports comes from an installed
package (``warmcache``, ``warmcache_testkit``), as when it runs.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_script(path: Path) -> ModuleType:
    """The script at ``path`` executed as the module ``tools_<stem>`` (once: a second call returns the same module;
    registered in ``sys.modules`` while it runs, as dataclasses need)."""
    name = f"tools_{path.stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path}: not a Python script")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
