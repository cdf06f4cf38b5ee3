"""Fencing in the write: the optional fenced methods every shipped backend implements.

A store that implements them refuses a write from a producer whose epoch is
below the conversation's fence *in the write itself*, and keeps that fence
when a row is deleted or expires. Subclass the contract of each store you
implement the fenced methods of, and override ``store``::

    class TestMyRecordingFence(ChatStreamRecordingFenceContract):
        @pytest.fixture
        def store(self):
            return MyRecordingStore(...)

``ChatStreamSupervisionEpochContract`` also takes an ``expire`` fixture: a
coroutine function ``expire(tenant, requester_uuid, session_id)`` that removes
the row the way the backend's own clean-up would (a TTL, a sweep). Its default
is the guarded ``delete`` of the current row.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, ClassVar

import pytest

from tether.domain.capabilities import Capability, supports
from tether.domain.chat_agent_state_store import ChatAgentStateStore
from tether.domain.chat_conversation_store import ChatConversationStore, ConversationNotOwnedError
from tether.domain.chat_message import ChatMessage, ChatMessageSender
from tether.domain.chat_stream_recording_store import (
    ChatStreamRecordingStore,
    RecordedStreamEvent,
    RecordingFencedError,
    RecordingPut,
)
from tether.domain.chat_stream_supervision_store import (
    ChatStreamStatus,
    ChatStreamSupervision,
    ChatStreamSupervisionStore,
    SupervisionSwap,
)
from tether.testing.contracts._support import ManualClock, exercises, unique, user

Expire = Callable[[str, str | None, str], Awaitable[None]]

_T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


def _row(epoch: int, message_id: str = "m-1") -> ChatStreamSupervision:
    return ChatStreamSupervision(
        status=ChatStreamStatus.RUNNING, heartbeat_at=_T0, message_id=message_id, epoch=epoch
    )


def _event(epoch: int, index: int = 0, message_id: str = "m-1") -> RecordedStreamEvent:
    message = ChatMessage(sender=ChatMessageSender.BOT, content=f"e{epoch} i{index}")
    return RecordedStreamEvent(index=index, message=message, message_id=message_id, epoch=epoch)


def _answer(text: str, message_id: str = "m-1") -> ChatMessage:
    return ChatMessage(sender=ChatMessageSender.BOT, content=text, message_id=message_id)


class _Fixtures:
    pytestmark: ClassVar[list[Any]] = [pytest.mark.asyncio]

    @pytest.fixture
    def store(self) -> Any:
        """Override: the store under test."""
        raise NotImplementedError("override the `store` fixture with your adapter")

    @pytest.fixture
    def tenant(self) -> str:
        return unique("tenant")


@exercises(Capability.SUPERVISION_LAST_EPOCH)
class ChatStreamSupervisionEpochContract(_Fixtures):
    """Epochs only grow, also after a row is deleted or expires."""

    @pytest.fixture
    def expire(self, store: ChatStreamSupervisionStore) -> Expire:
        """Override where rows expire by themselves: remove the row that way."""

        async def remove(tenant: str, requester_uuid: str | None, session_id: str) -> None:
            row = await store.read(tenant, requester_uuid, session_id)
            assert row is not None
            await store.delete(tenant, requester_uuid, session_id, row.message_id, row.epoch)

        return remove

    async def test_last_epoch_is_zero_for_a_new_conversation(
        self, store: ChatStreamSupervisionStore, tenant: str
    ) -> None:
        assert await store.last_epoch(tenant, "user", "session") == 0

    async def test_last_epoch_follows_every_write(
        self, store: ChatStreamSupervisionStore, tenant: str
    ) -> None:
        assert await store.compare_and_swap(tenant, "user", "session", None, _row(1))
        assert await store.compare_and_swap(tenant, "user", "session", 1, _row(4))
        assert await store.last_epoch(tenant, "user", "session") == 4
        swaps = [SupervisionSwap(tenant, "user", "session", 4, _row(6))]
        assert await store.compare_and_swap_many(swaps) == [True]
        assert await store.last_epoch(tenant, "user", "session") == 6

    @pytest.mark.parametrize("removal", ["delete", "expire"])
    async def test_the_epoch_outlives_the_row(
        self, store: ChatStreamSupervisionStore, tenant: str, expire: Expire, removal: str
    ) -> None:
        assert await store.compare_and_swap(tenant, "user", "session", None, _row(1))
        assert await store.compare_and_swap(tenant, "user", "session", 1, _row(7))
        if removal == "delete":
            await store.delete(tenant, "user", "session", "m-1", 7)
        else:
            await expire(tenant, "user", "session")
        assert await store.read(tenant, "user", "session") is None
        assert await store.last_epoch(tenant, "user", "session") == 7
        # A claim that would reuse an epoch already granted is refused ...
        for reused in (1, 7):
            assert not await store.compare_and_swap(tenant, "user", "session", None, _row(reused))
        assert await store.read(tenant, "user", "session") is None
        # ... and a late write of the removed turn finds nothing to swap.
        assert not await store.compare_and_swap(tenant, "user", "session", 7, _row(7))
        assert await store.compare_and_swap(tenant, "user", "session", None, _row(8, "m-2"))
        assert await store.read(tenant, "user", "session") == _row(8, "m-2")

    async def test_epochs_of_other_conversations_are_apart(
        self, store: ChatStreamSupervisionStore, tenant: str
    ) -> None:
        assert await store.compare_and_swap(tenant, "user", "session", None, _row(5))
        assert await store.last_epoch(tenant, "other", "session") == 0
        assert await store.last_epoch(tenant, "user", "other") == 0
        assert await store.compare_and_swap(tenant, "other", "session", None, _row(1))

    async def test_concurrent_claims_after_a_delete_have_one_winner_above_the_old_epoch(
        self, store: ChatStreamSupervisionStore, tenant: str
    ) -> None:
        assert await store.compare_and_swap(tenant, "user", "session", None, _row(3))
        await store.delete(tenant, "user", "session", "m-1", 3)
        claims = [_row(4, f"m-{n}") for n in range(8)]
        won = await asyncio.gather(
            *(store.compare_and_swap(tenant, "user", "session", None, row) for row in claims)
        )
        assert sum(won) == 1
        row = await store.read(tenant, "user", "session")
        assert row is not None and row.epoch == 4


@exercises(Capability.RECORDING_FENCE)
class ChatStreamRecordingFenceContract(_Fixtures):
    """``fence`` and the fence's survival across ``delete``."""

    async def test_a_fence_refuses_lower_puts_and_keeps_the_record(
        self, store: ChatStreamRecordingStore, tenant: str
    ) -> None:
        await store.put(tenant, "user", "session", _event(2, index=5))
        await store.fence(tenant, "user", "session", 3)
        assert await store.read(tenant, "user", "session") == _event(2, index=5)
        with pytest.raises(RecordingFencedError):
            await store.put(tenant, "user", "session", _event(2, index=6))
        put = RecordingPut(tenant, "user", "session", _event(2, index=7))
        assert await store.put_many([put]) == [False]
        assert await store.read(tenant, "user", "session") == _event(2, index=5)
        await store.put(tenant, "user", "session", _event(3, index=8))
        assert await store.read(tenant, "user", "session") == _event(3, index=8)

    async def test_a_fence_on_an_empty_conversation_holds(
        self, store: ChatStreamRecordingStore, tenant: str
    ) -> None:
        await store.fence(tenant, "user", "session", 4)
        assert await store.read(tenant, "user", "session") is None
        with pytest.raises(RecordingFencedError):
            await store.put(tenant, "user", "session", _event(3))
        assert await store.read(tenant, "user", "session") is None

    async def test_a_lower_fence_never_lowers_it(
        self, store: ChatStreamRecordingStore, tenant: str
    ) -> None:
        await store.fence(tenant, "user", "session", 5)
        await store.fence(tenant, "user", "session", 2)
        with pytest.raises(RecordingFencedError):
            await store.put(tenant, "user", "session", _event(4))
        await store.put(tenant, "user", "session", _event(5))

    async def test_the_fence_outlives_delete(
        self, store: ChatStreamRecordingStore, tenant: str
    ) -> None:
        await store.put(tenant, "user", "session", _event(6, message_id="m-6"))
        await store.delete(tenant, "user", "session", "m-6")
        assert await store.read(tenant, "user", "session") is None
        with pytest.raises(RecordingFencedError):
            await store.put(tenant, "user", "session", _event(5, message_id="m-5"))
        assert await store.read(tenant, "user", "session") is None

    async def test_fences_of_other_conversations_are_apart(
        self, store: ChatStreamRecordingStore, tenant: str
    ) -> None:
        await store.fence(tenant, "user", "session", 9)
        await store.put(tenant, "other", "session", _event(1))
        await store.put(tenant, "user", "other", _event(1))

    async def test_a_fence_racing_puts_refuses_every_later_lower_put(
        self, store: ChatStreamRecordingStore, tenant: str
    ) -> None:
        async def put(index: int) -> bool:
            try:
                await store.put(tenant, "user", "session", _event(1, index=index))
            except RecordingFencedError:
                return False
            return True

        puts = [asyncio.create_task(put(index)) for index in range(10)]
        await store.fence(tenant, "user", "session", 2)
        await asyncio.gather(*puts)
        before = await store.read(tenant, "user", "session")
        assert not await put(99)
        assert await store.read(tenant, "user", "session") == before


