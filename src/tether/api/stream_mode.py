"""The shape of a stream's ``new_message`` events: ``stream_mode`` (design §3).

``cumulative`` (the default, the seed's shape): every event carries the whole
message so far, so a 4 KB answer in a few hundred events costs its length a
few hundred times over. ``delta``: the first event of the stream carries the
whole message; each later one, when the message only grew, carries
``{"index", "delta"}``: the text appended since the previous event
(``tether.domain.appended_text`` says where a reader puts it). A change that
is not an append (a tool part; text that a takeover rewound) goes out whole
again, never as a wrong delta. Either way the event id is
``<message_id>:<index>`` and ``Last-Event-ID`` works the same; a stream that
resumes after one starts with a whole message, so a reader needs nothing but
the stream it reads.

The mode is a query parameter on ``POST /chat/stream`` and
``GET /chat/stream/{message_id}`` alike (an attach has no body); any other
value is a 422.
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Annotated

from fastapi import Query
from sse_starlette import ServerSentEvent

from tether.domain.appended_text import appended_text
from tether.domain.chat_message import ChatMessage
from tether.runtime.live_buffer import StreamEvent


class StreamMode(StrEnum):
    CUMULATIVE = "cumulative"
    DELTA = "delta"


StreamModeQuery = Annotated[
    StreamMode,
    Query(
        description="cumulative (default): every new_message event holds the whole "
        'message; delta: after the first, {"index", "delta"} with the text appended'
    ),
]


class MessageEncoder:
    """Turns one stream's events into ``new_message`` events in its mode."""

    def __init__(self, message_id: str, mode: StreamMode = StreamMode.CUMULATIVE) -> None:
        self._message_id = message_id
        self._mode = mode
        self._sent: ChatMessage | None = None
        """The message as the reader holds it after the last event."""

    def encode(self, event: StreamEvent) -> ServerSentEvent:
        data = self._data(event)
        return ServerSentEvent(
            data=data, event="new_message", id=f"{self._message_id}:{event.index}"
        )

    def _data(self, event: StreamEvent) -> str:
        message = event.message
        if self._mode is StreamMode.CUMULATIVE:
            return message.model_dump_json(exclude_none=True)
        previous, self._sent = self._sent, message
        text = appended_text(previous, message) if previous is not None else None
        if text is None:
            return message.model_dump_json(exclude_none=True)
        return json.dumps(
            {"index": event.index, "delta": text}, ensure_ascii=False, separators=(",", ":")
        )
