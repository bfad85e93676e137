"""No module of warmcache is over 400 lines: past that a file holds more than one idea, and is split along them."""

from __future__ import annotations

from pathlib import Path

#: The checkout's package, as tests/test_imports.py reads it (the suite may run an installed wheel).
PACKAGE = Path(__file__).resolve().parents[1] / "warmcache"
MAX_LINES = 400


def test_no_module_is_over_400_lines() -> None:
    sizes = {path: len(path.read_text(encoding="utf-8").splitlines()) for path in PACKAGE.rglob("*.py")}
    assert len(sizes) > 100, f"found only {len(sizes)} modules under {PACKAGE}"
    over = sorted(f"{path.relative_to(PACKAGE)}: {lines} lines" for path, lines in sizes.items() if lines > MAX_LINES)
    assert over == []
