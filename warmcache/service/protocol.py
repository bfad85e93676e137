"""The HTTP protocol ``warmcache serve`` runs: uvicorn's httptools protocol with a deadline on each request's headers.

uvicorn closes an idle connection only between two requests (its keep-alive timeout):
a connection that never sends a request, or sends its headers a byte at a time
(slowloris), is held for as long as the client likes; the last hardening pass held
1,100 such sockets. Here every request's headers must be complete within
:data:`HEADER_TIMEOUT_S` of the connection (or of the request's first byte, on a
kept-alive connection), or the connection is closed. A body is the handlers' to
bound (``write_body``'s size limit).
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

#: Seconds a client has to send a request's headers (a real client sends them in one packet).
HEADER_TIMEOUT_S = 10.0


class HeaderDeadlineProtocol(HttpToolsProtocol):
    """:class:`HttpToolsProtocol` that closes a connection whose request headers do not arrive in time."""

    header_timeout_s = HEADER_TIMEOUT_S
    _header_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._header_deadline is None and (self.cycle is None or self.cycle.response_complete):
            self._arm()  # the first bytes of the next request on a kept-alive connection
        super().data_received(data)

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._header_deadline = self.loop.call_later(self.header_timeout_s, self._headers_too_slow)

    def _disarm(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _headers_too_slow(self) -> None:
        self._header_deadline = None
        if not self.transport.is_closing():
            self.transport.close()
