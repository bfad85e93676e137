"""``warmcache serve`` over real HTTP (uvicorn on an ephemeral port) on SQLite and PostgreSQL.

Every answer is compared with what the CLI prints for the same question (``--json``),
so the service cannot drift from ``warmcache check``/``shapes``/``plan``/``status``/``misses``.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from test_cli_query import MANIFEST, _compile_all  # the registry's real claim → mark_compiled path
from test_guard import silent_postgres  # noqa: F401 - fixture: a PostgreSQL server that accepts and never answers

from warmcache.cli import main
from warmcache.errors import TrustError
from warmcache.identity.plan import plan_manifest
from warmcache.manifest import load_manifest
from warmcache.registry import Registry
from warmcache.runtime.guard import ShapeGuard
from warmcache.service import ServiceConfig
from warmcache.service.app import reader_row
from warmcache.service.server import running_server
from warmcache.service.view import CONNECT_TIMEOUT_S as VIEW_CONNECT_TIMEOUT_S
from warmcache.settings import RegistryLocation
from warmcache.trust import SigningKey, generate_key

TOKEN = "s3cret-token"


def call(
    url: str, method: str = "GET", body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, Any, dict[str, str]]:
    """``(status, decoded JSON or text, headers)`` of one request; HTTP errors are answers, not exceptions."""
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            status, raw, got = response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as exc:
        status, raw, got = exc.code, exc.read(), dict(exc.headers)
    text = raw.decode()
    return (
        status,
        json.loads(text) if got.get("content-type", "").startswith("application/json") and text else text,
        got,
    )


def cli_json(*args: str) -> Any:
    result = CliRunner().invoke(main, [*args, "--json"])
    return json.loads(result.output)


@pytest.fixture
def manifest(write_manifest) -> Path:
    return write_manifest(MANIFEST)


def seed_registry(url: str, manifest: Path) -> None:
    """Generate batch 1 and 2 compiled, batch 4 pending, train failed."""
    _compile_all(url, manifest, keep=lambda p: p.spec.workload == "generate" and p.spec.batch_size < 4)
    planned = plan_manifest(load_manifest(manifest))
    with Registry.open(url) as registry:
        registry.ensure_pending(planned)
        row = registry.claim([p.identity for p in planned if p.spec.workload == "train"], "host-a:1", 60)
        assert row is not None
        registry.mark_failed(row.id, "host-a:1", "RuntimeError: out of memory\ntraceback...")


@pytest.fixture
def compiled(registry_url: str, manifest: Path) -> str:
    seed_registry(registry_url, manifest)
    return registry_url


@pytest.fixture
def service(compiled: str, manifest: Path) -> Iterator[str]:
    with running_server(
        ServiceConfig(RegistryLocation.parse(compiled), token=TOKEN, manifest=manifest, refresh_interval=0.2)
    ) as base:
        wait_ready(base)
        yield base


def wait_ready(base: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while call(f"{base}/readyz")[0] != 200:
        assert time.monotonic() < deadline, "service never became ready"
        time.sleep(0.05)


CHECKS = [
    "batch=1&seq=16",  # exact
    "batch=2&seq=10",  # pads
    "batch=3&seq=20",  # pads across batch and length
    "batch=4&seq=16",  # batch 4 is only pending: refused with the nearest
    "batch=2&seq=10&exact=true",  # padding does not count
    "batch=1&seq=16&workload=train",  # only a failed row: refused with the reason
]


def test_check_answers_as_the_cli_does(service: str, compiled: str) -> None:
    for query in CHECKS:
        status, answer, _ = call(f"{service}/v1/check?model=m&{query}")
        params = dict(p.split("=") for p in query.split("&"))
        args = ["check", "--model", "m", "--batch", params["batch"], "--seq", params["seq"], "--db", compiled]
        args += ["--workload", params["workload"]] if "workload" in params else []
        args += ["--exact"] if "exact" in params else []
        assert status == 200
        assert answer == cli_json(*args), query
        assert call(f"{service}/v1/check?model=m&{query}")[1] == answer  # the memoised answer is the same


def test_reads_match_the_cli_json(service: str, compiled: str, manifest: Path) -> None:
    # less each row's paths on the server's disk: any reader may ask
    assert call(f"{service}/v1/shapes")[1] == [reader_row(r) for r in cli_json("shapes", "--db", compiled)]
    assert call(f"{service}/v1/shapes?workload=generate&status=compiled")[1] == [
        reader_row(r) for r in cli_json("shapes", "--db", compiled, "--workload", "generate", "--status", "compiled")
    ]
    status, models, _ = call(f"{service}/v1/models")
    assert status == 200 and models == [
        {
            "model": "m",
            "workloads": ["generate", "train"],
            "shapes": 7,
            "counts": {"pending": 2, "compiled": 4, "failed": 1},
        }
    ]
    report = call(f"{service}/v1/status")[1]
    expected = cli_json("status", str(manifest), "--db", compiled)
    assert {k: v for k, v in report.items() if k != "checked_at"} == {
        k: v for k, v in expected.items() if k != "checked_at"
    }
    assert report["groups"][1]["failures"][0]["error"] == "RuntimeError: out of memory"
    status, planned, _ = call(f"{service}/v1/plan", "POST", manifest.read_bytes(), {"Authorization": f"Bearer {TOKEN}"})
    assert status == 200 and planned == cli_json("plan", str(manifest), "--db", compiled)
    # each unusable shape says why
    assert {p["reason"].split(":")[0] for p in planned if p["reason"]} == {
        "pending",
        "failed",
    }


def test_misses_round_trip_and_show_in_metrics(service: str, compiled: str) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    report = {
        "misses": [
            {
                "model": "m",
                "workload": "generate",
                "dtype": "float32",
                "batch_size": 3,
                "seq_len": 20,
                "decision": "pad",
                "padded_batch": 4,
                "padded_seq": 32,
                "count": 5,
            },
            {
                "model": "m",
                "workload": "generate",
                "dtype": "float32",
                "batch_size": 9,
                "seq_len": 99,
                "decision": "refuse",
            },
        ]
    }
    status, answer, _ = call(f"{service}/v1/misses", "POST", json.dumps(report).encode(), auth)
    assert (status, answer) == (200, {"recorded": 2, "count": 6})
    assert call(f"{service}/v1/misses")[1] == cli_json("misses", "--db", compiled)
    assert [m["count"] for m in call(f"{service}/v1/misses?model=m")[1]] == [5, 1]
    assert call(f"{service}/v1/refresh", "POST", b"", auth)[0] == 200
    metrics = call(f"{service}/metrics")[1]
    assert 'warmcache_misses_total{decision="pad",model="m",workload="generate"} 5.0' in metrics
    assert 'warmcache_shapes{model="m",status="compiled",workload="generate"} 4.0' in metrics
    assert 'warmcache_warmup_progress{model="m"} ' + str(4 / 7) in metrics
    assert 'warmcache_compile_seconds_bucket{le="1.0",model="m",workload="generate"} 4.0' in metrics
    assert "warmcache_registry_up 1.0" in metrics and "warmcache_expired_claims" in metrics


def _miss_count(url: str) -> int:
    with Registry.open(url) as registry:
        return sum(m["count"] for m in registry.miss_summary())


def test_writes_without_the_right_token_are_refused_and_change_nothing(service: str, compiled: str) -> None:
    body = json.dumps(
        {
            "misses": [
                {
                    "model": "m",
                    "workload": "generate",
                    "dtype": "float32",
                    "batch_size": 3,
                    "seq_len": 20,
                    "decision": "refuse",
                }
            ]
        }
    ).encode()
    for header in [None, "Bearer wrong-token", f"Basic {TOKEN}", "Bearer ", f"Bearer {TOKEN}x"]:
        headers = {"Authorization": header} if header else {}
        for path in ("/v1/misses", "/v1/plan", "/v1/refresh"):
            status, answer, _ = call(f"{service}{path}", "POST", body, headers)
            assert status == 401 and answer["error"]["field"] == "Authorization", (header, path)
    assert _miss_count(compiled) == 0


def test_without_a_configured_token_every_write_is_refused(compiled: str) -> None:
    with running_server(ServiceConfig(RegistryLocation.parse(compiled), token=None)) as base:
        wait_ready(base)
        body = json.dumps(
            {
                "misses": [
                    {
                        "model": "m",
                        "workload": "generate",
                        "dtype": "float32",
                        "batch_size": 3,
                        "seq_len": 20,
                        "decision": "refuse",
                    }
                ]
            }
        ).encode()
        status, answer, _ = call(f"{base}/v1/misses", "POST", body, {"Authorization": "Bearer anything"})
        assert status == 403 and "writes are disabled" in answer["error"]["message"]
        assert call(f"{base}/v1/check?model=m&batch=1&seq=16")[0] == 200  # reads stay open
    assert _miss_count(compiled) == 0


BAD_QUERIES = [
    ("/v1/check?batch=1&seq=16", "model", 400),
    ("/v1/check?model=m&batch=0&seq=16", "batch", 400),
    ("/v1/check?model=m&batch=1&seq=abc", "seq", 400),
    ("/v1/check?model=m&batch=1&seq=16&workload=infer", "workload", 400),
    ("/v1/check?model=m&batch=1&seq=16&exact=maybe", "exact", 400),
    ("/v1/check?model=nope&batch=1&seq=16", "model", 404),
    ("/v1/shapes?status=great", "status", 400),
    ("/v1/guard/nope", "model", 404),
]


def test_bad_input_is_a_4xx_naming_the_field(service: str) -> None:
    for path, field, status in BAD_QUERIES:
        got, answer, _ = call(f"{service}{path}")
        assert got == status and answer["error"]["field"] == field, (path, answer)
    got, answer, _ = call(f"{service}/v1/nothing-here")
    assert got == 404 and answer["error"]["status"] == 404


BAD_MISSES = [
    (b"not json", "body"),
    (b'{"misses": {}}', "misses"),
    (
        b'{"misses": [{"model": "m", "workload": "generate", "dtype": "float32", "batch_size": 3, '
        b'"seq_len": -1, "decision": "pad"}]}',
        "misses[0].seq_len",
    ),
    (
        b'{"misses": [{"model": "m", "workload": "generate", "dtype": "float32", "batch_size": 3, '
        b'"seq_len": 2, "decision": "pad"}, 7]}',
        "misses[1]",
    ),
    (
        b'{"misses": [{"model": "m", "workload": "generate", "dtype": "float32", "batch_size": 3, '
        b'"seq_len": 2, "decision": "eat"}]}',
        "misses[0].decision",
    ),
]


def test_bad_miss_reports_name_the_key_and_write_nothing(service: str, compiled: str) -> None:
    for body, field in BAD_MISSES:
        status, answer, _ = call(f"{service}/v1/misses", "POST", body, {"Authorization": f"Bearer {TOKEN}"})
        assert status == 400 and answer["error"]["field"] == field, answer
    assert _miss_count(compiled) == 0


def test_bodies_over_the_limit_are_refused(service: str) -> None:
    # Declares 2 MiB and sends a little: the server answers from the header, without reading a body it would refuse.
    host, port = service.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=20)
    connection.putrequest("POST", "/v1/plan")
    connection.putheader("Authorization", f"Bearer {TOKEN}")
    connection.putheader("Content-Length", str(2 << 20))
    connection.endheaders(b"#" * 1024)
    response = connection.getresponse()
    assert response.status == 413 and json.loads(response.read())["error"]["field"] == "body"
    connection.close()
    status, answer, _ = call(
        f"{service}/v1/plan", "POST", b"[[model]]\nname = 1\n", {"Authorization": f"Bearer {TOKEN}"}
    )
    assert status == 400 and "model[0].name" in answer["error"]["message"], answer


def test_guard_from_url_decides_as_from_registry_and_refreshes_with_the_etag(
    service: str, compiled: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    status, snapshot, headers = call(f"{service}/v1/guard/m?workload=generate")
    assert status == 200 and headers["etag"] and snapshot["format"] == "warmcache-guard-snapshot"
    assert sorted((r["batch_size"], r["seq_len"]) for r in snapshot["records"]) == [(1, 16), (1, 32), (2, 16), (2, 32)]
    assert call(f"{service}/v1/guard/m?workload=generate", headers={"If-None-Match": headers["etag"]})[0] == 304
    monkeypatch.setenv("WARMCACHE_TOKEN", TOKEN)  # the guard posts its misses to the service with it
    remote = ShapeGuard.from_url(service, "m", policy="pad")
    local = ShapeGuard.from_registry(compiled, "m", telemetry=False)
    for batch, seq in [(1, 16), (2, 10), (1, 31), (2, 32)]:
        assert remote.decide(batch, seq) == local.decide(batch, seq)
    assert remote.telemetry.flush() and remote.telemetry.flushed == 2
    assert sorted((m["batch_size"], m["seq_len"], m["count"]) for m in call(f"{service}/v1/misses")[1]) == [
        (1, 31, 1),
        (2, 10, 1),
    ]
    assert remote.buckets == local.buckets == [(1, 16), (1, 32), (2, 16), (2, 32)]
    remote.refresh()
    source = remote._load.__self__  # type: ignore[attr-defined]
    assert source.downloads == 1  # the refresh was a 304
    # batch 4 compiles; the next refresh downloads the new snapshot and pads onto it
    with Registry.open(compiled) as registry:
        pending = [r.identity for r in registry.rows(model="m", workload="generate", statuses=["pending"])]
        while (row := registry.claim(pending, "w", 60)) is not None:
            registry.mark_compiled(row.id, "w", compile_seconds=1.0, graphs_compiled=1)
    call(f"{service}/v1/refresh", "POST", b"", {"Authorization": f"Bearer {TOKEN}"})
    remote.refresh()
    assert source.downloads == 2 and remote.decide(3, 16).target == (4, 16)
    remote.close()
    openapi = call(f"{service}/openapi.json")[1]
    assert {"/v1/check", "/v1/guard/{model}", "/metrics", "/v1/misses", "/v1/plan"} <= set(openapi["paths"])


def test_guard_answers_signed_by_serve_sign_are_verified_by_from_url(
    service: str, compiled: str, manifest: Path, tmp_path: Path
) -> None:
    for name in ("ours", "theirs"):
        generate_key(tmp_path / name)
    ours, theirs = [str(tmp_path / "ours.pub")], [str(tmp_path / "theirs.pub")]
    with pytest.raises(TrustError, match="unsigned, but trusted keys are configured"):
        ShapeGuard.from_url(service, "m", telemetry=False, trust=ours)  # the fixture's service does not sign
    config = ServiceConfig(
        RegistryLocation.parse(compiled), refresh_interval=0.2, signing_key=SigningKey.load(tmp_path / "ours")
    )
    with running_server(config) as base:
        wait_ready(base)
        guard = ShapeGuard.from_url(base, "m", telemetry=False, trust=ours)
        assert guard.artifact_trust.signed_by and guard.buckets == [(1, 16), (1, 32), (2, 16), (2, 32)]
        guard.refresh()  # a 304 keeps the rows verified when they came
        assert guard._load.__self__.downloads == 1  # type: ignore[attr-defined]
        with pytest.raises(TrustError, match="which is not trusted") as refused:
            ShapeGuard.from_url(base, "m", telemetry=False, trust=theirs)
        assert f"{base}/v1/guard/m" in str(refused.value)


def test_a_registry_outage_is_a_503_never_a_hang(silent_postgres: str) -> None:  # noqa: F811 - the imported fixture
    host, port = silent_postgres.split("@")[-1].split("/")[0].split(":")
    with running_server(
        ServiceConfig(RegistryLocation.parse(silent_postgres), token=TOKEN, refresh_interval=0.5)
    ) as base:
        assert call(f"{base}/healthz")[:2] == (200, {"ok": True})
        deadline = time.monotonic() + 15
        while "unavailable" not in str(call(f"{base}/readyz")[1]):
            assert time.monotonic() < deadline
            time.sleep(0.2)
        for path in ("/readyz", "/v1/check?model=m&batch=1&seq=1", "/v1/shapes", "/v1/models", "/v1/guard/m"):
            start = time.monotonic()
            status, answer, _ = call(f"{base}{path}")
            assert status == 503 and "registry unavailable" in answer["error"]["message"], (path, answer)
            # the cause, naming the database's host and port, goes to the server's log only
            assert host not in answer["error"]["message"] and port not in answer["error"]["message"], answer
            # Answered from the service's own state: sooner than one connect attempt could time out.
            # (How fast is bench_serve's question; a shared CI machine makes a tighter bound flaky.)
            assert time.monotonic() - start < VIEW_CONNECT_TIMEOUT_S
        start = time.monotonic()
        status, answer, _ = call(f"{base}/v1/misses")  # a direct query: bounded by the connect timeout
        assert status == 503 and time.monotonic() - start < 10
        assert "warmcache_registry_up 0.0" in call(f"{base}/metrics")[1]
        assert "registry unavailable" in call(f"{base}/")[1]


#: Hostile manifests as ``POST /v1/plan`` bodies (about 200 KB each): each must be refused by the manifest's own bounds.
MANIFEST_BOMBS = {
    "nesting": (b"a = " + b"[" * 100_000 + b"]" * 100_000, "nests 100000 levels deep"),
    "one dotted key": (b"a" + b".a" * 100_000 + b" = 1\n", "nests 100001 levels deep"),
    "many dotted keys": (b"\n".join(b"k%d" % i + b".a" * 62 + b" = 1" for i in range(1500)), "joined by 93000 dots"),
}


@pytest.mark.parametrize("bomb", MANIFEST_BOMBS)
def test_manifest_bombs_are_refused_naming_the_problem_while_healthz_answers(service: str, bomb: str) -> None:
    from concurrent.futures import ThreadPoolExecutor

    body, problem = MANIFEST_BOMBS[bomb]
    with ThreadPoolExecutor(1) as pool:
        posted = pool.submit(call, f"{service}/v1/plan", "POST", body, {"Authorization": f"Bearer {TOKEN}"})
        latencies = []
        while not latencies or not posted.done():  # at least once, and for as long as the plan is being worked on
            started = time.perf_counter()
            assert call(f"{service}/healthz")[:2] == (200, {"ok": True})
            latencies.append(time.perf_counter() - started)
        status, answer, _ = posted.result()
    assert status == 400 and answer["error"]["field"] == "body" and problem in answer["error"]["message"], answer
    assert answer["error"]["message"].startswith("request-body.toml: ")
    assert max(latencies) < 1.0, latencies
