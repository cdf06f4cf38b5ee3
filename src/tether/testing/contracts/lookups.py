"""Lookups without the conversation's key: a turn by its message id, conversations by age.

Three optional methods, each with its contract:

- ``ChatStreamSupervisionStore.find_by_message_id`` (a cancel that names only
  its turn): ``ChatStreamSupervisionLookupContract``;
- ``ChatStreamSupervisionStore.list_stale_running`` (finding turns whose
  producer died, with no client): ``ChatStreamSupervisionStaleContract``;
- ``ChatConversationStore.list_stale_conversations`` (retention, ``tether db
  prune``): ``ChatConversationRetentionContract``. Its ``store`` must stamp
  times with the ``clock`` fixture, as for ``ChatConversationStoreFullContract``.

::

    class TestMySupervisionLookups(ChatStreamSupervisionLookupContract):
        @pytest.fixture
        def store(self):
            return MySupervisionStore(...)

    class TestMyRetention(ChatConversationRetentionContract):
        @pytest.fixture
        def store(self, clock):
            return MyConversationStore(..., clock=clock)

Every test works under fresh ids, and the retention tests look only at their
own tenants' conversations: a shared database may hold any number of others.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import pytest

from tether.domain.capabilities import Capability
from tether.domain.chat_conversation_store import ChatConversationStore
from tether.domain.chat_stream_supervision_store import (
    ChatStreamStatus,
    ChatStreamSupervision,
    ChatStreamSupervisionStore,
    SupervisionSwap,
)
from tether.testing.contracts._support import ManualClock, exercises, unique, user

_T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


def _row(
    epoch: int, message_id: str, status: ChatStreamStatus = ChatStreamStatus.RUNNING
) -> ChatStreamSupervision:
    return ChatStreamSupervision(
        status=status, heartbeat_at=_T0, message_id=message_id, epoch=epoch
    )


class _Fixtures:
    pytestmark: ClassVar[list[Any]] = [pytest.mark.asyncio]

    @pytest.fixture
    def store(self) -> Any:
        """Override: the store under test."""
        raise NotImplementedError("override the `store` fixture with your adapter")

    @pytest.fixture
    def tenant(self) -> str:
        return unique("tenant")


@exercises(Capability.SUPERVISION_FIND_BY_MESSAGE_ID)
class ChatStreamSupervisionLookupContract(_Fixtures):
    """``find_by_message_id``: the requester's session whose row holds the turn, now."""

    async def test_a_claimed_turn_is_found_by_its_message_id(
        self, store: ChatStreamSupervisionStore, tenant: str
    ) -> None:
        assert await store.compare_and_swap(tenant, "alice", "s-1", None, _row(1, "m-1"))
        assert await store.compare_and_swap(tenant, "alice", "s-2", None, _row(1, "m-2"))
        assert await store.find_by_message_id(tenant, "alice", "m-1") == "s-1"
        assert await store.find_by_message_id(tenant, "alice", "m-2") == "s-2"
        assert await store.find_by_message_id(tenant, "alice", "m-3") is None

    async def test_only_the_requesters_own_turns_in_the_tenant_are_found(
        self, store: ChatStreamSupervisionStore, tenant: str
    ) -> None:
        assert await store.compare_and_swap(tenant, "alice", "s", None, _row(1, "m-1"))
        assert await store.find_by_message_id(tenant, "bob", "m-1") is None
        assert await store.find_by_message_id(tenant, None, "m-1") is None
        assert await store.find_by_message_id(unique("tenant"), "alice", "m-1") is None
        assert await store.compare_and_swap(tenant, None, "s", None, _row(1, "m-anon"))
        assert await store.find_by_message_id(tenant, None, "m-anon") == "s"
        assert await store.find_by_message_id(tenant, "", "m-anon") == "s"

    async def test_heartbeats_and_status_changes_keep_the_turn_found(
        self, store: ChatStreamSupervisionStore, tenant: str
    ) -> None:
        assert await store.compare_and_swap(tenant, "alice", "s", None, _row(1, "m-1"))
        swaps = [SupervisionSwap(tenant, "alice", "s", 1, _row(1, "m-1"))]
        assert await store.compare_and_swap_many(swaps) == [True]
        done = _row(2, "m-1", ChatStreamStatus.DONE)
        assert await store.compare_and_swap(tenant, "alice", "s", 1, done)
        assert await store.find_by_message_id(tenant, "alice", "m-1") == "s"

    async def test_a_turn_replaced_by_a_newer_one_is_found_no_more(
        self, store: ChatStreamSupervisionStore, tenant: str
    ) -> None:
        assert await store.compare_and_swap(tenant, "alice", "s", None, _row(1, "m-1"))
        assert await store.compare_and_swap(tenant, "alice", "s", 1, _row(2, "m-2"))
        assert await store.find_by_message_id(tenant, "alice", "m-1") is None
        assert await store.find_by_message_id(tenant, "alice", "m-2") == "s"

    async def test_a_deleted_row_is_found_no_more_and_a_refused_delete_changes_nothing(
        self, store: ChatStreamSupervisionStore, tenant: str
    ) -> None:
        assert await store.compare_and_swap(tenant, "alice", "s", None, _row(1, "m-1"))
        await store.delete(tenant, "alice", "s", "m-1", 2)  # wrong epoch: left alone
        assert await store.find_by_message_id(tenant, "alice", "m-1") == "s"
        await store.delete(tenant, "alice", "s", "m-1", 1)
        assert await store.find_by_message_id(tenant, "alice", "m-1") is None
        assert await store.compare_and_swap(tenant, "alice", "s", None, _row(2, "m-2"))
        assert await store.find_by_message_id(tenant, "alice", "m-2") == "s"

    async def test_awkward_ids_are_found_exactly(
        self, store: ChatStreamSupervisionStore, tenant: str
    ) -> None:
        awkward = ["../../x", "a/b", "x.lock", "Session", "session", "会話", "x" * 2_000]
        for number, value in enumerate(awkward):
            assert await store.compare_and_swap(tenant, value, value, None, _row(1, value))
            assert await store.find_by_message_id(tenant, value, value) == value, number
        assert await store.find_by_message_id(tenant, "session", "Session") is None


