"""SSE framing of a turn (design §3).

Each event is ``event: new_message`` with ``id: <message_id>:<index>`` and the
message as data, whole or as the text appended (``tether.api.stream_mode``).
Every stream, POST or GET, ends with ``event: stream_status`` saying how:
``done``, ``errored``, ``cancelled``, ``dead`` (resume elsewhere), ``gone``
(another producer has the turn; ask the status) or ``interrupted`` (this
stream stopped, the turn did not: attach again). A reader of the seed's SDK
that knows none of this sees one more event after the answer and skips it, as
it skips any event type it does not know. Errors after the 201 are ``event:
error`` with a code, before the ``stream_status``.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncIterator

from sse_starlette import ServerSentEvent

from tether.api.coalescing import coalesce
from tether.api.stream_mode import MessageEncoder, StreamMode
from tether.api.validation_errors import invalid_request
from tether.domain.store_errors import StoreUnavailableError
from tether.runtime.live_buffer import EndReason, StreamEnd, StreamEvent

logger = logging.getLogger(__name__)

INTERRUPTED = "interrupted"
"""The verdict of a stream that stopped while its turn goes on."""
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


def end_events(end: StreamEnd) -> list[ServerSentEvent]:
    """What closes a stream: the error of an errored turn, then the verdict."""
    events: list[ServerSentEvent] = []
    if end.reason is EndReason.ERRORED:
        events.append(error_event(end.error_code or "INTERNAL", end.error_message or ""))
    events.append(status_event(end.reason))
    return events


async def frame(
    message_id: str,
    source: AsyncIterator[StreamEvent | StreamEnd],
    mode: StreamMode = StreamMode.CUMULATIVE,
) -> AsyncIterator[ServerSentEvent]:
    encoder = MessageEncoder(message_id, mode)
    paced = coalesce(source) if mode is StreamMode.DELTA else None
    try:
        async for item in paced or source:
            if isinstance(item, StreamEvent):
                yield encoder.encode(item)
            else:
                for event in end_events(item):
                    yield event
                return
    except StoreUnavailableError:
        # After the 201 a failure is an event, not a status: a follower whose
        # stores went away tells its client to ask again (the turn lives on).
        logger.warning("turn %s: stores unavailable while following", message_id)
        yield error_event("STORE_UNAVAILABLE", "a store is unavailable; attach again shortly")
        yield status_event(INTERRUPTED)
    finally:
        if paced is not None:
            # A reader that left stops the pacing's own read of the turn now.
            await paced.aclose()


def status_event(reason: str) -> ServerSentEvent:
    return ServerSentEvent(data=json.dumps({"reason": reason}), event="stream_status")


def error_event(code: str, message: str) -> ServerSentEvent:
    return ServerSentEvent(data=json.dumps({"code": code, "message": message}), event="error")
