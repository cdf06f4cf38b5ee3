"""A turn's stream as typed events, decoded from its server-sent events (design §3).

``new_message`` carries the whole cumulative message with ``id:
<message_id>:<index>`` (or, on a ``stream_mode=delta`` stream, after its first
event, ``{"index", "delta"}``: ``held_message`` rebuilds the message);
``stream_status`` says how the stream ended (every stream ends with one; a
server of an older release sent none after a clean live close); ``error`` is
a failure after the 201; ``queued`` opens the
202 answer to ``multitask_strategy="enqueue"`` on a busy conversation. Anything
else (a comment, an event type from a newer server) decodes to None and is
skipped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tether.client.sse import SSEEvent


@dataclass(frozen=True)
class MessageEvent:
    """``new_message``: the answer so far, or the text appended to it, at
    ``index`` of the turn's stream."""

    event_id: str
    message_id: str
    index: int | None
    data: dict[str, Any]


@dataclass(frozen=True)
class StatusEvent:
    """``stream_status``: the verdict a stream ended with (done, errored,
    cancelled, dead, gone)."""

    reason: str


@dataclass(frozen=True)
class ErrorEvent:
    """``error``: what went wrong after the stream started."""

    code: str
    message: str


@dataclass(frozen=True)
class QueuedEvent:
    """``queued``: the turn waits for the conversation's turns before it;
    ``position`` is its place in line (1: next)."""

    message_id: str
    position: int | None


WireEvent = MessageEvent | StatusEvent | ErrorEvent | QueuedEvent


def split_event_id(event_id: str) -> tuple[str, int | None]:
    """``<message_id>:<index>`` apart; message ids may hold colons, indexes don't."""
    message_id, _, index = event_id.rpartition(":")
    return message_id, int(index) if index.isdigit() else None


def decode(event: SSEEvent) -> WireEvent | None:
    payload = _json(event.data)
    if event.event == "new_message" and isinstance(payload, dict):
        message_id, index = split_event_id(event.id)
        message_id = message_id or str(payload.get("message_id") or "")
        return MessageEvent(event.id, message_id, index, payload)
    if event.event == "stream_status" and isinstance(payload, dict):
        return StatusEvent(str(payload.get("reason")))
    if event.event == "queued" and isinstance(payload, dict):
        position = payload.get("position")
        return QueuedEvent(
            str(payload.get("message_id") or ""), position if isinstance(position, int) else None
        )
    if event.event == "error":
        if isinstance(payload, dict):
            return ErrorEvent(str(payload.get("code", "ERROR")), str(payload.get("message", "")))
        return ErrorEvent("ERROR", event.data)
    return None


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None
