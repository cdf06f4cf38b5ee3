"""How a conversation's queue is written in its transcript, and read back.

An enqueued user message is appended at once with a ``queued`` mark
(``QueuedTurn``) under the id ``<turn>-queued``; once its turn starts, the
turn appends the message again as its own (``<turn>-user``) and removes the
queued copy. So the marked messages whose turn has no user message yet are
the queue, in transcript order (``handlers.queue`` starts them), and an agent
reads the conversation without them: they are not asked yet.
"""

from __future__ import annotations

from dataclasses import dataclass

from tether.domain.chat_message import ChatMessage, QueuedTurn

QUEUED_SUFFIX = "-queued"


def queued_id(message_id: str) -> str:
    """The transcript id of turn ``message_id``'s message while it waits."""
    return f"{message_id}{QUEUED_SUFFIX}"


@dataclass(frozen=True)
class Waiting:
    """One queued message: the user's message and its mark."""

    message: ChatMessage
    mark: QueuedTurn

    @property
    def message_id(self) -> str:
        return self.mark.message_id


def waiting_in(transcript: list[ChatMessage]) -> list[Waiting]:
    """The queue, in arrival order: marked messages whose turn has not appended
    its own user message yet."""
    ids = {m.message_id for m in transcript if m.message_id and m.queued is None}
    return [
        Waiting(m, m.queued)
        for m in transcript
        if m.queued is not None
        and m.message_id == queued_id(m.queued.message_id)
        and f"{m.queued.message_id}-user" not in ids
    ]


def without_queued(transcript: list[ChatMessage]) -> list[ChatMessage]:
    """The conversation as an agent reads it: queued messages are not asked yet."""
    return [m for m in transcript if m.queued is None]
