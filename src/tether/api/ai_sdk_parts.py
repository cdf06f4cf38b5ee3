"""tether's messages as the AI SDK's UI message stream parts (protocol ``v1``).

A tether turn streams *cumulative* snapshots: each message holds the whole
answer so far. The AI SDK's UI message stream is *incremental*: a text part
is opened once (``text-start``), grown by ``text-delta`` and closed by
``text-end``; a tool call is announced once (``tool-input-available``) and
answered once (``tool-output-available`` or ``tool-output-error``); the
message opens with ``start`` and closes with ``finish``, ``abort`` or
``error``. ``UIMessageStreamParts`` keeps what it has sent and turns each
new snapshot into the parts that bring the client from there to it.

Replay is the same code: a reconnect starts a fresh converter from the
newest snapshot, so the client gets the whole answer so far in one round of
parts, then the live deltas (the AI SDK's ``DefaultChatTransport`` expects a
resumed stream to replay the response from its start).

Ids are stable across replicas: a text part is ``text-<position>``, a tool
part is its ``toolCallId``, and the message is the turn's ``message_id``, so
a replay through another replica rebuilds the same message.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tether.domain.chat_message import (
    ChatMessage,
    ChatMessageSender,
    ContentPart,
    ContentPartType,
    ToolCallStatus,
)
from tether.runtime.live_buffer import EndReason, StreamEnd

Part = dict[str, Any]
"""One chunk of the UI message stream, sent as ``data: <json>``."""

HEADERS = {
    # What the AI SDK's own servers send with this protocol (``ai``'s
    # UI_MESSAGE_STREAM_HEADERS): the version header, and no proxy buffering.
    "x-vercel-ai-ui-message-stream": "v1",
    "x-accel-buffering": "no",
}
DONE = "[DONE]"
"""The last ``data:`` line of every stream."""


@dataclass
class _Text:
    id: str
    text: str


class UIMessageStreamParts:
    """The parts of one turn's answer, from its cumulative snapshots.

    Call ``start`` once, ``update`` with every snapshot in stream order, and
    ``finish`` with how the stream ended. Never sends a part twice, never
    retracts one: a snapshot that is an older state of what was sent (a
    resumed producer catching up) sends nothing.
    """

    def __init__(self, message_id: str) -> None:
        self.message_id = message_id
        self._texts: dict[int, _Text] = {}
        self._restarts = 0
        self._tools: dict[str, str] = {}  # toolCallId -> "input" or "output"
        self._data_sent: dict[str, str] = {}  # data part id -> its JSON as sent

    def start(self) -> list[Part]:
        return [{"type": "start", "messageId": self.message_id}]

    def update(self, message: ChatMessage) -> list[Part]:
        parts: list[Part] = []
        for position, part in enumerate(_shown_parts(message)):
            if part.type is ContentPartType.TEXT:
                parts += self._text(position, part.text or "")
            elif part.type is ContentPartType.TOOL and part.tool is not None:
                parts += self._tool(part)
            elif part.type is ContentPartType.TABLE and part.table is not None:
                parts += self._data_part("table", position, part.table.model_dump(mode="json"))
            elif part.type is ContentPartType.CONTEXT and part.context is not None:
                parts += self._data_part("context", position, part.context)
        return parts

    def finish(self, end: StreamEnd) -> list[Part]:
        """Close every open text part, then say how the answer ended."""
        parts: list[Part] = [{"type": "text-end", "id": t.id} for t in self._texts.values()]
        self._texts.clear()
        if end.reason is EndReason.DONE:
            parts.append({"type": "finish", "finishReason": "stop"})
        elif end.reason is EndReason.CANCELLED:
            # What the AI SDK's own servers send when a generation is aborted.
            parts.append({"type": "abort", "reason": "cancelled"})
        else:
            parts.append(error_part(end.error_code or end.reason.upper(), _why(end)))
        return parts

    def _text(self, position: int, text: str) -> list[Part]:
        sent = self._texts.get(position)
        if sent is None:
            if not text:
                return []  # an empty part shows nothing; open it when it has text
            sent = self._texts[position] = _Text(f"text-{position}", "")
            return [{"type": "text-start", "id": sent.id}, *self._grow(sent, text)]
        if text.startswith(sent.text):
            return self._grow(sent, text)
        if sent.text.startswith(text):
            return []  # an older state of what the client has: it catches up
        # The text changed under what was sent (a model that answers
        # differently after a takeover). A part cannot be retracted: close it
        # and show the new text as a part of its own.
        self._restarts += 1
        restarted = self._texts[position] = _Text(f"text-{position}-{self._restarts}", "")
        return [
            {"type": "text-end", "id": sent.id},
            {"type": "text-start", "id": restarted.id},
            *self._grow(restarted, text),
        ]

    @staticmethod
    def _grow(sent: _Text, text: str) -> list[Part]:
        delta = text[len(sent.text) :]
        sent.text = text
        return [{"type": "text-delta", "id": sent.id, "delta": delta}] if delta else []

    def _tool(self, part: ContentPart) -> list[Part]:
        tool = part.tool
        assert tool is not None
        parts: list[Part] = []
        stage = self._tools.get(tool.tool_call_id)
        if stage is None:
            parts.append(
                {
                    "type": "tool-input-available",
                    "toolCallId": tool.tool_call_id,
                    "toolName": tool.name,
                    "input": tool.params,
                }
            )
            stage = self._tools[tool.tool_call_id] = "input"
        if stage == "input" and tool.status is ToolCallStatus.COMPLETED:
            parts.append(
                {
                    "type": "tool-output-available",
                    "toolCallId": tool.tool_call_id,
                    "output": tool.response,
                }
            )
            self._tools[tool.tool_call_id] = "output"
        elif stage == "input" and tool.status is ToolCallStatus.ERROR:
            parts.append(
                {
                    "type": "tool-output-error",
                    "toolCallId": tool.tool_call_id,
                    "errorText": _as_text(tool.response),
                }
            )
            self._tools[tool.tool_call_id] = "output"
        return parts

    def _data_part(self, kind: str, position: int, data: Any) -> list[Part]:
        # A data part with an id is replaced in place by the client when the
        # same id comes again, so a growing table or context stays one part.
        part_id = f"{kind}-{position}"
        encoded = json.dumps(data, sort_keys=True, default=str)
        if self._data_sent.get(part_id) == encoded:
            return []
        self._data_sent[part_id] = encoded
        return [{"type": f"data-{kind}", "id": part_id, "data": data}]


def error_part(code: str, message: str) -> Part:
    """An ``error`` part: the AI SDK shows ``errorText`` as the chat's error."""
    return {"type": "error", "errorText": f"{code}: {message}"}


