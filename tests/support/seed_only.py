"""Third-party adapters as the seed's interface allows them: the required
(abstract) methods of each store port and nothing more, kept in memory.

Every optional method is the port's default, so these stores declare no
capability (``tether.domain.capabilities``): what the runtime does without
each one is tested against them.
"""

from __future__ import annotations

from typing import Any

from tether.adapters.memory import (
    InMemoryChatAgentStateStore,
    InMemoryChatConversationStore,
    InMemoryChatStreamRecordingStore,
    InMemoryChatStreamSupervisionStore,
)
from tether.domain.chat_agent_state_store import ChatAgentStateStore, DependencyState
from tether.domain.chat_conversation_store import ChatConversationStore
from tether.domain.chat_message import ChatMessage
from tether.domain.chat_stream_recording_store import (
    ChatStreamRecordingStore,
    RecordedStreamEvent,
)
from tether.domain.chat_stream_supervision_store import (
    ChatStreamSupervision,
    ChatStreamSupervisionStore,
)


class SeedOnlyAgentStateStore(ChatAgentStateStore):
    """``load``, ``save`` and ``delete`` only."""

    def __init__(self) -> None:
        self._inner = InMemoryChatAgentStateStore()

    async def load(self, tenant: str, user_uuid: str | None, session_id: str) -> DependencyState:
        return await self._inner.load(tenant, user_uuid, session_id)

    async def save(
        self, tenant: str, user_uuid: str | None, session_id: str, state: DependencyState
    ) -> None:
        await self._inner.save(tenant, user_uuid, session_id, state)

    async def delete(self, tenant: str, user_uuid: str | None, session_id: str) -> None:
        await self._inner.delete(tenant, user_uuid, session_id)


class SeedOnlyRecordingStore(ChatStreamRecordingStore):
    """``put``, ``read`` and ``delete`` only."""

    def __init__(self) -> None:
        self._inner = InMemoryChatStreamRecordingStore()

    async def put(
        self, tenant: str, requester_uuid: str | None, session_id: str, event: RecordedStreamEvent
    ) -> None:
        await self._inner.put(tenant, requester_uuid, session_id, event)

    async def read(
        self, tenant: str, requester_uuid: str | None, session_id: str
    ) -> RecordedStreamEvent | None:
        return await self._inner.read(tenant, requester_uuid, session_id)

    async def delete(
        self, tenant: str, requester_uuid: str | None, session_id: str, message_id: str
    ) -> None:
        await self._inner.delete(tenant, requester_uuid, session_id, message_id)


class SeedOnlySupervisionStore(ChatStreamSupervisionStore):
    """``compare_and_swap``, ``read`` and ``delete`` only."""

    def __init__(self) -> None:
        self._inner = InMemoryChatStreamSupervisionStore()

    async def compare_and_swap(
        self,
        tenant: str,
        requester_uuid: str | None,
        session_id: str,
        expected_epoch: int | None,
        supervision: ChatStreamSupervision,
    ) -> bool:
        return await self._inner.compare_and_swap(
            tenant, requester_uuid, session_id, expected_epoch, supervision
        )

    async def read(
        self, tenant: str, requester_uuid: str | None, session_id: str
    ) -> ChatStreamSupervision | None:
        return await self._inner.read(tenant, requester_uuid, session_id)

    async def delete(
        self, tenant: str, requester_uuid: str | None, session_id: str, message_id: str, epoch: int
    ) -> None:
        await self._inner.delete(tenant, requester_uuid, session_id, message_id, epoch)


class SeedOnlyConversationStore(ChatConversationStore):
    """``append_messages``, ``set_last_turn_status`` and ``get_transcript`` only."""

    def __init__(self) -> None:
        self._inner = InMemoryChatConversationStore()

    async def append_messages(self, *args: Any, **kwargs: Any) -> None:
        await self._inner.append_messages(*args, **kwargs)

    async def set_last_turn_status(self, *args: Any, **kwargs: Any) -> None:
        await self._inner.set_last_turn_status(*args, **kwargs)

    async def get_transcript(
        self, tenant: str, requester_uuid: str | None, session_id: str
    ) -> list[ChatMessage]:
        return await self._inner.get_transcript(tenant, requester_uuid, session_id)
