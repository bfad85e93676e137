"""Settings resolved once (warmcache/settings.py): one precedence table, sources named in errors, one URL normaliser."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from click.testing import CliRunner
from warmcache_testkit.manifests import generate, manifest_toml, model

import warmcache
from warmcache.cli import main
from warmcache.errors import UsageError
from warmcache.manifest import load_manifest
from warmcache.registry import Registry
from warmcache.settings import (
    CACHE_DIR,
    FOUND,
    REGISTRY,
    SETTINGS,
    STORE,
    TRUSTED_KEYS,
    Chosen,
    RegistryLocation,
    Setting,
    choose,
    find_project_registry,
    resolve_cache_folder,
    resolve_registry,
)

PACKAGE = Path(warmcache.__file__).parent


@pytest.mark.parametrize("setting", [s for s in SETTINGS if s.flag and s.manifest_key], ids=lambda s: s.name)
def test_each_setting_takes_flag_then_environment_then_manifest_then_default(setting: Setting, tmp_path: Path) -> None:
    manifest = tmp_path / "m.toml"
    flag, env, from_manifest, default = setting.sources(manifest)
    assert (flag, env, from_manifest, default) == (
        setting.flag,
        f"${setting.env}",
        f"{manifest} {setting.manifest_key}",
        "default",
    )
    given = {setting.env: "e"}
    for (flag_value, environ, manifest_value), expected in (
        (("f", given, "m"), Chosen("f", flag)),
        ((None, given, "m"), Chosen("e", env)),
        ((None, {}, "m"), Chosen("m", from_manifest)),
        ((None, {}, None), None),  # nothing given: the setting's default applies
    ):
        assert choose(setting, flag_value, manifest_value, manifest, environ) == expected


def test_the_table_is_what_the_commands_resolve(tmp_path: Path) -> None:
    """The same order for the registry and the cache folder, through the functions the CLI calls."""
    manifest = load_manifest(_manifest(tmp_path, registry={"url": "from-manifest.sqlite"}))
    env = {
        "WARMCACHE_DB": str(tmp_path / "env.sqlite"),
        "WARMCACHE_CACHE_DIR": str(tmp_path / "env-cache"),
        "XDG_CACHE_HOME": str(tmp_path / "xdg"),
    }
    assert resolve_registry(str(tmp_path / "flag.sqlite"), manifest.registry, env) == RegistryLocation(
        f"sqlite:///{tmp_path / 'flag.sqlite'}", "--db"
    )
    assert resolve_registry(None, manifest.registry, env) == RegistryLocation(
        f"sqlite:///{tmp_path / 'env.sqlite'}", "$WARMCACHE_DB"
    )
    assert resolve_registry(None, manifest.registry, {"XDG_CACHE_HOME": env["XDG_CACHE_HOME"]}) == manifest.registry
    # anchored at the manifest's folder
    assert manifest.registry == RegistryLocation(
        f"sqlite:///{tmp_path / 'from-manifest.sqlite'}", f"{manifest.path} [registry] url"
    )
    assert resolve_registry(None, None, {"XDG_CACHE_HOME": env["XDG_CACHE_HOME"]}) == RegistryLocation(
        f"sqlite:///{tmp_path / 'xdg' / 'warmcache' / 'registry.sqlite'}", "default"
    )

    folder = resolve_cache_folder(str(tmp_path / "flag-cache"), env)
    assert folder is not None and (folder.path, folder.source) == (tmp_path / "flag-cache", "--cache-dir")
    folder = resolve_cache_folder(None, env)
    assert folder is not None and (folder.path, folder.source) == (tmp_path / "env-cache", "$WARMCACHE_CACHE_DIR")
    # then the manifest's [cache] dir, then the target's own (resolve_cache_dir)
    assert resolve_cache_folder(None, {}) is None
    assert {s.env for s in SETTINGS if s.manifest_key} == {REGISTRY.env, CACHE_DIR.env, STORE.env, TRUSTED_KEYS.env}


def test_errors_name_the_source_of_the_bad_value(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(UsageError, match=r"^\$WARMCACHE_DB 'not-a-url' is neither a database URL nor a file path"):
        resolve_registry(None, None, {"WARMCACHE_DB": "not-a-url"})
    with pytest.raises(UsageError, match=r"^--db 'postgresql://db:port/x' is not a database URL \(invalid literal"):
        RegistryLocation.parse("postgresql://db:port/x", "--db")  # checked once, so no later reading of it fails
    with pytest.raises(UsageError, match=r"^--cache-dir is empty"):
        resolve_cache_folder("", {})
    monkeypatch.setenv("WARMCACHE_CACHE_DIR", " ")
    result = CliRunner().invoke(main, ["cache", "scan", "--db", f"sqlite:///{tmp_path / 'r.sqlite'}"])
    assert result.exit_code == 2 and "$WARMCACHE_CACHE_DIR is empty" in result.output, result.output
    bad = _manifest(tmp_path, registry={"url": "mysql://db/x"})
    result = CliRunner().invoke(main, ["plan", str(bad)])
    assert result.exit_code == 2 and f"{bad}: registry.url: 'mysql://db/x': unknown scheme 'mysql'" in result.output, (
        result.output
    )


def test_the_registry_url_is_normalised_in_exactly_one_function(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``settings.normalise_url`` is the one normaliser and ``RegistryLocation.parse`` its one caller; a command
    normalises once."""
    callers = sorted(
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if any(
            isinstance(node, ast.Name | ast.alias | ast.Attribute)
            and "normalise_url" in (getattr(node, "id", None), getattr(node, "name", None), getattr(node, "attr", None))
            for node in ast.walk(ast.parse(path.read_text()))
        )
    )
    assert callers == ["settings.py"]

    import warmcache.settings as settings

    calls: list[str] = []
    real = settings.normalise_url

    def counted(text: str, source: str = "registry URL", base: Path | None = None) -> str:
        calls.append(source)
        return real(text, source, base)

    monkeypatch.setattr(settings, "normalise_url", counted)
    Registry.open(f"sqlite:///{tmp_path / 'r.sqlite'}").close()  # shapes only reads a registry
    calls.clear()
    result = CliRunner().invoke(main, ["shapes", "--db", f"sqlite:///{tmp_path / 'r.sqlite'}", "--json"])
    assert result.exit_code == 0, result.output
    assert calls == ["--db"]  # not again in Registry.open or the engine