def ui_message(message: ChatMessage) -> dict[str, Any]:
    """A stored message as the AI SDK's ``UIMessage`` (for a front end's
    initial ``messages``): the same parts a stream of it would build."""
    role = "user" if message.sender is ChatMessageSender.USER else "assistant"
    parts: list[dict[str, Any]] = []
    for position, part in enumerate(_shown_parts(message)):
        if part.type is ContentPartType.TEXT and part.text:
            parts.append({"type": "text", "text": part.text, "state": "done"})
        elif part.type is ContentPartType.TOOL and part.tool is not None:
            tool = part.tool
            shown: dict[str, Any] = {
                "type": f"tool-{tool.name}",
                "toolCallId": tool.tool_call_id,
                "input": tool.params,
                "state": "input-available",
            }
            if tool.status is ToolCallStatus.COMPLETED:
                shown.update(state="output-available", output=tool.response)
            elif tool.status is ToolCallStatus.ERROR:
                shown.update(state="output-error", errorText=_as_text(tool.response))
            parts.append(shown)
        elif part.type is ContentPartType.TABLE and part.table is not None:
            parts.append(
                {
                    "type": "data-table",
                    "id": f"table-{position}",
                    "data": part.table.model_dump(mode="json"),
                }
            )
        elif part.type is ContentPartType.CONTEXT and part.context is not None:
            parts.append(
                {"type": "data-context", "id": f"context-{position}", "data": part.context}
            )
    return {"id": message.message_id or "", "role": role, "parts": parts}


def _shown_parts(message: ChatMessage) -> list[ContentPart]:
    """What a message shows, in order: its content parts, with ``content`` as
    the text when no part carries text (an agent that yields plain text)."""
    parts = list(message.content_parts or [])
    if message.content and not any(p.type is ContentPartType.TEXT for p in parts):
        parts.insert(0, ContentPart(type=ContentPartType.TEXT, text=message.content))
    return parts


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _why(end: StreamEnd) -> str:
    if end.error_message:
        return end.error_message
    if end.reason is EndReason.DEAD:
        return "the turn's producer stopped and no replica took it over"
    if end.reason is EndReason.GONE:
        return "another producer owns the turn now; reconnect to follow it"
    return f"the turn ended {end.reason}"
