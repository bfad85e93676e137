"""The service's OpenAPI 3.1 document (served at ``/openapi.json``).

Written out rather than generated: the hot ``/v1/check`` route is raw ASGI, outside any
framework's schema generator. A test checks that every route is described here.
"""

from __future__ import annotations

from typing import Any

from warmcache.registry.statuses import PLAN_STATUSES
from warmcache.shapes import WORKLOADS


def _param(
    name: str, description: str, schema: dict[str, Any], required: bool = False, where: str = "query"
) -> dict[str, Any]:
    return {"name": name, "in": where, "required": required, "description": description, "schema": schema}


_INT = {"type": "integer", "minimum": 1}
_JSON = {"application/json": {"schema": {"type": "object"}}}
_ERROR = {
    "description": "Bad input, naming the field",
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
}
_DOWN = {
    "description": "The registry is unavailable",
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
}
_WRITE = {
    "401": {"description": "Missing or wrong bearer token"},
    "403": {"description": "Writes are disabled (no token configured)"},
    "413": {"description": "Body too large"},
}
_MODEL = _param("model", "Model name as in the manifest", {"type": "string"})
_WORKLOAD = _param("workload", "Workload", {"type": "string", "enum": list(WORKLOADS)})


def _get(
    summary: str, parameters: list[dict[str, Any]] | None = None, content: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "get": {
            "summary": summary,
            "parameters": parameters or [],
            "responses": {"200": {"description": "OK", "content": content or _JSON}, "400": _ERROR, "503": _DOWN},
        }
    }


def _post(summary: str, body_type: str) -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "security": [{"bearer": []}],
            "requestBody": {
                "required": True,
                "content": {body_type: {"schema": {"type": "object" if body_type.endswith("json") else "string"}}},
            },
            "responses": {"200": {"description": "OK", "content": _JSON}, "400": _ERROR, "503": _DOWN, **_WRITE},
        }
    }


def openapi_document(version: str) -> dict[str, Any]:
    misses = _get("Recorded misses per shape, as `warmcache misses --json`", [{**_MODEL}])
    misses.update(
        _post(
            'Report misses a guard saw: {"misses": [{model, workload, dtype, batch_size, seq_len, '
            "decision, padded_batch?, padded_seq?, count?, tp_size?, fsdp_size?}]}",
            "application/json",
        )
    )
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "warmcache",
            "version": version,
            "description": "The compile registry over HTTP: checks, status, misses, guard snapshots, metrics.",
        },
        "paths": {
            "/v1/models": _get("Models in the registry with counts by status"),
            "/v1/shapes": _get(
                "Registry rows, as `warmcache shapes --json`",
                [
                    _MODEL,
                    _WORKLOAD,
                    _param(
                        "status", "Effective status", {"type": "string", "enum": [str(s) for s in PLAN_STATUSES[1:]]}
                    ),
                ],
            ),
            "/v1/check": _get(
                "Can a request run without compiling (exact, padded, or refused with the nearest "
                "shapes), as `warmcache check --json`",
                [
                    {**_MODEL, "required": True},
                    _WORKLOAD,
                    _param("batch", "Batch size", _INT, True),
                    _param("seq", "Prompt or sequence length", _INT, True),
                    _param("dtype", "Only shapes of this dtype", {"type": "string"}),
                    _param("max_cache_len", "Only this cache length", _INT),
                    _param("exact", "Padding does not count", {"type": "boolean"}),
                ],
            ),
            "/v1/plan": _post(
                "Every shape a manifest (TOML body) declares with its status, as `warmcache plan --json`",
                "application/toml",
            ),
            "/v1/status": _get("The configured manifest's warmup status, as `warmcache status --json`"),
            "/v1/misses": misses,
            "/v1/refresh": _post("Reload the in-memory view of the registry now", "application/json"),
            "/v1/guard/{model}": {
                "get": {
                    **_get(
                        "Guard snapshot of a model's compiled rows (ETag; If-None-Match answers 304)",
                        [{**_MODEL, "in": "path", "required": True}, _WORKLOAD],
                    )["get"]
                }
            },
            "/metrics": _get("Prometheus metrics", content={"text/plain": {"schema": {"type": "string"}}}),
            "/healthz": _get("The process is up"),
            "/readyz": _get("The registry answers (503 when it does not)"),
            "/": _get("Dashboard", content={"text/html": {"schema": {"type": "string"}}}),
            "/dashboard/panels": _get(
                "Dashboard panels (HTML fragment the page refreshes)",
                content={"text/html": {"schema": {"type": "string"}}},
            ),
            "/openapi.json": _get("This document"),
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": {
                    "type": "object",
                    "properties": {
                        "error": {
                            "type": "object",
                            "properties": {
                                "status": {"type": "integer"},
                                "message": {"type": "string"},
                                "field": {"type": "string"},
                            },
                        }
                    },
                }
            },
        },
    }
