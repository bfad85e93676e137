"""``GET /v1/check`` as a raw ASGI route: the hot path a router calls per request.

It skips the framework (routing, request objects, JSON encoding per call): the raw
query string is the memo key on the current :class:`~warmcache.service.view.RegistryState`,
so a repeated request costs a dict lookup and two ``send`` calls. A new request is
parsed, decided by the same :class:`~warmcache.reports.query.RequestChecker` as
``warmcache check``, and its body is memoised.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qsl

from warmcache.reports.query import CheckRequest
from warmcache.service.http import JSON_TYPE, ApiError, choice, dumps, flag, positive_int
from warmcache.service.view import RegistryState, RegistryView
from warmcache.shapes import DTYPE_ALIASES, WORKLOADS

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

CHECK_PATH = "/v1/check"
_DTYPES = sorted(set(DTYPE_ALIASES.values()))


def check_answer(view: RegistryView, query_string: bytes) -> tuple[int, bytes]:
    """``(status, body)`` for one ``/v1/check`` query string."""
    try:
        state = view.current()
    except ApiError as exc:
        return exc.status, exc.body()
    return state.memoise(state.check_memo, query_string, lambda: _decide(state, query_string))


def _decide(state: RegistryState, query_string: bytes) -> tuple[int, bytes]:
    try:
        params = dict(parse_qsl(query_string.decode("latin-1"), keep_blank_values=True))
        model = params.get("model")
        if not model:
            raise ApiError(400, "query parameter 'model' is required", "model")
        workload = choice(params, "workload", WORKLOADS, default="generate")
        assert workload is not None
        batch_size, seq_len = positive_int(params, "batch"), positive_int(params, "seq")
        assert batch_size is not None and seq_len is not None
        checker = state.checkers.get((model, workload))
        if checker is None:
            raise ApiError(404, f"model {model!r} has no {workload} shapes in the registry", "model")
        dtype, max_cache_len = choice(params, "dtype", _DTYPES), positive_int(params, "max_cache_len", required=False)
        result = checker.check(CheckRequest(batch_size, seq_len, flag(params, "exact"), dtype, max_cache_len))
    except ApiError as exc:
        return exc.status, exc.body()
    return 200, dumps(result.as_json())


class CheckRoute:
    """ASGI middleware: answers ``GET /v1/check`` itself and hands everything else to ``app``."""

    def __init__(self, app: ASGIApp, view: RegistryView) -> None:
        self.app = app
        self.view = view

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != CHECK_PATH or scope["method"] not in ("GET", "HEAD"):
            await self.app(scope, receive, send)
            return
        status, body = check_answer(self.view, scope["query_string"])
        headers = [(b"content-type", JSON_TYPE), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body if scope["method"] == "GET" else b""})
