"""Fuzzing the two readers of outside input: the manifest parser and the bundle reader.

Hypothesis mutates a valid manifest and a valid bundle (a value anywhere in the tree
replaced by any JSON/TOML value: huge integers, long or odd strings, deep nesting,
wrong types; keys added or removed; raw bytes flipped, inserted or cut) and runs the
real command in-process. Whatever it builds, the command must end with an exit code
(0 for input that is still valid, 2–5 for refused input), never a traceback, and a
refused command must write nothing but what the test itself put in its sandbox.
Seeded (``derandomize``) and without an example database, so CI runs the same
examples every time in bounded time.
"""

from __future__ import annotations

import io
import json
import shutil
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import test_bundle
from click.testing import Result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_bundle import Built, pack
from test_cache_neuron import cli

built = test_bundle.built  # the build machine's cache and registry (a fixture)

FUZZ = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=120,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
REFUSED = {2, 3, 4, 5}
DEEP = "\x00deep\x00"  # a placeholder string, replaced after serialising by brackets nested thousands deep

_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)
#: Values that broke a reader once (issue 15), drawn often so that 120 examples meet them in every key.
_hostile = st.sampled_from(
    [
        -1, 0, 2**31, 2**63, 10**30, -(2**63) - 1, float("nan"), float("inf"),
        "", "a" * 300, "x/" + "y" * 256, "../../etc", "/abs/path", "~nobody/x", "bad\x00byte", "sqlite:///" + "z" * 300,
        "not-a-url", "ed25519:AAAA", DEEP, [DEEP], {"": DEEP},
    ]
)  # fmt: skip
_scalars = st.one_of(st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True), _text)
_values = st.one_of(
    _hostile,
    st.recursive(
        _scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4), max_leaves=8
    ),
)