@exercises(Capability.STATE_SAVE_FENCED, Capability.STATE_FENCE)
class ChatAgentStateFenceContract(_Fixtures):
    """``save_fenced`` and ``fence``: a fenced producer's checkpoint never lands."""

    async def test_a_fenced_save_writes_and_says_so(
        self, store: ChatAgentStateStore, tenant: str
    ) -> None:
        assert await store.save_fenced(tenant, "user", "session", {"dep": {"n": 1}}, 1)
        assert await store.load(tenant, "user", "session") == {"dep": {"n": 1}}
        assert await store.save_fenced(tenant, "user", "session", {"dep": {"n": 2}}, 1)
        assert await store.load(tenant, "user", "session") == {"dep": {"n": 2}}

    async def test_a_save_below_a_newer_one_is_refused_and_changes_nothing(
        self, store: ChatAgentStateStore, tenant: str
    ) -> None:
        assert await store.save_fenced(tenant, "user", "session", {"dep": {"turn": 2}}, 2)
        assert not await store.save_fenced(tenant, "user", "session", {"dep": {"turn": 1}}, 1)
        assert await store.load(tenant, "user", "session") == {"dep": {"turn": 2}}

    async def test_a_fence_refuses_lower_saves_and_keeps_the_state(
        self, store: ChatAgentStateStore, tenant: str
    ) -> None:
        assert await store.save_fenced(tenant, "user", "session", {"dep": {"n": 1}}, 1)
        await store.fence(tenant, "user", "session", 2)
        await store.fence(tenant, "user", "session", 1)
        assert await store.load(tenant, "user", "session") == {"dep": {"n": 1}}
        assert not await store.save_fenced(tenant, "user", "session", {"dep": {"n": 9}}, 1)
        assert await store.load(tenant, "user", "session") == {"dep": {"n": 1}}
        assert await store.save_fenced(tenant, "user", "session", {"dep": {"n": 3}}, 2)

    async def test_a_fence_on_an_empty_conversation_holds(
        self, store: ChatAgentStateStore, tenant: str
    ) -> None:
        await store.fence(tenant, "user", "session", 3)
        assert await store.load(tenant, "user", "session") == {}
        assert not await store.save_fenced(tenant, "user", "session", {"dep": {}}, 2)
        assert await store.load(tenant, "user", "session") == {}

    async def test_the_fence_outlives_delete(self, store: ChatAgentStateStore, tenant: str) -> None:
        assert await store.save_fenced(tenant, "user", "session", {"dep": {"n": 1}}, 4)
        await store.delete(tenant, "user", "session")
        assert await store.load(tenant, "user", "session") == {}
        assert not await store.save_fenced(tenant, "user", "session", {"dep": {"n": 0}}, 3)
        assert await store.load(tenant, "user", "session") == {}

    async def test_fences_of_other_conversations_are_apart(
        self, store: ChatAgentStateStore, tenant: str
    ) -> None:
        await store.fence(tenant, "user", "session", 9)
        assert await store.save_fenced(tenant, "other", "session", {"dep": {}}, 1)
        assert await store.save_fenced(tenant, "user", "other", {"dep": {}}, 1)

    async def test_concurrent_fenced_saves_end_at_the_highest_epoch(
        self, store: ChatAgentStateStore, tenant: str
    ) -> None:
        epochs = list(range(1, 9))
        await asyncio.gather(
            *(
                store.save_fenced(tenant, "user", "session", {"dep": {"epoch": e}}, e)
                for e in reversed(epochs)
            )
        )
        assert await store.load(tenant, "user", "session") == {"dep": {"epoch": 8}}


