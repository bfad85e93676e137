"""The ASGI application: routes over the registry view, reusing the library the CLI uses."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from warmcache import manifest as manifests
from warmcache.errors import UsageError
from warmcache.identity.fingerprint import package_version
from warmcache.identity.plan import plan_manifest
from warmcache.manifest import load_manifest
from warmcache.registry import Registry
from warmcache.registry.statuses import PLAN_STATUSES
from warmcache.registry.usability import effective_status
from warmcache.reports.explain import explain_plan
from warmcache.reports.query import plan_json, shape_json
from warmcache.reports.status import warmup_status
from warmcache.service import dashboard
from warmcache.service.auth import WriteAuthorisation
from warmcache.service.check import CheckRoute
from warmcache.service.http import ApiError, choice, dumps
from warmcache.service.metrics import metrics_registry
from warmcache.service.misses import parse_misses
from warmcache.service.openapi import openapi_document
from warmcache.service.plan_request import plan_request
from warmcache.service.reader_text import known_paths, reader_error, without_paths
from warmcache.service.view import RegistryView, guard_document
from warmcache.settings import RegistryLocation
from warmcache.shapes import WORKLOADS
from warmcache.trust import SigningKey

T = TypeVar("T")

#: Largest request body accepted (a manifest or a batch of misses).
MAX_BODY_BYTES = 1 << 20
#: Seconds ``POST /v1/plan`` may spend parsing and planning a manifest (in a worker thread) before it answers 503.
PLAN_TIMEOUT_S = 10.0
#: Seconds a write's whole body may take to arrive after its headers (a real client sends it at once).
BODY_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class ServiceConfig:
    registry: RegistryLocation
    token: str | None = None
    """Bearer token for writes; ``None`` refuses every write."""
    manifest: Path | None = None
    """The manifest ``/v1/status`` reports on (none: ``/v1/status`` answers 404)."""
    refresh_interval: float = 5.0
    max_body_bytes: int = MAX_BODY_BYTES
    body_timeout_s: float = BODY_TIMEOUT_S
    signing_key: SigningKey | None = None
    """Signs every ``/v1/guard/{model}`` answer, so guards with trusted keys load the precompiled code it names."""


#: A row's paths on the registry host (its cache folder, the model's folder): ``/v1/shapes`` is open to any reader.
SERVER_PATHS = ("cache_root", "model_path")


def reader_row(row: dict[str, Any]) -> dict[str, Any]:
    """A row as any reader may see it: ``warmcache shapes --json`` without :data:`SERVER_PATHS`, and its error with
    every path named by role (:mod:`~warmcache.service.reader_text`)."""
    shown = {key: value for key, value in row.items() if key not in SERVER_PATHS}
    shown["error"] = reader_error(row.get("error"), row.get("model_path"), row.get("cache_root"))
    return shown


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(dumps(data), status_code=status, media_type="application/json", headers=headers)


class Handlers:
    """The routes' handlers over one registry view, each a method, so that :func:`create_app` only wires routes.

    What they share (the view, the configuration, the write authorisation, the metrics,
    the OpenAPI document) is built once, here.
    """

    def __init__(self, config: ServiceConfig, view: RegistryView) -> None:
        self.config = config
        self.view = view
        self.auth = WriteAuthorisation(config.token)
        self.metrics = metrics_registry(view)
        self.openapi = dumps(openapi_document(package_version("warmcache") or "unknown"))

    async def in_registry(self, work: Callable[[Registry], T]) -> T:
        """Run one direct query off the event loop; a database failure is a 503."""

        def run() -> T:
            with self.view.query() as registry:
                return work(registry)

        return await run_in_threadpool(run)

    async def write_body(self, request: Request) -> bytes:
        self.auth.require(request.headers.get("authorization"))
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.config.max_body_bytes:
            raise ApiError(413, f"body of {declared} bytes exceeds the limit of {self.config.max_body_bytes}", "body")
        body = bytearray()

        async def receive() -> None:
            async for chunk in request.stream():
                body.extend(chunk)
                if len(body) > self.config.max_body_bytes:
                    raise ApiError(413, f"body exceeds the limit of {self.config.max_body_bytes} bytes", "body")

        try:
            # A body sent a byte at a time would hold a worker for as long as the client likes.
            await asyncio.wait_for(receive(), self.config.body_timeout_s)
        except TimeoutError:
            raise ApiError(408, f"body not received within {self.config.body_timeout_s:g} s; refused", "body") from None
        except ClientDisconnect:
            raise ApiError(400, "the client disconnected before its body ended", "body") from None
        return bytes(body)

    async def models(self, request: Request) -> Response:
        state = self.view.current()
        out: dict[str, dict[str, Any]] = {}
        for r in state.records:
            entry = out.setdefault(r.model_name, {"model": r.model_name, "workloads": set(), "counts": Counter()})
            entry["workloads"].add(r.workload)
            entry["counts"][effective_status(r)] += 1
        return json_response(
            [
                {
                    "model": e["model"],
                    "workloads": sorted(e["workloads"]),
                    "shapes": sum(e["counts"].values()),
                    "counts": {str(s): e["counts"][s] for s in PLAN_STATUSES if e["counts"][s]},
                }
                for e in (out[m] for m in sorted(out))
            ]
        )

    async def shapes(self, request: Request) -> Response:
        params = request.query_params
        workload = choice(params, "workload", WORKLOADS)
        status = choice(params, "status", [str(s) for s in PLAN_STATUSES[1:]])
        model = params.get("model")
        rows = [
            reader_row(shape_json(r))
            for r in self.view.current().records
            if (model is None or r.model_name == model) and (workload is None or r.workload == workload)
        ]
        return json_response([r for r in rows if status is None or r["status"] == status])

    async def plan(self, request: Request) -> Response:
        body = await self.write_body(request)
        model = request.query_params.get("model")
        abandoned = threading.Event()

        def checkpoint() -> None:
            # The worker thread cannot be cancelled from here: it stops itself, within milliseconds of the 503.
            if abandoned.is_set():
                raise ApiError(503, "plan abandoned")

        served = self.served_models()
        try:
            # The manifest front door with all its bounds, off the event loop, in bounded time; paths on the server's
            # disk are never disclosed, and only the models this service's own manifest names are read.
            planned = await asyncio.wait_for(
                run_in_threadpool(
                    lambda: plan_request(manifests.loads(body, "request-body.toml"), model, served, checkpoint)
                ),
                PLAN_TIMEOUT_S,
            )
        except UsageError as exc:
            raise ApiError(400, str(exc), "body") from None
        except TimeoutError:
            abandoned.set()
            raise ApiError(503, f"planning the manifest took more than {PLAN_TIMEOUT_S:g}s; refused", "body") from None
        explained = await self.in_registry(lambda registry: explain_plan(registry, planned))
        return json_response([plan_json(e.status, e.reason) for e in explained])

    def served_models(self) -> frozenset[tuple[str, str | None]]:
        """``(path, revision)`` of each model this service's manifest names: the only model folders ``POST /v1/plan``
        reads (none without ``--manifest``); another would let a token holder probe the server's disk."""
        if self.config.manifest is None:
            return frozenset()
        try:
            return frozenset((m.path, m.revision) for m in load_manifest(self.config.manifest).models)
        except UsageError:
            return frozenset()  # /v1/status says what is wrong with it

    async def status(self, request: Request) -> Response:
        manifest = self.config.manifest
        if manifest is None:
            raise ApiError(404, "no manifest configured: start the server with --manifest PATH", "manifest")
        try:
            planned = plan_manifest(load_manifest(manifest), request.query_params.get("model"))
        except UsageError as exc:  # any reader asks: the manifest's and its models' paths are named by role
            raise ApiError(400, without_paths(str(exc), {str(manifest): "<manifest>"}), "model") from None
        report = (await self.in_registry(lambda registry: warmup_status(registry, planned))).as_json()
        state = self.view.state
        known = known_paths(
            [p.model.path for p in planned], [r.cache_root for r in state.records] if state is not None else []
        )
        for group in report["groups"]:
            for failure in group["failures"]:
                failure["error"] = without_paths(failure["error"], known)
        return json_response(report)

    async def misses(self, request: Request) -> Response:
        if request.method == "GET":
            model = request.query_params.get("model")
            return json_response(await self.in_registry(lambda registry: registry.miss_summary(model)))
        events = parse_misses(await self.write_body(request))
        await self.in_registry(lambda registry: registry.record_misses(events))
        return json_response({"recorded": len(events), "count": sum(e.count for e in events)})

    async def refresh(self, request: Request) -> Response:
        await self.write_body(request)
        state = await run_in_threadpool(self.view.refresh)
        return json_response({"loaded_at": state.loaded_at.isoformat(), "shapes": len(state.records)})

    async def guard(self, request: Request) -> Response:
        workload = choice(request.query_params, "workload", WORKLOADS)
        model, key = request.path_params["model"], self.config.signing_key
        etag, body = guard_document(self.view.current(), model, workload, key)
        headers = {"ETag": etag, "Cache-Control": "no-cache"}
        if etag in [tag.strip() for tag in request.headers.get("if-none-match", "").split(",")]:
            return Response(status_code=304, headers=headers)
        return Response(body, media_type="application/json", headers=headers)

    async def metrics_text(self, request: Request) -> Response:
        return Response(generate_latest(self.metrics), media_type=CONTENT_TYPE_LATEST)

    async def readyz(self, request: Request) -> Response:
        state = self.view.current()
        return json_response({"ready": True, "loaded_at": state.loaded_at.isoformat(), "shapes": len(state.records)})

    async def page(self, request: Request) -> Response:
        try:
            body = dashboard.render_panels(self.view.current())
        except ApiError as exc:
            body = dashboard.render_down(exc.message)
        return HTMLResponse(dashboard.render_page(body))

    async def panels(self, request: Request) -> Response:
        try:
            return HTMLResponse(dashboard.render_panels(self.view.current()))
        except ApiError as exc:
            return Response(exc.message, status_code=exc.status, media_type="text/plain")

    async def openapi_json(self, request: Request) -> Response:
        return Response(self.openapi, media_type="application/json")

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self.view.start()
        try:
            yield
        finally:
            await run_in_threadpool(self.view.stop)


