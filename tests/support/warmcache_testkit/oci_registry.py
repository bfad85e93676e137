"""A real OCI registry on 127.0.0.1 for tests and benchmarks: Debian's ``docker-registry`` (CNCF distribution 2.8).

It is the registry most others are measured against (the reference implementation of the
OCI distribution API): warmcache's oras-based client talks to it over plain HTTP exactly as
to ECR or Harbor over HTTPS. Started on a free port with deletes enabled (``store gc``), and,
with ``htpasswd``, behind HTTP basic auth; stopped afterwards.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from warmcache_testkit.moto_server import free_port
from warmcache_testkit.processes import stop

REGISTRY_BINARY = "docker-registry"
SKOPEO_BINARY = "skopeo"
#: Why a test or benchmark that needs them does not run, named once.
MISSING = (
    "Debian's docker-registry and skopeo are not installed (apt-get install docker-registry "
    "skopeo apache2-utils; .ci/run installs them)"
)


def available() -> bool:
    """Whether the registry, skopeo and htpasswd (basic-auth tests) are all on PATH."""
    return all(shutil.which(tool) for tool in (REGISTRY_BINARY, SKOPEO_BINARY, "htpasswd"))


@dataclass(frozen=True, slots=True)
class RunningRegistry:
    """Where a started registry listens (``127.0.0.1:PORT``) and the folder it stores into."""

    host: str
    root: Path

    def url(self, repository: str, tag: str = "latest") -> str:
        """The warmcache store URL of ``repository:tag`` on this registry (plain HTTP on loopback)."""
        return f"oci+http://{self.host}/{repository}:{tag}"


@contextmanager
def oci_registry(users: dict[str, str] | None = None) -> Iterator[RunningRegistry]:
    """Run ``docker-registry serve`` on a free local port (with ``users`` behind htpasswd basic auth); yields where."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="warmcache-registry-") as folder:
        root = Path(folder)
        auth = ""
        if users:
            for number, (user, password) in enumerate(users.items()):
                subprocess.run(
                    ["htpasswd", "-Bb" + ("c" if number == 0 else ""), str(root / "htpasswd"), user, password],
                    check=True,
                    capture_output=True,
                )
            auth = f"auth:\n  htpasswd:\n    realm: warmcache-test\n    path: {root / 'htpasswd'}\n"
        config = root / "config.yml"
        config.write_text(
            "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\n"
            f"storage:\n  filesystem:\n    rootdirectory: {root / 'data'}\n  delete:\n    enabled: true\n"
            f"http:\n  addr: 127.0.0.1:{port}\n{auth}"
        )
        process = subprocess.Popen(
            [REGISTRY_BINARY, "serve", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        host = f"127.0.0.1:{port}"
        try:
            _wait_until_up(host, process)
            yield RunningRegistry(host, root / "data")
        finally:
            stop(process)


def _wait_until_up(host: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"http://{host}/v2/", timeout=1).close()
            return
        except urllib.error.HTTPError:
            return  # 401: up, and asking for credentials
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"docker-registry did not start on {host} (exit code {process.poll()})") from None
            time.sleep(0.05)


def skopeo_copy(source: str, target: str) -> None:
    """Copy a tag between loopback registries with skopeo, as a mirror does (both warmcache ``oci+http://`` URLs)."""
    image = lambda url: "docker://" + url.split("://", 1)[1]  # noqa: E731
    done = subprocess.run(
        [SKOPEO_BINARY, "copy", "--src-tls-verify=false", "--dest-tls-verify=false", image(source), image(target)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        raise RuntimeError(f"skopeo copy {source} {target}: {done.stderr.strip()[-2000:]}")
