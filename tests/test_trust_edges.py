"""The fifth hardening pass's edges, each against the real thing: a database URL's secrets and control characters
(a PostgreSQL client that never connects, ``serve`` run for real), what open endpoints say about a failed shape, which
folders ``POST /v1/plan`` reads, and the memory a capped registry answer costs (a child process's peak RSS)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_service import TOKEN, call, wait_ready
from test_store import error_lines
from warmcache_testkit.hostile_servers import HostileRegistry
from warmcache_testkit.moto_server import free_port

from warmcache.bounds import json_nesting
from warmcache.identity.plan import plan_manifest
from warmcache.manifest import load_manifest
from warmcache.registry import Registry
from warmcache.service import ServiceConfig
from warmcache.service.server import running_server
from warmcache.settings import RegistryLocation
from warmcache.store.oci.transport import MAX_ANSWER_BYTES

SECRET = "S3CRET-in-the-query"
WARMCACHE = [sys.executable, "-c", "from warmcache.cli import main; main()"]


def warmcache(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARMCACHE_")}
    return subprocess.run([*WARMCACHE, *args], capture_output=True, text=True, env=env, timeout=timeout, check=False)


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A TCP port on loopback that records whether anything connected (nothing answers it)."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(0.2)
        yield server


def connected(server: socket.socket) -> bool:
    try:
        server.accept()[0].close()
    except TimeoutError:
        return False
    return True


# ------------------------------------------------------------------ item 5: a password in the URL's query


@pytest.mark.parametrize("parameter", ["password", "sslpassword"])
def test_a_password_in_the_query_is_hidden_in_the_error_line(parameter: str) -> None:
    port = free_port()  # nothing listens: the connect fails, and the error names the registry
    url = f"postgresql://postgres@127.0.0.1:{port}/test?{parameter}={SECRET}&connect_timeout=2"
    done = warmcache("shapes", "--db", url)
    assert done.returncode != 0 and len(error_lines(done.stderr)) == 1, done.stderr
    assert SECRET not in done.stderr and f"{parameter}=***" in done.stderr, done.stderr
    refused = warmcache("shapes", "--db", f"postgresql://postgres@127.0.0.1:{port}/?{parameter}={SECRET}")
    assert refused.returncode == 2 and "names no database" in refused.stderr, refused.stderr  # refused unparsed
    assert SECRET not in refused.stderr and f"{parameter}=***" in refused.stderr, refused.stderr


def test_serve_hides_a_password_in_the_query_in_its_banner_and_its_log() -> None:
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/test?password={SECRET}"
    command = [*WARMCACHE, "serve", "--db", url, "--port", str(free_port()), "--refresh", "0.2"]
    with subprocess.Popen(command, stderr=subprocess.PIPE, text=True) as server:
        watchdog = threading.Timer(60, server.kill)  # a server that never logs fails the test, not the run
        watchdog.start()
        assert server.stderr is not None
        lines = [server.stderr.readline() for _ in range(4)]  # the banner, then a failed refresh or two
        server.terminate()
        watchdog.cancel()
    assert "warmcache serve: registry" in lines[0] and "password=***" in lines[0], lines
    assert sum("cannot open" in line for line in lines) >= 2, lines  # the log names the registry each time
    assert not [line for line in lines if SECRET in line], lines


# ------------------------------------------------------------------ item 6: control characters in a database URL


@pytest.mark.parametrize(
    ("path", "part"),
    [
        ("test%0Aother", "database name"),
        ("test%00other", "database name"),
        ("test\nother", "database name"),
        ("test?application_name=a%0Db", "query parameter 'application_name'"),
    ],
)
def test_a_control_character_in_a_database_url_is_refused_in_one_line_before_any_connect(
    listener: socket.socket, path: str, part: str
) -> None:
    port = listener.getsockname()[1]
    done = warmcache("shapes", "--db", f"postgresql://postgres@127.0.0.1:{port}/{path}")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert f"its {part} holds the control character" in done.stderr, done.stderr
    assert not connected(listener), "a connection was made for a URL that should have been refused"


def test_a_control_character_in_the_user_or_password_is_refused_without_showing_the_password() -> None:
    done = warmcache("shapes", "--db", f"postgresql://bob:{SECRET}%00x@127.0.0.1:{free_port()}/test")
    assert done.returncode == 2 and "its password holds the control character" in done.stderr, done.stderr
    assert SECRET not in done.stderr and "bob:***@" in done.stderr, done.stderr
    done = warmcache("shapes", "--db", f"postgresql://bo%0Ab@127.0.0.1:{free_port()}/test")
    assert done.returncode == 2 and "its user name holds the control character" in done.stderr, done.stderr


# ------------------------------------------------------------------ item 8: open endpoints say what, never where


def one_model_manifest(tmp_path: Path, folder: Path, name: str = "m") -> Path:
    """A manifest of one model read from ``folder`` (a config the service holds: a plan reads no weights)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2}))
    manifest = tmp_path / f"{name}.toml"
    manifest.write_text(
        f'[[model]]\nname = "{name}"\npath = "{folder}"\nbackend = "eager"\n[[model.generate]]\nbatch_sizes = [1]\n'
        "prompt_lengths = [8]\nmax_cache_len = 16\n"
    )
    return manifest


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path, Path]]:
    """A running service whose registry holds one failed shape, its error naming paths on this host; ``(base URL,
    model folder, manifest)``."""
    folder = tmp_path / "srv" / "models" / "secret-model"
    manifest = one_model_manifest(tmp_path, folder)
    url = f"sqlite:///{tmp_path / 'registry.sqlite'}"
    planned = plan_manifest(load_manifest(manifest))
    with Registry.open(url) as registry:
        registry.ensure_pending(planned)
        row = registry.claim([p.identity for p in planned], "host-a:1", 60)
        assert row is not None
        registry.mark_failed(
            row.id,
            "host-a:1",
            f"OSError: no file named model.safetensors found in directory {folder}\n"
            f'  File "{tmp_path}/venv/lib/python3.11/site-packages/torch/_dynamo/eval_frame.py", line 3',
        )
    config = ServiceConfig(RegistryLocation.parse(url), token=TOKEN, manifest=manifest, refresh_interval=0.2)
    with running_server(config) as base:
        wait_ready(base)
        yield base, folder, manifest


