"""The faults the fleet simulation injects: killed workers, dropped connections, a database outage.

Each runs in a thread of the simulation's coordinator while the workers claim:

- :class:`Killer` SIGKILLs chosen workers at chosen moments (a host that dies mid-compile);
- :class:`BackendTerminator` ends random workers' PostgreSQL backends with
  ``pg_terminate_backend`` (a failover, an operator, an idle-session reaper);
- :class:`OutageProxy` is a TCP proxy one worker reaches PostgreSQL through; for a
  while it drops every connection and refuses new ones (the worker's network or
  the database is gone), then lets them through again.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Sequence

import sqlalchemy as sa


class Killer(threading.Thread):
    """SIGKILL each ``(pid, at)`` when ``at`` seconds have passed since ``start``."""

    def __init__(self, schedule: Sequence[tuple[int, float]], start: float) -> None:
        super().__init__(daemon=True, name="sim-killer")
        self._schedule = sorted(schedule, key=lambda item: item[1])
        self._start = start
        self.killed: list[int] = []

    def run(self) -> None:
        for pid, at in self._schedule:
            time.sleep(max(0.0, self._start + at - time.time()))
            try:
                os.kill(pid, signal.SIGKILL)
                self.killed.append(pid)
            except ProcessLookupError:
                pass  # it already finished: nothing to kill


class BackendTerminator(threading.Thread):
    """Every ``interval`` seconds, terminate up to ``per_round`` backends of the simulation's workers."""

    def __init__(self, engine: sa.Engine, application_prefix: str, interval: float, per_round: int) -> None:
        super().__init__(daemon=True, name="sim-terminator")
        self._engine, self._prefix, self._interval, self._per_round = engine, application_prefix, interval, per_round
        self._stop = threading.Event()
        self.terminated = 0

    def run(self) -> None:
        query = sa.text(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name LIKE "
            ":prefix AND pid <> pg_backend_pid() ORDER BY random() LIMIT :n"
        )
        while not self._stop.wait(self._interval):
            with self._engine.begin() as conn:
                self.terminated += sum(
                    1 for (ok,) in conn.execute(query, {"prefix": f"{self._prefix}%", "n": self._per_round}) if ok
                )

    def stop(self) -> None:
        self._stop.set()


class OutageProxy(threading.Thread):
    """Forward ``127.0.0.1:port`` to PostgreSQL; between ``down_at`` and ``down_at + seconds``, drop everything."""

    def __init__(self, target: tuple[str, int]) -> None:
        super().__init__(daemon=True, name="sim-outage-proxy")
        self._target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._down = threading.Event()
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.refused = 0

    def run(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._down.is_set():
                self.refused += 1
                client.close()
                continue
            try:
                upstream = socket.create_connection(self._target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open.update((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with self._lock:
                    self._open.discard(sock)
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()

    def outage(self, at: float, seconds: float) -> threading.Thread:
        """From ``at`` (a ``time.time()``), drop every connection for ``seconds``; the returned thread ends when it
        is over."""

        def cut() -> None:
            time.sleep(max(0.0, at - time.time()))
            self._down.set()
            with self._lock:
                doomed = list(self._open)
            for sock in doomed:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            time.sleep(seconds)
            self._down.clear()

        thread = threading.Thread(target=cut, daemon=True, name="sim-outage")
        thread.start()
        return thread

    def close(self) -> None:
        self._listener.close()
