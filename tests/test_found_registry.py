"""A registry nobody named: ``.warmcache/registry.sqlite`` found from the working folder upward is used only where no
other user could have put it there or changed it (git's ``safe.directory`` rule, CVE-2022-24765), and never by a
command that deletes or signs; a read leaves whatever file it is given as it was.

Another user is uid 65534 (``nobody``): these tests run as root, which owns everything else. The planted registry
is a real one with a forged row, the cache a real Neuron cache none of whose entries that registry names.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from test_cache_neuron import NEURON_MANIFEST, done_files, module, planned_by_batch, record_compiled

from warmcache.cli import main
from warmcache.settings import SAFE_DIRECTORIES_ENV

pytestmark = pytest.mark.skipif(os.getuid() != 0, reason="hands files to another user (uid 65534): needs root")

NOBODY = 65534
#: The forged row the planted registry holds: ``check`` must not answer from it, nor ``guard export --sign`` sign it.
FORGED_BATCH, FORGED_SEQ = 4, 16


@dataclass(frozen=True)
class Project:
    """``shared/.warmcache/registry.sqlite`` above the working folder ``shared/victim/sub``, the victim's own cache
    elsewhere, a manifest naming no registry and a signing key."""

    project: Path
    registry: Path
    below: Path
    cache: Path
    manifest: Path
    key: Path
    tmp: Path

    def hand_to(self, uid: int) -> None:
        """Give the project folder, its ``.warmcache`` and the registry in it to ``uid``: the planter's layout."""
        for path in (self.project, self.registry.parent, *self.registry.parent.iterdir()):
            os.chown(path, uid, uid)

    def state(self) -> dict[str, str]:
        """sha256 of every file of the registry's folder and of the cache: what a refused command must leave."""
        return {
            str(path): hashlib.sha256(path.read_bytes()).hexdigest()
            for root in (self.registry.parent, self.cache)
            for path in sorted(root.rglob("*"))
            if path.is_file()
        }


@pytest.fixture
def project(tmp_path: Path, write_manifest, monkeypatch: pytest.MonkeyPatch) -> Project:
    project = tmp_path / "shared"
    registry = project / ".warmcache" / "registry.sqlite"
    registry.parent.mkdir(parents=True)
    manifest = write_manifest(NEURON_MANIFEST)  # no [registry]: a command given no --db finds one
    cache = tmp_path / "cache"
    entries = [module(cache, name, done_files()) for name in ("aaa+f1", "bbb+f1", "ccc+f1")]
    record_compiled(f"sqlite:///{registry}", planned_by_batch(manifest)[FORGED_BATCH], ["neuronxcc-x/MODULE_zzz+f1"])
    assert all((cache / entry).is_dir() for entry in entries)
    below = project / "victim" / "sub"
    below.mkdir(parents=True)
    key = tmp_path / "keys" / "build-key"
    key.parent.mkdir()
    assert cli("keys", "generate", str(key)).exit_code == 0
    monkeypatch.chdir(below)
    return Project(project, registry, below, cache, manifest, key, tmp_path)


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def one_error_line(result: Result) -> str:
    """The command's stderr, asserted to be exactly one ``warmcache: error:`` line."""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("warmcache: error: "), result.output
    return lines[0]


def commands(p: Project) -> dict[str, list[str]]:
    """Each kind of command the planted registry used to drive: a read, a deletion, a signature and a write."""
    return {
        "check": ["check", "--model", "neuron-m", "--batch", str(FORGED_BATCH), "--seq", str(FORGED_SEQ)],
        "cache prune": ["cache", "prune", "--orphans", "--cache-dir", str(p.cache), "--grace", "0s"],
        "guard export --sign": [
            "guard", "export", "--model", "neuron-m", "--out", str(p.tmp / "snapshot.json"), "--sign", str(p.key)
        ],
        "warmup": ["warmup", str(p.manifest), "--cache-dir", str(p.cache)],
    }  # fmt: skip


