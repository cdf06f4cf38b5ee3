"""A tether conversation as PydanticAI message history.

The conversation a turn is given (the stored transcript of a stateful turn, the
request's messages of a stateless one) is the truth about what was said: it
already reflects rollbacks, cancelled answers and other agents' turns. Its last
user message becomes the run's prompt and everything before it the history, so
the user's message reaches the model once.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    ModelResponsePart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)

from tether.domain.answer_text import TEXT_PART_SEPARATOR
from tether.domain.chat_message import (
    ChatMessage,
    ChatMessageSender,
    ContentPartTool,
    ContentPartType,
    ToolCallStatus,
)

NEVER_ANSWERED = (
    "No result: the answer stopped (cancelled, or its server failed) before this call "
    "completed; it may or may not have happened."
)


def history_and_prompt(conversation: Sequence[ChatMessage]) -> tuple[list[ModelMessage], str]:
    """The history before the conversation's last user message, and that message's text."""
    if not conversation or conversation[-1].sender is not ChatMessageSender.USER:
        raise ValueError("a turn's conversation ends with the user's message")
    history: list[ModelMessage] = []
    for message in conversation[:-1]:
        if message.sender is ChatMessageSender.USER:
            history.append(ModelRequest(parts=[UserPromptPart(message.content)]))
        else:
            history += _earlier_answer(message)
    return history, conversation[-1].content


def _earlier_answer(message: ChatMessage) -> list[ModelMessage]:
    """An earlier answer as the model said it: its text, and each group of tool
    calls followed by their results. A call the answer never got a result for
    is answered as such, since every model API refuses an unanswered call."""
    messages: list[ModelMessage] = []
    parts: list[ModelResponsePart] = []
    calls: list[ContentPartTool] = []
    text: list[str] = []
    for part in message.content_parts or []:
        if part.tool is not None:
            if text:
                parts.append(TextPart(TEXT_PART_SEPARATOR.join(text)))
                text = []
            parts.append(
                ToolCallPart(part.tool.name, dict(part.tool.params), part.tool.tool_call_id)
            )
            calls.append(part.tool)
        elif part.type is ContentPartType.TEXT and part.text:
            if calls:
                messages += [ModelResponse(parts=parts), _results(calls)]
                parts, calls = [], []
            text.append(part.text)
    if text:
        parts.append(TextPart(TEXT_PART_SEPARATOR.join(text)))
    if not message.content_parts and message.content:
        parts.append(TextPart(message.content))
    if parts:
        messages.append(ModelResponse(parts=parts))
    if calls:
        messages.append(_results(calls))
    return messages


def _results(calls: list[ContentPartTool]) -> ModelRequest:
    return ModelRequest(parts=[_result(call) for call in calls])


def _result(call: ContentPartTool) -> ToolReturnPart:
    if call.status is ToolCallStatus.RUNNING:
        return ToolReturnPart(call.name, NEVER_ANSWERED, call.tool_call_id, outcome="failed")
    if call.status is ToolCallStatus.ERROR:
        return ToolReturnPart(call.name, call.response, call.tool_call_id, outcome="failed")
    return ToolReturnPart(call.name, call.response, call.tool_call_id)
