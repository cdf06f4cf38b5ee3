"""``SyncTetherClient``: the asyncio ``TetherClient``'s twin for blocking code.

    with SyncTetherClient("http://lb:8000", tenant="acme", requester_uuid="alice") as client:
        for update in client.stream(agent_identifier="assistant", message="Hi"):
            print(update.content)

Every call runs the async client on a private event loop (``Portal``), so
both behave the same, recovery included.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any

import httpx2

from tether.client._portal import Portal
from tether.client.async_client import (
    DEFAULT_RECOVERY_TIMEOUT,
    DEFAULT_STREAM_READ_TIMEOUT,
    DEFAULT_TIMEOUT,
    TetherClient,
)
from tether.client.endpoints import Endpoints
from tether.client.models import (
    Conversation,
    ConversationPage,
    ConversationSummary,
    TurnStatus,
    TurnUpdate,
)
from tether.client.observer import Connection, TurnObserver
from tether.client.turn import Dropped, Turn
from tether.client.turn_events import TurnEvent
from tether.domain.chat_message import ChatMessage
from tether.domain.chat_request import MultitaskStrategy


class SyncTurn:
    """``Turn`` for blocking code: iterate it for the answer so far."""

    def __init__(self, portal: Portal, turn: Turn) -> None:
        self._portal = portal
        self._turn = turn

    def __iter__(self) -> Iterator[TurnUpdate]:
        return self

    def __next__(self) -> TurnUpdate:
        try:
            return self._portal.call(self._turn.__anext__())
        except StopAsyncIteration:
            raise StopIteration from None

    def start(self) -> SyncTurn:
        """Send the turn and return once a replica started or queued it."""
        self._portal.call(self._turn.start())
        return self

    def answer(self) -> TurnUpdate | None:
        """Read the turn to its end; its final answer."""
        return self._portal.call(self._turn.answer())

    def events(self) -> Iterator[TurnEvent]:
        """See ``Turn.events``: everything that happens to the turn, in order."""
        events = self._turn.events()

        async def next_event() -> TurnEvent:
            return await events.__anext__()

        try:
            while True:
                try:
                    yield self._portal.call(next_event())
                except StopAsyncIteration:
                    return
        finally:
            with contextlib.suppress(RuntimeError):  # the client is closed
                self._portal.call(events.aclose())

    def cancel(self) -> bool:
        """See ``Turn.cancel``."""
        return self._portal.call(self._turn.cancel())

    def close(self) -> None:
        """Hang up; the turn goes on on the server."""
        self._portal.call(self._turn.aclose())

    def __enter__(self) -> SyncTurn:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def session_id(self) -> str:
        return self._turn.session_id

    @property
    def message_id(self) -> str | None:
        return self._turn.message_id

    @property
    def queued(self) -> bool:
        return self._turn.queued

    @property
    def queue_position(self) -> int | None:
        return self._turn.queue_position

    @property
    def latest(self) -> TurnUpdate | None:
        return self._turn.latest

    @property
    def message(self) -> ChatMessage | None:
        return self._turn.message

    @property
    def last_event_id(self) -> str | None:
        return self._turn.last_event_id

    @property
    def dropped(self) -> Dropped:
        return self._turn.dropped

    @property
    def url(self) -> str | None:
        return self._turn.url

    @property
    def outcome(self) -> str | None:
        return self._turn.outcome

    @property
    def path(self) -> list[str]:
        return self._turn.path

    @property
    def connections(self) -> list[Connection]:
        return self._turn.connections

    @property
    def recovered(self) -> bool:
        return self._turn.recovered


class SyncTetherClient:
    """The blocking twin of ``TetherClient``: the same arguments, the same
    methods without ``await``. Close it (or use ``with``) to stop its loop."""

    def __init__(
        self,
        base_url: str | Sequence[str] | Endpoints,
        *,
        tenant: str,
        requester_uuid: str | None = None,
        token: str | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        stream_read_timeout: float = DEFAULT_STREAM_READ_TIMEOUT,
        recovery_timeout: float = DEFAULT_RECOVERY_TIMEOUT,
        transport: httpx2.AsyncBaseTransport | None = None,
    ) -> None:
        self._portal = Portal()

        async def build() -> TetherClient:
            # Made on the portal's loop, where all of its I/O runs.
            return TetherClient(
                base_url,
                tenant=tenant,
                requester_uuid=requester_uuid,
                token=token,
                headers=headers,
                timeout=timeout,
                stream_read_timeout=stream_read_timeout,
                recovery_timeout=recovery_timeout,
                transport=transport,
            )

        try:
            self._client = self._portal.call(build())
        except BaseException:
            self._portal.close()
            raise

    @property
    def tenant(self) -> str:
        return self._client.tenant

    def close(self) -> None:
        self._portal.call(self._client.aclose())
        self._portal.close()

    def __enter__(self) -> SyncTetherClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def stream(
        self,
        *,
        agent_identifier: str,
        message: str | ChatMessage,
        session_id: str | None = None,
        stateful: bool = True,
        bot_params: dict[str, Any] | None = None,
        conversation_context: dict[str, Any] | None = None,
        multitask_strategy: MultitaskStrategy = "reject",
        observer: TurnObserver | None = None,
    ) -> SyncTurn:
        """See ``TetherClient.stream``."""
        turn = self._client.stream(
            agent_identifier=agent_identifier,
            message=message,
            session_id=session_id,
            stateful=stateful,
            bot_params=bot_params,
            conversation_context=conversation_context,
            multitask_strategy=multitask_strategy,
            observer=observer,
        )
        return SyncTurn(self._portal, turn)

    def start_turn(
        self,
        *,
        agent_identifier: str,
        message: str | ChatMessage,
        session_id: str | None = None,
        stateful: bool = True,
        bot_params: dict[str, Any] | None = None,
        conversation_context: dict[str, Any] | None = None,
        multitask_strategy: MultitaskStrategy = "reject",
        observer: TurnObserver | None = None,
    ) -> SyncTurn:
        """See ``TetherClient.start_turn``: the turn, once a replica started or queued it."""
        return self.stream(
            agent_identifier=agent_identifier,
            message=message,
            session_id=session_id,
            stateful=stateful,
            bot_params=bot_params,
            conversation_context=conversation_context,
            multitask_strategy=multitask_strategy,
            observer=observer,
        ).start()

    def follow(
        self,
        session_id: str,
        message_id: str,
        *,
        last_event_id: str | None = None,
        agent_identifier: str | None = None,
        observer: TurnObserver | None = None,
    ) -> SyncTurn:
        """See ``TetherClient.follow``."""
        turn = self._client.follow(
            session_id,
            message_id,
            last_event_id=last_event_id,
            agent_identifier=agent_identifier,
            observer=observer,
        )
        return SyncTurn(self._portal, turn)

    def status(self, session_id: str) -> TurnStatus | None:
        """See ``TetherClient.status``."""
        return self._portal.call(self._client.status(session_id))

    def cancel(self, session_id: str | None, message_id: str) -> bool:
        """See ``TetherClient.cancel``: the conversation first, then the turn."""
        return self._portal.call(self._client.cancel(session_id, message_id))

    def list_conversations(self, *, limit: int = 50, cursor: str | None = None) -> ConversationPage:
        return self._portal.call(self._client.list_conversations(limit=limit, cursor=cursor))

    def conversations(self, *, page_size: int = 50) -> Iterator[ConversationSummary]:
        cursor: str | None = None
        while True:
            page = self.list_conversations(limit=page_size, cursor=cursor)
            yield from page.items
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def get_conversation(self, session_id: str) -> Conversation:
        return self._portal.call(self._client.get_conversation(session_id))

    def share_conversation(self, session_id: str, shared: bool = True) -> ConversationSummary:
        return self._portal.call(self._client.share_conversation(session_id, shared))

    def delete_conversation(self, session_id: str) -> None:
        self._portal.call(self._client.delete_conversation(session_id))


SyncTurnStream = SyncTurn
"""The old name of ``SyncTurn`` (deprecated)."""
