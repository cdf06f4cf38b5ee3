"""A refusal sent straight from ASGI middleware, in tether's ``{"code", "message"}`` shape."""

from __future__ import annotations

import json

from starlette.types import Send


async def send_refusal(send: Send, status: int, code: str, message: str) -> None:
    """Answer ``status`` and close the connection: the middleware refusing did
    not read the rest of the request, so the connection cannot carry another."""
    body = json.dumps({"code": code, "message": message}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
