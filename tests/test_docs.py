"""The documentation stays true to the repository: named files exist, commands agree.

The same path check runs during ``mkdocs build --strict`` (``tools/docs/mkdocs_hooks.py``, a
hook in mkdocs.yml); this test runs it over README.md too, and without MkDocs installed.
"""

from __future__ import annotations

import functools
import http.server
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from warmcache_testkit.scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
#: The hook mkdocs.yml names, loaded from its file as mkdocs loads it.
HOOKS = load_script(ROOT / "tools" / "docs" / "mkdocs_hooks.py")
lazy_public_names = HOOKS.lazy_public_names
missing_references = HOOKS.missing_references
on_page_markdown = HOOKS.on_page_markdown
resolve_lazy_directives = HOOKS.resolve_lazy_directives
unescape_table_pipes = HOOKS.unescape_table_pipes
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
        ("run `python tools/bench/bench_*.py` and `tests/test_store_oci*.py`", []),
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


def test_sphinx_roles_read_as_cross_references_or_plain_code_names() -> None:
    """mkdocstrings leaves a docstring's Sphinx roles as text: the API page read ``:class:`` before the code
    ``~warmcache.errors.WarmcacheError``. Each now shows the name Sphinx shows; one inside the package is an optional
    autorefs cross-reference (a link where the site renders it, plain code where not, so a strict build never fails
    on one); code that no role precedes is left alone."""
    html = (
        "<p>:class:<code>~warmcache.errors.WarmcacheError</code>, :mod:<code>warmcache.runtime.padding</code>, "
        ":meth:<code>prime</code>, :func:<code>.reroutes.reroute_chances</code>, "
        ":class:<code>the guard &lt;~warmcache.ShapeGuard&gt;</code>, <code>~kept.as.is</code></p>"
    )
    assert HOOKS.on_page_content(html) == (
        '<p><autoref identifier="warmcache.errors.WarmcacheError" optional><code>WarmcacheError</code></autoref>, '
        '<autoref identifier="warmcache.runtime.padding" optional><code>warmcache.runtime.padding</code></autoref>, '
        "<code>prime</code>, <code>reroutes.reroute_chances</code>, "
        '<autoref identifier="warmcache.ShapeGuard" optional><code>the guard</code></autoref>, '
        "<code>~kept.as.is</code></p>"
    )


def test_a_relative_sphinx_role_links_to_the_object_its_docstring_means() -> None:
    """``:meth:`prime``` in a docstring of ShapeGuard's means ShapeGuard's prime (the heading before it names the
    docstring's object); a name no object on the page ends with stays plain code."""
    html = (
        '<h2 id="warmcache.a.Guard">Guard</h2><h3 id="warmcache.a.Guard.fit">fit</h3><p>then :meth:<code>prime</code>'
        ", :class:<code>~Mounted.load</code>, :class:<code>Nowhere</code></p>"
        '<h3 id="warmcache.a.Guard.prime">prime</h3><h2 id="warmcache.b.Mounted.load">load</h2>'
    )
    rendered = HOOKS.on_page_content(html)
    assert '<autoref identifier="warmcache.a.Guard.prime" optional><code>prime</code></autoref>' in rendered
    assert '<autoref identifier="warmcache.b.Mounted.load" optional><code>load</code></autoref>' in rendered
    assert ", <code>Nowhere</code></p>" in rendered


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


