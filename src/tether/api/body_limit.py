"""Refuse request bodies over the size limit with 413, before anything parses them."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tether.api.refusal import send_refusal


class BodySizeLimitMiddleware:
    """A declared ``Content-Length`` over the limit is refused before the app runs.

    A body without one (chunked) is counted as the app reads it. The moment it
    passes the limit the 413 is sent from here and the app is told the client
    went away. Raising instead would not work: FastAPI turns any exception
    from reading the body into its own 400 before it could reach this
    middleware, so the client would hear "error parsing the body" for what is
    a body too large. Whatever the app answers after that is dropped.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(send)
            return
        seen = 0
        started = False
        refused = False

        async def limited_receive() -> Message:
            nonlocal seen, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    if not started:
                        refused = True
                        await self._refuse(send)
                    return {"type": "http.disconnect"}
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if refused:
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        await self.app(scope, limited_receive, tracking_send)

    async def _refuse(self, send: Send) -> None:
        # The rest of the body is never read: the refusal closes the connection.
        message = f"request body is over the {self.max_bytes} byte limit"
        await send_refusal(send, 413, "BODY_TOO_LARGE", message)
