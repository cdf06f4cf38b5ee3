"""A replica's deltas: the watched turns' recorded messages, published as they are recorded.

A follower on another replica would otherwise see a turn only through its
recording snapshots. When a follower announces that it watches a conversation
(``StreamChange.WATCH``), the producing turn hands every message it shows to
this publisher for the next ``watch_for`` seconds (followers announce again
while they follow). A turn shows a message once the recording store accepted
it, so followers read exactly the durable steps the producer's own readers
read, one publish later.

The publishing adapts to the load: when no publish is in flight, what was
handed over goes out at once (the follower is a round trip behind the
producer's own readers); while one is in flight, what every watched turn
hands over accumulates, one ``StreamDelta`` per turn, and goes in the next
``publish_deltas`` call. So one round trip per replica at a time, however
many turns are watched. Unwatched turns cost a dictionary lookup per message.

Deltas are best effort: a batch that fails is dropped, and a delta too large
for the channel is left out; a follower sees the gap and reads the snapshot.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tether.domain.chat_message import ChatMessage
from tether.domain.chat_stream_recording_store import ChatStreamRecordingStore, DeltaPublication
from tether.domain.stream_delta import MAX_DELTA_BYTES, Step, StreamDelta, step_between
from tether.runtime import background
from tether.runtime.lease import ConversationKey
from tether.runtime.live_buffer import StreamEvent

logger = logging.getLogger(__name__)

WATCH_SECONDS = 10.0
"""How long a turn publishes deltas after a follower's watch; followers
announce their watch again every third of it."""


@dataclass
class _Watched:
    key: ConversationKey
    message_id: str
    epoch: int
    until: float
    previous: ChatMessage | None = None
    """The last message handed over (published or not): what the next step builds on."""
    send_whole: bool = True
    """Send the next message whole: a follower that just started watching
    needs one to start from (if it is too large, it reads the snapshot)."""
    first_index: int = 0
    steps: list[Step] = field(default_factory=list)
    """Handed over since the last window, from ``first_index`` on."""

    def publication(self) -> DeltaPublication | None:
        if not self.steps:
            return None
        delta = StreamDelta(self.message_id, self.epoch, self.first_index, tuple(self.steps))
        self.steps = []
        k = self.key
        return DeltaPublication(k.tenant, k.requester_uuid, k.session_id, delta)


class DeltaPublisher:
    """Publishes the new messages of the watched turns, one batch at a time.

    A batch that took longer than ``window`` to publish is followed by a pause
    as long (at most ``max_window``), in which the next batch accumulates.
    """

    def __init__(
        self,
        store: ChatStreamRecordingStore,
        *,
        window: float = 0.02,
        watch_for: float = WATCH_SECONDS,
        max_window: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._window = window
        self._max_window = max_window
        self._watch_for = watch_for
        self._clock = clock
        self._watched: dict[int, _Watched] = {}
        self._leaving: list[DeltaPublication] = []
        self._task: asyncio.Task[None] | None = None
        self.published = 0
        """Deltas handed to the store (for the benchmarks' channel load)."""

    def watch(
        self,
        owner: object,
        key: ConversationKey,
        message_id: str,
        epoch: int,
        latest: StreamEvent | None,
    ) -> None:
        """A follower watches ``owner``'s turn: publish its messages for the
        next ``watch_for`` seconds, starting with ``latest`` whole (so a new
        follower has the current answer in one window)."""
        until = self._clock() + self._watch_for
        watched = self._watched.get(id(owner))
        if watched is not None and watched.message_id == message_id:
            watched.until = until
            watched.send_whole = True
        else:
            watched = _Watched(key, message_id, epoch, until)
            self._watched[id(owner)] = watched
        if latest is not None:
            self.offer(owner, latest)

    def offer(self, owner: object, event: StreamEvent) -> None:
        """``owner`` published ``event``: add it to the next delta if watched."""
        watched = self._watched.get(id(owner))
        if watched is None:
            return
        if self._clock() > watched.until:
            self._leave(owner)
            return
        if watched.steps and event.index != watched.first_index + len(watched.steps):
            # Not the next index (never expected): keep each delta consecutive.
            self._leaving.extend(filter(None, [watched.publication()]))
        if not watched.steps:
            watched.first_index = event.index
        step = step_between(watched.previous, event.message)
        if watched.send_whole:
            watched.send_whole = False
            if not isinstance(step, ChatMessage) and _fits(watched, event):
                step = event.message
        watched.steps.append(step)
        watched.previous = event.message
        self._ensure_running()

    async def publish_now(self, owner: object) -> None:
        """Publish what ``owner`` handed over at once, not at the window's end:
        its last messages reach followers before its verdict does."""
        watched = self._watched.get(id(owner))
        publication = watched.publication() if watched is not None else None
        if publication is not None:
            await self._publish([publication])

    def discard(self, owner: object) -> None:
        """``owner``'s turn ended or stopped: publish what it handed over, then forget it."""
        self._leave(owner)
        if self._leaving:
            self._ensure_running()

    async def aclose(self) -> None:
        await background.stop(self._task)
        self._watched.clear()
        self._leaving.clear()

    def _leave(self, owner: object) -> None:
        watched = self._watched.pop(id(owner), None)
        if watched is not None and (publication := watched.publication()) is not None:
            self._leaving.append(publication)

    def _ensure_running(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="stream deltas")

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            # Started by an offer, so the first batch goes out at once: all
            # that was offered in the same step of the loop (a recording
            # batch's turns) goes in it.
            started = loop.time()
            if not await self.flush():
                return
            # Back-pressure: when the channel takes longer than the window to
            # carry a batch (a thousand followed turns on PostgreSQL's NOTIFY,
            # which serializes commits), pause as long before the next, up to
            # ``max_window``, rather than keep the channel busy back to back
            # and crowd out the heartbeats: followers lag more, turns stay alive.
            took = loop.time() - started
            if took > self._window:
                await asyncio.sleep(min(took, max(self._max_window, self._window)))

    async def flush(self) -> bool:
        """Publish what every watched turn handed over since the last window, in
        one call (the window's timer calls this); whether there was anything."""
        batch, self._leaving = self._leaving, []
        batch.extend(p for w in self._watched.values() if (p := w.publication()) is not None)
        if not batch:
            return False
        await self._publish(batch)
        return True

    async def _publish(self, batch: list[DeltaPublication]) -> None:
        sized = [part for publication in batch for part in _within_limit(publication)]
        try:
            await self._store.publish_deltas(sized)
        except Exception:
            # Best effort: each follower bridges the gap from the snapshot.
            logger.debug("publishing %d stream deltas failed", len(sized), exc_info=True)
        else:
            self.published += len(sized)


def _fits(watched: _Watched, event: StreamEvent) -> bool:
    """Whether ``event``'s message, sent whole, fits in a delta on the channel."""
    delta = StreamDelta(watched.message_id, watched.epoch, event.index, (event.message,))
    return len(delta.encode().encode()) <= MAX_DELTA_BYTES


def _within_limit(publication: DeltaPublication) -> list[DeltaPublication]:
    """``publication`` cut into consecutive deltas the channel carries; a single
    step too large for it is left out (a gap, bridged from the snapshot)."""
    delta = publication.delta
    if len(delta.encode().encode()) <= MAX_DELTA_BYTES:
        return [publication]
    if len(delta.steps) == 1:
        return []
    half = len(delta.steps) // 2
    parts = []
    for first, steps in (
        (delta.first_index, delta.steps[:half]),
        (delta.first_index + half, delta.steps[half:]),
    ):
        part = StreamDelta(delta.message_id, delta.epoch, first, steps)
        parts.extend(
            _within_limit(
                DeltaPublication(
                    publication.tenant, publication.requester_uuid, publication.session_id, part
                )
            )
        )
    return parts