def test_wheel_check_runs_the_readmes_quickstart_from_the_wheel() -> None:
    """``tools/ci/wheel_check.sh`` (in CI) runs the README's quickstart line itself, in a folder outside the checkout
    with only the wheel installed:
    the line must begin with the install step the script replaces, build its models from the
    wheel (it built them with tools/tiny_model.py, which no wheel holds) and name only example files the script
    copies."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    command = _bash_blocks(readme.split("\n## Quickstart", 1)[1])[0].strip()
    script = (ROOT / "tools" / "ci" / "wheel_check.sh").read_text(encoding="utf-8")
    (install,) = re.findall(r'^INSTALL="(.*)"$', script, flags=re.MULTILINE)
    assert command.startswith(install), (install, command[:120])
    assert ".venv/bin/python -m warmcache.examples.tiny_model " in command and "tools/" not in command
    named = set(re.findall(r"\bexamples/[\w./-]+", command))
    copied = set(re.findall(r'"\$work/src/(examples/[\w./-]+)"', script))
    assert named and named <= copied, (named, copied)


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


MERMAID = ROOT / "docs" / "assets" / "javascripts" / "mermaid.min.js"
# Every host name resolves to nothing but 127.0.0.1, and no proxy: the browser reaches no network (unpkg.com, where
# Material fetches Mermaid from when the page defines none, included).
OFFLINE_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-dev-shm-usage",
    "--disable-gpu",
    "--window-size=1100,900",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
    "--no-proxy-server",
)


def _rendered_diagrams(driver: Any) -> list[str]:
    """The text of each SVG Mermaid drew into a ``div.mermaid``: Material puts it in a *closed* shadow root, which page
    scripts cannot read, so the DevTools DOM (which pierces it) is walked."""
    document = driver.execute_cdp_cmd("DOM.getDocument", {"depth": -1, "pierce": True})["root"]

    def children(node: dict) -> list[dict]:
        return [*node.get("children", []), *node.get("shadowRoots", []), *filter(None, [node.get("contentDocument")])]

    def text(node: dict) -> str:
        return (node.get("nodeValue", "") if node.get("nodeType") == 3 else "") + "".join(map(text, children(node)))

    def find(node: dict, match: Callable[[dict], bool]) -> list[dict]:
        return ([node] if match(node) else []) + [m for child in children(node) for m in find(child, match)]

    def is_diagram(node: dict) -> bool:
        attributes = node.get("attributes", [])
        classes = dict(zip(attributes[::2], attributes[1::2], strict=True)).get("class", "").split()
        return node.get("localName") == "div" and "mermaid" in classes

    return [
        text(svg) for block in find(document, is_diagram) for svg in find(block, lambda n: n.get("localName") == "svg")
    ]


def test_the_home_page_diagram_renders_with_no_network(tmp_path: Path) -> None:
    """The loop diagram rendered as raw ``flowchart LR`` text wherever the browser could not reach the CDN Material
    loads Mermaid from (an air-gapped cluster's docs mirror): the site now carries its own copy."""
    chromium, chromedriver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or chromedriver is None:
        pytest.skip("chromium or chromedriver is not on PATH (.ci/run installs Debian's chromium and chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import WebDriverWait

    site = tmp_path / "site"
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    assert (site / "assets" / "javascripts" / "mermaid.min.js").stat().st_size == MERMAID.stat().st_size
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        options = webdriver.ChromeOptions()
        options.binary_location = chromium
        for flag in OFFLINE_FLAGS:
            options.add_argument(flag)
        driver = webdriver.Chrome(service=Service(executable_path=chromedriver), options=options)
        try:
            driver.get(f"http://127.0.0.1:{server.server_address[1]}/")
            (diagram,) = WebDriverWait(driver, 60).until(_rendered_diagrams)
            fetched = driver.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
            raw = driver.execute_script("return document.body.innerText")
            # The first screen (900 px) holds the one command to start.
            first_screen = driver.execute_script(
                "return Array.from(document.querySelectorAll('article code')).filter(c => "
                "c.getBoundingClientRect().bottom < window.innerHeight).map(c => c.textContent)"
            )
        finally:
            driver.quit()
            server.shutdown()
    assert "warmcache warmup" in diagram and "flowchart LR" not in raw, diagram
    assert [url for url in fetched if not url.startswith("http://127.0.0.1:")] == [], fetched
    assert any(START in c for c in first_screen), first_screen


#: What the home page's first screen holds: the quickstart's first steps, the README's own calls.
START = ".venv/bin/warmcache warmup examples/tiny-cpu.toml"


def test_the_home_pages_start_command_is_the_readmes_quickstart_begun() -> None:
    """The home page's first screen had no command ("Where to start" sat below 1,600 px): its one command must be the
    README quickstart's first calls, in order."""
    home = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    first = _bash_blocks(home.split("\n## ", 1)[0])
    assert len(first) == 1 and START in first[0], first
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    quickstart = _invocations(_bash_blocks(readme.split("\n## Quickstart", 1)[1])[0])
    started = _invocations(first[0])
    assert started == quickstart[: len(started)], (started, quickstart)
    assert _invocations(first[0], "pip") == _invocations(_bash_blocks(readme.split("\n## Quickstart", 1)[1])[0], "pip")


def test_time_figures_name_the_machine_they_were_measured_on() -> None:
    """The README said "a few minutes", the example manifest "about two minutes": a 2-core machine took 8-10. Each
    figure now comes with the machine (and its load) it was measured on."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    quickstart = readme.split("\n## Quickstart", 1)[1].split("```bash", 1)[0]
    manifest_header = (ROOT / "examples" / "tiny-cpu.toml").read_text(encoding="utf-8").split("\n\n", 1)[0]
    for text in (quickstart, manifest_header):
        assert re.search(r"\b\d+ s\b", text) and "2-core" in text and "load average" in text, text
        assert not re.search(r"a few minutes|about two minutes", text), text
