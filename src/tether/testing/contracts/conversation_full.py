"""The whole ``ChatConversationStore`` contract, optional methods included.

For adapters implementing ``get_conversation``, ``list_conversations``,
``set_shared`` and ``delete_conversation`` as well as the seed's three methods::

    import pytest
    from tether.testing.contracts import ChatConversationStoreFullContract

    class TestMyConversationStore(ChatConversationStoreFullContract):
        @pytest.fixture
        def store(self, clock):
            return MyConversationStore(..., clock=clock)

The store must stamp ``created_at``/``updated_at`` with the ``clock`` it is given:
these tests move it by hand and check the stamps and the listing order.
"""

from __future__ import annotations

import pytest

from tether.domain.capabilities import Capability
from tether.domain.chat_conversation_store import (
    ChatConversationStore,
    ConversationNotOwnedError,
    ConversationSummary,
    LastTurnStatus,
)
from tether.testing.contracts._support import ManualClock, bot, exercises, unique, user
from tether.testing.contracts.conversation import ChatConversationStoreContract

_STATUSES: list[LastTurnStatus] = ["running", "complete", "errored", "cancelled"]


async def _ids(store: ChatConversationStore, tenant: str, requester: str | None) -> list[str]:
    """Every session id the requester lists, walking all pages."""
    ids: list[str] = []
    cursor: str | None = None
    while True:
        page = await store.list_conversations(tenant, requester, limit=2, cursor=cursor)
        ids.extend(item.session_id for item in page.items)
        if page.next_cursor is None:
            return ids
        cursor = page.next_cursor