# Far in the past, so these rows come before any other test's in a shared store
# (the list is oldest first); each test moves to its own second.
_LONG_AGO = datetime(2001, 1, 1, tzinfo=UTC)


def _at(heartbeat_at: datetime, epoch: int, message_id: str, status: ChatStreamStatus) -> Any:
    return ChatStreamSupervision(
        status=status, heartbeat_at=heartbeat_at, message_id=message_id, epoch=epoch
    )


@exercises(Capability.SUPERVISION_LIST_STALE_RUNNING)
class ChatStreamSupervisionStaleContract(_Fixtures):
    """``list_stale_running``: RUNNING rows older than a bound, oldest first."""

    @pytest.fixture
    def base(self) -> datetime:
        return _LONG_AGO + timedelta(seconds=int(unique("")[-6:], 16) % 10_000_000)

    async def _mine(
        self, store: ChatStreamSupervisionStore, tenant: str, before: datetime
    ) -> list[tuple[str, str]]:
        listed = await store.list_stale_running(before, limit=1_000)
        heartbeats = [turn.supervision.heartbeat_at for turn in listed]
        assert heartbeats == sorted(heartbeats)
        assert all(turn.supervision.status is ChatStreamStatus.RUNNING for turn in listed)
        assert all(turn.supervision.heartbeat_at < before for turn in listed)
        return [(t.session_id, t.supervision.message_id) for t in listed if t.tenant == tenant]

    async def test_only_running_rows_older_than_the_bound_are_listed_oldest_first(
        self, store: ChatStreamSupervisionStore, tenant: str, base: datetime
    ) -> None:
        running = ChatStreamStatus.RUNNING
        rows = {
            "s-old": _at(base, 1, "m-old", running),
            "s-older": _at(base - timedelta(seconds=2), 1, "m-older", running),
            "s-fresh": _at(base + timedelta(seconds=10), 1, "m-fresh", running),
            "s-done": _at(base - timedelta(seconds=5), 2, "m-done", ChatStreamStatus.DONE),
        }
        for session, row in rows.items():
            assert await store.compare_and_swap(tenant, "alice", session, None, row)
        before = base + timedelta(seconds=1)
        assert await self._mine(store, tenant, before) == [
            ("s-older", "m-older"),
            ("s-old", "m-old"),
        ]
        listed = await store.list_stale_running(before, limit=1_000)
        mine = [t for t in listed if t.tenant == tenant]
        assert {(t.requester_uuid or "") for t in mine} == {"alice"}
        assert mine[0].supervision == rows["s-older"]
        for session, row in rows.items():
            await store.delete(tenant, "alice", session, row.message_id, row.epoch)

    async def test_a_heartbeat_or_a_verdict_takes_a_row_off_the_list(
        self, store: ChatStreamSupervisionStore, tenant: str, base: datetime
    ) -> None:
        running = ChatStreamStatus.RUNNING
        assert await store.compare_and_swap(tenant, None, "s-1", None, _at(base, 1, "m-1", running))
        assert await store.compare_and_swap(tenant, None, "s-2", None, _at(base, 1, "m-2", running))
        before = base + timedelta(seconds=1)
        assert sorted(await self._mine(store, tenant, before)) == [("s-1", "m-1"), ("s-2", "m-2")]
        renewed = _at(base + timedelta(seconds=5), 1, "m-1", running)
        assert await store.compare_and_swap_many([SupervisionSwap(tenant, None, "s-1", 1, renewed)])
        ended = _at(base, 2, "m-2", ChatStreamStatus.ERRORED)
        assert await store.compare_and_swap(tenant, None, "s-2", 1, ended)
        assert await self._mine(store, tenant, before) == []
        # A takeover's fresh claim is live; a row deleted is gone.
        taken = _at(base - timedelta(seconds=1), 2, "m-1", running)
        assert await store.compare_and_swap(tenant, None, "s-1", 1, taken)
        assert await self._mine(store, tenant, before) == [("s-1", "m-1")]
        await store.delete(tenant, None, "s-1", "m-1", 2)
        assert await self._mine(store, tenant, before) == []

    async def test_the_limit_keeps_the_oldest(
        self, store: ChatStreamSupervisionStore, tenant: str, base: datetime
    ) -> None:
        for n in range(5):
            row = _at(base + timedelta(seconds=n), 1, f"m-{n}", ChatStreamStatus.RUNNING)
            assert await store.compare_and_swap(tenant, "u", f"s-{n}", None, row)
        listed = await store.list_stale_running(base + timedelta(seconds=10), limit=3)
        assert len(listed) == 3
        heartbeats = [t.supervision.heartbeat_at for t in listed]
        assert heartbeats == sorted(heartbeats)
        # The oldest three of the whole store (another test's rows may be older).
        mine = {t.supervision.message_id for t in listed if t.tenant == tenant}
        assert mine == {f"m-{n}" for n in range(5) if base + timedelta(seconds=n) <= heartbeats[-1]}
        for n in range(5):
            await store.delete(tenant, "u", f"s-{n}", f"m-{n}", 1)

    async def test_the_producer_round_trips_through_every_write_and_read(
        self, store: ChatStreamSupervisionStore, tenant: str, base: datetime
    ) -> None:
        """A row names the replica producing it (``tether.runtime.presence``):
        every write keeps what it is given, every read returns it."""

        def row(at: float, epoch: int, message_id: str, producer: str | None) -> Any:
            return ChatStreamSupervision(
                status=ChatStreamStatus.RUNNING,
                heartbeat_at=base + timedelta(seconds=at),
                message_id=message_id,
                epoch=epoch,
                producer=producer,
            )

        named, anonymous = row(0, 1, "m-named", "replica-a"), row(0, 1, "m-anonymous", None)
        assert await store.compare_and_swap(tenant, "alice", "named", None, named)
        assert await store.compare_and_swap(tenant, "alice", "anonymous", None, anonymous)
        assert await store.read(tenant, "alice", "named") == named
        assert await store.read(tenant, "alice", "anonymous") == anonymous
        swaps = [  # a heartbeat, and a takeover by another replica
            SupervisionSwap(tenant, "alice", "named", 1, row(1, 1, "m-named", "replica-a")),
            SupervisionSwap(tenant, "alice", "anonymous", 1, row(2, 2, "m-taken", "replica-b")),
        ]
        assert await store.compare_and_swap_many(swaps) == [True, True]
        for swap in swaps:
            assert await store.read(tenant, "alice", swap.session_id) == swap.supervision
        listed = await store.list_stale_running(base + timedelta(seconds=3), limit=1_000)
        assert [(t.session_id, t.supervision) for t in listed if t.tenant == tenant] == [
            (swap.session_id, swap.supervision) for swap in swaps
        ]
        for swap in swaps:
            written = swap.supervision
            await store.delete(tenant, "alice", swap.session_id, written.message_id, written.epoch)


