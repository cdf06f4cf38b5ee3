"""The ``ChatConversationStore`` contract (the seed's three methods), as inherited tests.

Subclass the contract in a test module and override the ``store`` fixture; pass
the contract's ``clock`` fixture to your store if it stamps times::

    import pytest
    from tether.testing.contracts import ChatConversationStoreContract

    class TestMyConversationStore(ChatConversationStoreContract):
        @pytest.fixture
        def store(self, clock):
            return MyConversationStore(..., clock=clock)

An adapter that also implements the optional methods (``get_conversation``,
``list_conversations``, ``set_shared``, ``delete_conversation``) should subclass
``ChatConversationStoreFullContract`` instead, which runs these tests too.
Every test works under fresh random ids, so one store may serve many tests.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import pytest

from tether.domain.chat_conversation_store import ChatConversationStore, ConversationNotOwnedError
from tether.domain.chat_message import (
    ChatMessage,
    ChatMessageSender,
    ContentPart,
    ContentPartTool,
    ContentPartType,
    ToolCallStatus,
)
from tether.testing.contracts._support import TRICKY_IDS, ManualClock, bot, unique, user


def _rich_bot() -> ChatMessage:
    tool = ContentPartTool(
        tool_call_id="call-1",
        name="lookup",
        params={"q": "会話"},
        response=[{"score": 0.25}],
        status=ToolCallStatus.COMPLETED,
    )
    return ChatMessage(
        sender=ChatMessageSender.BOT,
        content="done 🙂",
        content_parts=[
            ContentPart(type=ContentPartType.TEXT, text="done"),
            ContentPart(type=ContentPartType.TOOL, tool=tool),
        ],
        message_id="m-1",
        session_id="session",
        custom_input={"k": [1, None]},
    )


class ChatConversationStoreContract:
    """Durable transcripts: owner-only writes, owner reads, no ghost rows, copies."""

    pytestmark: ClassVar[list[Any]] = [pytest.mark.asyncio]
    tricky_ids: ClassVar[tuple[str, ...]] = TRICKY_IDS

    @pytest.fixture
    def clock(self) -> ManualClock:
        """The time source to hand the store; tests move it with ``advance``."""
        return ManualClock()

    @pytest.fixture
    def store(self, clock: ManualClock) -> ChatConversationStore:
        """Override: the store under test."""
        raise NotImplementedError("override the `store` fixture with your adapter")

    @pytest.fixture
    def tenant(self) -> str:
        return unique("tenant")

    async def test_get_transcript_is_empty_when_no_conversation_exists(
        self, store: ChatConversationStore, tenant: str
    ) -> None:
        assert await store.get_transcript(tenant, "alice", "session") == []

    async def test_set_last_turn_status_is_a_no_op_when_no_conversation_exists(
        self, store: ChatConversationStore, tenant: str
    ) -> None:
        await store.set_last_turn_status(tenant, "alice", "session", "errored")
        assert await store.get_transcript(tenant, "alice", "session") == []
        await store.append_messages(tenant, "bob", "session", "agent", [user("mine")])
        assert await store.get_transcript(tenant, "bob", "session") == [user("mine")]

    async def test_append_without_create_if_absent_does_not_create(
        self, store: ChatConversationStore, tenant: str
    ) -> None:
        await store.append_messages(
            tenant, "alice", "session", "agent", [bot("ghost")], create_if_absent=False
        )
        assert await store.get_transcript(tenant, "alice", "session") == []
        # Nothing was created, so another user may still start this conversation.
        await store.append_messages(tenant, "bob", "session", "agent", [user("hi")])
        assert await store.get_transcript(tenant, "bob", "session") == [user("hi")]

    async def test_appends_accumulate_in_order(
        self, store: ChatConversationStore, tenant: str
    ) -> None:
        await store.append_messages(tenant, "alice", "s", "agent", [user("1")])
        await store.append_messages(
            tenant, "alice", "s", "agent", [bot("2")], last_turn_status="complete"
        )
        await store.append_messages(tenant, "alice", "s", "agent", [user("3"), bot("4")])
        expected = [user("1"), bot("2"), user("3"), bot("4")]
        assert await store.get_transcript(tenant, "alice", "s") == expected

    async def test_a_bot_turn_is_appended_to_an_existing_conversation(
        self, store: ChatConversationStore, tenant: str
    ) -> None:
        await store.append_messages(
            tenant, "alice", "s", "agent", [user("q")], last_turn_status="running"
        )
        await store.append_messages(
            tenant,
            "alice",
            "s",
            "agent",
            [bot("a")],
            last_turn_status="complete",
            create_if_absent=False,
        )
        assert await store.get_transcript(tenant, "alice", "s") == [user("q"), bot("a")]

    async def test_a_missing_requester_is_the_empty_owner(
        self, store: ChatConversationStore, tenant: str
    ) -> None:
        await store.append_messages(tenant, None, "s", "agent", [user("1")])
        await store.append_messages(tenant, "", "s", "agent", [bot("2")])
        await store.set_last_turn_status(tenant, None, "s", "complete")
        assert await store.get_transcript(tenant, None, "s") == [user("1"), bot("2")]
        with pytest.raises(ConversationNotOwnedError):
            await store.append_messages(tenant, "mallory", "s", "agent", [user("x")])

    @pytest.mark.parametrize("create_if_absent", [True, False])
    async def test_appends_by_another_user_are_refused_and_change_nothing(
        self, store: ChatConversationStore, tenant: str, create_if_absent: bool
    ) -> None:
        await store.append_messages(tenant, "alice", "s", "agent", [user("mine")])
        with pytest.raises(ConversationNotOwnedError):
            await store.append_messages(
                tenant, "mallory", "s", "agent", [user("x")], create_if_absent=create_if_absent
            )
        assert await store.get_transcript(tenant, "alice", "s") == [user("mine")]

    async def test_a_status_change_by_another_user_is_refused(
        self, store: ChatConversationStore, tenant: str
    ) -> None:
        await store.append_messages(tenant, "alice", "s", "agent", [user("mine")])
        with pytest.raises(ConversationNotOwnedError):
            await store.set_last_turn_status(tenant, "mallory", "s", "errored")
        await store.set_last_turn_status(tenant, "alice", "s", "errored")

    async def test_a_private_transcript_is_refused_to_another_user(
        self, store: ChatConversationStore, tenant: str
    ) -> None:
        await store.append_messages(tenant, "alice", "s", "agent", [user("secret")])
        with pytest.raises(ConversationNotOwnedError):
            await store.get_transcript(tenant, "mallory", "s")
        with pytest.raises(ConversationNotOwnedError):
            await store.get_transcript(tenant, None, "s")

    async def test_same_session_id_in_two_tenants_is_two_conversations(
        self, store: ChatConversationStore, tenant: str
    ) -> None:
        other_tenant = unique("tenant")
        await store.append_messages(tenant, "alice", "s", "agent", [user("a")])
        await store.append_messages(other_tenant, "bob", "s", "agent", [user("b")])
        assert await store.get_transcript(tenant, "alice", "s") == [user("a")]
        assert await store.get_transcript(other_tenant, "bob", "s") == [user("b")]

    async def test_the_transcript_is_a_copy(
        self, store: ChatConversationStore, tenant: str
    ) -> None:
        await store.append_messages(tenant, "alice", "s", "agent", [user("1"), _rich_bot()])
        transcript = await store.get_transcript(tenant, "alice", "s")
        transcript[0].content = "mutated"
        transcript.append(user("injected"))
        assert await store.get_transcript(tenant, "alice", "s") == [user("1"), _rich_bot()]

    async def test_the_store_keeps_a_copy_of_appended_messages(
        self, store: ChatConversationStore, tenant: str
    ) -> None:
        messages = [user("1"), _rich_bot()]
        await store.append_messages(tenant, "alice", "s", "agent", messages)
        messages[0].content = "mutated"
        assert messages[1].content_parts is not None
        messages[1].content_parts.clear()
        messages.append(user("injected"))
        assert await store.get_transcript(tenant, "alice", "s") == [user("1"), _rich_bot()]

    async def test_tricky_ids_are_stored_and_read_back_separately(
        self, store: ChatConversationStore, tenant: str
    ) -> None:
        session = unique("session")
        for number, tricky in enumerate(self.tricky_ids):
            await store.append_messages(tenant, "alice", tricky, "agent", [user(f"s{number}")])
            await store.append_messages(tricky, "alice", session, "agent", [user(f"t{number}")])
            await store.append_messages(tenant, tricky, f"{session}-{number}", "a", [user("u")])
        for number, tricky in enumerate(self.tricky_ids):
            assert await store.get_transcript(tenant, "alice", tricky) == [user(f"s{number}")]
            assert await store.get_transcript(tricky, "alice", session) == [user(f"t{number}")]
            transcript = await store.get_transcript(tenant, tricky, f"{session}-{number}")
            assert transcript == [user("u")]

    async def test_concurrent_appends_lose_and_duplicate_nothing(
        self, store: ChatConversationStore, tenant: str
    ) -> None:
        await store.append_messages(tenant, "alice", "s", "agent", [user("first")])
        extra = [user(f"message {number}") for number in range(20)]
        await asyncio.gather(
            *(store.append_messages(tenant, "alice", "s", "agent", [m]) for m in extra)
        )
        transcript = await store.get_transcript(tenant, "alice", "s")
        assert transcript[0] == user("first")
        assert sorted(m.content for m in transcript[1:]) == sorted(m.content for m in extra)

    async def test_concurrent_creations_by_two_users_leave_one_owner(
        self, store: ChatConversationStore, tenant: str
    ) -> None:
        outcomes = await asyncio.gather(
            store.append_messages(tenant, "alice", "s", "agent", [user("alice")]),
            store.append_messages(tenant, "bob", "s", "agent", [user("bob")]),
            return_exceptions=True,
        )
        refused = [isinstance(outcome, ConversationNotOwnedError) for outcome in outcomes]
        assert refused.count(True) == 1 and outcomes[refused.index(False)] is None
        winner = "bob" if refused[0] else "alice"
        assert await store.get_transcript(tenant, winner, "s") == [user(winner)]
