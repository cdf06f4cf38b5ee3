"""The message model every layer speaks: what a user sends and what an agent answers.

A bot message is always *cumulative*: each one an agent yields, and each one the
stream carries, holds the whole answer so far, never a delta. That is what lets a
recording keep only the newest message and lets a client join mid-turn.
"""

from __future__ import annotations

import logging
from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tether.domain.safe_text import repair_surrogates

logger = logging.getLogger(__name__)


class ChatMessageSender(StrEnum):
    USER = "user"
    BOT = "bot"


class ContentPartType(StrEnum):
    TEXT = "text"
    TOOL = "tool"
    TABLE = "table"
    CONTEXT = "context"


class ToolCallStatus(StrEnum):
    RUNNING = "running"
    COMPLETED = "completed"
    ERROR = "error"


class ContentPartTool(BaseModel):
    """One tool call as the user sees it: shown running, then completed or error."""

    tool_call_id: str
    name: str
    params: dict[str, Any] = Field(default_factory=dict)
    response: Any = None
    status: ToolCallStatus = ToolCallStatus.RUNNING


class ContentPartTable(BaseModel):
    headers: list[str] = Field(default_factory=list)
    rows: list[list[Any]] = Field(default_factory=list)


class ContentPart(BaseModel):
    """A typed piece of a message; exactly the field named by ``type`` is set."""

    type: ContentPartType
    text: str | None = None
    tool: ContentPartTool | None = None
    table: ContentPartTable | None = None
    context: dict[str, Any] | None = None


class FunctionCallRequest(BaseModel):
    name: str
    params: dict[str, Any] = Field(default_factory=dict)


class FunctionCallResponse(BaseModel):
    name: str
    response: Any = None


class QueuedTurn(BaseModel):
    """The mark of a user message waiting in its conversation's queue
    (``multitask_strategy="enqueue"``): the turn it will start, in arrival
    order, when the turns before it have ended, with what that turn needs to
    run on any replica. The message leaves the queue (and this mark the
    transcript) when its turn starts or is cancelled."""

    message_id: str
    agent_identifier: str
    enqueued_at: datetime
    bot_params: dict[str, Any] | None = None
    user_roles: list[str] | None = None
    user_tenants: list[str] | None = None


class ChatMessage(BaseModel):
    """A user or bot message in a conversation."""

    model_config = ConfigDict(use_enum_values=False)

    sender: ChatMessageSender
    content: str = ""
    content_parts: list[ContentPart] | None = None
    message_id: str | None = None
    session_id: str | None = None
    function_call_request: FunctionCallRequest | None = None
    function_call_response: FunctionCallResponse | None = None
    custom_input: dict[str, Any] | None = None
    queued: QueuedTurn | None = Field(
        default=None,
        description="set while the message waits for the turns before it "
        "(multitask_strategy=enqueue); the server sets it, never a client",
    )

    @model_validator(mode="before")
    @classmethod
    def _repair_lone_surrogates(cls, data: Any) -> Any:
        # The API refuses lone surrogates (tether.api.forms), but SQLite and the
        # file store kept those an older version let in, and an agent may yield
        # one: no response can encode it, so it is read as U+FFFD instead.
        if not isinstance(data, dict):
            return data
        repaired, count = repair_surrogates(data)
        if count:
            logger.warning(
                "a %s message (message_id %s) held %d strings with lone UTF-16 "
                "surrogates; replaced by U+FFFD",
                data.get("sender"),
                ascii(data.get("message_id")),
                count,
            )
        return repaired


class ConversationContext(BaseModel):
    """Context a client attaches to a conversation (documents, custom fields).

    Free-form by design: agents read what they understand and ignore the rest.
    """

    model_config = ConfigDict(extra="allow")

    document_context: dict[str, Any] | None = None
    custom_context: dict[str, Any] | None = None
