"""SSE framing of a turn (design §3).

Each event is ``event: new_message`` with ``id: <message_id>:<index>`` and the
whole cumulative ChatMessage as data. A stream that ends any other way than a
clean live close says why in ``event: stream_status``; errors after the 201 are
``event: error`` with a code.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncIterator

from sse_starlette import ServerSentEvent

from tether.api.validation_errors import invalid_request
from tether.domain.store_errors import StoreUnavailableError
from tether.runtime.live_buffer import StreamEnd, StreamEvent

logger = logging.getLogger(__name__)

MAX_START_INDEX = 10**9
"""The largest index an attach may start from, by ``start_index`` or ``Last-Event-ID``."""
_INDEX = re.compile(r"[0-9]{1,10}")
"""ASCII digits only: ``str.isdigit`` also accepts ``²``, which ``int`` refuses."""


def parse_last_event_id(value: str | None, message_id: str) -> int | None:
    """The index to start after, from a ``Last-Event-ID`` of this turn; None
    when there is none or it names another turn (``start_index`` applies).

    An id of this turn whose index is not one tether sends is a 422, bounded as
    ``start_index`` is: never a number too long to parse."""
    if not value:
        return None
    turn, _, index = value.rpartition(":")
    if turn != message_id:
        return None
    if _INDEX.fullmatch(index) is None or int(index) >= MAX_START_INDEX:
        raise invalid_request(
            "header.Last-Event-ID",
            f"must be <message_id>:<index>, the index at most {MAX_START_INDEX - 1}",
        )
    return int(index) + 1


def message_event(message_id: str, event: StreamEvent) -> ServerSentEvent:
    return ServerSentEvent(
        data=event.message.model_dump_json(exclude_none=True),
        event="new_message",
        id=f"{message_id}:{event.index}",
    )


def end_events(end: StreamEnd, *, live: bool) -> list[ServerSentEvent]:
    """What closes a stream: nothing for a clean live close, else the verdict."""
    events: list[ServerSentEvent] = []
    if end.reason == "errored":
        events.append(
            ServerSentEvent(
                data=json.dumps({"code": end.error_code, "message": end.error_message}),
                event="error",
            )
        )
    if not (live and end.reason == "done"):
        events.append(
            ServerSentEvent(data=json.dumps({"reason": end.reason}), event="stream_status")
        )
    return events


async def frame(
    message_id: str, source: AsyncIterator[StreamEvent | StreamEnd], *, live: bool
) -> AsyncIterator[ServerSentEvent]:
    try:
        async for item in source:
            if isinstance(item, StreamEvent):
                yield message_event(message_id, item)
            else:
                for event in end_events(item, live=live):
                    yield event
                return
    except StoreUnavailableError:
        # After the 201 a failure is an event, not a status: a follower whose
        # stores went away tells its client to ask again (the turn lives on).
        logger.warning("turn %s: stores unavailable while following", message_id)
        yield error_event("STORE_UNAVAILABLE", "a store is unavailable; attach again shortly")


def error_event(code: str, message: str) -> ServerSentEvent:
    return ServerSentEvent(data=json.dumps({"code": code, "message": message}), event="error")
