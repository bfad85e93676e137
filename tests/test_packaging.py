"""The wheel users install holds every module of the source tree, and the migrations.

An editable install imports a folder without ``__init__.py`` as a namespace package, so a
package the wheel leaves out passes every other test and fails every command of a regular
install (``warmcache.store.oci`` once did). This builds the wheel from a copy of the tree as a
user's ``pip install .`` would, and compares file lists.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from importlib.metadata import distribution
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "warmcache"
MIGRATIONS = ROOT / "migrations"
#: What a build never needs; the rest of the checkout is copied as it is (new files included, unlike ``git ls-files``).
NOT_SOURCE = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".warmcache", "site")


def source_folders() -> list[Path]:
    return sorted({path.parent for path in PACKAGE.rglob("*.py") if "__pycache__" not in path.parts})


def test_every_folder_is_a_regular_package_that_says_what_it_holds() -> None:
    problems = []
    for folder in [*source_folders(), MIGRATIONS, MIGRATIONS / "versions"]:
        init = folder / "__init__.py"
        if not init.is_file():
            problems.append(f"{folder.relative_to(ROOT)}: no __init__.py (a namespace package the wheel drops)")
        elif folder.is_relative_to(PACKAGE) and not ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))):
            problems.append(f"{init.relative_to(ROOT)}: no docstring saying what the package holds")
    assert not problems, "\n".join(problems)


@pytest.fixture(scope="module")
def wheel_files(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """The file names inside a wheel built from a clean copy of the tree (a stale ``build/`` folder cannot leak in)."""
    tree = tmp_path_factory.mktemp("tree") / "warmcache"
    shutil.copytree(ROOT, tree, ignore=NOT_SOURCE)
    out = tree.parent / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(tree)],
        check=True,
        capture_output=True,
    )
    (wheel,) = out.glob("warmcache-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return set(archive.namelist())


@pytest.mark.slow
def test_the_wheel_holds_every_module_and_the_migrations(wheel_files: set[str]) -> None:
    expected = {path.relative_to(ROOT).as_posix() for path in PACKAGE.rglob("*.py") if "__pycache__" not in path.parts}
    expected.add("warmcache/py.typed")  # the type hints' marker (PEP 561): mypy in users' projects reads ours
    expected |= {
        f"warmcache/_migrations/{path.relative_to(MIGRATIONS).as_posix()}"
        for path in MIGRATIONS.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }
    missing = sorted(expected - wheel_files)
    assert not missing, f"{len(missing)} source file(s) not in the wheel: {missing}"
    stray = sorted(name for name in wheel_files if name.startswith("warmcache/") and name not in expected)
    assert not stray, f"the wheel ships files the tree does not hold: {stray}"


@pytest.mark.slow
def test_the_wheel_ships_the_quickstarts_model_builder_and_not_the_testkit(wheel_files: set[str]) -> None:
    """The quickstart's first step (``python -m warmcache.examples.tiny_model``) needs no source tree; what tests and
    tools share (``warmcache_testkit``, tests/support) is a development install of its own, never in the wheel."""
    assert "warmcache/examples/tiny_model.py" in wheel_files
    assert sorted(name for name in wheel_files if "testkit" in name or name.startswith(("tests/", "tools/"))) == []


def test_tests_and_tools_import_installed_packages_without_path_tricks() -> None:
    """Tests and tools import ``warmcache`` and ``warmcache_testkit`` as installed (issue 50: 24 lines put tools/ and
    tests/support on the import path, and tests imported 9 tools as libraries through them)."""
    assert (ROOT / "tests" / "support" / "pyproject.toml").is_file()
    offenders = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for folder in ("tests", "tools")
        for path in sorted((ROOT / folder).rglob("*"))
        if path.suffix in (".py", ".sh") and "build" not in path.parts
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"\bsys\.path\b", line)
    ]
    assert offenders == []


def test_the_suite_runs_the_installed_package_not_the_source_tree() -> None:
    """CI installs the wheel (not ``-e``) and runs pytest with ``PYTHONSAFEPATH=1``: the suite then proves what users
    install. Without it, ``python -m pytest`` in the checkout imports ``warmcache/`` beside the tests instead, and a
    module the wheel drops passes every test."""
    import warmcache

    dist = distribution("warmcache")
    direct_url = json.loads(dist.read_text("direct_url.json") or "{}")
    if direct_url.get("dir_info", {}).get("editable"):
        pytest.skip("an editable install (pip install -e): the suite runs the source tree, as the developer chose")
    installed = Path(str(dist.locate_file("warmcache/__init__.py"))).resolve()
    imported = Path(warmcache.__file__).resolve()
    assert imported == installed and not imported.is_relative_to(PACKAGE), (
        f"the suite imported {imported}, not the installed {installed}: run pytest with PYTHONSAFEPATH=1"
    )


def test_python_m_warmcache_in_the_checkout_root_finds_the_migrations(tmp_path: Path) -> None:
    """``python -m warmcache`` in the checkout's root imports the source folder, which has no ``warmcache._migrations``
    (the wheel maps ``migrations/`` there): the checkout's own ``migrations/`` serves it."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONSAFEPATH"}
    db = f"sqlite:///{tmp_path / 'registry.sqlite'}"
    command = [sys.executable, "-m", "warmcache", "db", "upgrade", "--db", db]
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "registry.sqlite").is_file()
