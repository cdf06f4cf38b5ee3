"""One heartbeat round trip per replica per second, for all of its turns.

With a thousand turns in flight, a heartbeat per turn would be a thousand
writes a second. The batcher renews every lease this replica holds in one
``compare_and_swap_many`` call; each swap keeps its own epoch guard, so a
refused one fences only its own turn.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from tether.domain.chat_stream_supervision_store import (
    ChatStreamStatus,
    ChatStreamSupervision,
    ChatStreamSupervisionStore,
    SupervisionSwap,
)
from tether.runtime import background
from tether.runtime.lease import Lease

logger = logging.getLogger(__name__)

Clock = Callable[[], datetime]


@dataclass
class _Held:
    lease: Lease
    on_lost: Callable[[], None]


class HeartbeatBatcher:
    """Renews registered leases every ``interval`` seconds, in one batch.

    A lease whose swap is refused is marked lost and its ``on_lost`` runs. When
    the store cannot be reached, leases are kept until they have gone unrenewed
    for longer than ``dead_after``: past that, another replica may own the turn,
    so the producer must stop rather than keep writing blind.
    """

    def __init__(
        self,
        store: ChatStreamSupervisionStore,
        *,
        interval: float,
        dead_after: timedelta,
        clock: Clock,
        on_batch: Callable[[float], None] = lambda seconds: None,
    ) -> None:
        self._store = store
        self._interval = interval
        self._dead_after = dead_after
        self._clock = clock
        self._on_batch = on_batch  # told each batch's duration (metrics)
        self._held: dict[int, _Held] = {}
        self._task: asyncio.Task[None] | None = None
        self.late_beats = 0  # batches that took longer than the interval

    def add(self, lease: Lease, on_lost: Callable[[], None]) -> None:
        """Renew ``lease`` in every batch until it is discarded; ``on_lost`` runs
        if the store refuses a renewal (the turn is fenced)."""
        self._held[id(lease)] = _Held(lease, on_lost)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="heartbeats")

    def discard(self, lease: Lease) -> None:
        """Renew ``lease`` no more (its turn has written its verdict)."""
        self._held.pop(id(lease), None)

    async def aclose(self) -> None:
        await background.stop(self._task)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_beat = loop.time() + self._interval
        while self._held:
            await asyncio.sleep(max(0.0, next_beat - loop.time()))
            started = loop.time()
            await self.beat()
            self._on_batch(loop.time() - started)
            if loop.time() - started > self._interval:
                self.late_beats += 1
            next_beat += self._interval
            # After a stall, beat again now rather than firing a burst to catch up.
            next_beat = max(next_beat, loop.time())

    async def beat(self) -> None:
        """Renew every held lease once (the ticker calls this each interval)."""
        held = [h for h in self._held.values() if not h.lease.lost]
        if not held:
            return
        now = self._clock()
        swaps = [
            SupervisionSwap(
                h.lease.key.tenant,
                h.lease.key.requester_uuid,
                h.lease.key.session_id,
                h.lease.epoch,
                ChatStreamSupervision(
                    status=ChatStreamStatus.RUNNING,
                    heartbeat_at=now,
                    message_id=h.lease.message_id,
                    epoch=h.lease.epoch,
                ),
            )
            for h in held
        ]
        try:
            results = await self._store.compare_and_swap_many(swaps)
        except Exception:
            logger.warning("heartbeat batch of %d failed; will retry", len(held), exc_info=True)
            for h in held:
                if now - h.lease.renewed_at > self._dead_after:
                    self._lose(h)
            return
        for h, renewed in zip(held, results, strict=True):
            if renewed:
                h.lease.renewed_at = now
            else:
                self._lose(h)

    def _lose(self, held: _Held) -> None:
        if self._held.get(id(held.lease)) is not held:
            # Discarded while its renewal was in flight: the turn has written its
            # final status since (at the next epoch), so the refusal is expected
            # and says nothing about who owns the turn.
            return
        held.lease.lost = True
        self._held.pop(id(held.lease), None)
        try:
            held.on_lost()
        except Exception:
            logger.exception("on_lost callback of %s failed", held.lease.message_id)