async def healthz(request: Request) -> Response:
    return json_response({"ok": True})


async def api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return Response(exc.body(), status_code=exc.status, media_type="application/json")


async def http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return Response(
        ApiError(exc.status_code, str(exc.detail)).body(), status_code=exc.status_code, media_type="application/json"
    )


def create_app(config: ServiceConfig) -> CheckRoute:
    """The service as one ASGI callable: the raw ``/v1/check`` route in front of the Starlette routes."""
    view = RegistryView(config.registry, interval=config.refresh_interval)
    handlers = Handlers(config, view)
    routes = [
        Route("/v1/models", handlers.models),
        Route("/v1/shapes", handlers.shapes),
        Route("/v1/plan", handlers.plan, methods=["POST"]),
        Route("/v1/status", handlers.status),
        Route("/v1/misses", handlers.misses, methods=["GET", "POST"]),
        Route("/v1/refresh", handlers.refresh, methods=["POST"]),
        Route("/v1/guard/{model}", handlers.guard),
        Route("/metrics", handlers.metrics_text),
        Route("/healthz", healthz),
        Route("/readyz", handlers.readyz),
        Route("/", handlers.page),
        Route("/dashboard/panels", handlers.panels),
        Route("/openapi.json", handlers.openapi_json),
    ]
    app = Starlette(
        routes=routes, lifespan=handlers.lifespan, exception_handlers={ApiError: api_error, HTTPException: http_error}
    )
    app.state.view = view
    return CheckRoute(app, view)
