"""The store's clock: ``ChatStreamSupervisionStore.server_time``, an optional method.

A supervision store that implements it gives every replica one clock to
stamp and judge heartbeats by (``tether.runtime.clock``), so replicas whose
own clocks disagree never misjudge a producer's liveness::

    class TestMyStoreClock(ChatStreamSupervisionClockContract):
        @pytest.fixture
        def store(self):
            return MySupervisionStore(...)

``tolerance`` bounds how far a replica's corrected clock may be from the
store's: half a round trip, plus the time between two reads. Raise it for a
store far away.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import pytest

from tether.domain.capabilities import Capability
from tether.domain.chat_stream_supervision_store import ChatStreamSupervisionStore
from tether.runtime.clock import ReplicaClock
from tether.testing.contracts._support import exercises

SKEW = timedelta(seconds=10)


@exercises(Capability.SUPERVISION_SERVER_TIME)
class ChatStreamSupervisionClockContract:
    pytestmark: ClassVar[list[Any]] = [pytest.mark.asyncio]
    tolerance: ClassVar[timedelta] = timedelta(milliseconds=250)
    """How far the corrected clock may be from the store's (a round trip, about)."""

    @pytest.fixture
    def store(self) -> Any:
        """Override: the store under test."""
        raise NotImplementedError("override the `store` fixture with your adapter")

    async def test_server_time_is_an_aware_utc_datetime(
        self, store: ChatStreamSupervisionStore
    ) -> None:
        now = await store.server_time()
        assert isinstance(now, datetime)
        assert now.tzinfo is not None and now.utcoffset() == timedelta(0)
        assert now.astimezone(UTC) == now

    async def test_server_time_moves_forward_with_real_time(
        self, store: ChatStreamSupervisionStore
    ) -> None:
        readings = [await store.server_time() for _ in range(5)]
        assert readings == sorted(readings)
        started = time.monotonic()
        first = await store.server_time()
        await asyncio.sleep(0.2)  # a measured interval, not a synchronisation
        second = await store.server_time()
        elapsed = timedelta(seconds=time.monotonic() - started)
        assert timedelta(milliseconds=200) - self.tolerance <= second - first
        assert second - first <= elapsed + self.tolerance

    async def test_a_skewed_local_clock_plus_the_offset_is_the_store_clock(
        self, store: ChatStreamSupervisionStore
    ) -> None:
        for skew in (SKEW, -SKEW):
            clock = ReplicaClock(store.server_time, skew=skew.total_seconds())
            assert await clock.sync()
            assert clock.corrected and clock.synced
            before = clock()
            remote = await store.server_time()
            after = clock()
            assert before - self.tolerance <= remote <= after + self.tolerance