def _places(tree: Any, at: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every place in a JSON tree (the root, each container, each leaf), as a key path."""
    yield at
    children = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, list) else ()
    for key, child in children:
        yield from _places(child, (*at, key))


def _mutate(data: st.DataObject, tree: Any) -> Any:
    """``tree`` with one to three places changed (a value replaced, a key added or removed);
    each place is drawn from all of them, so deep keys (a model's path) are hit as often as top ones."""
    for _ in range(data.draw(st.integers(1, 3))):
        place = data.draw(st.sampled_from(list(_places(tree))))
        tree = _change(data, tree, place, data.draw(st.sampled_from(["replace", "replace", "delete", "add"])))
    return tree


def _change(data: st.DataObject, tree: Any, place: tuple[Any, ...], action: str) -> Any:
    if not place:
        return (
            {**tree, data.draw(_text): data.draw(_values)}
            if action == "add" and isinstance(tree, dict)
            else data.draw(_values)
        )
    key, rest = place[0], place[1:]
    if isinstance(tree, dict):
        if not rest and action == "delete":
            return {k: v for k, v in tree.items() if k != key}
        return {**tree, key: _change(data, tree[key], rest, action)}
    if not rest and action == "delete":
        return tree[:key] + tree[key + 1 :]
    return [*tree[:key], _change(data, tree[key], rest, action), *tree[key + 1 :]]


def _deepen(text: str, depth: int) -> str:
    return text.replace(json.dumps(DEEP), "[" * depth + "]" * depth)


def _mutate_bytes(data: st.DataObject, blob: bytes) -> bytes:
    """Flip, insert or cut bytes at a drawn position."""
    if not blob:
        return data.draw(st.binary(max_size=64))
    position = data.draw(st.integers(0, max(len(blob) - 1, 0)))
    action = data.draw(st.sampled_from(["flip", "insert", "cut", "truncate"]))
    if action == "flip":
        return blob[:position] + bytes([blob[position] ^ data.draw(st.integers(1, 255))]) + blob[position + 1 :]
    if action == "insert":
        return blob[:position] + data.draw(st.binary(min_size=1, max_size=64)) + blob[position:]
    if action == "cut":
        return blob[:position] + blob[position + data.draw(st.integers(1, 512)) :]
    return blob[:position]


def _settled(result: Result, sandbox: Path, allowed_after_success: set[str], before: set[str]) -> None:
    """An exit code, no traceback; a refusal left the sandbox as it was."""
    assert result.exit_code == 0 or result.exit_code in REFUSED, (
        result.exit_code,
        result.output[-2000:],
        result.exception,
    )
    assert result.exit_code != 0 or result.exception is None
    after = {p.relative_to(sandbox).as_posix() for p in sandbox.rglob("*")}
    if result.exit_code in REFUSED:
        assert after == before, sorted(after ^ before)[:5]
    else:
        assert {p.split("/")[0] for p in after - before} <= allowed_after_success


# ---------------------------------------------------------------- manifests


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return {"nan": "nan", "inf": "inf", "-inf": "-inf"}.get(repr(value), repr(value))
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return "{" + ", ".join(f"{json.dumps(k, ensure_ascii=False)} = {_toml_value(v)}" for k, v in value.items()) + "}"


def _toml(document: dict[str, Any]) -> str:
    return "".join(f"{json.dumps(key, ensure_ascii=False)} = {_toml_value(value)}\n" for key, value in document.items())


def _good_manifest(model_path: Path) -> dict[str, Any]:
    return {
        "registry": {"lease_seconds": 60},
        "cache": {"dir": "cache"},
        "trust": {"keys": []},
        "model": [
            {
                "name": "m",
                "path": str(model_path),
                "dtype": "float32",
                "distributed": {"tp_size": 1},
                "generate": [{"batch_sizes": [1, 2], "prompt_lengths": [8], "max_cache_len": 32, "num_beams": 1}],
                "train": [{"batch_sizes": [2], "seq_lengths": [16], "bf16": False}],
            }
        ],
    }


@FUZZ
@given(data=st.data(), depth=st.sampled_from([3, 70, 5000]), raw=st.sampled_from([False, False, False, True]))
def test_fuzzed_manifests_end_in_an_exit_code_and_write_nothing(
    tiny_models: dict[str, Path], data: st.DataObject, depth: int, raw: bool
) -> None:
    with tempfile.TemporaryDirectory() as folder:
        sandbox = Path(folder)
        document = _mutate(data, _good_manifest(tiny_models["qwen3"]))
        text = _toml(document if isinstance(document, dict) else {"model": document})
        manifest = sandbox / "manifest.toml"
        manifest.write_bytes(_mutate_bytes(data, text.encode()) if raw else _deepen(text, depth).encode())
        before = {"manifest.toml"}
        result = cli("plan", str(manifest), "--db", f"sqlite:///{sandbox / 'reg.sqlite'}")
        _settled(result, sandbox, {"reg.sqlite", "reg.sqlite-wal", "reg.sqlite-shm"}, before)


# ---------------------------------------------------------------- bundles


def _rebuild(good: Path, out: Path, edit: Callable[[list[tuple[tarfile.TarInfo, bytes | None]]], None]) -> None:
    with tarfile.open(good) as tar:
        members = [(m, tar.extractfile(m).read() if m.isfile() else None) for m in tar.getmembers()]  # type: ignore[union-attr]
    edit(members)
    with tarfile.open(out, "w") as tar:
        for info, blob in members:
            tar.addfile(info, io.BytesIO(blob) if blob is not None else None)


@pytest.fixture
def good_bundle(built: Built, tmp_path: Path) -> Path:
    bundle = tmp_path / "good.tar"
    assert pack(built, bundle).exit_code == 0
    return bundle


def _unpack_in_sandbox(bundle_bytes: Callable[[Path], None]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        sandbox = Path(folder)
        bundle_bytes(sandbox / "fuzzed.tar")
        before = {p.relative_to(sandbox).as_posix() for p in sandbox.rglob("*")}
        result = cli(
            "bundle",
            "unpack",
            "--allow-unsigned",
            str(sandbox / "fuzzed.tar"),
            "--cache-dir",
            str(sandbox / "cache"),
            "--db",
            f"sqlite:///{sandbox / 'reg.sqlite'}",
        )
        _settled(result, sandbox, {"cache", "reg.sqlite", "reg.sqlite-wal", "reg.sqlite-shm"}, before)
        shutil.rmtree(sandbox / "cache", ignore_errors=True)


@FUZZ
@given(data=st.data(), depth=st.sampled_from([3, 70, 5000]))
def test_fuzzed_bundle_metadata_ends_in_an_exit_code_and_writes_nothing(
    good_bundle: Path, data: st.DataObject, depth: int
) -> None:
    def edit(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> None:
        info, blob = members[0]
        assert blob is not None
        mutated = _deepen(json.dumps(_mutate(data, json.loads(blob))), depth).encode()
        info.size = len(mutated)
        members[0] = (info, mutated)

    _unpack_in_sandbox(lambda out: _rebuild(good_bundle, out, edit))


@FUZZ
@given(data=st.data(), compressed=st.booleans())
def test_fuzzed_bundle_bytes_end_in_an_exit_code_and_write_nothing(
    good_bundle: Path, built: Built, tmp_path: Path, data: st.DataObject, compressed: bool
) -> None:
    source = good_bundle
    if compressed:
        source = tmp_path / "good.tar.gz"
        if not source.exists():
            assert pack(built, source).exit_code == 0
    blob = _mutate_bytes(data, source.read_bytes())
    _unpack_in_sandbox(lambda out: out.write_bytes(blob))
