"""The dashboard in a real headless browser (Debian's chromium through Selenium and chromedriver).

The grid's cells must show each shape's status as the registry has it, the requests
guards padded onto a cell, the failures, and follow the registry live.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from test_cli_query import MANIFEST, _compile_all
from test_service import TOKEN, seed_registry, wait_ready

from warmcache.registry import Registry
from warmcache.registry.records import MissEvent
from warmcache.registry.usability import effective_status
from warmcache.service import ServiceConfig
from warmcache.service.server import running_server
from warmcache.settings import RegistryLocation

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
SCREENSHOT_DIR_ENV = "WARMCACHE_SCREENSHOT_DIR"


def missing_browser(programs: dict[str, str | None]) -> str | None:
    """Why the browser cannot start, naming only the programs that are missing (``None``: both are there)."""
    missing = [name for name, path in programs.items() if path is None]
    if not missing:
        return None
    verb = "is" if len(missing) == 1 else "are"
    return (
        f"{' and '.join(missing)} {verb} not on PATH (.ci/run installs Debian's chromium and chromium-driver, "
        "which holds chromedriver)"
    )


def test_the_skip_reason_names_only_what_is_missing() -> None:
    assert missing_browser({"chromium": "/usr/bin/chromium", "chromedriver": None}) == (
        "chromedriver is not on PATH (.ci/run installs Debian's chromium and chromium-driver, which holds chromedriver)"
    )
    assert (missing_browser({"chromium": None, "chromedriver": None}) or "").startswith("chromium and chromedriver are")
    assert missing_browser({"chromium": "/usr/bin/chromium", "chromedriver": "/usr/bin/chromedriver"}) is None


@pytest.fixture
def browser():
    reason = missing_browser({"chromium": CHROMIUM, "chromedriver": CHROMEDRIVER})
    if reason:
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1100,900",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


# Read in one script call: the page replaces its panels every two seconds, so element handles go stale.
_READ_CELLS = """
return Array.from(document.querySelectorAll("section[data-model='m'] td.cell")).map(cell => [
  cell.closest("table").dataset.workload, Number(cell.dataset.batch), Number(cell.dataset.seq),
  cell.dataset.status, Number(cell.dataset.padded), cell.innerText]);
"""


def _cells(driver) -> dict[tuple[str, int, int], tuple[str, int, str]]:
    """``(workload, batch, length) -> (status, padded, text)`` as the page shows it now."""
    return {(w, b, s): (status, padded, text) for w, b, s, status, padded, text in driver.execute_script(_READ_CELLS)}


def _text(driver, selector: str) -> str:
    return driver.execute_script("return document.querySelector(arguments[0]).innerText", selector)


def _wait_for(predicate, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "the dashboard did not show the change in time"
        time.sleep(0.2)


def test_dashboard_grid_matches_the_registry_and_follows_it_live(browser, tmp_path: Path, write_manifest) -> None:
    url = f"sqlite:///{tmp_path / 'registry.sqlite'}"
    path = write_manifest(MANIFEST)
    seed_registry(url, path)
    with Registry.open(url) as registry:
        registry.record_misses(
            [MissEvent("m", "generate", "float32", 2, 20, "pad", padded_batch=2, padded_seq=32, count=7)]
        )
        rows = registry.rows(model="m")
    with running_server(ServiceConfig(RegistryLocation.parse(url), token=TOKEN, refresh_interval=0.3)) as base:
        wait_ready(base)
        browser.get(base + "/")
        expected = {(r.workload, r.batch_size, r.seq_len): effective_status(r) for r in rows}
        shown = _cells(browser)
        assert {k: status for k, (status, _, _) in shown.items()} == expected
        assert shown[("generate", 2, 32)] == ("compiled", 7, "compiled\n7 padded")
        assert sum(padded for _, padded, _ in shown.values()) == 7
        assert "RuntimeError: out of memory" in _text(browser, "table.failures")
        assert "4 of 7 shapes usable" in _text(browser, "p.counts")
        screenshot = Path(os.environ.get(SCREENSHOT_DIR_ENV) or tmp_path) / "dashboard.png"
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        assert browser.save_screenshot(str(screenshot)) and screenshot.stat().st_size > 10_000

        # Batch 4 compiles: the page's script picks it up without a reload.
        _compile_all(url, path, keep=lambda p: p.spec.workload == "generate" and p.spec.batch_size == 4)
        _wait_for(lambda: _cells(browser)[("generate", 4, 16)][0] == "compiled")
        assert "6 of 7 shapes usable" in _text(browser, "p.counts")
