"""One heartbeat round trip per replica per second, for all of its turns.

With a thousand turns in flight, a heartbeat per turn would be a thousand
writes a second. The batcher renews every lease this replica holds in one
``compare_and_swap_many`` call; each swap keeps its own epoch guard, so a
refused one fences only its own turn.

Where the supervision store can give a copy of itself for another event loop
(``ChatStreamSupervisionStore.for_another_loop``: PostgreSQL, Redis), the batches run
on a thread of their own, with that copy's own connection. The serving loop
may be flooded (a thousand turns starting at once, another process taking a
core): callbacks then wait seconds for their turn there, and a renewal queued
behind them would let live leases age past the dead threshold. The thread
needs only the interpreter's lock, which it gets every few milliseconds
whatever the loop does. A lease the store refuses is reported back on the
serving loop. Elsewhere (memory, which lives in this loop; SQLite and the
file store, whose writes already run off the loop) the batches run on the
serving loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from tether.domain.capabilities import Capability, supports
from tether.domain.chat_stream_supervision_store import ChatStreamSupervisionStore
from tether.runtime import background
from tether.runtime import conversation_row as rows
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
        # Guards ``_held``: the serving loop adds and discards, the lease
        # thread (where there is one) takes each batch's snapshot.
        self._guard = threading.Lock()
        self._task: asyncio.Task[None] | None = None
        self._thread: _LeaseThread | None = None
        self._serving_loop: asyncio.AbstractEventLoop | None = None
        self.late_beats = 0  # batches that took longer than the interval

    def add(self, lease: Lease, on_lost: Callable[[], None]) -> None:
        """Renew ``lease`` in every batch until it is discarded; ``on_lost`` runs
        (on the serving loop) if the store refuses a renewal (the turn is fenced)."""
        with self._guard:
            self._held[id(lease)] = _Held(lease, on_lost)
        self._ensure_running()

    def discard(self, lease: Lease) -> None:
        """Renew ``lease`` no more (its turn has written its verdict)."""
        with self._guard:
            self._held.pop(id(lease), None)

    @property
    def on_own_thread(self) -> bool:
        """Whether the batches run on a thread of their own (see the module docstring)."""
        return self._thread is not None

    def _ensure_running(self) -> None:
        self._serving_loop = asyncio.get_running_loop()
        if self._thread is None and self._task is None:
            copy = self._copy_for_another_loop()
            if copy is not None:
                self._thread = _LeaseThread(self, copy)
                self._thread.start()
                return
        if self._thread is None and (self._task is None or self._task.done()):
            self._task = self._serving_loop.create_task(self._run(self._store), name="heartbeats")

    def _copy_for_another_loop(self) -> ChatStreamSupervisionStore | None:
        """The store's copy for the lease thread, where it can give one."""
        if not supports(self._store, Capability.SUPERVISION_FOR_ANOTHER_LOOP):
            return None
        try:
            return self._store.for_another_loop()
        except NotImplementedError:
            # Its class can, this object cannot: a PostgreSQL or Redis store
            # built over a given pool or client knows no way to connect again.
            return None

    async def aclose(self) -> None:
        await background.stop(self._task)
        if self._thread is not None:
            thread, self._thread = self._thread, None
            await asyncio.to_thread(thread.stop)

    async def _run(self, store: ChatStreamSupervisionStore) -> None:
        """The ticker: a batch each interval while leases are held (on the lease
        thread, for as long as the batcher lives)."""
        loop = asyncio.get_running_loop()
        next_beat = loop.time() + self._interval
        while self._held or self._thread is not None:
            await asyncio.sleep(max(0.0, next_beat - loop.time()))
            started = loop.time()
            await self.beat(store)
            self._on_batch(loop.time() - started)
            if loop.time() - started > self._interval:
                self.late_beats += 1
            next_beat += self._interval
            # After a stall, beat again now rather than firing a burst to catch up.
            next_beat = max(next_beat, loop.time())

    async def beat(self, store: ChatStreamSupervisionStore | None = None) -> None:
        """Renew every held lease once (the ticker calls this each interval)."""
        store = store if store is not None else self._store
        with self._guard:
            held = [h for h in self._held.values() if not h.lease.lost]
        if not held:
            return
        now = self._clock()
        renewals = [
            (
                h.lease.key,
                rows.running(h.lease.message_id, h.lease.epoch, now, h.lease.producer),
            )
            for h in held
        ]
        try:
            results = await rows.renew_many(store, renewals)
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
        with self._guard:
            if self._held.get(id(held.lease)) is not held:
                # Discarded while its renewal was in flight: the turn has written
                # its final status since (at the next epoch), so the refusal is
                # expected and says nothing about who owns the turn.
                return
            held.lease.lost = True
            self._held.pop(id(held.lease), None)
        serving = self._serving_loop
        if self._thread is not None and serving is not None:
            serving.call_soon_threadsafe(self._tell_lost, held)
        else:
            self._tell_lost(held)

    @staticmethod
    def _tell_lost(held: _Held) -> None:
        try:
            held.on_lost()
        except Exception:
            logger.exception("on_lost callback of %s failed", held.lease.message_id)


class _LeaseThread:
    """The thread the batches run on, with its own event loop and its own copy
    of the supervision store (opened and closed there)."""

    def __init__(self, batcher: HeartbeatBatcher, store: ChatStreamSupervisionStore) -> None:
        self._batcher = batcher
        self._store = store
        self._loop: asyncio.AbstractEventLoop | None = None
        self._main: asyncio.Task[None] | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="tether-leases", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._ready.wait(5.0)

    def stop(self, within: float = 5.0) -> None:
        """Stop the ticker and close the store copy (blocking: call it off-loop)."""
        loop, main = self._loop, self._main
        if loop is not None and main is not None and not loop.is_closed():
            loop.call_soon_threadsafe(main.cancel)
        self._thread.join(within)

    def _serve(self) -> None:
        asyncio.run(self._life())

    async def _life(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._main = asyncio.current_task()
        self._ready.set()
        try:
            opener = getattr(self._store, "open", None)
            if opener is not None:
                await _opened(opener, self._store)
            while True:
                try:
                    await self._batcher._run(self._store)
                except Exception:
                    # Never die quietly: a lease thread that stopped would let
                    # every lease of this replica read dead.
                    logger.exception("the lease thread's ticker failed; restarting it")
                    await asyncio.sleep(self._batcher._interval)
        except asyncio.CancelledError:
            pass
        finally:
            closer = getattr(self._store, "aclose", None)
            if closer is not None:
                try:
                    await closer()
                except Exception:
                    logger.warning("closing the lease thread's store failed", exc_info=True)


async def _opened(opener: Callable[[], Any], store: object) -> None:
    """Open the lease thread's store, retrying while it is unreachable (the
    batches meanwhile fail, and leases age as in any outage)."""
    while True:
        try:
            await opener()
            return
        except Exception:
            logger.warning("the lease thread cannot open %s yet; retrying", store, exc_info=True)
            await asyncio.sleep(1.0)
