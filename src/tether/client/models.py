"""What the client hands back: a turn's updates, its status, conversations.

Messages and conversation summaries are tether's own domain models
(``ChatMessage``, ``ConversationSummary``, ``ConversationPage``), parsed from
the wire, so a client reads the same fields an agent writes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tether.domain.chat_conversation_store import ConversationPage, ConversationSummary
from tether.domain.chat_message import ChatMessage

__all__ = [
    "Conversation",
    "ConversationPage",
    "ConversationSummary",
    "QueuedMessage",
    "StreamStatus",
    "TurnStatus",
    "TurnUpdate",
]


@dataclass(frozen=True)
class QueuedMessage:
    """A message waiting in the conversation's queue (``multitask_strategy="enqueue"``):
    the id of the turn it will start, when it was queued, and its text."""

    message_id: str
    enqueued_at: str
    content: str

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> QueuedMessage:
        return cls(
            message_id=str(body["message_id"]),
            enqueued_at=str(body.get("enqueued_at", "")),
            content=str(body.get("content", "")),
        )


@dataclass(frozen=True)
class TurnStatus:
    """``GET /chat/stream/status``: who occupies the conversation, and its verdict
    (running, done, errored, cancelled, dead); ``queue``: the turns waiting
    after it, in the order they will run."""

    message_id: str
    status: str
    epoch: int
    heartbeat_at: str | None
    session_id: str | None = None
    queue: tuple[QueuedMessage, ...] = ()

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> TurnStatus:
        return cls(
            message_id=str(body["message_id"]),
            status=str(body["status"]),
            epoch=int(body["epoch"]),
            heartbeat_at=body.get("heartbeat_at"),
            session_id=body.get("session_id"),
            queue=tuple(QueuedMessage.from_json(entry) for entry in body.get("queue") or []),
        )

    def queue_position(self, message_id: str) -> int | None:
        """Where turn ``message_id`` waits (1: next); None when it does not."""
        for place, entry in enumerate(self.queue, start=1):
            if entry.message_id == message_id:
                return place
        return None


StreamStatus = TurnStatus
"""The old name of ``TurnStatus`` (deprecated; the TypeScript client's name is ``TurnStatus``)."""


@dataclass(frozen=True)
class TurnUpdate:
    """The whole answer so far, as one message of the turn's stream.

    ``index`` only grows over a turn, across every reconnect and takeover (it
    jumps when another replica takes the turn over); it is None only for an
    answer read from the transcript because its stream was already gone.
    """

    message: ChatMessage
    index: int | None
    event_id: str | None
    message_id: str
    session_id: str
    data: dict[str, Any] = field(repr=False)
    """The message as JSON: the whole message, also where the server sent only
    the text appended (``stream_mode=delta``)."""

    @property
    def content(self) -> str:
        return self.message.content


@dataclass(frozen=True)
class Conversation:
    """``GET /conversations/{session_id}``: the summary and the transcript."""

    summary: ConversationSummary
    messages: list[ChatMessage]

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Conversation:
        return cls(
            ConversationSummary.model_validate(body["conversation"]),
            [ChatMessage.model_validate(message) for message in body["messages"]],
        )
