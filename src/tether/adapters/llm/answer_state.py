"""The checkpointed progress of a ``ChatClient``'s answer: what the model said,
which tools it asked for and what they returned, and the answer as shown.

``ChatClient.dump`` is its ``model_dump``, and a resumed turn's client
validates it back (``ChatClient.load``): its fields are what a checkpoint holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field

from tether.adapters.llm.model_messages import tool_result_text
from tether.domain.answer_text import TEXT_PART_SEPARATOR
from tether.domain.chat_message import (
    ChatMessage,
    ChatMessageSender,
    ContentPart,
    ContentPartTool,
    ContentPartType,
    ToolCallStatus,
)
from tether.domain.chat_model import ModelMessage, ModelRole, ModelToolCall
from tether.tools import MalformedToolCall


class ToolCallState(BaseModel):
    """A tool call the model asked for, as a checkpoint holds it."""

    id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    # Kept so a malformed call restored from a checkpoint is still reported as one.
    arguments_error: str | None = None
    raw_arguments: str | None = None

    @classmethod
    def of(cls, call: ModelToolCall) -> ToolCallState:
        if isinstance(call, MalformedToolCall):
            return cls(
                id=call.id,
                name=call.name,
                arguments=dict(call.arguments),
                arguments_error=call.error,
                raw_arguments=call.raw_arguments,
            )
        return cls(id=call.id, name=call.name, arguments=dict(call.arguments))

    def call(self) -> ModelToolCall:
        if self.arguments_error is not None:
            return MalformedToolCall(
                id=self.id,
                name=self.name,
                arguments=self.arguments,
                raw_arguments=self.raw_arguments or "",
                error=self.arguments_error,
            )
        return ModelToolCall(id=self.id, name=self.name, arguments=self.arguments)


class MessageState(BaseModel):
    """A model message of the answer, as a checkpoint holds it."""

    role: ModelRole
    content: str = ""
    tool_calls: list[ToolCallState] = Field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None

    def message(self) -> ModelMessage:
        return ModelMessage(
            role=self.role,
            content=self.content,
            tool_calls=tuple(call.call() for call in self.tool_calls),
            tool_call_id=self.tool_call_id,
            name=self.name,
        )


class AnswerState(BaseModel):
    """The checkpointed progress of one turn.

    ``transcript``: the model messages this turn produced (assistant messages that
    asked for tools, and the tools' results). ``partial_text``: what the model has
    said in the response in progress. ``content_parts``: the answer as shown.
    ``content`` is the answer's text, kept for readers of a checkpoint; the parts are
    what is restored.
    """

    version: Literal[1] = 1
    transcript: list[MessageState] = Field(default_factory=list)
    started: dict[str, int] = Field(default_factory=dict)
    """Tool call id to the attempts started; a call started and not answered in
    ``transcript`` has an unknown outcome."""
    partial_text: str = ""
    content: str = ""
    content_parts: list[ContentPart] = Field(default_factory=list)
    finished: bool = False
    turn_key: str | None = None
    """The idempotency keys' prefix of the turn this answer belongs to."""
    first_call_index: int = 0
    """The index of this answer's first tool call among all the turn's calls:
    an agent may ask for several answers in one turn (``stream`` twice), and
    their calls' keys must not repeat."""

    def next_answer(self, turn_key: str) -> AnswerState:
        """A new answer's state: its calls numbered after this one's when both
        belong to the same turn, from 0 in a new turn."""
        if turn_key != self.turn_key:
            return AnswerState(turn_key=turn_key)
        return AnswerState(turn_key=turn_key, first_call_index=self.first_call_index + self.calls())

    def calls(self) -> int:
        """How many tool calls this answer asked for."""
        return sum(len(m.tool_calls) for m in self.transcript if m.role == "assistant")

    def model_messages(self) -> list[ModelMessage]:
        messages = [message.message() for message in self.transcript]
        if self.partial_text:
            # A resumed response: the model is asked to continue this text.
            messages.append(ModelMessage(role="assistant", content=self.partial_text))
        return messages

    def tool_rounds(self) -> int:
        return sum(1 for m in self.transcript if m.role == "assistant" and m.tool_calls)

    def add_text(self, text: str) -> None:
        if self.partial_text and self.content_parts:
            part = self.content_parts[-1]
            part.text = (part.text or "") + text
        else:
            self.content_parts.append(ContentPart(type=ContentPartType.TEXT, text=text))
        self.partial_text += text
        self._refresh_content()

    def text_beyond(self, shown: Sequence[ContentPart]) -> str:
        """The text ``shown`` has past this state's answer, when that is all it
        has past it: the same parts, with the response in progress longer, or
        one more text part (a response begun after the last tool call). ``""``
        otherwise."""
        parts = self.content_parts
        if self.partial_text and parts and parts[-1].type is ContentPartType.TEXT:
            if len(shown) != len(parts) or list(shown[:-1]) != parts[:-1]:
                return ""
            said, mine = shown[-1].text or "", parts[-1].text or ""
            if shown[-1].type is not ContentPartType.TEXT or not said.startswith(mine):
                return ""
            return said[len(mine) :]
        if len(shown) != len(parts) + 1 or list(shown[:-1]) != parts:
            return ""
        return (shown[-1].text or "") if shown[-1].type is ContentPartType.TEXT else ""

    def add_note(self, text: str) -> None:
        self.content_parts.append(ContentPart(type=ContentPartType.TEXT, text=text))
        self._refresh_content()

    def request_tools(self, calls: Sequence[ModelToolCall]) -> None:
        # The response is complete, so its text moves into the transcript with the
        # calls; the next response starts a new text part.
        self.transcript.append(
            MessageState(
                role="assistant",
                content=self.partial_text,
                tool_calls=[ToolCallState.of(call) for call in calls],
            )
        )
        self.partial_text = ""
        for call in calls:
            self.content_parts.append(
                ContentPart(
                    type=ContentPartType.TOOL,
                    tool=ContentPartTool(
                        tool_call_id=call.id, name=call.name, params=dict(call.arguments)
                    ),
                )
            )

    def pending_tool_calls(self) -> list[ModelToolCall]:
        """Calls of the latest tool request that have no result yet."""
        for index in range(len(self.transcript) - 1, -1, -1):
            message = self.transcript[index]
            if message.role == "assistant" and message.tool_calls:
                answered = {m.tool_call_id for m in self.transcript[index + 1 :]}
                return [c.call() for c in message.tool_calls if c.id not in answered]
        return []

    def call_index(self, call_id: str) -> int:
        """The call's place among every tool call of the turn (0 for the first)."""
        calls = [c.id for m in self.transcript if m.role == "assistant" for c in m.tool_calls]
        return calls.index(call_id) if call_id in calls else len(calls)

    def close_pending(self, reason: str) -> None:
        """Answer every call still without a result with ``reason`` (an error):
        every model API refuses a conversation with an unanswered tool call."""
        for call in self.pending_tool_calls():
            self.complete_tool(call.id, ToolCallStatus.ERROR, reason)

    def complete_tool(self, call_id: str, status: ToolCallStatus, response: Any) -> None:
        name = ""
        for part in self.content_parts:
            if part.tool is not None and part.tool.tool_call_id == call_id:
                part.tool.status = status
                part.tool.response = response
                name = part.tool.name
        self.transcript.append(
            MessageState(
                role="tool",
                content=tool_result_text(status, response),
                tool_call_id=call_id,
                name=name or None,
            )
        )

    def message(self) -> ChatMessage:
        # Called for every streamed chunk, so the copy is kept cheap: a text part
        # is only ever changed by assigning a new string, so a shallow copy keeps
        # the message already published intact; tool parts change in place.
        return ChatMessage(
            sender=ChatMessageSender.BOT,
            content=self.content,
            content_parts=[
                part.model_copy(deep=part.type is not ContentPartType.TEXT)
                for part in self.content_parts
            ],
        )

    def _refresh_content(self) -> None:
        self.content = TEXT_PART_SEPARATOR.join(
            part.text
            for part in self.content_parts
            if part.type == ContentPartType.TEXT and part.text
        )
