"""The documentation stays true to the repository: named files exist, commands agree.

The same path check runs during ``mkdocs build --strict`` (``tools/mkdocs_hooks.py``, a
hook in mkdocs.yml); this test runs it over README.md too, and without MkDocs installed.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from mkdocs_hooks import (
    lazy_public_names,
    missing_references,
    on_page_markdown,
    resolve_lazy_directives,
    unescape_table_pipes,
)

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted(ROOT.glob("docs/**/*.md"))


def _bash_blocks(text: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)\n```", text, flags=re.DOTALL)


def test_every_page_and_the_readme_name_only_files_that_exist() -> None:
    assert PAGES, "no pages under docs/"
    problems = []
    for page in [ROOT / "README.md", *PAGES]:
        text = page.read_text(encoding="utf-8")
        problems += [f"{page.relative_to(ROOT)}: {name}" for name in missing_references(text)]
    assert not problems, "pages name repository files or modules that do not exist:\n" + "\n".join(problems)


def test_readme_links_into_docs_resolve() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\((docs/[^)#\s]+)(?:#[^)]*)?\)", readme)
    assert links, "the README links to no page under docs/"
    missing = sorted({link for link in links if not (ROOT / link).is_file()})
    assert not missing, f"README.md links to pages that do not exist: {missing}"


@pytest.mark.parametrize(
    ("text", "missing"),
    [
        ("see `tools/no_such_tool.py`.", ["tools/no_such_tool.py"]),
        ("run `python tools/bench_*.py` and `tests/test_store_oci*.py`", []),
        ("the class `warmcache.kv_cache_gone.PositionTensorCache`", ["warmcache.kv_cache_gone.PositionTensorCache"]),
        ("`warmcache.trust.no_such_function` signs", ["warmcache.trust.no_such_function"]),
        ("`warmcache.ShapeGuard` and `warmcache.manifest.loads`", []),
        ("~/.cache/warmcache/registry.sqlite, oci://host/warmcache/x:tag, .warmcache/models/x", []),
        ("`examples/k8s/` and `examples/k8s/gone.yaml`", ["examples/k8s/gone.yaml"]),
    ],
)
def test_the_check_finds_exactly_the_missing_names(text: str, missing: list[str]) -> None:
    assert missing_references(text) == missing


def test_the_build_warning_names_the_page_and_the_path(caplog: pytest.LogCaptureFixture) -> None:
    page = SimpleNamespace(file=SimpleNamespace(src_uri="guides/example.md"))
    with caplog.at_level(logging.WARNING, logger="mkdocs.plugins.warmcache_docs"):
        on_page_markdown("compiled by `warmcache/gone.py`", page=page)
    expected = "docs/guides/example.md names warmcache/gone.py, which does not exist in the repository"
    assert [r.getMessage() for r in caplog.records] == [expected]


def test_lazy_api_names_resolve_to_their_module() -> None:
    lazy = lazy_public_names()
    assert "ShapeGuard" in lazy
    page = "::: warmcache.ShapeGuard\n\n::: warmcache.UsageError\n"
    assert resolve_lazy_directives(page) == f"::: {lazy['ShapeGuard']}.ShapeGuard\n\n::: warmcache.UsageError\n"


def test_a_pipe_in_a_table_cells_code_reads_as_a_pipe_on_the_site() -> None:
    """GitHub needs ``\\|`` in a table cell's code span; Python-Markdown keeps that pipe in its cell but showed the
    backslash (the Commands table read ``--lengths F \\| --dataset F``)."""
    markdown = pytest.importorskip("markdown")
    page = (ROOT / "docs" / "reference" / "commands.md").read_text(encoding="utf-8")
    assert "`warmcache buckets suggest (--lengths F \\| --dataset F" in page  # as GitHub wants it
    html = markdown.markdown(unescape_table_pipes(page), extensions=["tables"])
    assert "<code>warmcache buckets suggest (--lengths F | --dataset F --tokenizer P | --from-misses" in html
    assert "\\|" not in html
    # a pipe escaped outside a table's code, and outside a table, is left alone
    assert unescape_table_pipes("| `a \\| b` \\| c |\n`x \\| y`") == "| `a | b` \\| c |\n`x \\| y`"


def test_the_ci_runs_the_readmes_test_command_verbatim() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    tests = readme.split("\n## Tests\n", 1)[1]
    command = _bash_blocks(tests)[0].strip()
    # The wheel users install, not an editable checkout, and the tests import it, not the source tree beside them.
    assert "'.[test,docs]'" in command and " -e " not in command and "PYTHONSAFEPATH=1" in command
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    marker = ci.index("# --- the README's test command, verbatim ---")
    assert ci[marker + 1] == command
    development = (ROOT / "docs" / "development.md").read_text(encoding="utf-8")
    assert command in _bash_blocks(development)


#: The registry the quickstart's commands find without --db (the nearest .warmcache/registry.sqlite).
PROJECT_DB = " --db sqlite:///.warmcache/registry.sqlite"


def _invocations(command: str, program: str = "warmcache|python") -> list[str]:
    """The ``.venv/bin/PROGRAM ...`` calls a shell command makes, in order, without the project registry's ``--db``
    (quoted text, such as an echo's, is not a call)."""
    unquoted = re.sub(r'"[^"]*"', "", command)
    calls = re.findall(rf"\.venv/bin/(?:{program}) [^&;|{{}}\n]*", unquoted)
    return [call.replace(PROJECT_DB, "").strip() for call in calls]


def test_the_quickstart_page_runs_the_readmes_quickstart_one_step_a_block() -> None:
    """The page makes the README's one-line run step-by-step blocks: the same calls in the same order, each a
    readable line (it was one 900-character line); the install step installs the same extra under the same pins."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    command = _bash_blocks(readme.split("\n## Quickstart", 1)[1])[0].strip()
    page = (ROOT / "docs" / "getting-started" / "quickstart.md").read_text(encoding="utf-8")
    blocks = _bash_blocks(page)
    steps = iter(_invocations("\n".join(blocks)))
    missing = [call for call in _invocations(command) if call not in steps]  # in order: each found after the last
    assert not missing, f"the quickstart page lacks, or reorders, the README's {missing}"
    (readme_install,) = _invocations(command, "pip")
    (page_install,) = _invocations("\n".join(blocks), "pip")
    for part in ("-c constraints.txt", "'.[serve]'"):
        assert part in readme_install and part in page_install, (readme_install, page_install)
    long = [line for block in blocks for line in block.splitlines() if len(line) > 120]
    assert not long, f"quickstart lines over 120 characters: {long}"


def test_every_page_is_in_the_navigation() -> None:
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    names = [page.relative_to(ROOT / "docs").as_posix() for page in PAGES]
    left_out = [name for name in names if f": {name}\n" not in nav]
    assert not left_out, f"pages missing from mkdocs.yml's nav: {left_out}"
