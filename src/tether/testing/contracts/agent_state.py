"""The ``ChatAgentStateStore`` contract, as tests your adapter inherits.

Subclass the contract in a test module and override the ``store`` fixture::

    import pytest
    from tether.testing.contracts import ChatAgentStateStoreContract

    class TestMyStateStore(ChatAgentStateStoreContract):
        @pytest.fixture
        def store(self, tmp_path):
            return MyStateStore(base_path=tmp_path)

Every test works under fresh random ids, so one store may serve many tests (a
real database need not be emptied between them). Narrow ``tricky_ids`` in the
subclass if your backend legitimately refuses some ids (say, NUL in PostgreSQL).
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import pytest

from tether.domain.chat_agent_state_store import ChatAgentStateStore, DependencyState
from tether.testing.contracts._support import TRICKY_IDS, unique


def _state(marker: str) -> DependencyState:
    return {
        "search": {"marker": marker, "hits": [1, 2, 3], "nested": {"ok": True, "none": None}},
        "notes": {"text": f"written by {marker}", "unicode": "ünïcødé 会話"},
    }


class ChatAgentStateStoreContract:
    """Checkpoints: ``{}`` when missing, whole-blob replace, no-op delete, copies."""

    pytestmark: ClassVar[list[Any]] = [pytest.mark.asyncio]
    tricky_ids: ClassVar[tuple[str, ...]] = TRICKY_IDS

    @pytest.fixture
    def store(self) -> ChatAgentStateStore:
        """Override: the store under test."""
        raise NotImplementedError("override the `store` fixture with your adapter")

    @pytest.fixture
    def tenant(self) -> str:
        return unique("tenant")

    async def test_load_returns_empty_dict_when_nothing_is_saved(
        self, store: ChatAgentStateStore, tenant: str
    ) -> None:
        assert await store.load(tenant, "user", "session") == {}

    async def test_save_then_load_returns_the_state(
        self, store: ChatAgentStateStore, tenant: str
    ) -> None:
        await store.save(tenant, "user", "session", _state("a"))
        assert await store.load(tenant, "user", "session") == _state("a")

    async def test_save_replaces_the_whole_blob(
        self, store: ChatAgentStateStore, tenant: str
    ) -> None:
        await store.save(tenant, "user", "session", _state("a"))
        await store.save(tenant, "user", "session", {"other": {"only": 1}})
        assert await store.load(tenant, "user", "session") == {"other": {"only": 1}}

    async def test_an_empty_state_round_trips(
        self, store: ChatAgentStateStore, tenant: str
    ) -> None:
        await store.save(tenant, "user", "session", _state("a"))
        await store.save(tenant, "user", "session", {})
        assert await store.load(tenant, "user", "session") == {}

    async def test_delete_removes_the_state(self, store: ChatAgentStateStore, tenant: str) -> None:
        await store.save(tenant, "user", "session", _state("a"))
        await store.delete(tenant, "user", "session")
        assert await store.load(tenant, "user", "session") == {}

    async def test_delete_is_a_no_op_when_nothing_exists(
        self, store: ChatAgentStateStore, tenant: str
    ) -> None:
        await store.delete(tenant, "user", "session")
        await store.delete(tenant, "user", "session")
        assert await store.load(tenant, "user", "session") == {}

    async def test_delete_leaves_other_conversations_alone(
        self, store: ChatAgentStateStore, tenant: str
    ) -> None:
        await store.save(tenant, "user", "one", _state("one"))
        await store.save(tenant, "user", "two", _state("two"))
        await store.delete(tenant, "user", "one")
        assert await store.load(tenant, "user", "two") == _state("two")

    async def test_load_returns_a_copy(self, store: ChatAgentStateStore, tenant: str) -> None:
        await store.save(tenant, "user", "session", _state("a"))
        loaded = await store.load(tenant, "user", "session")
        loaded["search"]["marker"] = "mutated"
        loaded["injected"] = {}
        assert await store.load(tenant, "user", "session") == _state("a")

    async def test_save_keeps_a_copy(self, store: ChatAgentStateStore, tenant: str) -> None:
        state = _state("a")
        await store.save(tenant, "user", "session", state)
        state["search"]["marker"] = "mutated"
        state["injected"] = {}
        assert await store.load(tenant, "user", "session") == _state("a")

    async def test_same_session_id_in_two_tenants_or_users_does_not_collide(
        self, store: ChatAgentStateStore, tenant: str
    ) -> None:
        other_tenant = unique("tenant")
        await store.save(tenant, "alice", "session", _state("alice"))
        await store.save(tenant, "bob", "session", _state("bob"))
        await store.save(other_tenant, "alice", "session", _state("other"))
        assert await store.load(tenant, "alice", "session") == _state("alice")
        assert await store.load(tenant, "bob", "session") == _state("bob")
        assert await store.load(other_tenant, "alice", "session") == _state("other")
        await store.delete(tenant, "alice", "session")
        assert await store.load(tenant, "bob", "session") == _state("bob")
        assert await store.load(other_tenant, "alice", "session") == _state("other")

    async def test_a_missing_user_is_the_empty_user(
        self, store: ChatAgentStateStore, tenant: str
    ) -> None:
        # construct_agent_state_key spells a missing user as "".
        await store.save(tenant, None, "session", _state("anonymous"))
        assert await store.load(tenant, "", "session") == _state("anonymous")
        await store.delete(tenant, "", "session")
        assert await store.load(tenant, None, "session") == {}

    async def test_tricky_ids_are_stored_and_read_back_separately(
        self, store: ChatAgentStateStore, tenant: str
    ) -> None:
        session = unique("session")
        for position, tricky in enumerate(self.tricky_ids):
            await store.save(tenant, "user", tricky, _state(f"session {position}"))
            await store.save(tenant, tricky, session, _state(f"user {position}"))
            await store.save(tricky, "user", session, _state(f"tenant {position}"))
        for position, tricky in enumerate(self.tricky_ids):
            assert await store.load(tenant, "user", tricky) == _state(f"session {position}")
            assert await store.load(tenant, tricky, session) == _state(f"user {position}")
            assert await store.load(tricky, "user", session) == _state(f"tenant {position}")
        for tricky in self.tricky_ids:
            await store.delete(tricky, "user", session)
        assert await store.load(tenant, "user", self.tricky_ids[0]) == _state("session 0")

    async def test_concurrent_saves_leave_one_whole_blob(
        self, store: ChatAgentStateStore, tenant: str
    ) -> None:
        states = [_state(f"writer {number}") for number in range(12)]
        await asyncio.gather(*(store.save(tenant, "user", "session", s) for s in states))
        assert await store.load(tenant, "user", "session") in states