async def _stale(
    store: ChatConversationStore, before: datetime, tenants: set[str]
) -> list[tuple[str, str]]:
    """``(tenant, session_id)`` of every stale conversation of ``tenants``, walking
    pages of two, in the order listed."""
    found: list[tuple[str, str]] = []
    cursor: str | None = None
    while True:
        page = await store.list_stale_conversations(before, limit=2, cursor=cursor)
        assert len(page.items) <= 2
        found.extend((i.tenant, i.session_id) for i in page.items if i.tenant in tenants)
        if page.next_cursor is None:
            return found
        cursor = page.next_cursor


@exercises(Capability.CONVERSATION_LIST_STALE)
class ChatConversationRetentionContract(_Fixtures):
    """``list_stale_conversations``: every owner's, oldest first, before the cutoff."""

    @pytest.fixture
    def clock(self) -> ManualClock:
        """The clock the ``store`` fixture must stamp times with."""
        return ManualClock()

    async def test_conversations_older_than_the_cutoff_of_every_owner_and_tenant(
        self, store: ChatConversationStore, tenant: str, clock: ManualClock
    ) -> None:
        other = unique("tenant")
        await store.append_messages(tenant, "alice", "old", "a", [user("1")])
        clock.advance(60)
        await store.append_messages(other, "bob", "older-elsewhere", "a", [user("2")])
        clock.advance(60)
        await store.append_messages(tenant, None, "anonymous", "a", [user("3")])
        clock.advance(60)
        cutoff = clock()
        await store.append_messages(tenant, "alice", "fresh", "a", [user("4")])
        assert await _stale(store, cutoff, {tenant, other}) == [
            (tenant, "old"),
            (other, "older-elsewhere"),
            (tenant, "anonymous"),
        ]
        summaries = await store.list_stale_conversations(cutoff, limit=1_000)
        owners = {i.session_id: i.owner_uuid for i in summaries.items if i.tenant == tenant}
        assert owners == {"old": "alice", "anonymous": ""}

    async def test_an_update_makes_a_conversation_fresh_again(
        self, store: ChatConversationStore, tenant: str, clock: ManualClock
    ) -> None:
        await store.append_messages(tenant, "alice", "a", "agent", [user("1")])
        await store.append_messages(tenant, "alice", "b", "agent", [user("2")])
        clock.advance(3600)
        await store.set_last_turn_status(tenant, "alice", "a", "complete")
        assert await _stale(store, clock(), {tenant}) == [(tenant, "b")]
        assert await _stale(store, clock() - timedelta(hours=2), {tenant}) == []

    async def test_many_conversations_of_one_moment_page_without_gaps_or_repeats(
        self, store: ChatConversationStore, tenant: str, clock: ManualClock
    ) -> None:
        sessions = [f"s-{number:02d}" for number in range(7)]
        for session in sessions:
            await store.append_messages(tenant, f"owner-{session}", session, "a", [user("x")])
        clock.advance(1)
        listed = await _stale(store, clock(), {tenant})
        assert sorted(listed) == [(tenant, s) for s in sessions]
        assert len(set(listed)) == len(listed)

    async def test_a_deleted_conversation_is_not_listed(
        self, store: ChatConversationStore, tenant: str, clock: ManualClock
    ) -> None:
        await store.append_messages(tenant, "alice", "s", "a", [user("x")])
        assert await store.delete_conversation(tenant, "alice", "s")
        clock.advance(1)
        assert await _stale(store, clock(), {tenant}) == []

    async def test_a_cursor_it_did_not_hand_out_or_a_bad_limit_is_a_value_error(
        self, store: ChatConversationStore, clock: ManualClock
    ) -> None:
        with pytest.raises(ValueError):
            await store.list_stale_conversations(clock(), limit=10, cursor="not a cursor")
        with pytest.raises(ValueError):
            await store.list_stale_conversations(clock(), limit=0)
