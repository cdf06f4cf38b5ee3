"""Refuse a request body that trickles: it must arrive whole within a time limit.

uvicorn bounds how long a kept-alive connection may idle, but not how long a
body may take: a client sending one byte a second holds a connection, and the
route waiting on it, for as long as it likes. Here the whole body must arrive
within ``timeout`` seconds of the request's head, or the request is answered
408 and the app is told the client went away.
"""

from __future__ import annotations

import asyncio

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tether.api.refusal import send_refusal


class BodyTimeoutMiddleware:
    """Bounds the time from the request's head to the end of its body.

    Only the body is timed: once it is complete, ``receive`` (which a streaming
    response keeps waiting on to hear a disconnect) is passed through as is.
    A request whose route never reads its body is never refused.
    """

    def __init__(self, app: ASGIApp, timeout: float) -> None:
        self.app = app
        self.timeout = timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        deadline = asyncio.get_running_loop().time() + self.timeout
        body_done = False
        started = False
        refused = False

        async def timed_receive() -> Message:
            nonlocal body_done, refused
            if refused:
                return {"type": "http.disconnect"}
            if body_done:
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                refused = True
                if not started:
                    await send_refusal(
                        send,
                        408,
                        "REQUEST_TIMEOUT",
                        f"the request body did not arrive within {self.timeout:g} s",
                    )
                return {"type": "http.disconnect"}
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_done = True
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if refused:
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        await self.app(scope, timed_receive, tracking_send)
