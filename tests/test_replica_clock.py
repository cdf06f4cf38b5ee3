"""The replica's clock: local time plus the measured offset of the store's clock.

The offset logic runs here against a hand-moved local clock and a fake store
clock whose round trips take exactly as long as the test says (nothing
sleeps); the store clocks themselves (PostgreSQL, Redis) are checked by the
contract kit in ``test_contracts.py`` and below, with a skewed local clock.
Two real replicas with skewed clocks run in ``test_clock_skew.py``.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta

import pytest

from tests.support.backends import BACKENDS, SERVER_TIME_BACKENDS, Backend
from tests.support.seed_only import SeedOnlySupervisionStore
from tether.domain.store_errors import StoreUnavailableError
from tether.runtime.clock import ReplicaClock, measure_offset
from tether.stores import StoreBundle
from tether.testing.contracts import ManualClock

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


class FakeStoreClock:
    """A store clock ``ahead`` of true time, reached through round trips that take
    ``(there, back)`` seconds of the local clock each (queued; (0, 0) once
    the queue is empty). ``fail`` makes the next reads raise."""

    def __init__(self, local: ManualClock, ahead: float) -> None:
        self.local = local
        self.ahead = timedelta(seconds=ahead)
        self.trips: list[tuple[float, float]] = []
        self.fail: BaseException | None = None
        self.reads = 0

    async def __call__(self) -> datetime:
        self.reads += 1
        if self.fail is not None:
            raise self.fail
        there, back = self.trips.pop(0) if self.trips else (0.0, 0.0)
        self.local.advance(there)
        # The local ManualClock is true time here; the store's is ``ahead`` of it.
        reading = self.local() + self.ahead
        self.local.advance(back)
        return reading


class FakeSleep:
    """``sleep`` for the refresh loop: records each wait and returns only when
    the test says, so each refresh happens exactly when the test wants it."""

    def __init__(self) -> None:
        self.waits: list[float] = []
        self._waiting = asyncio.Event()
        self._go = asyncio.Event()

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
        self._waiting.set()
        await self._go.wait()
        self._go.clear()

    async def parked(self) -> float:
        """Wait until the loop sleeps again (its refresh is done); the wait asked."""
        await asyncio.wait_for(self._waiting.wait(), 5)
        self._waiting.clear()
        return self.waits[-1]

    def wake(self) -> None:
        self._go.set()


@pytest.fixture
def local() -> ManualClock:
    return ManualClock(T0)


async def test_one_round_trip_measures_the_offset_at_its_midpoint(local: ManualClock) -> None:
    store = FakeStoreClock(local, ahead=7.0)
    store.trips = [(0.1, 0.1), (0.3, 0.1)]
    symmetric = await measure_offset(local, store)
    assert symmetric.offset == timedelta(seconds=7)
    assert symmetric.round_trip == timedelta(seconds=0.2)
    # Asymmetric: off by half the difference, within half the round trip.
    lopsided = await measure_offset(local, store)
    assert lopsided.round_trip == timedelta(seconds=0.4)
    assert lopsided.offset - timedelta(seconds=7) == timedelta(seconds=0.1)
    assert abs(lopsided.offset - timedelta(seconds=7)) <= lopsided.round_trip / 2


@pytest.mark.parametrize("skew", [10.0, -10.0, 0.0])
async def test_the_offset_cancels_a_skewed_local_clock(local: ManualClock, skew: float) -> None:
    store = FakeStoreClock(local, ahead=2.5)
    clock = ReplicaClock(store, local=local, skew=skew)
    assert clock() == T0 + timedelta(seconds=skew)  # not measured yet: the local clock
    assert await clock.sync()
    assert clock.offset == timedelta(seconds=2.5 - skew)
    assert clock() == local() + timedelta(seconds=2.5)  # the store's time, exactly
    local.advance(3600)
    assert clock() == local() + timedelta(seconds=2.5)  # and it goes on with the local one


async def test_the_shortest_round_trip_wins(local: ManualClock) -> None:
    store = FakeStoreClock(local, ahead=1.0)
    store.trips = [(0.5, 0.1), (0.01, 0.01), (0.2, 0.6)]
    clock = ReplicaClock(store, local=local, samples=3)
    assert await clock.sync()
    assert store.reads == 3
    assert clock.offset == timedelta(seconds=1)


async def test_a_failed_refresh_keeps_the_last_good_offset(
    local: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    store = FakeStoreClock(local, ahead=4.0)
    clock = ReplicaClock(store, local=local, samples=1)
    assert await clock.sync()
    store.ahead = timedelta(seconds=9)
    store.fail = StoreUnavailableError("the store is down")
    with caplog.at_level(logging.WARNING, logger="tether.runtime.clock"):
        assert not await clock.sync()
        assert not await clock.sync()
    assert clock.offset == timedelta(seconds=4) and clock.synced and clock.corrected
    assert isinstance(clock.last_error, StoreUnavailableError)
    assert len([r for r in caplog.records if "cannot read the store's clock" in r.message]) == 1
    store.fail = None
    assert await clock.sync()
    assert clock.offset == timedelta(seconds=9) and clock.last_error is None


async def test_slow_round_trips_do_not_replace_a_known_offset(local: ManualClock) -> None:
    store = FakeStoreClock(local, ahead=3.0)
    clock = ReplicaClock(store, local=local, samples=2, max_round_trip=1.0)
    store.trips = [(1.0, 2.0), (2.0, 2.0)]
    assert await clock.sync()  # nothing known yet: the best of them is better than none
    assert clock.offset == timedelta(seconds=2.5)
    store.trips = [(1.0, 0.9), (0.6, 0.6)]
    assert not await clock.sync()
    assert clock.offset == timedelta(seconds=2.5)
    store.trips = [(0.1, 0.1)]
    assert await clock.sync()
    assert clock.offset == timedelta(seconds=3)


async def test_a_store_without_a_clock_leaves_the_local_clock(
    local: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ReplicaClock.of_store(SeedOnlySupervisionStore(), local=local, skew=10.0)
    with caplog.at_level(logging.INFO, logger="tether.runtime.clock"):
        await clock.start()
    assert not clock.corrected and not clock.synced
    assert clock() == T0 + timedelta(seconds=10)  # nothing corrects the skew
    messages = [r.getMessage() for r in caplog.records]
    assert any(
        "liveness clock: this host's (SeedOnlySupervisionStore has no server_time)" in m
        for m in messages
    )
    assert any("TETHER_CLOCK_SKEW" in m for m in messages)
    await clock.aclose()


async def test_the_offset_is_measured_at_start_and_refreshed_periodically(
    local: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    store = FakeStoreClock(local, ahead=5.0)
    sleep = FakeSleep()
    clock = ReplicaClock(
        store, local=local, skew=-10.0, refresh_interval=30.0, retry_interval=1.0, sleep=sleep
    )
    store.fail = StoreUnavailableError("not yet")
    with caplog.at_level(logging.INFO, logger="tether.runtime.clock"):
        await clock.start()
    assert not clock.synced and clock() == local() - timedelta(seconds=10)
    assert "could not be read yet" in caplog.text
    # Until a measurement succeeds, it is tried again every retry interval.
    assert await sleep.parked() == 1.0
    sleep.wake()
    assert await sleep.parked() == 1.0
    store.fail = None
    sleep.wake()
    assert await sleep.parked() == 30.0  # measured: from now on every refresh interval
    assert clock() == local() + timedelta(seconds=5)
    # The store's clock is stepped (or the local one drifts): the next refresh follows.
    store.ahead = timedelta(seconds=5.25)
    local.advance(30)
    assert clock() == local() + timedelta(seconds=5)
    sleep.wake()
    assert await sleep.parked() == 30.0
    assert clock() == local() + timedelta(seconds=5.25)
    await clock.aclose()


async def test_start_says_which_clock_the_replica_follows(
    local: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ReplicaClock(
        FakeStoreClock(local, ahead=-2.0), local=local, source_name="PgStore", sleep=FakeSleep()
    )
    with caplog.at_level(logging.INFO, logger="tether.runtime.clock"):
        await clock.start()
    await clock.aclose()
    assert "liveness clock: the store's (PgStore.server_time); this host is +2.000 s off it" in (
        caplog.text
    )


# The stores' own clocks --------------------------------------------------------------


@pytest.fixture(params=SERVER_TIME_BACKENDS)
def backend(request: pytest.FixtureRequest) -> Backend:
    """PostgreSQL and Redis, unless a test names others."""
    chosen: Backend = request.param
    return chosen


@pytest.mark.parametrize("skew", [10.0, -10.0])
async def test_a_skewed_replica_reads_the_store_clock(bundle: StoreBundle, skew: float) -> None:
    """Against PostgreSQL and Redis: the skewed local clock plus the measured
    offset is the store's clock within a few milliseconds."""
    store = bundle.chat_stream_supervision_store
    assert store is not None
    clock = ReplicaClock.of_store(store, skew=skew)
    await clock.start()
    try:
        assert clock.corrected and clock.synced
        before = clock()
        remote = await store.server_time()
        after = clock()
        bound = timedelta(milliseconds=20)
        assert before - bound <= remote <= after + bound
        # The test's PostgreSQL and Redis run on this host, so their clock is
        # this host's: the offset is the skew, undone.
        assert abs(clock.offset + timedelta(seconds=skew)) < timedelta(milliseconds=50)
        assert abs(clock() - datetime.now(UTC)) < timedelta(milliseconds=50)
    finally:
        await clock.aclose()


@pytest.mark.parametrize(
    "backend", [p for p in BACKENDS if not p.values[0].has_server_time], indirect=True
)
async def test_stores_on_one_host_keep_the_local_clock(bundle: StoreBundle) -> None:
    """Memory, file and SQLite have no clock of their own: ``server_time`` is
    the interface's default, and the replica keeps its own clock."""
    store = bundle.chat_stream_supervision_store
    assert store is not None
    with pytest.raises(NotImplementedError):
        await store.server_time()
    clock = ReplicaClock.of_store(store)
    await clock.start()
    assert not clock.corrected
    assert abs(clock() - datetime.now(UTC)) < timedelta(seconds=1)
    await clock.aclose()