@pytest.mark.parametrize("command", ["check", "cache prune", "guard export --sign", "warmup"])
def test_a_registry_another_user_planted_above_the_working_folder_drives_no_command(
    project: Project, command: str
) -> None:
    """Before: prune deleted the cache (none of it was in the planted registry), export signed the forged row,
    check answered ``ok`` from it and warmup wrote this host's rows into it."""
    project.hand_to(NOBODY)
    before = project.state()
    result = cli(*commands(project)[command])
    assert result.exit_code == 3, result.output
    line = one_error_line(result)
    assert f"registry {project.registry} (found from the working folder upward) refused" in line
    assert f"{project.registry} is owned by uid {NOBODY} (nobody), not by you (uid 0, root)" in line
    assert f"--db {project.registry}" in line and "$WARMCACHE_DB" in line
    assert f"list {project.project} in ${SAFE_DIRECTORIES_ENV}" in line
    assert result.stdout == ""
    assert project.state() == before
    assert not (project.tmp / "snapshot.json").exists()


@pytest.mark.parametrize(
    ("mode", "problem"), [(0o775, f"is writable by group {NOBODY} (nogroup) (mode 0775)"), (0o757, "is writable by "
    "every user (mode 0757)")]
)  # fmt: skip
def test_a_folder_others_can_write_between_the_registry_and_the_working_folder_is_refused(
    project: Project, mode: int, problem: str
) -> None:
    """Everything is root's, but ``victim/`` is writable by another group (or by all): whoever can write there can
    put a project registry of their own nearer (``victim/.warmcache``)."""
    victim = project.below.parent
    os.chown(victim, 0, NOBODY)
    victim.chmod(mode)
    result = cli(*commands(project)["check"])
    assert result.exit_code == 3, result.output
    assert f"refused: {victim} {problem}" in one_error_line(result)


