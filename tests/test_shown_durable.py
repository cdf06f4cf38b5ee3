"""Shown implies durable: no reader is handed text a successor could not go on from.

In-process replicas over one set of in-memory stores (``tests.support.scripted``).
The producer's recording put of its newest text is held at the store; the
producer then dies. A reader on the producing replica, and a follower on a
survivor, must never have been shown that text: the successor resumes from the
recording, so across the takeover each reader's text only grows.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator

import pytest

from tests.support.scripted import ScriptedCluster
from tether.handlers.chat_handler import ChatHandler
from tether.runtime.live_buffer import StreamEnd, StreamEvent
from tether.testing.interleavings import hold

pytestmark = pytest.mark.cluster(takeover_scan_interval=0.01)


class Screen:
    """What one reader was shown of one message, in order."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.last_index = -1
        self.end: StreamEnd | None = None
        self._changed = asyncio.Condition()

    async def read(self, events: AsyncIterator[StreamEvent | StreamEnd]) -> None:
        async for item in events:
            async with self._changed:
                if isinstance(item, StreamEnd):
                    self.end = item
                else:
                    self.texts.append(item.message.content)
                    self.last_index = item.index
                self._changed.notify_all()
            if isinstance(item, StreamEnd):
                return

    async def shows(self, text: str) -> None:
        async with asyncio.timeout(10), self._changed:
            await self._changed.wait_for(lambda: bool(self.texts) and self.texts[-1] == text)

    def rewound(self) -> list[tuple[str, str]]:
        """Each pair of consecutive texts where the later does not extend the earlier."""
        return [(a, b) for a, b in itertools.pairwise(self.texts) if not b.startswith(a)]


async def _attach(
    replica: ChatHandler, message_id: str, start: int, screen: Screen
) -> asyncio.Task[None]:
    events, _ = await replica.attach("t", "u", "s1", message_id, start)
    return asyncio.create_task(screen.read(events))


async def test_a_reader_is_never_shown_text_the_successor_rewinds(cluster: ScriptedCluster) -> None:
    a, b, c = cluster.replica(), cluster.replica(), cluster.replica()
    turn = await cluster.start(a, "s1")
    first = cluster.scripts.of(turn.message_id, 0)
    first.say("To the sea")
    first.checkpoint()
    await first.spoken()

    direct, follower = Screen(), Screen()
    reading = [
        await _attach(a, turn.message_id, 0, direct),
        await _attach(c, turn.message_id, 0, follower),
    ]
    await direct.shows("To the sea")
    await follower.shows("To the sea")

    # The recording put of the next text never lands: the producer dies first.
    assert cluster.stores.recording is not None
    held = hold(
        cluster.stores.recording,
        "put_many",
        when=lambda puts: any("beyond" in p.event.message.content for p in puts),
    )
    first.say(", and beyond")
    # The producer dies once its put is in flight; or, where readers are handed
    # text before it is recorded, once the reader on its replica was shown it.
    in_flight = asyncio.create_task(held.reached())
    shown = asyncio.create_task(direct.shows("To the sea, and beyond"))
    await asyncio.wait([in_flight, shown], return_when=asyncio.FIRST_COMPLETED)
    in_flight.cancel()
    shown.cancel()
    await a.shutdown()
    cluster.kill_by_silence()
    await asyncio.wait_for(reading[0], 10)
    assert direct.end is not None and direct.end.reason == "dead"

    # A survivor takes the turn over from the recording and answers.
    assert await b.takeovers.scan() == 1
    second = cluster.scripts.of(turn.message_id, 1)
    async with asyncio.timeout(10):
        await second.started.wait()
    resumed = await _attach(b, turn.message_id, direct.last_index + 1, direct)
    second.say(" again.")
    second.finish()
    await asyncio.wait_for(asyncio.gather(resumed, reading[1]), 10)

    assert direct.rewound() == [] and follower.rewound() == []
    assert direct.texts[-1] == follower.texts[-1] == "To the sea again."
    held.release()


async def test_a_put_refused_before_the_cancels_row_lands_still_ends_cancelled(
    cluster: ScriptedCluster,
) -> None:
    """A cancel raises the stores' fences, then writes the row. With a recording
    put per message, the producer's next put is refused in between and finds the
    row still its own: its readers must hear ``cancelled``, not ``gone``."""
    a, b = cluster.replica(), cluster.replica()
    turn = await cluster.start(a, "s1")
    script = cluster.scripts.of(turn.message_id)
    script.say("streaming")
    await script.spoken()
    supervision = cluster.stores.supervision
    assert supervision is not None
    row_write = hold(supervision, "compare_and_swap")  # the cancel's take of the row
    cancelling = asyncio.create_task(b.cancel("t", "u", "s1", turn.message_id))
    await row_write.reached()  # every store fenced at the cancel's epoch; the row not yet
    row_read = hold(supervision, "read")  # the fenced producer asks who fenced it
    script.say(" on")  # its put is refused
    await row_read.reached()
    row_read.release()  # it reads the row while the cancel's write is held
    await row_read.returned()
    row_write.release()
    await asyncio.wait_for(cancelling, 10)
    assert await cluster.ended(turn) == "cancelled"
