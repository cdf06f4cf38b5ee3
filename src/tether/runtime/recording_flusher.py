"""One recording batch in flight per replica, for all of its turns: the durable watermark.

A turn's readers, on its replica (the live buffer) and on every other one (the
deltas), are handed a message only once the recording store has accepted it
with a fenced put: whatever any screen was shown, a successor that takes the
turn over resumes from at least that (design §5.12, "shown implies kept").

So the flush is adaptive. When no batch is in flight, a turn's new message goes
to the store at once, and its readers see it one round trip later. Under load,
the messages turns produce while a batch is in flight accumulate (only each
turn's newest is kept) and go in the next batch: one ``put_many`` per replica
per round trip, however many turns it runs, each put keeping its own epoch
fence, so a fenced one stops only its own turn. A thousand turns cost a batch
of a thousand puts per round trip, not a thousand round trips. A batch that
took longer than ``slow_batch`` is followed by a pause as long (at most
``max_pause``), in which the next one accumulates: back to back, large
batches would hold the store (SQLite's one writer, a PostgreSQL connection)
all the time and crowd out the heartbeats that keep the turns alive.

Batches run one at a time, in one task, so a turn's puts reach the store in
the order they were taken, and at most one of a turn's puts is in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

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
    """The turn's newest unrecorded message as a put, or None."""
    on_written: Callable[[RecordingPut], None]
    on_fenced: Callable[[], None]
    on_failed: Callable[[BaseException], None]


@dataclass
class _Waiter:
    owner: int
    done: asyncio.Future[bool]


def _future() -> asyncio.Future[bool]:
    future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    # A caller cancelled while it waited never reads the outcome; retrieve it
    # here so a failed batch is not also reported as "never retrieved".
    future.add_done_callback(lambda f: f.cancelled() or f.exception())
    return future


