"""The one reader of JSON request bodies for the admin endpoints (a bookie's, and `dlog
autorecovery`'s own): a bad body is one line for a 400, never a 500 (invalid UTF-8, a charset other
than UTF-8, too large, malformed or deeply nested JSON)."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

JSON_BODY_BYTES_MAX = 64 * 1024
JSON_DEPTH_MAX = 32


class BadBody(Exception):
    """A request body that is not the JSON it should be; the message says why."""


async def read_json(request: web.Request, bytes_max: int = JSON_BODY_BYTES_MAX) -> Any:
    """The body as JSON: UTF-8 only, at most `bytes_max` bytes and `JSON_DEPTH_MAX` levels deep."""
    charset = (request.charset or "utf-8").lower()
    if charset not in ("utf-8", "utf8"):
        raise BadBody(f"charset {request.charset!r} is not supported: send UTF-8 JSON")
    if request.content_length is not None and request.content_length > bytes_max:
        raise BadBody(f"body of {request.content_length} bytes is over {bytes_max}")
    raw = b""
    while len(raw) <= bytes_max:  # read() returns what has arrived: a body may come in parts
        part = await request.content.read(bytes_max + 1 - len(raw))
        if not part:
            break
        raw += part
    if len(raw) > bytes_max:
        raise BadBody(f"body is over {bytes_max} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadBody(f"body is not valid UTF-8 (byte {exc.start})") from None
    if json_depth(text) > JSON_DEPTH_MAX:
        raise BadBody(f"JSON nested deeper than {JSON_DEPTH_MAX} levels")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise BadBody(f"body is not valid JSON: {exc}") from None


def json_depth(text: str) -> int:
    """The deepest nesting of arrays and objects, counted outside strings (no parsing needed)."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest
