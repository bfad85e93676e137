"""Shared fixtures: tiny models built locally, registries on SQLite and PostgreSQL."""

from __future__ import annotations

import dataclasses
import os
import re
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The suite runs a worker per core (pytest-xdist) beside CI's other checks, and each torch process has a thread per
# core: OpenMP threads that spin while they wait burn the cores the others need. Passive waiting changes no result
# (the thread count is the same); set before torch loads its OpenMP runtime, here and in every process a test starts.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from warmcache_testkit.inductor_host import INDUCTOR_BUCKET, InductorWarmup, warmcache_json  # noqa: E402
from warmcache_testkit.moto_server import DUMMY_CREDENTIALS, create_bucket, moto_server  # noqa: E402
from warmcache_testkit.oci_registry import MISSING, RunningRegistry, available, oci_registry  # noqa: E402
from warmcache_testkit.postgres_schema import temporary_schema  # noqa: E402

from warmcache.examples.tiny_model import build_tiny_model  # noqa: E402

POSTGRES_ENV = "WARMCACHE_TEST_POSTGRES_URL"
#: The suite's expensive session fixtures: under pytest-xdist every test file that names one runs on the worker that
#: builds it, so each is built once (see :func:`pytest_xdist_make_scheduler`).
SHARED_BUILDS = ("packaged", "inductor_warmup")


def file_groups(root: Path) -> dict[str, str]:
    """The test files (as their node ids begin) that name a fixture of :data:`SHARED_BUILDS`, by that fixture: the group
    they run in. A file naming two would join the first's group, and the second fixture be built on its worker too."""
    groups = {}
    for path in sorted((root / "tests").glob("test_*.py")):
        text = path.read_text()
        named = [shared for shared in SHARED_BUILDS if re.search(rf"\b{shared}\b", text)]
        if named:
            groups[path.relative_to(root).as_posix()] = named[0]
    return groups


def scope_of(nodeid: str, groups: dict[str, str]) -> str:
    """The unit one xdist worker runs whole: the test's file, or the :data:`SHARED_BUILDS` group its file is in."""
    file = nodeid.split("::", 1)[0]
    return groups.get(file, file)


#: What a test marked ``slow`` (it compiles: seconds to minutes) weighs against one that is not (milliseconds to a
#: second), when the work is ordered longest first.
SLOW_WEIGHT = 20


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Order the tests heaviest scope first (by its count of ``slow`` tests): under pytest-xdist a worker takes a
    scope at a time in this order, so the long ones start at once and the short ones fill the end, where a long one
    started last would leave the other cores idle until it ends. The order within a scope is kept."""
    groups = file_groups(config.rootpath)
    weight: dict[str, int] = {}
    for item in items:
        scope = scope_of(item.nodeid, groups)
        weight[scope] = weight.get(scope, 0) + (SLOW_WEIGHT if item.get_closest_marker("slow") else 1)
    items.sort(key=lambda item: -weight[scope_of(item.nodeid, groups)])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under pytest-xdist (``-n``), send tests to workers a file at a time, so that each file's module fixtures (the
    architecture matrix's warmup: minutes) are built once, and the files sharing a :data:`SHARED_BUILDS` fixture
    together, in the order :func:`pytest_collection_modifyitems` gave them. xdist's own ``--dist loadgroup`` does not
    group under pytest 9 (it renames node ids, which pytest 9 no longer lets it), so the grouping is this
    scheduler's."""
    if config.getvalue("dist") != "load":
        return None  # another --dist the developer chose
    from xdist.scheduler import LoadScopeScheduling

    groups = file_groups(config.rootpath)
    config.option.loadscopereorder = False  # xdist would order scopes by their count of tests

    class FileGroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid, groups)

    return FileGroupScheduling(config, log)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``{"qwen3": path, "llama": path}``: tiny checkpoints saved with save_pretrained."""
    root = tmp_path_factory.mktemp("models")
    return {arch: build_tiny_model(arch, root / f"tiny-{arch}") for arch in ("qwen3", "llama")}


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No test reads the developer's registry or cache by accident."""
    monkeypatch.delenv("WARMCACHE_DB", raising=False)
    monkeypatch.delenv("WARMCACHE_CACHE_DIR", raising=False)
    monkeypatch.delenv("WARMCACHE_STORE", raising=False)
    # A developer's --debug environment changes what commands print; "0", not unset, so that a --debug under test
    # (which sets it for its child processes) is undone when the test ends.
    monkeypatch.setenv("WARMCACHE_DEBUG", "0")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg-state"))  # the tag versions pulls remember
    # A command given no registry looks for .warmcache/registry.sqlite from the working folder up: the checkout's own,
    # after a quickstart, must not answer a test.
    monkeypatch.chdir(tmp_path)


