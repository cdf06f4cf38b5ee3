"""The replica's heartbeat batcher: one round trip for all leases, fencing per lease."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest

from tether.adapters.memory import InMemoryChatStreamSupervisionStore
from tether.domain.chat_stream_supervision_store import (
    ChatStreamStatus,
    ChatStreamSupervision,
    SupervisionSwap,
)
from tether.runtime.clock import utc_now
from tether.runtime.heartbeats import HeartbeatBatcher
from tether.runtime.lease import ConversationKey, claim
from tether.stores import from_url


class CountingStore(InMemoryChatStreamSupervisionStore):
    """The real in-memory store, counting batch calls and able to go down."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[int] = []
        self.down = False

    async def compare_and_swap_many(self, swaps: Sequence[SupervisionSwap]) -> list[bool]:
        if self.down:
            raise ConnectionError("store unreachable")
        self.batches.append(len(swaps))
        return await super().compare_and_swap_many(swaps)


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


async def _leases(store: CountingStore, clock: Clock, count: int) -> list:  # type: ignore[type-arg]
    return [
        await claim(store, ConversationKey("t", "u", f"s{i}"), f"m{i}", clock, timedelta(seconds=3))
        for i in range(count)
    ]


async def test_one_batch_renews_every_lease() -> None:
    store, clock = CountingStore(), Clock()
    batcher = HeartbeatBatcher(store, interval=1.0, dead_after=timedelta(seconds=3), clock=clock)
    leases = await _leases(store, clock, 50)
    for lease in leases:
        batcher.add(lease, lambda: None)
    clock.now += timedelta(seconds=1)
    await batcher.beat()
    assert store.batches == [50]
    for i in range(50):
        row = await store.read("t", "u", f"s{i}")
        assert row is not None and row.heartbeat_at == clock.now and row.epoch == 1
    await batcher.aclose()


async def test_a_refused_renewal_fences_only_its_own_turn() -> None:
    store, clock = CountingStore(), Clock()
    batcher = HeartbeatBatcher(store, interval=1.0, dead_after=timedelta(seconds=3), clock=clock)
    first, second = await _leases(store, clock, 2)
    lost: list[str] = []
    batcher.add(first, lambda: lost.append("first"))
    batcher.add(second, lambda: lost.append("second"))
    takeover = ChatStreamSupervision(
        status=ChatStreamStatus.RUNNING, heartbeat_at=clock.now, message_id="m0", epoch=2
    )
    assert await store.compare_and_swap("t", "u", "s0", 1, takeover)
    await batcher.beat()
    assert lost == ["first"] and first.lost and not second.lost
    assert (await store.read("t", "u", "s0")) == takeover  # the successor's row is untouched
    await batcher.beat()
    assert store.batches == [2, 1]
    await batcher.aclose()


async def test_an_outage_keeps_leases_until_they_could_be_dead() -> None:
    store, clock = CountingStore(), Clock()
    batcher = HeartbeatBatcher(store, interval=1.0, dead_after=timedelta(seconds=3), clock=clock)
    (lease,) = await _leases(store, clock, 1)
    lost: list[bool] = []
    batcher.add(lease, lambda: lost.append(True))
    store.down = True
    clock.now += timedelta(seconds=2)
    await batcher.beat()
    assert not lost and not lease.lost
    clock.now += timedelta(seconds=2)  # 4 s unrenewed: another replica may own it now
    await batcher.beat()
    assert lost == [True] and lease.lost
    await batcher.aclose()


@pytest.fixture(
    params=[
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("redis", marks=pytest.mark.redis),
    ]
)
def networked_store_url(request: pytest.FixtureRequest) -> str:
    url: str = request.getfixturevalue(f"{request.param}_url")
    return url


async def test_leases_are_renewed_while_the_serving_loop_is_blocked(
    networked_store_url: str,
) -> None:
    """On PostgreSQL and Redis the batches run on a thread of their own, with
    their own connection: a serving loop that cannot run anything for longer
    than the dead threshold (here it is blocked outright) does not let a live
    lease read dead."""
    bundle = from_url(networked_store_url)
    store = bundle.chat_stream_supervision_store
    assert store is not None and hasattr(store, "open") and hasattr(store, "aclose")
    await store.open()
    try:
        key = ConversationKey("t", "u", "s1")
        lease = await claim(store, key, "m1", utc_now, timedelta(seconds=3))
        lost = asyncio.Event()
        batcher = HeartbeatBatcher(
            store, interval=0.2, dead_after=timedelta(seconds=3), clock=utc_now
        )
        batcher.add(lease, lost.set)
        assert batcher.on_own_thread
        claimed = lease.renewed_at
        time.sleep(3.5)  # noqa: ASYNC251 - the point: the serving loop runs nothing
        row = await store.read("t", "u", "s1")
        assert row is not None and row.heartbeat_at > claimed + timedelta(seconds=3)
        assert not row.is_dead(utc_now(), timedelta(seconds=3))
        assert lease.renewed_at > claimed + timedelta(seconds=3) and not lost.is_set()
        # A refused renewal still reaches the turn, on the serving loop.
        await store.compare_and_swap(
            "t",
            "u",
            "s1",
            lease.epoch,
            ChatStreamSupervision(
                status=ChatStreamStatus.CANCELLED,
                heartbeat_at=utc_now(),
                message_id="m1",
                epoch=lease.epoch + 1,
            ),
        )
        async with asyncio.timeout(5):
            await lost.wait()
        assert lease.lost
        await batcher.aclose()
    finally:
        await store.aclose()


async def test_the_in_memory_store_keeps_its_batches_on_the_serving_loop() -> None:
    store, clock = CountingStore(), Clock()
    batcher = HeartbeatBatcher(store, interval=1.0, dead_after=timedelta(seconds=3), clock=clock)
    [lease] = await _leases(store, clock, 1)
    batcher.add(lease, lambda: None)
    assert not batcher.on_own_thread
    await batcher.aclose()
