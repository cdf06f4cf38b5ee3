"""What the server knows about one request: who asks, for which agent, with what."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tether.domain.chat_message import ChatMessage, ConversationContext


class RequestHeaders(BaseModel):
    """Identity as set by a trusted gateway (or taken from a verified token).

    The aliases are the HTTP header names, so ``RequestHeaders(**request.headers)``
    style construction works with ``populate_by_name``.
    """

    model_config = ConfigDict(populate_by_name=True, frozen=True)

    requester_uuid: str | None = Field(default=None, alias="requester-uuid")
    user_roles: list[str] | None = Field(default=None, alias="user-roles")
    user_tenants: list[str] | None = Field(default=None, alias="user-tenants")
    authorization: str | None = Field(default=None, alias="Authorization", repr=False)


MultitaskStrategy = Literal["reject", "enqueue", "interrupt", "rollback"]
"""What a new turn does to a conversation another turn still occupies (the
name LangGraph's users know): ``reject`` it with a 409 naming the occupant
(the seed's behaviour, the default); ``enqueue`` it (its user message is
recorded at once, marked queued, and its turn runs when the turns before it
have ended, in arrival order, on whichever replica); ``interrupt`` the
occupant (cancelled, its partial answer kept, as a cancel does) and start at
once; ``rollback``, as interrupt, and the interrupted turn's user message and
partial answer leave the transcript."""


class ChatRequest(BaseModel):
    """One turn as the handler sees it, after the HTTP layer has checked it."""

    tenant: str
    request_headers: RequestHeaders = Field(default_factory=RequestHeaders)
    agent_identifier: str
    conversation: list[ChatMessage]
    conversation_context: ConversationContext | None = None
    bot_params: dict[str, Any] | None = None
    stateful: bool = False
    session_id: str | None = None
    multitask_strategy: MultitaskStrategy = "reject"
