"""One recording round trip per replica per flush interval, for all of its turns.

With a thousand turns in flight, a flush per turn every half second would be
two thousand writes a second, each its own round trip, crowding out the
heartbeat batch that keeps the turns alive. The flusher collects the newest
message of every turn that streamed something since its last flush and writes
them all with one ``put_many`` call; each put keeps its own epoch fence, so a
fenced one stops only its own turn.

Batches run one at a time, in one task, so a turn's puts reach the store in
the order they were taken: the final flush of a turn can never be overtaken
by an older periodic one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from tether.domain.chat_stream_recording_store import (
    ChatStreamRecordingStore,
    RecordingFencedError,
    RecordingPut,
)
from tether.domain.store_errors import StoreUnavailableError
from tether.runtime import background

logger = logging.getLogger(__name__)


class RecordingFencedOut(Exception):
    """The store refused a turn's put: a newer epoch owns the recording."""


@dataclass
class _Held:
    pending: Callable[[], RecordingPut | None]
    """The turn's newest unflushed message as a put, or None."""
    on_written: Callable[[RecordingPut], None]
    on_fenced: Callable[[], None]
    on_failed: Callable[[BaseException], None]


@dataclass
class _Urgent:
    owner: int
    put: RecordingPut
    done: asyncio.Future[bool] = field(default_factory=lambda: _future())


def _future() -> asyncio.Future[bool]:
    future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    # A caller cancelled while it waited never reads the outcome; retrieve it
    # here so a failed batch is not also reported as "never retrieved".
    future.add_done_callback(lambda f: f.cancelled() or f.exception())
    return future


class RecordingFlusher:
    """Flushes the held turns' recordings every ``interval`` seconds, in one batch.

    A turn is added while it streams (``add``) and discarded when it stops.
    Each interval, every held turn with something new is written at most once
    (the timing contract's "at most every ``interval``"); ``flush_now`` writes
    one turn's newest message in a batch of its own as soon as the batch in
    flight is done (the flush at the end, before the terminal status, or a
    hand-off), together with any other turn's that asked meanwhile.

    A fenced put runs that turn's ``on_fenced`` and discards it; it is never
    flushed again. A periodic batch that meets an outage
    (``StoreUnavailableError``) is logged and retried at the next interval (the
    recording lags meanwhile; the lease's heartbeats, not the recording, decide
    whether the turn is alive). Any other failure of a batch is narrowed down
    by sending its puts one by one, so that only the turn whose put fails
    hears of it (``on_failed``, and it is discarded). A failed ``flush_now``
    raises to its caller, as ``put`` would.
    """

    def __init__(
        self,
        store: ChatStreamRecordingStore,
        *,
        interval: float,
        on_batch: Callable[[float], None] = lambda seconds: None,
    ) -> None:
        self._store = store
        self._interval = interval
        self._on_batch = on_batch  # told each batch's duration (metrics)
        self._held: dict[int, _Held] = {}
        self._urgent: list[_Urgent] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.late_batches = 0  # periodic batches that took longer than the interval

    def add(
        self,
        owner: object,
        pending: Callable[[], RecordingPut | None],
        on_written: Callable[[RecordingPut], None],
        on_fenced: Callable[[], None],
        on_failed: Callable[[BaseException], None],
    ) -> None:
        """Flush ``owner``'s recording every interval until it is discarded:
        ``pending()`` gives the put to make (None: nothing new), and one of the
        callbacks hears how it went."""
        self._held[id(owner)] = _Held(pending, on_written, on_fenced, on_failed)
        self._ensure_running()

    def discard(self, owner: object) -> None:
        """Stop the periodic flushes of ``owner`` (a batch already in flight may
        still carry its last put)."""
        self._held.pop(id(owner), None)

    async def flush_now(self, owner: object, put: RecordingPut) -> None:
        """Write ``put`` for ``owner`` after the batch in flight; raise
        ``RecordingFencedOut`` if the store fenced it, or the store's error."""
        urgent = _Urgent(id(owner), put)
        self._urgent.append(urgent)
        self._wake.set()
        self._ensure_running()
        # Shielded: a caller cancelled while waiting leaves the batch intact.
        if not await asyncio.shield(urgent.done):
            raise RecordingFencedOut(put.event.message_id)

    async def aclose(self) -> None:
        await background.stop(self._task)
        for urgent in self._urgent:
            if not urgent.done.done():
                urgent.done.set_exception(RuntimeError("the recording flusher is closed"))
        self._urgent.clear()

    def _ensure_running(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="recording flushes"
            )

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_tick = loop.time() + self._interval
        while self._held or self._urgent:
            if not self._urgent:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout_at(next_tick):
                        await self._wake.wait()
            self._wake.clear()
            if self._urgent:
                urgent, self._urgent = self._urgent, []
                await self._flush_urgent(urgent)
            if loop.time() >= next_tick:
                started = loop.time()
                await self.flush()
                self._on_batch(loop.time() - started)
                if loop.time() - started > self._interval:
                    self.late_batches += 1
                # After a stall, flush again one interval from now rather than
                # in a burst to catch up: every turn must wait out the interval.
                next_tick = max(next_tick + self._interval, loop.time())

    async def flush(self) -> None:
        """Write every held turn's newest unflushed message once (the ticker
        calls this each interval)."""
        batch: list[tuple[_Held, RecordingPut]] = []
        for held in list(self._held.values()):
            put = held.pending()
            if put is not None:
                batch.append((held, put))
        if not batch:
            return
        try:
            results = await self._store.put_many([put for _, put in batch])
        except StoreUnavailableError:
            logger.warning("recording batch of %d failed; will retry", len(batch), exc_info=True)
            return
        except Exception:
            logger.warning("recording batch of %d failed; sending its puts one by one", len(batch))
            await self._one_by_one(batch)
            return
        for (held, put), written in zip(batch, results, strict=True):
            if written:
                held.on_written(put)
            else:
                self._fence(held)

    async def _one_by_one(self, batch: list[tuple[_Held, RecordingPut]]) -> None:
        for held, put in batch:
            try:
                await self._store.put(put.tenant, put.requester_uuid, put.session_id, put.event)
            except RecordingFencedError:
                self._fence(held)
            except StoreUnavailableError:
                return  # an outage after all: the next interval retries
            except Exception as error:
                self._drop(held)
                held.on_failed(error)
            else:
                held.on_written(put)

    async def _flush_urgent(self, urgent: list[_Urgent]) -> None:
        try:
            results = await self._store.put_many([u.put for u in urgent])
        except Exception as error:
            for u in urgent:
                if not u.done.done():
                    u.done.set_exception(error)
            return
        for u, written in zip(urgent, results, strict=True):
            if not written and (held := self._held.get(u.owner)) is not None:
                self._fence(held)
            if not u.done.done():
                u.done.set_result(written)

    def _drop(self, held: _Held) -> None:
        for key, value in list(self._held.items()):
            if value is held:
                del self._held[key]

    def _fence(self, held: _Held) -> None:
        self._drop(held)
        try:
            held.on_fenced()
        except Exception:
            logger.exception("on_fenced callback failed")
