"""What every endpoint shares: JSON bodies, 4xx/503 errors that name the field at fault, query parsing."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from warmcache.bounds import MAX_COUNT, MAX_NESTING, json_nesting

JSON_TYPE = b"application/json"


class ApiError(Exception):
    """A request the service refuses: an HTTP status and a one-line message, naming ``field`` when one is at fault."""

    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field

    def body(self) -> bytes:
        error: dict[str, Any] = {"status": self.status, "message": self.message}
        if self.field is not None:
            error["field"] = self.field
        return dumps({"error": error})


def dumps(data: Any) -> bytes:
    """Compact JSON; datetimes and other odd values as text (as the CLI's ``--json`` does)."""
    return json.dumps(data, separators=(",", ":"), default=str).encode()


def json_body(body: bytes) -> Any:
    """A request body parsed as JSON, its nesting measured first (``json`` recurses once per level), or a 400."""
    depth = json_nesting(body)
    if depth > MAX_NESTING:
        raise ApiError(400, f"body nests {depth} levels deep, more than the {MAX_NESTING} allowed", "body")
    try:
        return json.loads(body)
    except ValueError as exc:
        raise ApiError(400, f"body is not JSON: {exc}", "body") from None


def positive_int(params: Mapping[str, str], name: str, *, required: bool = True) -> int | None:
    """A positive integer query parameter, or a 400 naming it."""
    text = params.get(name)
    if text is None or text == "":
        if required:
            raise ApiError(400, f"query parameter {name!r} is required", name)
        return None
    # ASCII digits only: int() would also read '1_0', '+1', ' 1' and full-width digits.
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= MAX_COUNT:
        raise ApiError(
            400,
            f"query parameter {name!r} must be an integer from 1 to {MAX_COUNT} in ASCII digits, got {text[:40]!r}",
            name,
        )
    return int(text)


def choice(
    params: Mapping[str, str], name: str, options: tuple[str, ...] | list[str], default: str | None = None
) -> str | None:
    """A query parameter restricted to ``options`` (``default`` when absent), or a 400 naming it."""
    text = params.get(name) or default
    if text is not None and text not in options:
        raise ApiError(400, f"query parameter {name!r} must be one of {', '.join(options)}, got {text[:40]!r}", name)
    return text


def flag(params: Mapping[str, str], name: str) -> bool:
    text = params.get(name, "").lower()
    if text in ("", "0", "false", "no"):
        return False
    if text in ("1", "true", "yes"):
        return True
    raise ApiError(400, f"query parameter {name!r} must be true or false, got {text[:40]!r}", name)
