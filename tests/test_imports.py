"""warmcache imports only downwards, along one declared order of layers; no file imports itself back through others.

Every import counts, including those inside functions and under ``TYPE_CHECKING``:
an import deferred to break a cycle still couples the two files both ways.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "warmcache"
LAYOUT_DOC = PACKAGE.parent / "docs" / "development.md"

#: warmcache's packages (``shapes/``) and root modules (``errors.py``) from the bottom up. A file may import
#: files of its own package or root module and of any lower layer; never of its own layer's other members, never
#: of a higher one. A new package or root module is declared here, and in the code-layout table of
#: docs/development.md, which lists these layers in this order.
LAYERS: tuple[tuple[str, ...], ...] = (
    # Root leaf modules: they import nothing of warmcache.
    ("anchor.py", "bounds.py", "database_url.py", "errors.py", "jsonable.py"),
    # Root modules on the leaves: the table of every WARMCACHE_ variable, a store's URL, sizes and durations.
    ("settings_table.py", "store_location.py", "units.py"),
    # The settings read at the edge, and the --debug switch, through that table.
    ("diagnostics.py", "settings.py"),
    # Which keys and signatures are trusted.
    ("trust.py",),
    ("shapes/",),
    ("modeling/",),
    # The manifest asks the targets which devices, backends and precompile routes exist; a target never reads the
    # manifest, so adding a device means adding a target.
    ("buckets/", "targets/"),
    ("manifest/",),
    ("identity/",),
    # The registry's rows with their rules: a row's status, which rows are usable here and why others are not.
    ("registry/",),
    # Precompiled routes: how each saves, loads, proves and is trusted; serving imports it, so no compiler at import.
    ("artifacts/",),
    ("cache/",),
    # Production's side, and the shipping of caches between machines (bundles, what a manifest ships, installing
    # what arrives): both stand on the cache and know nothing of each other.
    ("runtime/", "shipping/"),
    ("store/", "warmup/"),
    # How the registry's answers are worded for commands and the service: nothing below shows, so the runtime and
    # the cache apply the registry's rules themselves.
    ("reports/",),
    ("__init__.py", "service/"),
    ("cli/",),
    ("__main__.py",),
    # What the quickstart runs besides commands (the tiny models it warms): shipped, imported by nothing of warmcache.
    ("examples/",),
)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the warmcache modules it imports (``from pkg import submodule`` names the submodule)."""
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([node.module] if node.module else [])])
                for alias in node.names:
                    targets.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else base)
        graph[name] = {t for t in targets if t in files and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one member (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterable[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(iter(children), None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def describe(graph: dict[str, set[str]], component: list[str]) -> str:
    members = set(component)
    return "; ".join(f"{m} -> {', '.join(sorted(graph[m] & members))}" for m in component)


def unit(module: str) -> str:
    """The package (``shapes/``) or root module (``errors.py``, ``__init__.py``) a module belongs to."""
    parts = module.split(".")
    if len(parts) == 1:
        return "__init__.py"
    return f"{parts[1]}/" if (PACKAGE / parts[1]).is_dir() else f"{parts[1]}.py"


def misplaced_imports(
    graph: Mapping[str, set[str]], layers: Sequence[Sequence[str]], unit_of: Callable[[str], str] = unit
) -> list[str]:
    """Each import between two packages or root modules that does not point to a lower layer, as one line."""
    layer = {name: number for number, names in enumerate(layers, 1) for name in names}
    found = []
    for module in sorted(graph):
        source = unit_of(module)
        for target in sorted(graph[module]):
            if unit_of(target) == source:
                continue
            destination = unit_of(target)
            if source not in layer or destination not in layer:
                continue  # an undeclared package or module: the declared-layer test names it
            low, high = layer[source], layer[destination]
            if high >= low:
                way = "up to" if high > low else "across"
                found.append(f"{module} (layer {low}, {source}) imports {way} {target} (layer {high}, {destination})")
    return found


def documented_layers() -> list[tuple[str, ...]]:
    """The code-layout table of docs/development.md: each row's packages and root modules, in the table's order."""
    text = LAYOUT_DOC.read_text(encoding="utf-8")
    section = text[text.index("## Code layout") :]
    section = section[: section.index("\n## ", 1)]
    rows = [line for line in section.splitlines() if re.match(r"\|\s*\d+\s*\|", line)]
    return [tuple(re.findall(r"`([^`]+)`", row.split("|")[2])) for row in rows]


def test_the_cycle_finder_finds_cycles() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_layer_check_finds_imports_up_and_across() -> None:
    graph = {"low.x": {"high.y", "low.z"}, "high.y": {"low.x", "side.w"}, "side.w": {"low.x"}, "low.z": set()}
    layers = [("low",), ("high", "side")]
    assert misplaced_imports(graph, layers, lambda m: m.split(".")[0]) == [
        "high.y (layer 2, high) imports across side.w (layer 2, side)",
        "low.x (layer 1, low) imports up to high.y (layer 2, high)",
    ]


def test_no_file_imports_itself_back() -> None:
    graph = import_graph()
    assert "warmcache.warmup.runner" in graph and graph["warmcache.warmup.runner"], "the import parser found nothing"
    assert [describe(graph, c) for c in cycles(graph)] == []


def test_every_package_and_root_module_has_one_declared_layer() -> None:
    declared = [name for names in LAYERS for name in names]
    assert len(declared) == len(set(declared)), "a package or module is declared on two layers"
    assert sorted({unit(module) for module in import_graph()}) == sorted(declared)


def test_imports_point_down_the_declared_layers() -> None:
    graph = import_graph()
    assert "warmcache.targets" in graph["warmcache.manifest.parse"], "the import parser missed an import"
    assert misplaced_imports(graph, LAYERS) == []


def test_the_code_layout_table_lists_the_declared_layers() -> None:
    """docs/development.md shows a newcomer the same order this test holds the code to."""
    assert documented_layers() == list(LAYERS)
