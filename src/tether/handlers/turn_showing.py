"""What one turn's readers are shown, and when: shown implies kept.

A recorded turn's readers, here (the live buffer) and on other replicas (the
deltas), are handed a message only once the recording store accepted it. A
message the agent yields waits as the turn's *produced* one until its put is
acknowledged; a newer one replaces it meanwhile (readers then skip the older,
as a slow reader does). So whatever a screen was shown, a successor that
takes the turn over resumes from at least that text.

A resumed turn starts its stream from what its clients last saw (its
recording), and holds back the regenerated text until it has passed that
point. A turn that does not record (stateless, or no recording store) shows
each message at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime

from tether.domain.answer_text import with_agreeing_text
from tether.domain.chat_message import ChatMessage
from tether.domain.chat_stream_recording_store import RecordedStreamEvent, RecordingPut
from tether.metrics import TetherMetrics
from tether.observability.turns import TurnObservation
from tether.runtime.delta_publisher import DeltaPublisher
from tether.runtime.fenced_writer import FencedWriter
from tether.runtime.follower import is_regression, shows_the_same
from tether.runtime.lease import ConversationKey, Takeover
from tether.runtime.live_buffer import ChatStreamBuffer, EndReason, StreamEnd
from tether.runtime.recording_flusher import RecordingFlusher
from tether.runtime.turn_stores import TurnStores

logger = logging.getLogger(__name__)


class TurnShowing:
    """The messages of one turn on their way to its readers: held back while
    they say again what a resumed turn's clients saw, recorded, then shown.

    It is the turn's owner in the replica's recording flusher and delta
    publisher. ``stop`` stops the turn (a fenced or failed recording)."""

    def __init__(
        self,
        *,
        key: ConversationKey,
        message_id: str,
        stateful: bool,
        stores: TurnStores,
        buffer: ChatStreamBuffer,
        writer: FencedWriter,
        flusher: RecordingFlusher | None,
        deltas: DeltaPublisher | None,
        observed: TurnObservation,
        metrics: TetherMetrics,
        clock: Callable[[], datetime],
        recorded: ChatMessage | None,
        takeover: Takeover | None,
        stop: Callable[[StreamEnd], None],
    ) -> None:
        self._key = key
        self._message_id = message_id
        self._stateful = stateful
        self._stores = stores
        self._buffer = buffer
        self._writer = writer
        self._flusher = flusher
        self._deltas = deltas
        self._observed = observed
        self._metrics = metrics
        self._clock = clock
        self._stop = stop
        # What a resumed turn's clients last saw, held back until passed.
        self._recorded = recorded
        self._holding_back = recorded
        # A taken-over turn's first new content ends the outage its clients saw.
        self._unmeasured_takeover = takeover
        # The newest message the agent yielded that readers were not handed
        # yet: it waits for its recording put (``_written``).
        self._produced: ChatMessage | None = None
        self._settled = asyncio.Event()
        self._settled.set()

    def __repr__(self) -> str:
        return f"<the messages of turn {self._message_id}>"

    @property
    def records(self) -> bool:
        """Whether the turn's messages are recorded before readers see them (a
        stateful turn with a recording store: one a successor can resume)."""
        return self._stateful and self._stores.recording is not None and self._flusher is not None

    def new_content(self, message: ChatMessage) -> ChatMessage | None:
        """``message`` as every reader sees it, or None while it is not past
        what a resumed turn's clients were shown (an older state, or the same
        one again: no new content)."""
        # Every reader sees one text: ``content`` wins over stale text parts
        # (an agent that edited one and not the other), before anything
        # compares, shows or records it.
        message = with_agreeing_text(message)
        if self._holding_back is not None:
            # Only what passes it is shown, recorded at once, and ends the
            # takeover's measured outage.
            if is_regression(self._holding_back, message) or shows_the_same(
                self._holding_back, message
            ):
                return None
            self._holding_back = None
        return message

    def offer(self, message: ChatMessage) -> None:
        """Show ``message`` (stamped the turn's): once recorded when the turn
        records (the replica's next batch carries it), at once otherwise."""
        if self.records:
            assert self._flusher is not None
            self._produced = message
            self._settled.clear()
            self._flusher.wake()
            return
        self._show(message)

    def show_recorded(self) -> None:
        """A resumed turn's stream starts from what its clients last saw."""
        if self._recorded is None:
            return
        if self.records:
            # Recorded again at our epoch before it is shown: the recording
            # names this producer even when all it says again is held back
            # (a fenced predecessor's late put can then never pass for ours).
            self.offer(self._recorded)
        else:
            self._buffer.publish(self._recorded)

    async def settled(self) -> None:
        """Wait until every message offered so far was shown, or never will be
        (the turn was stopped or fenced, or it ended)."""
        await self._settled.wait()

    def settle(self) -> None:
        """Nothing more is shown (the turn stopped or ended): release ``settled``."""
        self._settled.set()

    def _show(self, message: ChatMessage) -> None:
        """Hand ``message`` to the turn's readers: its live buffer's, and its
        followers' on other replicas through the deltas."""
        event = self._buffer.publish(message)
        if self._deltas is not None:
            self._deltas.offer(self, event)
        if message is self._recorded:
            return  # what the turn's readers were shown already: no new content
        self._observed.first_content()
        if self._unmeasured_takeover is not None:
            taken, self._unmeasured_takeover = self._unmeasured_takeover, None
            self._metrics.takeover_produced(taken, self._clock())

    # ------------------------------------------------------------- recording

    def hold(self) -> None:
        """Join the replica's recording flusher: it writes this turn's
        recording with all the others' every flush interval; a fenced put
        stops this turn."""
        assert self._flusher is not None, "a recorded turn needs the recording flusher"
        self._flusher.add(
            self,
            self._pending_put,
            self._written,
            self._fenced_by_recording,
            self._flush_failed,
        )

    def _pending_put(self) -> RecordingPut | None:
        """The produced message not yet recorded, as a put at the stream index
        readers will see it at; None when there is nothing new, or the turn
        may not record (a fenced producer writes nothing) or show (its
        stream ended)."""
        produced = self._produced
        if produced is None or self._buffer.end is not None:
            return None
        if not self._writer.allows_recording():
            return None
        k = self._key
        event = RecordedStreamEvent(
            index=self._buffer.next_index,
            message=produced,
            message_id=self._message_id,
            epoch=self._writer.epoch,
        )
        return RecordingPut(k.tenant, k.requester_uuid, k.session_id, event)

    def _written(self, put: RecordingPut) -> None:
        """The store accepted ``put``: its message is durable, show it."""
        message = put.event.message
        if self._produced is message:
            self._produced = None  # nothing newer came while it was in flight
            self._settled.set()
        # One put of a turn is in flight at a time, so it is the next index,
        # unless the stream ended meanwhile (nothing more is shown then).
        if self._buffer.end is None and put.event.index == self._buffer.next_index:
            self._show(message)

    def _fenced_by_recording(self) -> None:
        self._writer.fence()
        self._settled.set()
        self._stop(StreamEnd(EndReason.GONE))

    def _flush_failed(self, error: BaseException) -> None:
        # Not an outage (the flusher retries those: the next flush writes the
        # latest message again), but this turn's own put failing.
        logger.error("turn %s: recording flush failed", self._message_id, exc_info=error)
        self._stop(
            StreamEnd(EndReason.ERRORED, "INTERNAL", "a background worker of the turn failed")
        )

    async def flush(self) -> None:
        """Wait until everything offered is recorded, and so shown (the end of
        the turn, a hand-off, a cancel): in the replica's next batch."""
        if not self.records:
            return
        await self._writer.record(self)

    # ---------------------------------------------------------------- deltas

    def watched(self) -> None:
        """A follower on another replica watches: publish this turn's deltas."""
        if self._deltas is not None and self._writer.allows_recording():
            k, latest = self._key, self._buffer.latest
            self._deltas.watch(self, k, self._message_id, self._writer.epoch, latest)

    async def publish_now(self) -> None:
        """Hand followers what was shown at once, not at the deltas' window's end."""
        if self._deltas is not None:
            await self._deltas.publish_now(self)

    def leave(self) -> None:
        """The turn ended or stopped: leave the replica's flusher and deltas."""
        if self._flusher is not None:
            self._flusher.discard(self)
        if self._deltas is not None:
            self._deltas.discard(self)
