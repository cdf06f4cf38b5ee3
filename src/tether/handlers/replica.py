"""What the conversation's verbs ask of the replica they run on.

The queue (``handlers.queue``), the cancel (``handlers.cancel``) and the
automatic takeover (``handlers.takeover``) each act on a conversation for
the replica: they read its stores, start a turn through it, end a dead one.
``ChatHandler`` is that replica, and it holds each of them, so they name it
by what they use (``Replica``, ``ConversationQueue``), never by its class:
the handler layer imports downwards only, and a newcomer reads here the
whole of what a verb may do to the replica.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Protocol

from tether.domain.agent_setup import AgentSetup
from tether.domain.chat_request import ChatRequest
from tether.domain.chat_stream_supervision_store import ChatStreamSupervision
from tether.domain.queued_messages import Waiting
from tether.handlers.endings import TurnEndings
from tether.metrics import TetherMetrics
from tether.runtime.lease import ConversationKey, Lease
from tether.runtime.live_buffer import StreamEnd, StreamEvent
from tether.runtime.presence import ReplicaPresence
from tether.runtime.turn_stores import TurnStores
from tether.settings import TetherSettings

if TYPE_CHECKING:
    from tether.handlers.turn import Turn

AttachLater = Callable[[int], Awaitable[AsyncIterator[StreamEvent | StreamEnd]]]
"""How ``follow_when_started`` attaches once the turn runs: the handler's own
attach from a start index, the reader's identity bound."""


class ConversationQueue(Protocol):
    """What the cancel, the takeover and the readers ask of the conversations'
    queue (``handlers.queue.TurnQueue``)."""

    async def is_waiting(self, key: ConversationKey, message_id: str) -> bool: ...

    async def has_copy(self, key: ConversationKey, message_id: str) -> bool: ...

    async def remove(self, key: ConversationKey, message_id: str, epoch: int) -> bool: ...

    async def take_out(self, key: ConversationKey, message_id: str, epoch: int) -> bool: ...

    async def epoch_and_row(
        self, key: ConversationKey
    ) -> tuple[int, ChatStreamSupervision | None]: ...

    async def start_handed_off(self, key: ConversationKey, message_id: str) -> bool: ...

    async def waiting(self, key: ConversationKey) -> list[Waiting]: ...

    async def kick(self, key: ConversationKey) -> str | None: ...

    def follow_when_started(
        self,
        key: ConversationKey,
        message_id: str,
        attach: AttachLater,
        start_index: int,
    ) -> AsyncIterator[StreamEvent | StreamEnd]: ...


class Replica(Protocol):
    """The replica a verb runs on (``handlers.chat_handler.ChatHandler``)."""

    stores: TurnStores
    settings: TetherSettings
    clock: Callable[[], datetime]
    monotonic: Callable[[], float]
    dead_after: timedelta
    metrics: TetherMetrics
    presence: ReplicaPresence
    draining: bool

    @property
    def queue(self) -> ConversationQueue: ...

    @property
    def endings(self) -> TurnEndings: ...

    # ---------------------------------------------------------------- turns

    async def start_turn(
        self,
        request: ChatRequest,
        *,
        resume_message_id: str | None = None,
        automatic: bool = False,
        dequeue: str | None = None,
    ) -> Turn: ...

    async def check_request(
        self, request: ChatRequest, *, resuming: bool = False
    ) -> AgentSetup: ...

    def conversation_key(self, request: ChatRequest) -> ConversationKey: ...

    async def check_writer(self, key: ConversationKey) -> None: ...

    async def grant(self, key: ConversationKey, message_id: str) -> Lease: ...

    def reads_dead(self, row: ChatStreamSupervision) -> bool: ...

    # ---------------------------------------------------------------- ends

    async def cancel(
        self,
        tenant: str,
        requester_uuid: str | None,
        session_id: str | None,
        message_id: str,
        *,
        kick: bool = True,
    ) -> None: ...

    async def erase(self, tenant: str, requester_uuid: str | None, session_id: str) -> bool: ...
