"""The replica's one notion of "now": the store's clock, where the store has one.

Liveness compares a heartbeat one replica stamped with "now" on another: a
RUNNING row whose heartbeat is older than ``dead_after`` (3 s) is a dead
producer. If each replica read its own clock, two hosts 10 s apart would
read a live producer as dead (the judge's clock ahead) or a dead one as alive
for 10 s more (the producer's clock ahead). So every replica reads one clock,
the supervision store's, where the store has one (``server_time``: PostgreSQL
``clock_timestamp()``, Redis ``TIME``), and stamps and judges by it.

Reading the store on every call would put a round trip into every heartbeat,
status and verdict, and make "now" asynchronous. Instead ``ReplicaClock``
measures the offset between the store's clock and the local one, and is a
plain synchronous ``Callable[[], datetime]``: the local time plus that offset.

- The offset is measured at start-up and again every ``refresh_interval``
  (30 s): ``samples`` round trips each time, keeping the one with the
  shortest round trip, whose offset is the store's time minus the local
  time at the round trip's midpoint (so it is off by at most half that round
  trip: well under a millisecond on a LAN). Local clocks drift by
  milliseconds a minute at worst, far inside the 2 s between the heartbeat
  interval and the dead threshold.
- A refresh that fails (the store is down) or whose round trips are all
  slower than ``max_round_trip`` keeps the last good offset: a store outage
  never moves "now". Before the first good measurement the offset is zero.
- A supervision store without ``server_time`` (a seed-only adapter, SQLite,
  the file store, memory) gets the local clock, as before: exact on one host,
  and as good as NTP keeps the hosts otherwise. The replica says which at
  start-up.
- ``skew`` (``TETHER_CLOCK_SKEW``, for tests) shifts the local clock before the
  offset is measured, so a skewed replica must be corrected by the store's
  clock like any other; with no store clock nothing corrects it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from tether.domain.capabilities import Capability, supports
from tether.domain.chat_stream_supervision_store import ChatStreamSupervisionStore
from tether.runtime import background

logger = logging.getLogger(__name__)

Clock = Callable[[], datetime]
TimeSource = Callable[[], Awaitable[datetime]]
"""Reads the store's clock: one round trip (``ChatStreamSupervisionStore.server_time``)."""
Sleep = Callable[[float], Awaitable[None]]

REFRESH_INTERVAL = 30.0
"""Seconds between two measurements of the offset."""
RETRY_INTERVAL = 1.0
"""Seconds between attempts while no measurement has succeeded yet."""
SAMPLES = 3
"""Round trips per measurement; the shortest one wins."""
MAX_ROUND_TRIP = 1.0
"""A round trip slower than this (seconds) does not replace an offset already known."""


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class OffsetSample:
    """One round trip to the store's clock."""

    offset: timedelta
    """The store's time minus the local time at the round trip's midpoint."""
    round_trip: timedelta
    """How long the round trip took (local clock): twice the offset's error bound."""


async def measure_offset(local: Clock, source: TimeSource) -> OffsetSample:
    """The offset of ``source``'s clock from ``local``, by one round trip.

    The store read its clock somewhere between sending and receiving; the
    midpoint is the best guess, and off by at most half the round trip."""
    sent = local()
    remote = await source()
    received = local()
    round_trip = received - sent
    return OffsetSample(offset=remote - (sent + round_trip / 2), round_trip=round_trip)


