"""How the service is served: one uvicorn configuration, run in the foreground by ``warmcache serve`` and in a thread
of the calling process by :func:`running_server` (tests, embedding), so both serve alike."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

from warmcache.service.app import ServiceConfig, create_app
from warmcache.service.protocol import HeaderDeadlineProtocol

#: Seconds to wait for uvicorn to bind before giving up.
START_TIMEOUT_S = 15.0


def server_config(app: Any, host: str, port: int) -> uvicorn.Config:
    """uvicorn's settings for the service: no access log; no proxy-header rewriting (nothing sits in front by default)
    and no Server header, less work per /v1/check; the header deadline closes connections that never finish a
    request (slowloris)."""
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        lifespan="on",
        proxy_headers=False,
        server_header=False,
        http=HeaderDeadlineProtocol,
    )


@contextmanager
def running_server(config: ServiceConfig, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Serve ``config`` on ``host:port`` (``0``: an ephemeral port) until the block ends; yields the base URL."""
    server = uvicorn.Server(server_config(create_app(config), host, port))
    thread = threading.Thread(target=server.run, name="warmcache-serve", daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"warmcache serve did not start on {host}:{port}")
        time.sleep(0.01)
    bound = server.servers[0].sockets[0].getsockname()
    try:
        yield f"http://{host}:{bound[1]}"
    finally:
        server.should_exit = True
        thread.join(START_TIMEOUT_S)
