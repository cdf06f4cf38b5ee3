"""Request and response bodies of the HTTP API."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from tether.api.ids import ID_PATTERN, MAX_ID_LENGTH
from tether.domain.chat_message import ChatMessage, ConversationContext
from tether.domain.chat_request import MultitaskStrategy
from tether.domain.safe_text import find_unsafe, shown_path

UNSAFE_TEXT = "unsafe_text"
"""The pydantic error type of ``RequestBody``'s refusal; its context names the field."""


class RequestBody(BaseModel):
    """A JSON body a client sends. Before any field is validated, the whole raw
    document is checked once: every string and key valid Unicode without NUL
    (PostgreSQL cannot store either, so no backend may), nesting at most
    ``safe_text.MAX_DEPTH`` deep. Every request model derives from this, so no
    route can take a body that skips it."""

    @model_validator(mode="before")
    @classmethod
    def _refuse_unsafe_text(cls, data: Any) -> Any:
        unsafe = find_unsafe(data)
        if unsafe is not None:
            field = shown_path(unsafe.path)
            raise PydanticCustomError(
                UNSAFE_TEXT,
                "{field} {reason}",
                {"field": field or "body", "reason": unsafe.reason, "path": field},
            )
        return data


class ChatResponseForm(RequestBody):
    """The body of a turn. The server assigns the turn's ``message_id``."""

    model_config = ConfigDict(extra="forbid")

    agent_identifier: str = Field(min_length=1, max_length=MAX_ID_LENGTH)
    conversation: list[ChatMessage] = Field(default_factory=list)
    conversation_context: ConversationContext | None = None
    bot_params: dict[str, Any] | None = None
    stateful: bool = False
    session_id: str | None = Field(
        default=None, min_length=1, max_length=MAX_ID_LENGTH, pattern=ID_PATTERN
    )
    multitask_strategy: MultitaskStrategy = Field(
        default="reject",
        description="When another turn occupies the conversation: reject (409), "
        "enqueue (run after it, in arrival order; 202 with the queued turn's id), "
        "interrupt it, or roll it back (interrupt, and remove it from the transcript)",
    )


class ChatResponseBody(ChatMessage):
    """The answer of ``POST /chat/response``: the SDK's shape, the request with
    the bot's message appended to ``conversation``, and that message's fields
    at the top level too (tether's own clients read them there)."""

    agent_identifier: str
    conversation: list[ChatMessage]
    conversation_context: ConversationContext | None = None
    bot_params: dict[str, Any] | None = None


class BusyDetail(BaseModel):
    """Who occupies a busy conversation (a 409's ``detail``, as the SDK reads it)."""

    session_id: str | None = None
    message_id: str


class ErrorBody(BaseModel):
    code: str
    message: str
    detail: str | BusyDetail | None = None
    message_id: str | None = None


class ValidationErrorBody(BaseModel):
    """A 422: the request did not validate. ``field`` is where (``body.conversation.0.content``,
    ``query.start_index``, ``header.Last-Event-ID``); the rejected value is never echoed."""

    code: str = Field(description="INVALID_REQUEST")
    message: str
    field: str
    detail: str | None = None


class QueuedTurnBody(BaseModel):
    message_id: str
    enqueued_at: str
    content: str = ""


class StreamStatusBody(BaseModel):
    session_id: str
    message_id: str
    status: str = Field(description="running, done, errored, cancelled or dead")
    epoch: int
    heartbeat_at: str | None = None
    queue: list[QueuedTurnBody] = Field(
        default_factory=list,
        description="the turns waiting after this one (multitask_strategy=enqueue), "
        "in the order they will run",
    )