@pytest.fixture(autouse=True)
def _fresh_store_deadline() -> Iterator[None]:
    """A store command run in-process (CliRunner) sets its deadline in a context variable of the worker's thread: a
    later test's store calls in that worker measured it from the earlier test's start and ran out (a 3 s deadline)."""
    from warmcache.store.deadline import command_timeout

    token = command_timeout.set(None)
    yield
    command_timeout.reset(token)


def postgres_base_url() -> str:
    url = os.environ.get(POSTGRES_ENV)
    if not url:
        pytest.skip(f"{POSTGRES_ENV} is not set: PostgreSQL registry tests need a server (.ci/run sets it)")
    return url


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A PostgreSQL URL whose search_path is a fresh schema, dropped afterwards."""
    with temporary_schema(postgres_base_url()) as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def registry_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The same test on the embedded default and on the fleet database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'registry.sqlite'}"
    return request.getfixturevalue("postgres_url")


@pytest.fixture
def write_manifest(tmp_path: Path, request: pytest.FixtureRequest) -> Callable[..., Path]:
    """Write a manifest; ``{qwen3}``/``{llama}`` in the text become the tiny model folders.

    The models are built (once per session) only when the text names one: a test
    of manifest parsing alone builds nothing.
    """

    def write(text: str, name: str = "manifest.toml") -> Path:
        path = tmp_path / name
        body = textwrap.dedent(text)
        if "{qwen3}" in body or "{llama}" in body:
            models: dict[str, Path] = request.getfixturevalue("tiny_models")
            body = body.replace("{qwen3}", str(models["qwen3"])).replace("{llama}", str(models["llama"]))
        path.write_text(body)
        return path

    return write


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """moto's standalone S3 server on a free 127.0.0.1 port, for the whole session."""
    with moto_server() as endpoint:
        yield endpoint


@pytest.fixture(scope="session")
def registry_host() -> Iterator[RunningRegistry]:
    """Debian's docker-registry (CNCF distribution 2.8) on a free 127.0.0.1 port, deletes enabled, for the whole
    session."""
    if not available():
        pytest.skip(MISSING)
    with oci_registry() as running:
        yield running


@pytest.fixture
def s3_bucket(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> str:
    """A fresh bucket on the test server, with the dummy credentials in the environment; returns its name."""
    for name, value in DUMMY_CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    bucket = f"t{abs(hash(request.node.nodeid)) % 10**12}-{os.getpid()}"
    create_bucket(s3_endpoint, bucket)
    return bucket


@pytest.fixture(scope="session")
def inductor_warmup(
    tmp_path_factory: pytest.TempPathFactory, tiny_models: dict[str, Path], s3_endpoint: str
) -> InductorWarmup:
    """The suite's one real Inductor warmup (four shapes, two graphs, ≈45 s cold on 2 cores), pushed to S3 as it
    compiled.

    verify, bundle and store tests start from it (or a copy) instead of each compiling the same graphs cold.
    """
    root = tmp_path_factory.mktemp("inductor-host")
    warmed = InductorWarmup(
        root, tiny_models["qwen3"], {}, ("--store", f"s3://{INDUCTOR_BUCKET}/prod", "--endpoint-url", s3_endpoint)
    )
    warmed.manifest_for(warmed.manifest)
    os.environ.update(DUMMY_CREDENTIALS)  # for boto3 here and in the CLI processes (moto takes any key)
    create_bucket(s3_endpoint, INDUCTOR_BUCKET)
    # Flags, not the environment: a session fixture runs before the per-test isolation of WARMCACHE_*.
    report = warmcache_json(
        "warmup", str(warmed.manifest), "--db", warmed.db, "--cache-dir", str(warmed.cache), "--push", *warmed.s3_store
    )
    return dataclasses.replace(warmed, report=report)


@pytest.fixture(scope="session")
def packaged(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The suite's one AOTInductor warmup and verify (tiny llama, two buckets, ≈50 s on 2 cores).

    Defined here, not in a test module that others import it from: pytest caches a
    session fixture per module that registers it, so a shared one compiled twice.
    """
    from test_aotinductor import warm_packages

    return warm_packages(tmp_path_factory.mktemp("aotinductor"), tiny_models["llama"], "cpu")