def test_postgresql_locations_are_edited_as_urls_not_text() -> None:
    location = RegistryLocation.parse("postgres://u:secret@db:5432/reg?options=-csearch_path%3Dteam", "$WARMCACHE_DB")
    assert (
        location.url.startswith("postgresql+psycopg://")
        and location.display == "postgresql+psycopg://u:***@db:5432/reg?options=-csearch_path%3Dteam"
    )
    bounded = location.bounded(3, 5000)
    assert (
        bounded.url
        == "postgresql+psycopg://u:secret@db:5432/reg?connect_timeout=3&options=-csearch_path%3Dteam+-c+statement_timeout%3D5000"
    )
    assert bounded.bounded(3, 5000) == bounded and bounded.source == "$WARMCACHE_DB"  # idempotent
    # the URL's own wins
    assert (
        RegistryLocation.parse("postgresql://db/reg?connect_timeout=10").bounded(3).url
        == "postgresql+psycopg://db/reg?connect_timeout=10"
    )
    sqlite = RegistryLocation.parse("sqlite:///reg.sqlite")
    assert sqlite.bounded(3, 5000) == sqlite and sqlite.sqlite_file == Path("reg.sqlite").resolve()


def test_a_location_formatted_into_a_message_or_a_log_line_hides_its_password() -> None:
    """The URL keeps the password for the driver; ``str`` and ``repr`` (an f-string, a ``%s`` log argument, a
    traceback's locals) show only :attr:`RegistryLocation.display`."""
    location = RegistryLocation.parse("postgresql://u:hunter2@db:5432/reg", "--db")
    assert "hunter2" in location.url
    assert "hunter2" not in f"{location} {location!r}" and "u:***@db" in str(location) and "--db" in repr(location)


