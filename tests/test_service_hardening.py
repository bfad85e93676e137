"""The service under hostile requests: integers the registry cannot hold, deep JSON, lenient digits,
questions about the server's disk. Each is a 4xx naming the field, and none marks the registry down."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_service import TOKEN, call, compiled, manifest, service, wait_ready  # noqa: F401 - fixtures
from warmcache_testkit.moto_server import free_port

from warmcache.bounds import MAX_COUNT
from warmcache.registry import Registry
from warmcache.service import ServiceConfig
from warmcache.service.http import ApiError
from warmcache.service.misses import parse_misses
from warmcache.service.server import running_server
from warmcache.settings import RegistryLocation

AUTH = {"Authorization": f"Bearer {TOKEN}"}


def miss(**overrides: object) -> bytes:
    item = {
        "model": "m",
        "workload": "generate",
        "dtype": "float32",
        "batch_size": 3,
        "seq_len": 20,
        "decision": "pad",
        **overrides,
    }
    return json.dumps({"misses": [item]}).encode()


@pytest.mark.parametrize(
    ("field", "value"), [("batch_size", 2**31), ("count", 2**63), ("count", 2**62), ("padded_seq", MAX_COUNT + 1)]
)
def test_a_miss_report_the_registry_cannot_hold_is_a_400_naming_the_field(field: str, value: int) -> None:
    with pytest.raises(ApiError) as caught:
        parse_misses(miss(**{field: value}))
    assert (
        caught.value.status == 400
        and caught.value.field == f"misses[0].{field}"
        and str(MAX_COUNT) in caught.value.message
    )
    assert parse_misses(miss(**{field: MAX_COUNT}))[0]  # the largest value both backends hold is accepted


def test_json_nested_100000_deep_is_a_400_before_parsing() -> None:
    with pytest.raises(ApiError) as caught:
        parse_misses(b'{"misses": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    assert caught.value.status == 400 and "nest" in caught.value.message and caught.value.field == "body"


def test_an_oversized_miss_report_never_marks_the_registry_down(service: str, compiled: str) -> None:  # noqa: F811
    for body in (
        miss(batch_size=2**31),
        miss(count=2**62),
        miss(count=2**62),
        b'{"misses": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    ):
        status, answer, _ = call(f"{service}/v1/misses", "POST", body, AUTH)
        assert status == 400, answer
    assert call(f"{service}/v1/refresh", "POST", b"", AUTH)[0] == 200  # a refresh still sums the misses
    assert call(f"{service}/readyz")[0] == 200 and call(f"{service}/v1/models")[0] == 200


@pytest.mark.parametrize("batch", ["1_0", "+1", "\N{FULLWIDTH DIGIT ONE}", " 1", "1.0"])
def test_query_integers_are_ascii_digits_only(service: str, batch: str) -> None:  # noqa: F811
    status, answer, _ = call(f"{service}/v1/check?model=m&seq=16&batch={urllib.parse.quote(batch)}")
    assert status == 400 and answer["error"]["field"] == "batch", answer


@pytest.mark.parametrize("path", ["/etc", "/proc/self", "/no/such/folder", "/tmp"])
def test_plan_does_not_reveal_whether_server_paths_exist(service: str, path: str) -> None:  # noqa: F811
    body = (
        f'[[model]]\nname = "x"\npath = "{path}"\n[[model.generate]]\nbatch_sizes = '
        "[1]\nprompt_lengths = [8]\nmax_cache_len = 16\n".encode()
    )
    status, answer, _ = call(f"{service}/v1/plan", "POST", body, AUTH)
    assert status == 400, answer
    message = answer["error"]["message"]
    assert "model path not checked by the service" in message and answer["error"]["field"] == "model[0].path"
    assert (
        "not a folder" not in message and "not found" not in message and "/proc/" not in message and path not in message
    )


def test_plan_answers_are_the_same_for_a_missing_and_an_existing_server_path(service: str, tmp_path: Path) -> None:  # noqa: F811
    answers = set()
    for path in ("/etc", "/no/such/folder"):
        body = (
            f'[[model]]\nname = "x"\npath = "{path}"\n[[model.generate]]\nbatch_sizes = '
            "[1]\nprompt_lengths = [8]\nmax_cache_len = 16\n".encode()
        )
        answers.add(json.dumps(call(f"{service}/v1/plan", "POST", body, AUTH)[1]).replace(path, "PATH"))
    assert len(answers) == 1, answers


def serve_command(tmp_path: Path, host: str) -> list[str]:
    return [
        sys.executable,
        "-c",
        "from warmcache.cli import main; main()",
        "serve",
        "--db",
        f"sqlite:///{tmp_path / 'r.sqlite'}",
        "--host",
        host,
        "--port",
        str(free_port()),
    ]


def test_serve_refuses_a_short_token_without_quoting_it(tmp_path: Path) -> None:
    # a server that started anyway is killed by the timeout, failing the test
    env = {
        **os.environ,
        "WARMCACHE_TOKEN": "x",
    }
    result = subprocess.run(
        serve_command(tmp_path, "0.0.0.0"), capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert result.returncode == 2 and "fewer than 16" in result.stderr and "'x'" not in result.stderr


@pytest.mark.parametrize(
    ("host", "shown", "warned"),
    [("::", "http://[::]:", True), ("0.0.0.0", "http://0.0.0.0:", True), ("127.0.0.1", "http://127.0.0.1:", False)],
)
def test_serve_names_its_url_and_warns_when_bound_beyond_loopback(
    tmp_path: Path, host: str, shown: str, warned: bool
) -> None:
    env = {**os.environ, "WARMCACHE_TOKEN": "a-long-enough-secret-token"}
    command = serve_command(tmp_path, host)
    with subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env) as server:
        assert server.stderr is not None
        lines = [server.stderr.readline()]  # the warning comes before the dashboard line: no second read can block
        if "dashboard" not in lines[0]:
            lines.append(server.stderr.readline())
        server.terminate()
    assert shown in lines[-1], lines
    # which registry it serves, and that the address leads somewhere only while it runs
    assert f"registry sqlite:///{tmp_path / 'r.sqlite'}; dashboard {shown}" in lines[-1], lines
    assert "while this runs (Ctrl-C stops it)" in lines[-1], lines
    assert any("reachable beyond this machine" in line for line in lines) is warned, lines


@pytest.fixture
def planning(compiled: str, tmp_path: Path) -> Iterator[str]:  # noqa: F811 - the fixture of that name
    """A service whose manifest names the model folders these tests post: ``POST /v1/plan`` reads no other."""
    served = tmp_path / "served.toml"
    served.write_text(
        "".join(
            f'[[model]]\nname = "{name}"\npath = "{tmp_path / name}"\n[[model.generate]]\nbatch_sizes = [1]\n'
            "prompt_lengths = [8]\nmax_cache_len = 16\n"
            for name in ("config-only", "deep")
        )
    )
    config = ServiceConfig(RegistryLocation.parse(compiled), token=TOKEN, manifest=served, refresh_interval=0.2)
    with running_server(config) as base:
        wait_ready(base)
        yield base


def grid_manifest(tmp_path: Path, models: int, side: int) -> bytes:
    """``models`` models of one ``side`` × ``side`` generate grid each, on a config the server holds (a plan reads no
    weights)."""
    folder = tmp_path / "config-only"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2}))
    values = list(range(1, side + 1))
    table = (
        f'path = "{folder}"\n[[model.generate]]\nbatch_sizes = {values}\nprompt_lengths = '
        f"{values}\nmax_cache_len = {side + 1}\n"
    )
    return "\n".join(f'[[model]]\nname = "m{i}"\n{table}' for i in range(models)).encode()


def test_a_manifest_that_expands_past_the_limit_is_refused_before_planning(service: str, tmp_path: Path) -> None:  # noqa: F811
    """50 models × 299 × 299 (4.5 million shapes from 148 KB): a 400 within seconds naming the product (expanding
    4.5 million shapes would take far longer; 5 s leaves room for a loaded CI host), and the CLI alike."""
    body = grid_manifest(tmp_path, 50, 299)
    assert len(body) < 150_000  # far inside the 1 MiB a manifest may be
    start = time.monotonic()
    status, answer, _ = call(f"{service}/v1/plan", "POST", body, AUTH)
    seconds = time.monotonic() - start
    assert status == 400 and seconds < 5.0, (status, seconds)
    message = answer["error"]["message"]
    assert "declares 4,470,050 shapes" in message and "more than the 100,000 a manifest may" in message
    assert "model[0] 'm0' generate[0]: 299 batch sizes × 299 lengths = 89,401" in message and "\n" not in message
    (tmp_path / "big.toml").write_bytes(body)
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "warmcache", "plan", str(tmp_path / "big.toml"), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "declares 4,470,050 shapes" in done.stderr and "Traceback" not in done.stderr
    assert time.monotonic() - start < 10  # interpreter start-up included; the refusal itself is milliseconds


def test_a_plan_that_outlives_its_answer_stops_using_cpu(
    planning: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """97,200 shapes (within the limit) against a 0.3 s budget: the 503 comes, and the planning thread stops within a
    second."""
    from warmcache.service import app

    monkeypatch.setattr(app, "PLAN_TIMEOUT_S", 0.3)
    status, answer, _ = call(f"{planning}/v1/plan", "POST", grid_manifest(tmp_path, 3, 180), AUTH)
    assert status == 503 and "took more than 0.3s" in answer["error"]["message"], answer
    time.sleep(1.0)
    cpu, wall = time.process_time(), time.monotonic()
    time.sleep(1.0)
    busy = (time.process_time() - cpu) / (time.monotonic() - wall)
    assert busy < 0.3, f"the server process used {busy:.0%} of a core a second after answering 503"
    assert call(f"{planning}/healthz")[0] == 200


def test_a_model_config_nested_100000_deep_is_a_400_not_a_500(planning: str, tmp_path: Path) -> None:
    folder = tmp_path / "deep"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama", "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    body = (
        f'[[model]]\nname = "m"\npath = "{folder}"\n[[model.generate]]\nbatch_sizes = '
        "[1]\nprompt_lengths = [8]\nmax_cache_len = 16\n".encode()
    )
    status, answer, headers = call(f"{planning}/v1/plan", "POST", body, AUTH)
    assert status == 400 and headers["content-type"].startswith("application/json"), (status, answer)
    # the server's disk is not described
    assert answer["error"]["field"] == "model[0].path" and str(folder) not in answer["error"]["message"]


def test_connections_that_never_finish_their_headers_are_closed(service: str, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """Slowloris: silent connections and ones trickling a header byte at a time are closed at the header deadline;
    a normal request on a kept-alive connection is unaffected."""
    import http.client
    import socket
    import urllib.parse

    from warmcache.service.protocol import HeaderDeadlineProtocol

    monkeypatch.setattr(HeaderDeadlineProtocol, "header_timeout_s", 1.0)
    address = urllib.parse.urlsplit(service)
    host, port = address.hostname or "127.0.0.1", address.port or 80
    silent = [socket.create_connection((host, port)) for _ in range(20)]
    trickling = [socket.create_connection((host, port)) for _ in range(20)]
    for sock in trickling:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    kept = http.client.HTTPConnection(host, port, timeout=10)
    kept.request("GET", "/healthz")
    assert kept.getresponse().read() and kept.sock is not None
    # a second request on the kept-alive connection, never finished
    kept.sock.sendall(b"GET /healthz HTTP/1.1\r\nX-Slow: ")
    until = time.monotonic() + 2.5
    while time.monotonic() < until:
        for sock in trickling:
            try:
                sock.send(b"a")
            except OSError:
                pass  # closed already
        time.sleep(0.25)
    held = []
    for sock in [*silent, *trickling, kept.sock]:
        sock.settimeout(3)
        try:
            held.append(sock.recv(1) != b"")
        except ConnectionResetError:
            held.append(False)
        except TimeoutError:
            held.append(True)
        sock.close()
    assert not any(held), f"{sum(held)} of {len(held)} connections still open past the header deadline"
    assert call(f"{service}/healthz")[0] == 200


def test_readers_never_see_the_registry_url_or_paths_on_the_server(service: str, compiled: str) -> None:  # noqa: F811
    """Reads are open: no answer may name the registry (its host, user or file) or a path on the server's disk."""
    with Registry.open(compiled, create=False) as registry:
        on_disk = {path for r in registry.rows() for path in (r.model_path, r.cache_root) if path}
    where = compiled.split("://", 1)[1].split("@")[-1]  # the database's host and name, or the SQLite file
    secrets = {compiled, where, str(Path(compiled.split("///")[-1]).parent), *on_disk}
    assert on_disk, "the seeded rows name paths on this host"
    reads = ["/v1/guard/nope", "/v1/guard/m?workload=train", "/v1/shapes", "/v1/shapes?model=m", "/v1/models"]
    reads += ["/v1/check?model=m&batch=1&seq=16", "/v1/status", "/v1/misses", "/readyz", "/metrics", "/"]
    for path in reads:
        status, answer, _ = call(f"{service}{path}")
        text = answer if isinstance(answer, str) else json.dumps(answer)
        assert not [secret for secret in secrets if secret in text], (path, status, text[:300])
    status, answer, _ = call(f"{service}/v1/guard/nope")
    assert status == 404 and answer["error"]["message"] == "model 'nope' has no compiled shapes", answer
    rows = call(f"{service}/v1/shapes")[1]
    assert rows and not {"cache_root", "model_path"} & {key for row in rows for key in row}
