"""The ``ChatStreamRecordingStore`` contract, as tests your adapter inherits.

Subclass the contract in a test module and override the ``store`` fixture::

    import pytest
    from tether.testing.contracts import ChatStreamRecordingStoreContract

    class TestMyRecordingStore(ChatStreamRecordingStoreContract):
        @pytest.fixture
        def store(self):
            return MyRecordingStore(...)

Every test works under fresh random ids, so one store may serve many tests. For
a backend shared between processes, also run
``ChatStreamRecordingCrossProcessContract``.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any, ClassVar

import pytest

from tether.domain.capabilities import Capability
from tether.domain.chat_message import (
    ChatMessage,
    ChatMessageSender,
    ContentPart,
    ContentPartTable,
    ContentPartTool,
    ContentPartType,
    FunctionCallRequest,
    ToolCallStatus,
)
from tether.domain.chat_stream_recording_store import (
    ChatStreamRecordingStore,
    RecordedStreamEvent,
    RecordingFencedError,
    RecordingPut,
)
from tether.testing.contracts._support import TRICKY_IDS, exercises, unique


def _event(epoch: int, index: int = 0, message_id: str = "m-1") -> RecordedStreamEvent:
    return RecordedStreamEvent(
        index=index,
        message=ChatMessage(
            sender=ChatMessageSender.BOT,
            content=f"epoch {epoch} index {index}",
            message_id=message_id,
        ),
        message_id=message_id,
        epoch=epoch,
    )


def _rich_event() -> RecordedStreamEvent:
    tool = ContentPartTool(
        tool_call_id="call-1",
        name="search",
        params={"query": "ünïcødé", "limit": 3},
        response={"hits": [{"title": "会話", "score": 0.5}]},
        status=ToolCallStatus.COMPLETED,
    )
    message = ChatMessage(
        sender=ChatMessageSender.BOT,
        content="Found it 🙂\nsecond line",
        content_parts=[
            ContentPart(type=ContentPartType.TEXT, text="Found it"),
            ContentPart(type=ContentPartType.TOOL, tool=tool),
            ContentPart(
                type=ContentPartType.TABLE,
                table=ContentPartTable(headers=["a", "b"], rows=[[1, "x"], [2, None]]),
            ),
            ContentPart(type=ContentPartType.CONTEXT, context={"doc": {"id": 7}}),
        ],
        message_id="m-rich",
        session_id="session",
        function_call_request=FunctionCallRequest(name="search", params={"q": "x"}),
        custom_input={"nested": [1, {"deep": True}]},
    )
    return RecordedStreamEvent(index=41, message=message, message_id="m-rich", epoch=3)


class ChatStreamRecordingStoreContract:
    """One overwritten record per conversation, fenced by epoch; copies in and out."""

    pytestmark: ClassVar[list[Any]] = [pytest.mark.asyncio]
    tricky_ids: ClassVar[tuple[str, ...]] = TRICKY_IDS

    @pytest.fixture
    def store(self) -> ChatStreamRecordingStore:
        """Override: the store under test."""
        raise NotImplementedError("override the `store` fixture with your adapter")

    @pytest.fixture
    def tenant(self) -> str:
        return unique("tenant")

    async def test_read_returns_none_when_nothing_is_recorded(
        self, store: ChatStreamRecordingStore, tenant: str
    ) -> None:
        assert await store.read(tenant, "user", "session") is None

    async def test_put_then_read_returns_the_event(
        self, store: ChatStreamRecordingStore, tenant: str
    ) -> None:
        await store.put(tenant, "user", "session", _event(1))
        assert await store.read(tenant, "user", "session") == _event(1)

    async def test_a_rich_cumulative_message_round_trips(
        self, store: ChatStreamRecordingStore, tenant: str
    ) -> None:
        await store.put(tenant, "user", "session", _rich_event())
        assert await store.read(tenant, "user", "session") == _rich_event()

    async def test_put_at_the_same_epoch_overwrites(
        self, store: ChatStreamRecordingStore, tenant: str
    ) -> None:
        await store.put(tenant, "user", "session", _event(2, index=1))
        await store.put(tenant, "user", "session", _event(2, index=2))
        assert await store.read(tenant, "user", "session") == _event(2, index=2)

    async def test_put_at_a_higher_epoch_overwrites(
        self, store: ChatStreamRecordingStore, tenant: str
    ) -> None:
        await store.put(tenant, "user", "session", _event(2, index=5))
        await store.put(tenant, "user", "session", _event(3, index=6, message_id="m-2"))
        assert await store.read(tenant, "user", "session") == _event(3, 6, "m-2")

    @pytest.mark.parametrize("lower", [0, 1, 2])
    async def test_put_below_the_stored_epoch_is_fenced_and_changes_nothing(
        self, store: ChatStreamRecordingStore, tenant: str, lower: int
    ) -> None:
        await store.put(tenant, "user", "session", _event(3, index=4))
        with pytest.raises(RecordingFencedError):
            await store.put(tenant, "user", "session", _event(lower, index=9))
        assert await store.read(tenant, "user", "session") == _event(3, index=4)

    async def test_after_delete_the_same_epoch_may_record_again(
        self, store: ChatStreamRecordingStore, tenant: str
    ) -> None:
        await store.put(tenant, "user", "session", _event(5, message_id="m-5"))
        await store.delete(tenant, "user", "session", "m-5")
        await store.put(tenant, "user", "session", _event(5, message_id="m-6"))
        assert await store.read(tenant, "user", "session") == _event(5, message_id="m-6")

    async def test_delete_removes_the_record_of_its_message(
        self, store: ChatStreamRecordingStore, tenant: str
    ) -> None:
        await store.put(tenant, "user", "session", _event(1))
        await store.delete(tenant, "user", "session", "m-1")
        assert await store.read(tenant, "user", "session") is None

    async def test_delete_leaves_a_record_of_another_message(
        self, store: ChatStreamRecordingStore, tenant: str
    ) -> None:
        await store.put(tenant, "user", "session", _event(2, message_id="m-new"))
        await store.delete(tenant, "user", "session", "m-old")
        assert await store.read(tenant, "user", "session") == _event(2, message_id="m-new")

    async def test_delete_is_a_no_op_when_nothing_is_recorded(
        self, store: ChatStreamRecordingStore, tenant: str
    ) -> None:
        await store.delete(tenant, "user", "session", "m-1")
        assert await store.read(tenant, "user", "session") is None

    async def test_read_returns_a_copy(self, store: ChatStreamRecordingStore, tenant: str) -> None:
        await store.put(tenant, "user", "session", _rich_event())
        stored = await store.read(tenant, "user", "session")
        assert stored is not None
        stored.message.content = "mutated"
        assert stored.message.content_parts is not None
        stored.message.content_parts.clear()
        stored.epoch = 0
        assert await store.read(tenant, "user", "session") == _rich_event()

    async def test_the_store_keeps_a_copy_of_what_it_writes(
        self, store: ChatStreamRecordingStore, tenant: str
    ) -> None:
        event = _rich_event()
        await store.put(tenant, "user", "session", event)
        event.message.content = "mutated"
        assert event.message.content_parts is not None
        event.message.content_parts.pop()
        assert await store.read(tenant, "user", "session") == _rich_event()

    async def test_same_session_id_in_two_tenants_or_users_does_not_collide(
        self, store: ChatStreamRecordingStore, tenant: str
    ) -> None:
        other_tenant = unique("tenant")
        await store.put(tenant, "alice", "session", _event(5, message_id="alice"))
        await store.put(tenant, "bob", "session", _event(1, message_id="bob"))
        await store.put(other_tenant, "alice", "session", _event(1, message_id="other"))
        await store.delete(tenant, "alice", "session", "alice")
        assert await store.read(tenant, "alice", "session") is None
        assert await store.read(tenant, "bob", "session") == _event(1, message_id="bob")
        assert await store.read(other_tenant, "alice", "session") == _event(1, message_id="other")

    async def test_tricky_ids_are_stored_and_read_back_separately(
        self, store: ChatStreamRecordingStore, tenant: str
    ) -> None:
        session = unique("session")
        for number, tricky in enumerate(self.tricky_ids):
            await store.put(tenant, "u", tricky, _event(1, number, "s"))
            await store.put(tenant, tricky, session, _event(1, number, "u"))
            await store.put(tricky, "u", session, _event(1, number, "t"))
        for number, tricky in enumerate(self.tricky_ids):
            assert await store.read(tenant, "u", tricky) == _event(1, number, "s")
            assert await store.read(tenant, tricky, session) == _event(1, number, "u")
            assert await store.read(tricky, "u", session) == _event(1, number, "t")
        for tricky in self.tricky_ids:
            await store.delete(tricky, "u", session, "t")
            assert await store.read(tricky, "u", session) is None
        assert await store.read(tenant, "u", self.tricky_ids[0]) == _event(1, 0, "s")

    async def test_concurrent_puts_at_different_epochs_end_at_the_highest(
        self, store: ChatStreamRecordingStore, tenant: str
    ) -> None:
        events = [_event(epoch, index, f"m-{epoch}") for epoch in range(1, 9) for index in (0, 1)]
        random.Random(7).shuffle(events)

        async def put(event: RecordedStreamEvent) -> None:
            # Only a fence may refuse a put; any other error fails the test.
            try:
                await store.put(tenant, "user", "session", event)
            except RecordingFencedError:
                pass

        await asyncio.gather(*(put(event) for event in events))
        stored = await store.read(tenant, "user", "session")
        assert stored is not None and stored.epoch == 8
        assert stored in [event for event in events if event.epoch == 8]

    @exercises(Capability.RECORDING_PUT_MANY)
    async def test_put_many_writes_every_put_and_says_so(
        self, store: ChatStreamRecordingStore, tenant: str
    ) -> None:
        puts = [RecordingPut(tenant, "user", f"s{i}", _event(1, i, f"m-{i}")) for i in range(5)]
        assert await store.put_many(puts) == [True] * 5
        for i in range(5):
            assert await store.read(tenant, "user", f"s{i}") == _event(1, i, f"m-{i}")

    @exercises(Capability.RECORDING_PUT_MANY)
    async def test_put_many_of_nothing_is_nothing(
        self, store: ChatStreamRecordingStore, tenant: str
    ) -> None:
        assert await store.put_many([]) == []

    @exercises(Capability.RECORDING_PUT_MANY)
    async def test_a_fenced_put_in_a_batch_fails_alone_and_changes_nothing(
        self, store: ChatStreamRecordingStore, tenant: str
    ) -> None:
        await store.put(tenant, "user", "taken-over", _event(3, 7, "successor"))
        await store.put(tenant, "user", "running", _event(2, 1, "m-running"))
        puts = [
            RecordingPut(tenant, "user", "running", _event(2, 2, "m-running")),
            RecordingPut(tenant, "user", "taken-over", _event(2, 9, "fenced")),
            RecordingPut(tenant, "user", "new", _event(1, 0, "m-new")),
        ]
        assert await store.put_many(puts) == [True, False, True]
        assert await store.read(tenant, "user", "taken-over") == _event(3, 7, "successor")
        assert await store.read(tenant, "user", "running") == _event(2, 2, "m-running")
        assert await store.read(tenant, "user", "new") == _event(1, 0, "m-new")

    @exercises(Capability.RECORDING_PUT_MANY)
    async def test_puts_of_one_conversation_in_a_batch_apply_in_order(
        self, store: ChatStreamRecordingStore, tenant: str
    ) -> None:
        puts = [
            RecordingPut(tenant, "user", "session", _event(2, 1, "m-2")),
            RecordingPut(tenant, "user", "session", _event(1, 5, "m-1")),  # below the first
            RecordingPut(tenant, "user", "session", _event(2, 3, "m-2")),
        ]
        assert await store.put_many(puts) == [True, False, True]
        assert await store.read(tenant, "user", "session") == _event(2, 3, "m-2")

    @exercises(Capability.RECORDING_PUT_MANY)
    async def test_put_many_keeps_tricky_ids_apart(
        self, store: ChatStreamRecordingStore, tenant: str
    ) -> None:
        puts = [
            RecordingPut(tenant, tricky, tricky, _event(1, number, "m"))
            for number, tricky in enumerate(self.tricky_ids)
        ]
        assert await store.put_many(puts) == [True] * len(puts)
        for number, tricky in enumerate(self.tricky_ids):
            assert await store.read(tenant, tricky, tricky) == _event(1, number, "m")