@exercises(Capability.CONVERSATION_APPEND_FENCED, Capability.CONVERSATION_FENCE)
class ChatConversationFenceContract(_Fixtures):
    """``append_fenced`` and ``fence``: one answer per turn, none from a fenced producer."""

    @pytest.fixture
    def clock(self) -> ManualClock:
        return ManualClock()

    async def _start(self, store: ChatConversationStore, tenant: str, epoch: int = 1) -> None:
        question = user("question").model_copy(update={"message_id": "m-1-user"})
        assert await store.append_fenced(
            tenant, "user", "session", "agent", [question], epoch=epoch, last_turn_status="running"
        )

    async def test_append_fenced_creates_and_appends(
        self, store: ChatConversationStore, tenant: str
    ) -> None:
        await self._start(store, tenant)
        assert await store.append_fenced(
            tenant,
            "user",
            "session",
            "agent",
            [_answer("answer")],
            epoch=1,
            last_turn_status="complete",
            create_if_absent=False,
        )
        transcript = await store.get_transcript(tenant, "user", "session")
        assert [m.content for m in transcript] == ["question", "answer"]

    async def test_a_message_already_there_is_not_appended_again(
        self, store: ChatConversationStore, tenant: str
    ) -> None:
        await self._start(store, tenant)
        for text in ("answer", "answer again"):
            assert await store.append_fenced(
                tenant, "user", "session", "agent", [_answer(text)], epoch=1
            )
        await self._start(store, tenant)
        transcript = await store.get_transcript(tenant, "user", "session")
        assert [m.content for m in transcript] == ["question", "answer"]

    async def test_the_status_is_set_even_when_the_message_was_there(
        self, store: ChatConversationStore, tenant: str, clock: ManualClock
    ) -> None:
        await self._start(store, tenant)
        await store.append_fenced(
            tenant,
            "user",
            "session",
            "agent",
            [_answer("all")],
            epoch=1,
            last_turn_status="complete",
        )
        assert await store.append_fenced(
            tenant,
            "user",
            "session",
            "agent",
            [_answer("part")],
            epoch=2,
            last_turn_status="cancelled",
        )
        transcript = await store.get_transcript(tenant, "user", "session")
        assert [m.content for m in transcript] == ["question", "all"]
        summary = await _summary(store, tenant)
        if summary is not None:
            assert summary.last_turn_status == "cancelled"

    async def test_a_fenced_append_changes_nothing(
        self, store: ChatConversationStore, tenant: str
    ) -> None:
        await self._start(store, tenant)
        await store.fence(tenant, "user", "session", 2)
        assert not await store.append_fenced(
            tenant,
            "user",
            "session",
            "agent",
            [_answer("late")],
            epoch=1,
            last_turn_status="complete",
        )
        transcript = await store.get_transcript(tenant, "user", "session")
        assert [m.content for m in transcript] == ["question"]
        summary = await _summary(store, tenant)
        if summary is not None:
            assert summary.last_turn_status == "running"

    async def test_an_accepted_append_raises_the_fence(
        self, store: ChatConversationStore, tenant: str
    ) -> None:
        await self._start(store, tenant, epoch=1)
        assert await store.append_fenced(
            tenant, "user", "session", "agent", [_answer("partial")], epoch=3
        )
        assert not await store.append_fenced(
            tenant, "user", "session", "agent", [_answer("full", "m-2")], epoch=2
        )
        transcript = await store.get_transcript(tenant, "user", "session")
        assert [m.content for m in transcript] == ["question", "partial"]

    async def test_a_fence_on_a_missing_conversation_creates_nothing(
        self, store: ChatConversationStore, tenant: str
    ) -> None:
        await store.fence(tenant, "user", "session", 5)
        assert await store.get_transcript(tenant, "user", "session") == []
        assert await store.append_fenced(
            tenant, "user", "session", "agent", [_answer("x")], epoch=1, create_if_absent=False
        )
        assert await store.get_transcript(tenant, "user", "session") == []

    async def test_another_user_is_refused(self, store: ChatConversationStore, tenant: str) -> None:
        await self._start(store, tenant)
        with pytest.raises(ConversationNotOwnedError):
            await store.append_fenced(
                tenant, "intruder", "session", "agent", [_answer("x")], epoch=9
            )
        transcript = await store.get_transcript(tenant, "user", "session")
        assert [m.content for m in transcript] == ["question"]

    async def test_a_cancel_racing_the_seal_leaves_one_answer(
        self, store: ChatConversationStore, tenant: str
    ) -> None:
        await self._start(store, tenant, epoch=1)
        seal = store.append_fenced(
            tenant,
            "user",
            "session",
            "agent",
            [_answer("the whole answer")],
            epoch=1,
            last_turn_status="complete",
            create_if_absent=False,
        )
        cancel = store.append_fenced(
            tenant,
            "user",
            "session",
            "agent",
            [_answer("the whole")],
            epoch=2,
            last_turn_status="cancelled",
            create_if_absent=False,
        )
        await asyncio.gather(seal, cancel)
        transcript = await store.get_transcript(tenant, "user", "session")
        answers = [m for m in transcript if m.sender is ChatMessageSender.BOT]
        assert len(answers) == 1


async def _summary(store: ChatConversationStore, tenant: str) -> Any:
    if not supports(store, Capability.CONVERSATION_GET):
        return None
    return await store.get_conversation(tenant, "user", "session")
