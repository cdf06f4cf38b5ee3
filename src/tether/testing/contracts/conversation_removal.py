"""``remove_fenced``: a rollback takes the interrupted turn out of the transcript.

The ``rollback`` multitask strategy removes the interrupted turn's user message
and partial answer, fenced at the new turn's epoch: the store refuses it in the
write itself when the conversation's fence is above that epoch, and an
accepted removal raises the fence, so a producer of the interrupted turn
cannot put its answer back afterwards. Subclass the contract if your
conversation store implements ``remove_fenced``, and override ``store``; it
must stamp ``updated_at`` with the ``clock`` fixture::

    class TestMyRollback(ChatConversationRemovalContract):
        @pytest.fixture
        def store(self, clock):
            return MyConversationStore(..., clock=clock)

Summaries (status, message count, title, ``updated_at``) are checked only
where the store implements ``get_conversation``.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import pytest

from tether.domain.capabilities import Capability, supports
from tether.domain.chat_conversation_store import (
    ChatConversationStore,
    ConversationNotOwnedError,
    ConversationSummary,
)
from tether.domain.chat_message import ChatMessage, ChatMessageSender
from tether.testing.contracts._support import ManualClock, exercises, unique


def _question(turn: int, text: str | None = None) -> ChatMessage:
    return ChatMessage(
        sender=ChatMessageSender.USER,
        content=text or f"question {turn}",
        message_id=f"m-{turn}-user",
    )


def _answer(turn: int, text: str | None = None) -> ChatMessage:
    return ChatMessage(
        sender=ChatMessageSender.BOT, content=text or f"answer {turn}", message_id=f"m-{turn}"
    )


def _turn_ids(turn: int) -> list[str]:
    """What a rollback of ``turn`` names: its answer and its user message."""
    return [f"m-{turn}", f"m-{turn}-user"]


@exercises(Capability.CONVERSATION_REMOVE_FENCED)
class ChatConversationRemovalContract:
    """``remove_fenced``: removes by id, keeps the order, fenced like ``append_fenced``."""

    pytestmark: ClassVar[list[Any]] = [pytest.mark.asyncio]

    @pytest.fixture
    def store(self) -> Any:
        """Override: the store under test, stamping times with ``clock``."""
        raise NotImplementedError("override the `store` fixture with your adapter")

    @pytest.fixture
    def tenant(self) -> str:
        return unique("tenant")

    @pytest.fixture
    def clock(self) -> ManualClock:
        """The clock the ``store`` fixture must stamp times with."""
        return ManualClock()

    async def _turns(
        self, store: ChatConversationStore, tenant: str, count: int, session: str = "session"
    ) -> None:
        """``count`` finished turns, turn ``n`` written at epoch ``n``."""
        for turn in range(1, count + 1):
            assert await store.append_fenced(
                tenant,
                "user",
                session,
                "agent",
                [_question(turn), _answer(turn)],
                epoch=turn,
                last_turn_status="complete",
            )

    async def test_the_named_messages_go_and_the_rest_keep_their_order(
        self, store: ChatConversationStore, tenant: str
    ) -> None:
        await self._turns(store, tenant, 3)
        assert await store.remove_fenced(tenant, "user", "session", _turn_ids(2), epoch=4)
        assert await _contents(store, tenant) == [
            "question 1",
            "answer 1",
            "question 3",
            "answer 3",
        ]
        summary = await _summary(store, tenant)
        if summary is not None:
            assert summary.message_count == 4

    async def test_later_appends_go_after_the_messages_left(
        self, store: ChatConversationStore, tenant: str
    ) -> None:
        await self._turns(store, tenant, 3)
        assert await store.remove_fenced(tenant, "user", "session", ["m-1-user"], epoch=4)
        assert await store.remove_fenced(tenant, "user", "session", _turn_ids(2), epoch=4)
        assert await store.append_fenced(
            tenant, "user", "session", "agent", [_question(4)], epoch=4
        )
        await store.append_messages(tenant, "user", "session", "agent", [_answer(4)])
        assert await _contents(store, tenant) == [
            "answer 1",
            "question 3",
            "answer 3",
            "question 4",
            "answer 4",
        ]
        summary = await _summary(store, tenant)
        if summary is not None:
            assert summary.message_count == 5

    async def test_removing_every_message_leaves_an_empty_conversation(
        self, store: ChatConversationStore, tenant: str
    ) -> None:
        await self._turns(store, tenant, 2)
        ids = _turn_ids(1) + _turn_ids(2)
        assert await store.remove_fenced(tenant, "user", "session", ids, epoch=2)
        assert await store.get_transcript(tenant, "user", "session") == []
        summary = await _summary(store, tenant)
        if summary is not None:
            assert (summary.message_count, summary.title) == (0, "")
        # The conversation is still there: an append that must not create one lands.
        assert await store.append_fenced(
            tenant, "user", "session", "agent", [_question(3)], epoch=3, create_if_absent=False
        )
        assert await _contents(store, tenant) == ["question 3"]

    async def test_ids_not_in_the_transcript_and_messages_without_ids_are_left_alone(
        self, store: ChatConversationStore, tenant: str
    ) -> None:
        await self._turns(store, tenant, 1)
        unnamed = ChatMessage(sender=ChatMessageSender.BOT, content="no id")
        await store.append_messages(tenant, "user", "session", "agent", [unnamed])
        assert await store.remove_fenced(
            tenant, "user", "session", ["m-9", "m-1", "", "m-1-user-x"], epoch=1
        )
        assert await _contents(store, tenant) == ["question 1", "no id"]
        # Removing what is gone already is accepted and changes nothing.
        assert await store.remove_fenced(tenant, "user", "session", ["m-1"], epoch=1)
        assert await store.remove_fenced(tenant, "user", "session", [], epoch=1)
        assert await _contents(store, tenant) == ["question 1", "no id"]

    async def test_the_status_is_set_when_given_and_kept_otherwise(
        self, store: ChatConversationStore, tenant: str
    ) -> None:
        await self._turns(store, tenant, 2)
        assert await store.remove_fenced(tenant, "user", "session", ["m-2"], epoch=2)
        summary = await _summary(store, tenant)
        if summary is not None:
            assert summary.last_turn_status == "complete"
        assert await store.remove_fenced(
            tenant, "user", "session", ["m-2-user"], epoch=3, last_turn_status="cancelled"
        )
        summary = await _summary(store, tenant)
        if summary is not None:
            assert summary.last_turn_status == "cancelled"
        assert await _contents(store, tenant) == ["question 1", "answer 1"]

    async def test_an_accepted_removal_is_a_write_that_moves_updated_at(
        self, store: ChatConversationStore, tenant: str, clock: ManualClock
    ) -> None:
        await self._turns(store, tenant, 1)
        later = clock.advance(60)
        assert await store.remove_fenced(tenant, "user", "session", ["m-1"], epoch=1)
        summary = await _summary(store, tenant)
        if summary is not None:
            assert summary.updated_at == later

    async def test_the_title_is_taken_again_from_the_messages_left(
        self, store: ChatConversationStore, tenant: str
    ) -> None:
        await self._turns(store, tenant, 2)
        assert await store.remove_fenced(tenant, "user", "session", _turn_ids(1), epoch=2)
        summary = await _summary(store, tenant)
        if summary is not None:
            assert summary.title == "question 2"
        assert await store.remove_fenced(tenant, "user", "session", _turn_ids(2), epoch=2)
        assert await store.append_fenced(
            tenant, "user", "session", "agent", [_question(3, "  a  fresh\nstart ")], epoch=3
        )
        summary = await _summary(store, tenant)
        if summary is not None:
            assert summary.title == "a fresh start"

    async def test_a_removal_below_a_fence_changes_nothing(
        self, store: ChatConversationStore, tenant: str, clock: ManualClock
    ) -> None:
        await self._turns(store, tenant, 1)
        before = await _summary(store, tenant)
        await store.fence(tenant, "user", "session", 3)
        clock.advance(60)
        assert not await store.remove_fenced(
            tenant, "user", "session", _turn_ids(1), epoch=2, last_turn_status="cancelled"
        )
        assert await _contents(store, tenant) == ["question 1", "answer 1"]
        assert await _summary(store, tenant) == before
        # At the fence's own epoch it is the fencing turn's write: accepted.
        assert await store.remove_fenced(tenant, "user", "session", _turn_ids(1), epoch=3)
        assert await store.get_transcript(tenant, "user", "session") == []

    async def test_a_removal_below_a_later_append_is_refused(
        self, store: ChatConversationStore, tenant: str
    ) -> None:
        await self._turns(store, tenant, 1)
        assert await store.append_fenced(
            tenant, "user", "session", "agent", [_question(4)], epoch=4
        )
        assert not await store.remove_fenced(tenant, "user", "session", _turn_ids(1), epoch=3)
        assert await _contents(store, tenant) == ["question 1", "answer 1", "question 4"]

    async def test_an_accepted_removal_raises_the_fence(
        self, store: ChatConversationStore, tenant: str
    ) -> None:
        await self._turns(store, tenant, 1)
        assert await store.remove_fenced(tenant, "user", "session", ["m-1"], epoch=5)
        # The interrupted turn's producer, fenced, cannot put its answer back ...
        assert not await store.append_fenced(
            tenant, "user", "session", "agent", [_answer(1, "late")], epoch=4
        )
        assert not await store.remove_fenced(tenant, "user", "session", ["m-1-user"], epoch=4)
        assert await _contents(store, tenant) == ["question 1"]
        # ... while the turn that rolled it back writes on.
        assert await store.append_fenced(
            tenant, "user", "session", "agent", [_question(5)], epoch=5
        )
        assert await _contents(store, tenant) == ["question 1", "question 5"]

    async def test_a_missing_conversation_is_accepted_and_stays_missing(
        self, store: ChatConversationStore, tenant: str
    ) -> None:
        assert await store.remove_fenced(
            tenant, "user", "session", ["m-1"], epoch=7, last_turn_status="cancelled"
        )
        assert await store.get_transcript(tenant, "user", "session") == []
        assert await _summary(store, tenant) is None
        # Nothing was fenced either: a first turn at a lower epoch creates it.
        await self._turns(store, tenant, 1)
        assert await _contents(store, tenant) == ["question 1", "answer 1"]

    async def test_another_user_is_refused_and_changes_nothing(
        self, store: ChatConversationStore, tenant: str
    ) -> None:
        await self._turns(store, tenant, 1)
        with pytest.raises(ConversationNotOwnedError):
            await store.remove_fenced(tenant, "intruder", "session", _turn_ids(1), epoch=9)
        assert await _contents(store, tenant) == ["question 1", "answer 1"]
        # Not even the fence moved: the owner's turn 2 still writes.
        assert await store.append_fenced(
            tenant, "user", "session", "agent", [_question(2)], epoch=2
        )

    async def test_conversations_are_apart(self, store: ChatConversationStore, tenant: str) -> None:
        await self._turns(store, tenant, 1)
        await self._turns(store, tenant, 1, session="other")
        assert await store.remove_fenced(tenant, "user", "other", _turn_ids(1), epoch=8)
        assert await _contents(store, tenant) == ["question 1", "answer 1"]
        assert await store.append_fenced(
            tenant, "user", "session", "agent", [_question(2)], epoch=2
        )

    async def test_a_higher_append_after_the_removal_goes_after_the_rest(
        self, store: ChatConversationStore, tenant: str
    ) -> None:
        await self._turns(store, tenant, 2)
        assert await store.remove_fenced(tenant, "user", "session", _turn_ids(2), epoch=3)
        assert await store.append_fenced(
            tenant, "user", "session", "agent", [_question(4)], epoch=4
        )
        assert await _contents(store, tenant) == ["question 1", "answer 1", "question 4"]

    async def test_a_removal_racing_a_higher_append_lands_whole_or_not_at_all(
        self, store: ChatConversationStore, tenant: str
    ) -> None:
        # Several conversations, each a rollback at epoch 3 racing a turn at
        # epoch 4: whichever lands first, the result is one of the two orders,
        # never a mix (the removal half done, the append lost or misplaced).
        sessions = [f"session-{number}" for number in range(6)]
        for session in sessions:
            await self._turns(store, tenant, 2, session=session)

        async def race(session: str) -> tuple[bool, bool]:
            removed, appended = await asyncio.gather(
                store.remove_fenced(tenant, "user", session, _turn_ids(2), epoch=3),
                store.append_fenced(tenant, "user", session, "agent", [_question(4)], epoch=4),
            )
            return removed, appended

        outcomes = await asyncio.gather(*(race(session) for session in sessions))
        for session, (removed, appended) in zip(sessions, outcomes, strict=True):
            assert appended
            contents = await _contents(store, tenant, session)
            if removed:  # the removal went first
                assert contents == ["question 1", "answer 1", "question 4"]
            else:  # the append went first and fenced the removal out
                assert contents == [
                    "question 1",
                    "answer 1",
                    "question 2",
                    "answer 2",
                    "question 4",
                ]
            summary = await _summary(store, tenant, session)
            if summary is not None:
                assert summary.message_count == len(contents)


async def _contents(
    store: ChatConversationStore, tenant: str, session: str = "session"
) -> list[str]:
    return [message.content for message in await store.get_transcript(tenant, "user", session)]


async def _summary(
    store: ChatConversationStore, tenant: str, session: str = "session"
) -> ConversationSummary | None:
    if not supports(store, Capability.CONVERSATION_GET):
        return None
    return await store.get_conversation(tenant, "user", session)