def _manifest(tmp_path: Path, **tables: dict[str, str]) -> Path:
    path = tmp_path / "m.toml"
    path.write_text(manifest_toml(model("m", "some-org/some-model", backend="eager", generate=[generate()]), **tables))
    return path


# ------------------------------------------------------------------ the project registry, found from the working folder


def _project(tmp_path: Path) -> tuple[Path, Path]:
    """A project whose quickstart left ``.warmcache/registry.sqlite`` (a real, empty registry), and a folder deep in
    it."""
    project = tmp_path / "project"
    registry = project / ".warmcache" / "registry.sqlite"
    registry.parent.mkdir(parents=True)
    Registry.open(f"sqlite:///{registry}").close()
    deep = project / "src" / "pkg"
    deep.mkdir(parents=True)
    return registry, deep


def test_a_command_given_no_registry_finds_the_projects_from_a_folder_below_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As git finds .git: after the quickstart, ``warmcache shapes`` needs no --db, and says which registry it read."""
    registry, deep = _project(tmp_path)
    monkeypatch.chdir(deep)
    result = CliRunner().invoke(main, ["shapes", "--json"])
    assert result.exit_code == 0, result.output
    assert result.stdout == "[]\n"  # --json output stays clean: the note is on stderr
    assert result.stderr == f"registry: {registry} (found from the working folder upward; --db names another)\n"
    debug = CliRunner().invoke(main, ["--debug", "shapes", "--json"])
    assert f"debug: settings: registry sqlite:///{registry} (found from the working folder upward)" in debug.stderr


def test_the_found_registry_comes_after_every_named_one_and_before_the_default(tmp_path: Path) -> None:
    registry, deep = _project(tmp_path)
    manifest = load_manifest(_manifest(tmp_path, registry={"url": "from-manifest.sqlite"}))
    env = {"WARMCACHE_DB": str(tmp_path / "env.sqlite"), "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    no_env = {"XDG_CACHE_HOME": env["XDG_CACHE_HOME"]}
    assert resolve_registry("flag.sqlite", manifest.registry, env, start=deep).source == "--db"
    assert resolve_registry(None, manifest.registry, env, start=deep).source == "$WARMCACHE_DB"
    assert resolve_registry(None, manifest.registry, no_env, start=deep) == manifest.registry
    assert resolve_registry(None, None, no_env, start=deep) == RegistryLocation(f"sqlite:///{registry}", FOUND)
    assert resolve_registry(None, None, no_env, start=tmp_path).source == "default"  # above the project: not found
    # the nearest wins: a nested project's registry over its parent's
    inner = deep / ".warmcache" / "registry.sqlite"
    inner.parent.mkdir()
    inner.touch()
    (deep / "sub").mkdir()
    assert find_project_registry(deep / "sub") == inner
    assert find_project_registry(registry.parent.parent) == registry


def test_looking_for_the_project_registry_creates_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A read with no registry anywhere is refused at the default; the .warmcache/ folder without one (or with a folder
    of that name) is passed over, and neither is given a file."""
    deep = tmp_path / "project" / "src"
    (tmp_path / "project" / ".warmcache").mkdir(parents=True)  # a quickstart's models, no registry yet
    (deep / ".warmcache" / "registry.sqlite").mkdir(parents=True)  # not a file: not a registry
    monkeypatch.chdir(deep)
    before = sorted(tmp_path.rglob("*"))
    for command in (["shapes", "--json"], ["check", "--model", "m", "--batch", "1", "--seq", "8"], ["misses"]):
        result = CliRunner().invoke(main, command)
        assert result.exit_code == 3, result.output
        assert f"registry sqlite:///{tmp_path / 'xdg-cache'}/warmcache/registry.sqlite does not exist" in result.stderr
    assert sorted(tmp_path.rglob("*")) == before
