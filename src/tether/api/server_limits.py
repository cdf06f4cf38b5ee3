"""How ``tether serve`` bounds slow and oversized clients at the HTTP layer.

uvicorn has options for two of the bounds (``timeout_keep_alive`` for an idle
kept-alive connection, ``h11_max_incomplete_event_size`` for a head while it
arrives) but none for a head that trickles in, or a fresh connection that
never sends one: ``HeadTimeoutH11Protocol`` adds that. The body's own bound
is ASGI middleware (``tether.api.body_timeout``), so it holds under any server.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from tether.settings import TetherSettings

logger = logging.getLogger(__name__)


class HeadTimeoutH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, with a deadline for each request's head, and
    its refusals of a malformed or oversized head in tether's error shape.

    The deadline starts when the connection opens and again when a response
    completes; it is cleared once the head has arrived. A connection still
    waiting for its head at the deadline is closed, answered 408 first if
    part of a head had arrived (a connection that sent nothing is just
    closed, as uvicorn closes an idle kept-alive one).
    """

    header_timeout: float = 10.0
    max_header_bytes: int = 16_384

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._head_timer: asyncio.TimerHandle | None = None
        self._lingering: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        self._settle_head_timer()

    def data_received(self, data: bytes) -> None:
        if self._lingering is not None:
            return  # refused already: what the client still sends is dropped
        super().data_received(data)
        self._settle_head_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._settle_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        if self._lingering is not None:
            self._lingering.cancel()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        # uvicorn answers a head h11 cannot parse (or one that outgrew
        # h11_max_incomplete_event_size while arriving) in plain text: answer
        # in tether's shape instead, 431 for the head that is too large.
        buffered, _ = self.conn.trailing_data
        if len(buffered) > self.max_header_bytes:
            status, code = 431, "HEADERS_TOO_LARGE"
            message = f"the request head is over the {self.max_header_bytes} byte limit"
        else:
            status, code, message = 400, "BAD_REQUEST", "the request is not valid HTTP/1.1"
        body = json.dumps({"code": code, "message": message}).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        for event in (
            h11.Response(status_code=status, headers=headers),
            h11.Data(data=body),
            h11.EndOfMessage(),
        ):
            self.transport.write(self.conn.send(event) or b"")
        # A lingering close: closing now, with the client's unread head in
        # the socket, makes the kernel answer with a reset that can destroy
        # our answer before the client reads it. End our side, drop what
        # still arrives, and close once the client does (or soon after).
        self._cancel_head_timer()
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self._lingering = asyncio.get_running_loop().call_later(
            _LINGER_SECONDS, self.transport.close
        )

    def _waiting_for_head(self) -> bool:
        return self.conn.their_state is h11.IDLE and not self.transport.is_closing()

    def _settle_head_timer(self) -> None:
        if not self._waiting_for_head():
            self._cancel_head_timer()
        elif self._head_timer is None:
            self._head_timer = self.loop.call_later(self.header_timeout, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self._waiting_for_head():
            return
        buffered, _ = self.conn.trailing_data
        if buffered:
            message = f"the request headers did not arrive within {self.header_timeout:g} s"
            logger.info("closing a connection: %s", message)
            body = json.dumps({"code": "REQUEST_TIMEOUT", "message": message}).encode()
            # h11 cannot answer a request it has not parsed: the bytes are ours.
            self.transport.write(
                b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
            )
        self.transport.close()


_LINGER_SECONDS = 2.0
"""How long a refused connection drains the rest of what its client sends."""


def uvicorn_options(settings: TetherSettings) -> dict[str, Any]:
    """``uvicorn.Config`` keyword arguments that apply the settings' bounds."""
    bounds = {
        "header_timeout": settings.header_timeout,
        "max_header_bytes": settings.max_header_bytes,
    }
    protocol = type("H11Protocol", (HeadTimeoutH11Protocol,), bounds)
    return {
        "http": protocol,
        "timeout_keep_alive": settings.idle_timeout,
        "h11_max_incomplete_event_size": settings.max_header_bytes,
    }
