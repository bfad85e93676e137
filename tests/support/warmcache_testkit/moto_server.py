"""A real S3-protocol server on 127.0.0.1 for tests and benchmarks: moto's standalone server.

It speaks S3's HTTP API, so warmcache's boto3 code talks to it exactly as to AWS
(signing, multipart uploads, paginated listings, error codes). Started on a free
port as a subprocess and stopped afterwards; credentials are dummies moto accepts.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

from warmcache_testkit.processes import stop

#: What boto3 needs to sign requests; moto accepts any key.
DUMMY_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def moto_server() -> Iterator[str]:
    """Run ``moto_server`` on a free local port; yields its endpoint URL."""
    port = free_port()
    executable = shutil.which("moto_server", path=os.path.dirname(sys.executable)) or shutil.which("moto_server")
    command = [executable] if executable else [sys.executable, "-m", "moto.server"]
    process = subprocess.Popen(
        [*command, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"moto_server did not start on {endpoint} (exit code {process.poll()})"
                    ) from None
                time.sleep(0.1)
        yield endpoint
    finally:
        stop(process)


def create_bucket(endpoint: str, bucket: str) -> None:
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=DUMMY_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=DUMMY_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        region_name=DUMMY_CREDENTIALS["AWS_DEFAULT_REGION"],
    )
    client.create_bucket(Bucket=bucket)