def test_your_own_found_registry_still_answers_reads(project: Project) -> None:
    """The quickstart's layout: everything this user's, so a read needs no --db and says which registry it read."""
    result = cli(*commands(project)["check"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"ok: batch={FORGED_BATCH} seq={FORGED_SEQ} is compiled exactly")
    assert result.stderr == f"registry: {project.registry} (found from the working folder upward; --db names another)\n"
    shapes = cli("shapes", "--json")
    assert shapes.exit_code == 0 and len(json.loads(shapes.stdout)) == 1


@pytest.mark.parametrize("listed", ["project", "*"])
def test_a_project_in_the_allow_list_is_used_whoever_owns_it(
    project: Project, monkeypatch: pytest.MonkeyPatch, listed: str
) -> None:
    """``$WARMCACHE_SAFE_DIRECTORIES`` names it deliberately, as git's ``safe.directory`` does (``*``: any)."""
    project.hand_to(NOBODY)
    other = project.tmp / "elsewhere"
    monkeypatch.setenv(SAFE_DIRECTORIES_ENV, os.pathsep.join([str(other), str(project.project) if listed == "project"
                                                               else "*"]))  # fmt: skip
    result = cli(*commands(project)["check"])
    assert result.exit_code == 0, result.output
    assert "found from the working folder upward" in result.stderr  # still said: nobody named it on the command line
    monkeypatch.setenv(SAFE_DIRECTORIES_ENV, str(other))  # another project listed: this one is not
    assert cli(*commands(project)["check"]).exit_code == 3


def deleting_and_signing(p: Project) -> dict[str, list[str]]:
    """The commands that delete by what the registry says or sign what it holds."""
    return {
        "cache prune": commands(p)["cache prune"],
        "cache doctor --fix": ["cache", "doctor", "--fix", "--cache-dir", str(p.cache), "--grace", "0s"],
        "guard export --sign": commands(p)["guard export --sign"],
        "bundle pack --sign": [
            "bundle", "pack", str(p.manifest), "--cache-dir", str(p.cache), "-o", str(p.tmp / "b.tar"), "--sign",
            str(p.key),
        ],
        "push --sign": [
            "push", str(p.manifest), "--cache-dir", str(p.cache), "--store", str(p.tmp / "store"), "--sign", str(p.key)
        ],
        "warmup --push --sign": [
            "warmup", str(p.manifest), "--cache-dir", str(p.cache), "--push", "--store", str(p.tmp / "store"),
            "--sign", str(p.key),
        ],
    }  # fmt: skip


@pytest.mark.parametrize(
    "command",
    ["cache prune", "cache doctor --fix", "guard export --sign", "bundle pack --sign", "push --sign",
     "warmup --push --sign"],
)  # fmt: skip
def test_commands_that_delete_or_sign_refuse_a_found_registry_even_your_own(project: Project, command: str) -> None:
    """A found registry may be a parent project's, or one left behind: it must not decide what is deleted or
    signed."""
    before = project.state()
    result = cli(*deleting_and_signing(project)[command])
    assert result.exit_code == 2, result.output
    assert one_error_line(result) == (
        f"warmcache: error: {command} acts only on a registry named deliberately, and {project.registry} was found "
        f"from the working folder upward: name it with --db {project.registry} (or $WARMCACHE_DB, or the manifest's "
        "[registry] url)"
    )
    assert project.state() == before
    assert sorted(p.name for p in project.tmp.iterdir()) == ["cache", "keys", "manifest.toml", "shared"]


def test_serve_sign_refuses_a_found_registry_before_it_serves(project: Project) -> None:
    """Before, it served the found registry's rows signed (here it would still be running at the timeout)."""
    run = subprocess.run(
        [sys.executable, "-m", "warmcache", "serve", "--port", "0", "--sign", str(project.key)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2, run.stderr
    assert run.stderr.startswith("warmcache: error: serve --sign acts only on a registry named deliberately")


def test_pruning_and_signing_work_on_the_same_registry_once_named_with_db(project: Project) -> None:
    for command in ("cache prune", "guard export --sign"):
        assert cli(*commands(project)[command]).exit_code == 2  # found: refused
    prune = cli(*commands(project)["cache prune"], "--db", str(project.registry), "--json")
    assert prune.exit_code == 0, prune.output
    [plan] = json.loads(prune.stdout)
    assert plan["applied"] and len(plan["remove"]) == 3  # every entry: none is in this registry
    snapshot = project.tmp / "snapshot.json"
    export = cli(*commands(project)["guard export --sign"], "--db", str(project.registry))
    assert export.exit_code == 0, export.output
    assert export.stdout.startswith(f"wrote 1 compiled shapes of neuron-m to {snapshot} (signed by key ")
    assert json.loads(snapshot.read_text())["signature"]


@pytest.fixture(params=["empty file", "another application's SQLite file"])
def not_a_registry(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    path = tmp_path / "given.sqlite"
    if request.param == "empty file":
        path.touch()
    else:
        with sqlite3.connect(path) as conn:  # rollback journal, as most applications keep theirs
            conn.execute("CREATE TABLE notes (body TEXT)")
            conn.execute("INSERT INTO notes VALUES ('mine')")
        conn.close()
    return path


@pytest.mark.parametrize(
    "command",
    [
        ["check", "--model", "m", "--batch", "1", "--seq", "8"],
        ["shapes"],
        ["misses"],
        ["guard", "export", "--model", "m", "--out", "snapshot.json"],
        ["db", "current"],
        ["cache", "scan", "--cache-dir", "cache"],
        ["cache", "prune", "--orphans", "--cache-dir", "cache"],  # writes, once it has a registry: not to this file
    ],
    ids=" ".join,
)
def test_a_command_that_makes_no_registry_leaves_a_file_given_as_db_byte_for_byte(
    not_a_registry: Path, command: list[str]
) -> None:
    """Before: the empty file became a 4 KB WAL-mode database and the other application's file was switched to WAL
    (its header rewritten) by the engine's first PRAGMA, then the command said the file held no warmcache schema."""
    before = hashlib.sha256(not_a_registry.read_bytes()).hexdigest()
    result = cli(*command, "--db", str(not_a_registry))
    if command[:2] == ["db", "current"]:
        assert result.exit_code == 0 and "schema empty" in result.stdout, result.output
    else:
        assert result.exit_code == 3, result.output
        assert f"registry sqlite:///{not_a_registry} " in one_error_line(result)
    assert hashlib.sha256(not_a_registry.read_bytes()).hexdigest() == before
    assert sorted(p.name for p in not_a_registry.parent.iterdir()) == ["given.sqlite"]
