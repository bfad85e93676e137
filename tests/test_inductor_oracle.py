"""Oracle: whenever Inductor's own FX-graph cache key changes with a setting, warmcache's fingerprint does too.

Inductor decides hit or miss by its key; warmcache decides "compiled" or "stale"
by its fingerprint. If a setting moved Inductor's key but not the fingerprint, a
shape would read as compiled and still compile in production. Each variable
Inductor's config module reads is flipped (through ``config.patch``, as the
variable would set it at import) and the key of a tiny graph recomputed: no
compile, a few milliseconds per setting.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from warmcache.identity.compile_env import EXCLUDED_ENV, GRAPH_ENV
from warmcache.identity.fingerprint import current_toolchain

torch = pytest.importorskip("torch")

VARIABLE = re.compile(r"^(?:TORCHINDUCTOR|TORCHDYNAMO|TORCH_COMPILE)_[A-Z0-9_]+$")

#: Settings every Inductor user reaches for: the oracle must see each move Inductor's key.
GRAPH_CHANGING = (
    "TORCHINDUCTOR_FREEZING",
    "TORCHINDUCTOR_MAX_AUTOTUNE",
    "TORCHINDUCTOR_CPP_WRAPPER",
    "TORCHINDUCTOR_SHAPE_PADDING",
    "TORCHINDUCTOR_PERMUTE_FUSION",
    "TORCHINDUCTOR_DETERMINISTIC",
    "TORCHINDUCTOR_SIZE_ASSERTS",
    "TORCHINDUCTOR_COORDINATE_DESCENT_TUNING",
)

#: Harmless: settings that change neither Inductor's key nor the fingerprint (cache switches, debug tracing,
#: a library location). If torch starts keying on one, this test fails and compile_env.py must move it.
HARMLESS = {
    "TORCHINDUCTOR_FX_GRAPH_CACHE",
    "TORCHINDUCTOR_FX_GRAPH_CACHE_DEFAULT",
    "TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE",
    "TORCHINDUCTOR_AUTOTUNE_REMOTE_CACHE",
    "TORCHINDUCTOR_BUNDLED_AUTOTUNE_REMOTE_CACHE",
    "TORCHINDUCTOR_CUTLASS_DIR",
    "TORCH_COMPILE_DEBUG",
    "TORCH_COMPILE_DEBUG_SAVE_REAL",
}


def config_attributes() -> dict[str, str]:
    """``{variable: dotted config attribute}`` for each variable an assignment in Inductor's config module reads."""
    spec = importlib.util.find_spec("torch._inductor.config")
    assert spec is not None and spec.origin
    mapping: dict[str, str] = {}

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):  # nested namespaces: ``class triton: ...``
                visit(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if len(targets) == 1 and isinstance(targets[0], ast.Name):
                    for sub in ast.walk(node.value):
                        if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and VARIABLE.match(sub.value):
                            mapping.setdefault(sub.value, prefix + targets[0].id)

    visit(ast.parse(Path(spec.origin).read_text(encoding="utf-8")).body, "")
    return mapping


def flipped(value: Any) -> Any:
    """Another value of the setting's type (``None``: an unset option, turned on)."""
    if value is None or isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 1
    if isinstance(value, str):
        return value + "-other"
    return None


@pytest.fixture(scope="module")
def key_moves() -> Iterator[dict[str, bool]]:
    """``{variable: whether flipping its setting changes Inductor's key}`` for a two-op graph."""
    import torch._inductor.config as config
    from torch._inductor.codecache import compiled_fx_graph_hash

    graph = torch.fx.symbolic_trace(lambda x, y: torch.relu(x @ y) + 1)
    inputs = [torch.randn(4, 4), torch.randn(4, 4)]

    def key() -> str:
        return compiled_fx_graph_hash(graph, inputs, {}, [])[0]

    base = key()
    moves: dict[str, bool] = {}
    for variable, attribute in config_attributes().items():
        value: Any = config
        for part in attribute.split("."):
            value = getattr(value, part)
        other = flipped(value)
        if other is None:
            continue  # tuples of cluster shapes: nothing a variable sets on CPU
        with config.patch({attribute: other}):
            moves[variable] = key() != base
    yield moves


def fingerprint_moves(variable: str, monkeypatch: pytest.MonkeyPatch) -> bool:
    base = current_toolchain("cpu", "inductor").hash
    with monkeypatch.context() as patch:
        patch.setenv(variable, "1")
        return current_toolchain("cpu", "inductor").hash != base


def test_every_setting_that_moves_inductors_key_moves_the_fingerprint(
    key_moves: dict[str, bool], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert len(key_moves) > 100  # the mapping found Inductor's settings
    for name in GRAPH_ENV:
        monkeypatch.delenv(name, raising=False)
    missed = sorted(v for v, moved in key_moves.items() if moved and not fingerprint_moves(v, monkeypatch))
    assert not missed, f"Inductor's cache key changes with these but warmcache's fingerprint does not: {missed}"


def test_the_common_graph_changing_settings_move_both(key_moves: dict[str, bool]) -> None:
    assert all(key_moves[v] for v in GRAPH_CHANGING), {v: key_moves[v] for v in GRAPH_CHANGING}
    assert set(GRAPH_CHANGING) <= GRAPH_ENV


def test_harmless_settings_move_neither(key_moves: dict[str, bool]) -> None:
    """What the oracle can flip and Inductor ignores is exactly what compile_env.py excludes, and is documented here."""
    unmoved = {v for v, moved in key_moves.items() if not moved}
    assert unmoved & HARMLESS == {v for v in HARMLESS if v in key_moves}
    assert not (unmoved - set(EXCLUDED_ENV)), (
        f"fingerprinted although Inductor's key ignores them: {sorted(unmoved - set(EXCLUDED_ENV))}"
    )
    assert HARMLESS <= set(EXCLUDED_ENV)