class ReplicaClock:
    """Local time plus the offset of the store's clock (see the module docstring).

    Call it for "now". ``start`` measures the offset once and then keeps it
    fresh in the background until ``aclose``; without ``start`` (or without a
    ``source``) it is the local clock, shifted by ``skew``.
    """

    def __init__(
        self,
        source: TimeSource | None = None,
        *,
        local: Clock = utc_now,
        skew: float = 0.0,
        source_name: str = "the store",
        refresh_interval: float = REFRESH_INTERVAL,
        retry_interval: float = RETRY_INTERVAL,
        samples: int = SAMPLES,
        max_round_trip: float = MAX_ROUND_TRIP,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        if samples < 1:
            raise ValueError("samples must be at least 1")
        self._source = source
        self._local = local
        self.skew = timedelta(seconds=skew)
        self.source_name = source_name
        self._refresh_interval = refresh_interval
        self._retry_interval = retry_interval
        self._samples = samples
        self._max_round_trip = timedelta(seconds=max_round_trip)
        self._sleep = sleep
        self._offset = timedelta(0)
        self.synced = False
        """Whether an offset has been measured (else "now" is the local clock)."""
        self.last_error: BaseException | None = None
        """Why the last measurement failed, if it did."""
        self._failing = False
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def of_store(
        cls,
        store: ChatStreamSupervisionStore | None,
        *,
        local: Clock = utc_now,
        skew: float = 0.0,
        refresh_interval: float = REFRESH_INTERVAL,
    ) -> ReplicaClock:
        """The clock of a replica whose supervision store is ``store``: its
        ``server_time`` if it implements it (``Capability.SUPERVISION_SERVER_TIME``),
        else the local clock; with no supervision store, the local clock."""
        if store is None:
            return cls(None, local=local, skew=skew, source_name="no supervision store")
        return cls(
            store.server_time if supports(store, Capability.SUPERVISION_SERVER_TIME) else None,
            local=local,
            skew=skew,
            source_name=type(store).__name__,
            refresh_interval=refresh_interval,
        )

    def __call__(self) -> datetime:
        """Now, by the store's clock (the local clock until an offset is known)."""
        return self.local() + self._offset

    def local(self) -> datetime:
        """This host's clock, shifted by ``skew``: what the offset corrects."""
        return self._local() + self.skew

    @property
    def offset(self) -> timedelta:
        """The store's clock minus the local (skewed) one, as last measured."""
        return self._offset

    @property
    def corrected(self) -> bool:
        """Whether "now" follows a store's clock (else it is the local clock)."""
        return self._source is not None

    async def sync(self) -> bool:
        """Measure the offset once (``samples`` round trips, the shortest wins).

        Returns whether the offset was updated. On failure, or when every round
        trip was slower than ``max_round_trip`` and an offset is already known,
        the last good offset stays. Without a ``source`` (a store without
        ``server_time``) there is nothing to measure: the local clock it is."""
        if self._source is None:
            return False
        best: OffsetSample | None = None
        for _ in range(self._samples):
            try:
                sample = await measure_offset(self.local, self._source)
            except Exception as error:
                self._failed(error)
                return False
            if sample.round_trip < timedelta(0):
                continue  # the local clock stepped back meanwhile: no bound on this one
            if best is None or sample.round_trip < best.round_trip:
                best = sample
        if best is None or (self.synced and best.round_trip > self._max_round_trip):
            logger.debug("the store's clock answered too slowly; keeping the last offset")
            return False
        self._offset = best.offset
        self.synced = True
        self.last_error = None
        if self._failing:
            self._failing = False
            logger.info("the store's clock can be read again (%s)", self.source_name)
        return True

    def _failed(self, error: BaseException) -> None:
        self.last_error = error
        if not self._failing:  # once per outage, not every refresh
            logger.warning(
                "cannot read the store's clock (%s): %s; keeping the last offset (%+.3f s)",
                self.source_name,
                error,
                self._offset.total_seconds(),
            )
        self._failing = True

    async def start(self) -> None:
        """Measure the offset now, say at start-up which clock this replica
        follows, and keep the offset fresh in the background."""
        if self.skew:
            logger.warning(
                "TETHER_CLOCK_SKEW: this replica's local clock is shifted by %+g s (for tests)",
                self.skew.total_seconds(),
            )
        if self._source is not None:
            await self.sync()
        if self._source is None:
            logger.info(
                "liveness clock: this host's (%s has no server_time); heartbeats are stamped "
                "and judged by each replica's own clock: exact on one host, otherwise keep the "
                "hosts' clocks in sync (NTP)",
                self.source_name,
            )
            return
        if self.synced:
            logger.info(
                "liveness clock: the store's (%s.server_time); this host is %+.3f s off it, "
                "measured again every %g s",
                self.source_name,
                -self._offset.total_seconds(),
                self._refresh_interval,
            )
        else:
            logger.warning(
                "liveness clock: the store's (%s.server_time), but it could not be read yet; "
                "this host's clock until it can",
                self.source_name,
            )
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._refresh(), name="replica-clock"
            )

    async def _refresh(self) -> None:
        while self._source is not None:
            await self._sleep(self._refresh_interval if self.synced else self._retry_interval)
            try:
                await self.sync()
            except Exception:  # pragma: no cover - sync reports its own failures
                logger.exception("measuring the store's clock failed")

    async def aclose(self) -> None:
        """Stop refreshing; the last offset stays in use."""
        await background.stop(self._task)
        self._task = None
