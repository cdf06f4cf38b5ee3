"""The ``ChatStreamSupervisionStore`` contract, as tests your adapter inherits.

Subclass the contract in a test module and override the ``store`` fixture::

    import pytest
    from tether.testing.contracts import ChatStreamSupervisionStoreContract

    class TestMySupervisionStore(ChatStreamSupervisionStoreContract):
        @pytest.fixture
        def store(self):
            return MySupervisionStore(...)

Every test works under fresh random ids, so one store may serve many tests. The
concurrency tests race tasks of one event loop; for a backend shared between
processes, also run ``ChatStreamSupervisionCrossProcessContract``.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import pytest

from tether.domain.capabilities import Capability
from tether.domain.chat_stream_supervision_store import (
    ChatStreamStatus,
    ChatStreamSupervision,
    ChatStreamSupervisionStore,
    SupervisionSwap,
)
from tether.testing.contracts._support import TRICKY_IDS, exercises, unique

_T0 = datetime(2030, 1, 1, 12, 0, 0, 123456, tzinfo=UTC)


def _row(
    epoch: int,
    message_id: str = "m-1",
    status: ChatStreamStatus = ChatStreamStatus.RUNNING,
    seconds: float = 0.0,
) -> ChatStreamSupervision:
    return ChatStreamSupervision(
        status=status,
        heartbeat_at=_T0 + timedelta(seconds=seconds),
        message_id=message_id,
        epoch=epoch,
    )


class ChatStreamSupervisionStoreContract:
    """One row per conversation: epoch compare-and-swap, guarded delete, copies."""

    pytestmark: ClassVar[list[Any]] = [pytest.mark.asyncio]
    tricky_ids: ClassVar[tuple[str, ...]] = TRICKY_IDS

    @pytest.fixture
    def store(self) -> ChatStreamSupervisionStore:
        """Override: the store under test."""
        raise NotImplementedError("override the `store` fixture with your adapter")

    @pytest.fixture
    def tenant(self) -> str:
        return unique("tenant")

    async def test_read_returns_none_when_no_row_exists(
        self, store: ChatStreamSupervisionStore, tenant: str
    ) -> None:
        assert await store.read(tenant, "user", "session") is None

    async def test_claim_with_expected_none_writes_when_no_row_exists(
        self, store: ChatStreamSupervisionStore, tenant: str
    ) -> None:
        assert await store.compare_and_swap(tenant, "user", "session", None, _row(1)) is True
        assert await store.read(tenant, "user", "session") == _row(1)

    async def test_claim_with_expected_none_is_refused_when_a_row_exists(
        self, store: ChatStreamSupervisionStore, tenant: str
    ) -> None:
        await store.compare_and_swap(tenant, "user", "session", None, _row(1))
        claim = _row(2, "m-2")
        assert await store.compare_and_swap(tenant, "user", "session", None, claim) is False
        assert await store.read(tenant, "user", "session") == _row(1)

    async def test_cas_with_the_current_epoch_replaces_the_row(
        self, store: ChatStreamSupervisionStore, tenant: str
    ) -> None:
        await store.compare_and_swap(tenant, "user", "session", None, _row(1))
        heartbeat = _row(1, seconds=1)
        assert await store.compare_and_swap(tenant, "user", "session", 1, heartbeat) is True
        assert await store.read(tenant, "user", "session") == heartbeat
        takeover = _row(2, "m-2", seconds=5)
        assert await store.compare_and_swap(tenant, "user", "session", 1, takeover) is True
        assert await store.read(tenant, "user", "session") == takeover

    @pytest.mark.parametrize("wrong", [0, 2, 3, 100])
    async def test_cas_with_another_epoch_is_refused_and_changes_nothing(
        self, store: ChatStreamSupervisionStore, tenant: str, wrong: int
    ) -> None:
        await store.compare_and_swap(tenant, "user", "session", None, _row(1))
        attempt = _row(wrong + 1, "m-x", ChatStreamStatus.DONE, seconds=9)
        assert await store.compare_and_swap(tenant, "user", "session", wrong, attempt) is False
        assert await store.read(tenant, "user", "session") == _row(1)

    @pytest.mark.parametrize("expected", [0, 1])
    async def test_cas_with_an_epoch_is_refused_when_no_row_exists(
        self, store: ChatStreamSupervisionStore, tenant: str, expected: int
    ) -> None:
        assert await store.compare_and_swap(tenant, "user", "s", expected, _row(2)) is False
        assert await store.read(tenant, "user", "s") is None

    async def test_a_producer_is_fenced_once_a_higher_epoch_is_claimed(
        self, store: ChatStreamSupervisionStore, tenant: str
    ) -> None:
        await store.compare_and_swap(tenant, "user", "session", None, _row(1, "old"))
        await store.compare_and_swap(tenant, "user", "session", 1, _row(2, "new"))
        stale_heartbeat = _row(1, "old", seconds=3)
        assert await store.compare_and_swap(tenant, "user", "session", 1, stale_heartbeat) is False
        assert await store.read(tenant, "user", "session") == _row(2, "new")

    async def test_delete_removes_the_row_holding_exactly_message_and_epoch(
        self, store: ChatStreamSupervisionStore, tenant: str
    ) -> None:
        await store.compare_and_swap(tenant, "user", "session", None, _row(3, "m-3"))
        await store.delete(tenant, "user", "session", "m-3", 3)
        assert await store.read(tenant, "user", "session") is None

    @pytest.mark.parametrize(("message_id", "epoch"), [("m-other", 3), ("m-3", 2), ("m-3", 4)])
    async def test_delete_leaves_a_row_held_by_another_turn_or_epoch(
        self, store: ChatStreamSupervisionStore, tenant: str, message_id: str, epoch: int
    ) -> None:
        await store.compare_and_swap(tenant, "user", "session", None, _row(3, "m-3"))
        await store.delete(tenant, "user", "session", message_id, epoch)
        assert await store.read(tenant, "user", "session") == _row(3, "m-3")

    async def test_delete_is_a_no_op_when_no_row_exists(
        self, store: ChatStreamSupervisionStore, tenant: str
    ) -> None:
        await store.delete(tenant, "user", "session", "m-1", 1)
        assert await store.read(tenant, "user", "session") is None

    async def test_a_conversation_can_be_claimed_again_after_delete(
        self, store: ChatStreamSupervisionStore, tenant: str
    ) -> None:
        await store.compare_and_swap(tenant, "user", "session", None, _row(1))
        await store.delete(tenant, "user", "session", "m-1", 1)
        assert await store.compare_and_swap(tenant, "user", "session", None, _row(2, "m-2"))
        assert await store.read(tenant, "user", "session") == _row(2, "m-2")

    @pytest.mark.parametrize("status", list(ChatStreamStatus))
    async def test_every_status_and_the_heartbeat_round_trip(
        self, store: ChatStreamSupervisionStore, tenant: str, status: ChatStreamStatus
    ) -> None:
        row = _row(7, "m-7", status, seconds=0.000001)
        await store.compare_and_swap(tenant, "user", "session", None, row)
        stored = await store.read(tenant, "user", "session")
        assert stored == row
        assert stored is not None and stored.heartbeat_at.utcoffset() == timedelta(0)

    async def test_read_returns_a_copy(
        self, store: ChatStreamSupervisionStore, tenant: str
    ) -> None:
        await store.compare_and_swap(tenant, "user", "session", None, _row(1))
        stored = await store.read(tenant, "user", "session")
        assert stored is not None
        stored.epoch = 99
        stored.message_id = "mutated"
        assert await store.read(tenant, "user", "session") == _row(1)

    async def test_the_store_keeps_a_copy_of_what_it_writes(
        self, store: ChatStreamSupervisionStore, tenant: str
    ) -> None:
        row = _row(1)
        await store.compare_and_swap(tenant, "user", "session", None, row)
        row.epoch = 99
        row.status = ChatStreamStatus.DONE
        assert await store.read(tenant, "user", "session") == _row(1)

    async def test_same_session_id_in_two_tenants_or_users_does_not_collide(
        self, store: ChatStreamSupervisionStore, tenant: str
    ) -> None:
        other_tenant = unique("tenant")
        keys = [(tenant, "alice"), (tenant, "bob"), (other_tenant, "alice")]
        for number, (key_tenant, user) in enumerate(keys, start=1):
            row = _row(number, f"m-{number}")
            assert await store.compare_and_swap(key_tenant, user, "session", None, row)
        await store.delete(tenant, "alice", "session", "m-1", 1)
        assert await store.read(tenant, "alice", "session") is None
        assert await store.read(tenant, "bob", "session") == _row(2, "m-2")
        assert await store.read(other_tenant, "alice", "session") == _row(3, "m-3")

    @exercises(Capability.SUPERVISION_SWAP_MANY)
    async def test_a_batch_guards_each_swap_on_its_own_row(
        self, store: ChatStreamSupervisionStore, tenant: str
    ) -> None:
        # A replica's heartbeat batch: every turn renews at its own epoch, and a
        # turn taken over meanwhile is refused without touching the others.
        await store.compare_and_swap(tenant, "user", "alive", None, _row(1, "m-alive"))
        await store.compare_and_swap(tenant, "user", "taken", None, _row(3, "successor"))
        swaps = [
            SupervisionSwap(tenant, "user", "alive", 1, _row(1, "m-alive", seconds=1)),
            SupervisionSwap(tenant, "user", "taken", 2, _row(2, "m-taken", seconds=1)),
            SupervisionSwap(tenant, "user", "fresh", None, _row(1, "m-fresh", seconds=1)),
            SupervisionSwap(tenant, "user", "vanished", 4, _row(4, "m-gone", seconds=1)),
        ]
        assert await store.compare_and_swap_many(swaps) == [True, False, True, False]
        assert await store.read(tenant, "user", "alive") == _row(1, "m-alive", seconds=1)
        assert await store.read(tenant, "user", "taken") == _row(3, "successor")
        assert await store.read(tenant, "user", "fresh") == _row(1, "m-fresh", seconds=1)
        assert await store.read(tenant, "user", "vanished") is None

    @exercises(Capability.SUPERVISION_SWAP_MANY)
    async def test_an_empty_batch_is_nothing(
        self, store: ChatStreamSupervisionStore, tenant: str
    ) -> None:
        assert await store.compare_and_swap_many([]) == []

    @exercises(Capability.SUPERVISION_SWAP_MANY)
    async def test_a_batch_keeps_tricky_ids_apart(
        self, store: ChatStreamSupervisionStore, tenant: str
    ) -> None:
        swaps = [
            SupervisionSwap(tenant, tricky, tricky, None, _row(number, "m"))
            for number, tricky in enumerate(self.tricky_ids, start=1)
        ]
        assert await store.compare_and_swap_many(swaps) == [True] * len(swaps)
        for number, tricky in enumerate(self.tricky_ids, start=1):
            assert await store.read(tenant, tricky, tricky) == _row(number, "m")

    async def test_tricky_ids_are_stored_and_read_back_separately(
        self, store: ChatStreamSupervisionStore, tenant: str
    ) -> None:
        session = unique("session")
        for number, tricky in enumerate(self.tricky_ids, start=1):
            assert await store.compare_and_swap(tenant, "u", tricky, None, _row(number, "s"))
            assert await store.compare_and_swap(tenant, tricky, session, None, _row(number, "u"))
            assert await store.compare_and_swap(tricky, "u", session, None, _row(number, "t"))
        for number, tricky in enumerate(self.tricky_ids, start=1):
            assert await store.read(tenant, "u", tricky) == _row(number, "s")
            assert await store.read(tenant, tricky, session) == _row(number, "u")
            assert await store.read(tricky, "u", session) == _row(number, "t")
        for number, tricky in enumerate(self.tricky_ids, start=1):
            await store.delete(tricky, "u", session, "t", number)
            assert await store.read(tricky, "u", session) is None
        assert await store.read(tenant, "u", self.tricky_ids[0]) == _row(1, "s")

    async def test_concurrent_claims_have_exactly_one_winner(
        self, store: ChatStreamSupervisionStore, tenant: str
    ) -> None:
        claims = [_row(1, f"m-{number}") for number in range(16)]
        won = await asyncio.gather(
            *(store.compare_and_swap(tenant, "user", "session", None, claim) for claim in claims)
        )
        assert won.count(True) == 1
        assert await store.read(tenant, "user", "session") == claims[won.index(True)]

    async def test_concurrent_takeovers_have_exactly_one_winner(
        self, store: ChatStreamSupervisionStore, tenant: str
    ) -> None:
        await store.compare_and_swap(tenant, "user", "session", None, _row(1))
        takeovers = [_row(2, f"m-{number}") for number in range(16)]
        won = await asyncio.gather(
            *(store.compare_and_swap(tenant, "user", "session", 1, row) for row in takeovers)
        )
        assert won.count(True) == 1
        assert await store.read(tenant, "user", "session") == takeovers[won.index(True)]

    async def test_a_guarded_delete_never_removes_a_row_claimed_concurrently(
        self, store: ChatStreamSupervisionStore, tenant: str
    ) -> None:
        for attempt in range(8):
            session = f"session-{attempt}"
            await store.compare_and_swap(tenant, "user", session, None, _row(1, "old"))
            won, _ = await asyncio.gather(
                store.compare_and_swap(tenant, "user", session, 1, _row(2, "new")),
                store.delete(tenant, "user", session, "old", 1),
            )
            # Either the takeover came first (its row survives the delete) or the
            # delete did (and the takeover found no row at epoch 1).
            assert await store.read(tenant, "user", session) == (_row(2, "new") if won else None)