class ChatConversationStoreFullContract(ChatConversationStoreContract):
    """Adds summaries, listing (own only, newest first, paged), sharing and deletion."""

    @exercises(Capability.CONVERSATION_GET)
    async def test_get_conversation_is_none_when_no_conversation_exists(
        self, store: ChatConversationStore, tenant: str
    ) -> None:
        assert await store.get_conversation(tenant, "alice", "s") is None
        await store.set_last_turn_status(tenant, "alice", "s", "complete")
        await store.append_messages(tenant, "alice", "s", "a", [bot("x")], create_if_absent=False)
        assert await store.get_conversation(tenant, "alice", "s") is None

    @exercises(Capability.CONVERSATION_GET)
    async def test_creation_records_owner_agent_and_times(
        self, store: ChatConversationStore, tenant: str, clock: ManualClock
    ) -> None:
        await store.append_messages(tenant, "alice", "s", "helper", [user("Hello there")])
        assert await store.get_conversation(tenant, "alice", "s") == ConversationSummary(
            tenant=tenant,
            session_id="s",
            owner_uuid="alice",
            agent_identifier="helper",
            shared=False,
            last_turn_status=None,
            created_at=clock(),
            updated_at=clock(),
            message_count=1,
            title="Hello there",
        )

    @exercises(Capability.CONVERSATION_GET)
    async def test_a_missing_requester_owns_as_the_empty_owner(
        self, store: ChatConversationStore, tenant: str
    ) -> None:
        await store.append_messages(tenant, None, "s", "agent", [user("hi")])
        summary = await store.get_conversation(tenant, "", "s")
        assert summary is not None and summary.owner_uuid == ""
        assert await _ids(store, tenant, None) == ["s"]

    @exercises(Capability.CONVERSATION_GET)
    async def test_writes_move_updated_at_and_keep_created_at(
        self, store: ChatConversationStore, tenant: str, clock: ManualClock
    ) -> None:
        created = clock()
        await store.append_messages(tenant, "alice", "s", "agent", [user("1")])
        appended = clock.advance(5)
        await store.append_messages(tenant, "alice", "s", "agent", [bot("2")])
        summary = await store.get_conversation(tenant, "alice", "s")
        assert summary is not None
        assert (summary.created_at, summary.updated_at, summary.message_count) == (
            created,
            appended,
            2,
        )
        status_set = clock.advance(5)
        await store.set_last_turn_status(tenant, "alice", "s", "complete")
        summary = await store.get_conversation(tenant, "alice", "s")
        assert summary is not None and (summary.created_at, summary.updated_at) == (
            created,
            status_set,
        )

    @pytest.mark.parametrize("status", _STATUSES)
    @exercises(Capability.CONVERSATION_GET)
    async def test_last_turn_status_is_set_by_append_and_by_set_last_turn_status(
        self, store: ChatConversationStore, tenant: str, status: LastTurnStatus
    ) -> None:
        await store.append_messages(
            tenant, "alice", "s", "agent", [user("q")], last_turn_status=status
        )
        summary = await store.get_conversation(tenant, "alice", "s")
        assert summary is not None and summary.last_turn_status == status
        await store.append_messages(tenant, "alice", "s", "agent", [bot("a")])
        summary = await store.get_conversation(tenant, "alice", "s")
        assert summary is not None and summary.last_turn_status == status
        other = _STATUSES[(_STATUSES.index(status) + 1) % len(_STATUSES)]
        await store.set_last_turn_status(tenant, "alice", "s", other)
        summary = await store.get_conversation(tenant, "alice", "s")
        assert summary is not None and summary.last_turn_status == other

    @exercises(Capability.CONVERSATION_GET)
    async def test_the_title_is_the_first_user_message(
        self, store: ChatConversationStore, tenant: str
    ) -> None:
        await store.append_messages(tenant, "alice", "s", "agent", [bot("Welcome!")])
        await store.append_messages(tenant, "alice", "s", "agent", [user("What is tether?")])
        await store.append_messages(tenant, "alice", "s", "agent", [user("And why?")])
        summary = await store.get_conversation(tenant, "alice", "s")
        assert summary is not None and summary.title == "What is tether?"

    @exercises(Capability.CONVERSATION_GET)
    async def test_a_long_first_message_gives_a_truncated_title(
        self, store: ChatConversationStore, tenant: str
    ) -> None:
        content = "word " * 60
        await store.append_messages(tenant, "alice", "s", "agent", [user(content)])
        summary = await store.get_conversation(tenant, "alice", "s")
        assert summary is not None
        assert 20 <= len(summary.title) <= 80
        assert content.startswith(summary.title.rstrip(".\u2026").rstrip())

    @exercises(Capability.CONVERSATION_GET)
    async def test_a_private_summary_is_refused_to_another_user(
        self, store: ChatConversationStore, tenant: str
    ) -> None:
        await store.append_messages(tenant, "alice", "s", "agent", [user("secret")])
        with pytest.raises(ConversationNotOwnedError):
            await store.get_conversation(tenant, "mallory", "s")

    @exercises(Capability.CONVERSATION_GET, Capability.CONVERSATION_SET_SHARED)
    async def test_a_shared_conversation_is_readable_by_anyone_writable_by_the_owner(
        self, store: ChatConversationStore, tenant: str
    ) -> None:
        await store.append_messages(tenant, "alice", "s", "agent", [user("look")])
        await store.set_shared(tenant, "alice", "s", True)
        assert await store.get_transcript(tenant, "mallory", "s") == [user("look")]
        summary = await store.get_conversation(tenant, None, "s")
        assert summary is not None and summary.shared and summary.owner_uuid == "alice"
        with pytest.raises(ConversationNotOwnedError):
            await store.append_messages(tenant, "mallory", "s", "agent", [user("x")])
        with pytest.raises(ConversationNotOwnedError):
            await store.set_shared(tenant, "mallory", "s", False)
        await store.set_shared(tenant, "alice", "s", False)
        with pytest.raises(ConversationNotOwnedError):
            await store.get_transcript(tenant, "mallory", "s")
        assert await store.get_transcript(tenant, "alice", "s") == [user("look")]

    @exercises(
        Capability.CONVERSATION_GET,
        Capability.CONVERSATION_SET_SHARED,
        Capability.CONVERSATION_DELETE,
    )
    async def test_writes_by_another_user_are_refused_for_sharing_and_deletion(
        self, store: ChatConversationStore, tenant: str
    ) -> None:
        await store.append_messages(tenant, "alice", "s", "agent", [user("mine")])
        before = await store.get_conversation(tenant, "alice", "s")
        with pytest.raises(ConversationNotOwnedError):
            await store.set_shared(tenant, "mallory", "s", True)
        with pytest.raises(ConversationNotOwnedError):
            await store.delete_conversation(tenant, "mallory", "s")
        with pytest.raises(ConversationNotOwnedError):
            await store.set_last_turn_status(tenant, "mallory", "s", "errored")
        assert await store.get_conversation(tenant, "alice", "s") == before

    @exercises(Capability.CONVERSATION_LIST, Capability.CONVERSATION_SET_SHARED)
    async def test_listing_shows_only_own_conversations_newest_updated_first(
        self, store: ChatConversationStore, tenant: str, clock: ManualClock
    ) -> None:
        other_tenant = unique("tenant")
        for session in ("old", "middle", "new"):
            await store.append_messages(tenant, "alice", session, "agent", [user(session)])
            clock.advance(1)
        await store.append_messages(tenant, "bob", "bobs", "agent", [user("bob")])
        await store.set_shared(tenant, "bob", "bobs", True)
        await store.append_messages(other_tenant, "alice", "elsewhere", "agent", [user("x")])
        assert await _ids(store, tenant, "alice") == ["new", "middle", "old"]
        clock.advance(1)
        await store.append_messages(tenant, "alice", "old", "agent", [bot("revived")])
        assert await _ids(store, tenant, "alice") == ["old", "new", "middle"]
        assert await _ids(store, tenant, "bob") == ["bobs"]
        assert await _ids(store, tenant, "nobody") == []

    @exercises(Capability.CONVERSATION_LIST)
    async def test_listing_pages_with_an_opaque_cursor(
        self, store: ChatConversationStore, tenant: str, clock: ManualClock
    ) -> None:
        sessions = [f"s{number}" for number in range(7)]
        for session in sessions:
            await store.append_messages(tenant, "alice", session, "agent", [user(session)])
            clock.advance(1)
        # Two conversations updated at the same instant still page without loss.
        await store.append_messages(tenant, "alice", "tie-a", "agent", [user("a")])
        await store.append_messages(tenant, "alice", "tie-b", "agent", [user("b")])
        pages = []
        cursor: str | None = None
        while True:
            page = await store.list_conversations(tenant, "alice", limit=3, cursor=cursor)
            pages.append([item.session_id for item in page.items])
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        assert [len(items) for items in pages] == [3, 3, 3]
        listed = [session for items in pages for session in items]
        assert sorted(listed[:2]) == ["tie-a", "tie-b"]
        assert listed[2:] == sessions[::-1]

    @exercises(Capability.CONVERSATION_LIST)
    async def test_an_empty_listing_has_no_cursor(
        self, store: ChatConversationStore, tenant: str
    ) -> None:
        page = await store.list_conversations(tenant, "alice")
        assert page.items == [] and page.next_cursor is None

    @exercises(Capability.CONVERSATION_LIST)
    async def test_listing_returns_tricky_session_ids_exactly(
        self, store: ChatConversationStore, tenant: str
    ) -> None:
        for tricky in self.tricky_ids:
            await store.append_messages(tenant, "alice", tricky, "agent", [user("x")])
        assert sorted(await _ids(store, tenant, "alice")) == sorted(self.tricky_ids)

    @exercises(Capability.CONVERSATION_GET, Capability.CONVERSATION_DELETE)
    async def test_delete_removes_the_conversation(
        self, store: ChatConversationStore, tenant: str
    ) -> None:
        await store.append_messages(tenant, "alice", "s", "agent", [user("bye")])
        await store.append_messages(tenant, "alice", "kept", "agent", [user("stay")])
        assert await store.delete_conversation(tenant, "alice", "s") is True
        assert await store.get_conversation(tenant, "alice", "s") is None
        assert await store.get_transcript(tenant, "alice", "s") == []
        assert await _ids(store, tenant, "alice") == ["kept"]
        assert await store.delete_conversation(tenant, "alice", "s") is False

    @exercises(Capability.CONVERSATION_GET, Capability.CONVERSATION_DELETE)
    async def test_a_conversation_deleted_mid_stream_is_not_resurrected(
        self, store: ChatConversationStore, tenant: str
    ) -> None:
        await store.append_messages(tenant, "alice", "s", "agent", [user("q")])
        await store.delete_conversation(tenant, "alice", "s")
        await store.append_messages(
            tenant, "alice", "s", "agent", [bot("late")], create_if_absent=False
        )
        assert await store.get_conversation(tenant, "alice", "s") is None
        assert await _ids(store, tenant, "alice") == []

    @exercises(Capability.CONVERSATION_GET, Capability.CONVERSATION_DELETE)
    async def test_after_delete_someone_else_may_start_the_session(
        self, store: ChatConversationStore, tenant: str
    ) -> None:
        await store.append_messages(tenant, "alice", "s", "agent", [user("a")])
        await store.delete_conversation(tenant, "alice", "s")
        await store.append_messages(tenant, "bob", "s", "agent", [user("b")])
        summary = await store.get_conversation(tenant, "bob", "s")
        assert summary is not None and summary.owner_uuid == "bob"
        assert await store.get_transcript(tenant, "bob", "s") == [user("b")]
