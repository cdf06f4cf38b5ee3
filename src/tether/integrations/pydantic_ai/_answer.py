"""The tether message a PydanticAI run shows: rendered from its history alone.

The answer is a function of the turn's part of the message history, the tool
calls the turn's ledger knows about and the text of the response in progress.
A resumed turn renders the same answer from its checkpoint at once, so the text
of every finished response is shown again without the model saying it again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_core import to_jsonable_python

from tether.domain.answer_text import TEXT_PART_SEPARATOR
from tether.domain.chat_message import (
    ChatMessage,
    ChatMessageSender,
    ContentPart,
    ContentPartTool,
    ContentPartType,
    ToolCallStatus,
)

ToolOutcome = tuple[ToolCallStatus, Any]
"""A settled call as shown: its status and its response."""


def answer(
    turn_messages: Iterable[ModelMessage],
    *,
    outcomes: Mapping[str, ToolOutcome],
    live_text: Iterable[str] = (),
    notes: Iterable[str] = (),
) -> ChatMessage:
    """The answer so far: every response's text and tool calls in order, each
    call with its result (from the history, else from ``outcomes``, else
    running), then ``live_text`` (the text parts of the response being
    streamed) and ``notes``."""
    parts: list[ContentPart] = []
    tools: dict[str, ContentPartTool] = {}
    for message in turn_messages:
        if isinstance(message, ModelResponse):
            for part in message.parts:
                if isinstance(part, TextPart) and part.content:
                    parts.append(ContentPart(type=ContentPartType.TEXT, text=part.content))
                elif isinstance(part, ToolCallPart):
                    tool = ContentPartTool(
                        tool_call_id=part.tool_call_id,
                        name=part.tool_name,
                        params=_params(part),
                    )
                    tools[part.tool_call_id] = tool
                    parts.append(ContentPart(type=ContentPartType.TOOL, tool=tool))
        elif isinstance(message, ModelRequest):
            for request_part in message.parts:
                settled = outcome_of(request_part)
                call_id = getattr(request_part, "tool_call_id", None)
                if settled is not None and call_id in tools:
                    tools[call_id].status, tools[call_id].response = settled
    for call_id, tool in tools.items():
        if tool.status is ToolCallStatus.RUNNING and call_id in outcomes:
            tool.status, tool.response = outcomes[call_id]
    for text in [*live_text, *notes]:
        if text:
            parts.append(ContentPart(type=ContentPartType.TEXT, text=text))
    content = TEXT_PART_SEPARATOR.join(
        p.text for p in parts if p.type is ContentPartType.TEXT and p.text
    )
    return ChatMessage(sender=ChatMessageSender.BOT, content=content, content_parts=parts)


def outcome_of(part: object) -> ToolOutcome | None:
    """A tool call's result part as shown, or None for any other request part."""
    if isinstance(part, ToolReturnPart):
        status = ToolCallStatus.COMPLETED if part.outcome == "success" else ToolCallStatus.ERROR
        return status, to_jsonable_python(part.content, fallback=str)
    return None


def _params(part: ToolCallPart) -> dict[str, Any]:
    try:
        return dict(part.args_as_dict())
    except Exception:
        # Arguments the model garbled: show them as given; the run reports the error.
        return {"arguments": str(part.args)}