def test_open_endpoints_name_a_failed_shapes_paths_by_their_role(
    served: tuple[str, Path, Path], tmp_path: Path
) -> None:
    base, folder, _ = served
    for path in ("/", "/dashboard/panels", "/v1/shapes", "/v1/status", "/v1/models", "/v1/misses", "/metrics"):
        status, answer, _ = call(f"{base}{path}")
        text = answer if isinstance(answer, str) else json.dumps(answer)
        assert status == 200 and str(tmp_path) not in text, (path, text[:600])
    [row] = call(f"{base}/v1/shapes")[1]
    assert row["error"].startswith("OSError: no file named model.safetensors found in directory <model path>"), row
    [group] = call(f"{base}/v1/status")[1]["groups"]
    assert group["failures"][0]["error"].endswith("directory <model path>"), group
    assert "found in directory &lt;model path&gt;" in call(f"{base}/")[1]


def test_plan_reads_only_the_model_folders_the_services_manifest_names(
    served: tuple[str, Path, Path], tmp_path: Path
) -> None:
    base, _, manifest = served
    auth = {"Authorization": f"Bearer {TOKEN}"}
    status, answer, _ = call(f"{base}/v1/plan", "POST", manifest.read_bytes(), auth)
    assert status == 200 and answer[0]["status"] == "failed", answer
    readable = one_model_manifest(tmp_path, tmp_path / "elsewhere" / "model", "other")  # a real config, not served
    answers = set()
    for posted in (readable.read_text(), readable.read_text().replace("elsewhere", "nowhere")):
        status, answer, _ = call(f"{base}/v1/plan", "POST", posted.encode(), auth)
        assert status == 400 and answer["error"]["field"] == "model[0].path", answer
        assert "its own manifest names" in answer["error"]["message"], answer
        answers.add(json.dumps(answer))
    assert len(answers) == 1, answers  # whether the folder exists is not said


# ------------------------------------------------------------------ item 10: memory from a capped answer


def oci_manifest(hostile: HostileRegistry, size: int) -> bytes:
    """An image manifest of ``size`` bytes, padded by one annotation (warmcache refuses the image after parsing it)."""
    config = hostile.put_blob(json.dumps({"rootfs": {"type": "layers", "diff_ids": ["sha256:" + "0" * 64]}}).encode())
    document = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", **hostile.put_blob(b"layer")}],
        "annotations": {"note": ""},
    }
    document["annotations"]["note"] = "a" * (size - len(json.dumps(document)))
    data = json.dumps(document).encode()
    assert len(data) == size
    return data


#: Runs the CLI, then prints the process's peak RSS (KiB, as the kernel counts it) as its last stderr line.
MEASURED = (
    "import atexit, resource, sys\n"
    "atexit.register(lambda: print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr))\n"
    "from warmcache.cli import main\n"
    "main()\n"
)


def peak_rss_of_store_ls(url: str) -> tuple[int, str]:
    """The peak RSS (bytes) of a ``warmcache store ls`` process, and its stderr."""
    done = subprocess.run(
        [sys.executable, "-c", MEASURED, "store", "ls", "--store", url], capture_output=True, text=True, timeout=120
    )
    *lines, peak = done.stderr.strip().splitlines()
    return int(peak) * 1024, "\n".join(lines)


def test_a_manifest_just_under_the_cap_costs_a_small_multiple_of_it() -> None:
    """A 4 MiB annotation (under the 4 MiB cap) took 566 MB of RSS against 79 MB: the nesting check's regex kept a
    backtracking entry per character. Now the answer costs a few times its size."""
    with HostileRegistry().running() as hostile:
        assert isinstance(hostile, HostileRegistry)
        hostile.put_manifest("team/small", "prod", oci_manifest(hostile, 2048))
        hostile.put_manifest("team/big", "prod", oci_manifest(hostile, MAX_ANSWER_BYTES - 16))
        baseline, _ = peak_rss_of_store_ls(hostile.url("team/small", "prod"))
        peak, stderr = peak_rss_of_store_ls(hostile.url("team/big", "prod"))
    assert "rootfs.diff_ids" in stderr or "does not hash" in stderr, stderr  # parsed whole, refused after
    assert peak - baseline < 8 * MAX_ANSWER_BYTES, f"{(peak - baseline) >> 20} MiB above the baseline"


def test_measuring_nesting_copies_nothing() -> None:
    """One 4 MiB string, then a million short ones: neither is copied or kept track of per character."""
    for depth, document in ((1, b'{"a": "' + b"x" * (4 << 20) + b'"}'), (2, b"[[" + b'"a",' * (1 << 20) + b"1]]")):
        tracemalloc.start()
        try:
            assert json_nesting(document) == depth
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 1 << 20, peak
    assert json_nesting(b'{"a": [{"b": "]]]}}}\\""}]}') == 3 and json_nesting(b"[[[]]][[") == 3