class RecordingFlusher:
    """Records the held turns' newest messages, one batch at a time.

    A turn is added while it streams (``add``), tells the flusher when it has
    something new (``wake``) and is discarded when it stops. Each round writes
    every held turn's newest unrecorded message at most once; the next round
    starts as soon as the previous one is done and something new is waiting.
    ``flush_now`` waits until everything a turn produced so far is recorded
    (the end of a turn: its final message is durable before its verdict).

    A fenced put runs that turn's ``on_fenced`` and discards it; it is never
    flushed again. A batch that meets an outage (``StoreUnavailableError``) is
    logged and retried after ``retry_interval`` (readers wait meanwhile; the
    lease's heartbeats, not the recording, decide whether the turn is alive).
    Any other failure of a batch is narrowed down by sending its puts one by
    one, so that only the turn whose put fails hears of it (``on_failed``, and
    it is discarded). A failed ``flush_now`` raises to its caller, as ``put``
    would.
    """

    def __init__(
        self,
        store: ChatStreamRecordingStore,
        *,
        retry_interval: float,
        slow_batch: float = 0.02,
        max_pause: float = 0.25,
        on_batch: Callable[[float], None] = lambda seconds: None,
    ) -> None:
        self._store = store
        self._retry_interval = retry_interval
        self._slow_batch = slow_batch
        self._max_pause = max_pause
        self._pause = 0.0  # after the last batch, before the next
        self._on_batch = on_batch  # told each batch's duration (metrics)
        self._held: dict[int, _Held] = {}
        self._waiters: list[_Waiter] = []
        self._wake = asyncio.Event()
        self._asked = asyncio.Event()  # a ``flush_now`` waits: cut an outage's pause short
        self._task: asyncio.Task[None] | None = None
        self.batches = 0
        """Batches sent (for the benchmarks' write load)."""

    def add(
        self,
        owner: object,
        pending: Callable[[], RecordingPut | None],
        on_written: Callable[[RecordingPut], None],
        on_fenced: Callable[[], None],
        on_failed: Callable[[BaseException], None],
    ) -> None:
        """Record ``owner``'s messages until it is discarded: ``pending()``
        gives the put to make (None: nothing new), and one of the callbacks
        hears how it went."""
        self._held[id(owner)] = _Held(pending, on_written, on_fenced, on_failed)

    def discard(self, owner: object) -> None:
        """Stop recording ``owner`` (a batch already in flight may still carry
        its last put)."""
        self._held.pop(id(owner), None)

    def wake(self) -> None:
        """A held turn has a new message: record it in the next round."""
        self._wake.set()
        self._ensure_running()

    async def flush_now(self, owner: object) -> None:
        """Wait until everything ``owner`` produced before this call is recorded
        (after the batch in flight, in the next one); raise
        ``RecordingFencedOut`` if the store fenced it, or the store's error.
        An owner no longer held has nothing more to record."""
        if id(owner) not in self._held:
            return
        waiter = _Waiter(id(owner), _future())
        self._waiters.append(waiter)
        self._asked.set()
        self.wake()
        # Shielded: a caller cancelled while waiting leaves the batch intact.
        if not await asyncio.shield(waiter.done):
            raise RecordingFencedOut(f"the recording of {owner!r} is fenced")

    async def aclose(self) -> None:
        await background.stop(self._task)
        for waiter in self._waiters:
            if not waiter.done.done():
                waiter.done.set_exception(RuntimeError("the recording flusher is closed"))
        self._waiters.clear()

    def _ensure_running(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="recording flushes"
            )

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            if self._pause > 0:
                # Back-pressure after a slow batch; a ``flush_now`` (the end
                # of a turn) does not wait it out.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._pause):
                        await self._asked.wait()
            self._wake.clear()
            self._asked.clear()
            if not await self.flush():
                # An outage: try again after a pause, not in a tight loop, or
                # once a turn asks to be recorded (its writer paces its retries).
                self._asked.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._retry_interval):
                        await self._asked.wait()
                self._wake.set()

    async def flush(self) -> bool:
        """One round: write every held turn's newest unrecorded message once,
        and answer the ``flush_now`` callers waiting for it. False when the
        store was unavailable (the round is to be retried)."""
        waiters, self._waiters = self._waiters, []
        batch: list[tuple[int, _Held, RecordingPut]] = []
        for owner, held in list(self._held.items()):
            put = held.pending()
            if put is not None:
                batch.append((owner, held, put))
        outcomes: dict[int, bool | BaseException] = {}
        available = True
        if batch:
            self.batches += 1
            loop = asyncio.get_running_loop()
            started = loop.time()
            try:
                results = await self._store.put_many([put for _, _, put in batch])
            except StoreUnavailableError as error:
                logger.warning("recording batch of %d failed; will retry", len(batch))
                outcomes = {owner: error for owner, _, _ in batch}
                available = False
            except Exception:
                logger.warning(
                    "recording batch of %d failed; sending its puts one by one", len(batch)
                )
                outcomes = await self._one_by_one(batch)
            else:
                self._on_batch(loop.time() - started)
                for (owner, held, put), written in zip(batch, results, strict=True):
                    outcomes[owner] = written
                    if written:
                        held.on_written(put)
                    else:
                        self._fence(owner, held)
            took = loop.time() - started
            self._pause = min(took, self._max_pause) if took > self._slow_batch else 0.0
        for waiter in waiters:
            outcome = outcomes.get(waiter.owner, True)  # nothing pending: all recorded
            if waiter.done.done():
                continue
            if isinstance(outcome, BaseException):
                waiter.done.set_exception(outcome)
            else:
                waiter.done.set_result(outcome)
        return available

    async def _one_by_one(
        self, batch: list[tuple[int, _Held, RecordingPut]]
    ) -> dict[int, bool | BaseException]:
        outcomes: dict[int, bool | BaseException] = {}
        for owner, held, put in batch:
            try:
                await self._store.put(put.tenant, put.requester_uuid, put.session_id, put.event)
            except RecordingFencedError:
                self._fence(owner, held)
                outcomes[owner] = False
            except StoreUnavailableError as error:
                outcomes[owner] = error  # an outage after all: the next round retries
            except Exception as error:
                self._held.pop(owner, None)
                held.on_failed(error)
                outcomes[owner] = error
            else:
                held.on_written(put)
                outcomes[owner] = True
        return outcomes

    def _fence(self, owner: int, held: _Held) -> None:
        self._held.pop(owner, None)
        try:
            held.on_fenced()
        except Exception:
            logger.exception("on_fenced callback failed")
