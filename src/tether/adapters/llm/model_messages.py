"""What the model reads of a conversation: its messages as ``ModelMessage``s.

A user message is its text; an earlier answer is its text and its tool calls,
each followed by its result, as the model said and heard them. Every model API
refuses a conversation with an unanswered tool call, so a call an answer never
got a result for is answered as such.
"""

from __future__ import annotations

import json
from typing import Any

from tether.domain.answer_text import TEXT_PART_SEPARATOR
from tether.domain.chat_message import (
    ChatMessage,
    ChatMessageSender,
    ContentPartTool,
    ContentPartType,
    ToolCallStatus,
)
from tether.domain.chat_model import ModelMessage, ModelToolCall

_NEVER_ANSWERED = (
    "Error: no result: the answer stopped (cancelled, or its server failed) before this "
    "call completed; it may or may not have happened."
)


def model_prefix(conversation: list[ChatMessage], system_prompt: str | None) -> list[ModelMessage]:
    """``conversation`` as the model reads it, after the system prompt if any."""
    messages = [ModelMessage(role="system", content=system_prompt)] if system_prompt else []
    for message in conversation:
        if message.sender == ChatMessageSender.USER:
            messages.append(ModelMessage(role="user", content=message.content))
        else:
            messages += _earlier_answer(message)
    return messages


def _earlier_answer(message: ChatMessage) -> list[ModelMessage]:
    """An earlier answer as the model said it: its text, and its tool calls
    each followed by its result. A call the answer never got a result for (it
    was cancelled, or its replica died) is answered as such: every model API
    refuses a conversation with an unanswered tool call."""
    tools = [p.tool for p in message.content_parts or [] if p.tool is not None]
    if not tools:
        # An empty bot message would read as a turn to continue; it says nothing.
        return [ModelMessage(role="assistant", content=message.content)] if message.content else []
    messages: list[ModelMessage] = []
    text: list[str] = []
    calls: list[ContentPartTool] = []
    for part in message.content_parts or []:
        if part.tool is not None:
            calls.append(part.tool)
            continue
        if part.type == ContentPartType.TEXT and part.text:
            if calls:
                messages += _tool_exchange(TEXT_PART_SEPARATOR.join(text), calls)
                text, calls = [], []
            text.append(part.text)
    if calls:
        messages += _tool_exchange(TEXT_PART_SEPARATOR.join(text), calls)
        text = []
    if text:
        messages.append(ModelMessage(role="assistant", content=TEXT_PART_SEPARATOR.join(text)))
    return messages


def _tool_exchange(text: str, calls: list[ContentPartTool]) -> list[ModelMessage]:
    exchange = [
        ModelMessage(
            role="assistant",
            content=text,
            tool_calls=tuple(
                ModelToolCall(id=c.tool_call_id, name=c.name, arguments=dict(c.params))
                for c in calls
            ),
        )
    ]
    for call in calls:
        if call.status == ToolCallStatus.RUNNING:
            result = _NEVER_ANSWERED
        else:
            result = tool_result_text(call.status, call.response)
        answer = ModelMessage(
            role="tool", content=result, tool_call_id=call.tool_call_id, name=call.name
        )
        exchange.append(answer)
    return exchange


def tool_result_text(status: ToolCallStatus, response: Any) -> str:
    """A tool's result as the model reads it: its text, or its JSON."""
    text = response if isinstance(response, str) else json.dumps(response, ensure_ascii=False)
    return f"Error: {text}" if status == ToolCallStatus.ERROR else text
