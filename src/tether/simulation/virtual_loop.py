"""An event loop whose clock is virtual: time moves only when the simulator says.

Every timer of every replica (heartbeats, flushes, clean-ups, an agent's
pause between chunks) fires when the simulator advances the loop's time, in
the order of their deadlines, and never because real time passed. Deadlines
are kept on a 10 ms grid: a few handlers measure real elapsed time with
``time.monotonic`` (microseconds, in a simulation) and subtract it from a
virtual wait, and the grid absorbs that so the same seed orders the timers
the same way on every run.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

_GRID = 100
"""Timer deadlines per virtual second (a 10 ms grid)."""
_START = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
"""What the virtual clock reads at loop time 0."""


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """A selector loop whose ``time()`` is a number the simulator sets.

    ``pending()`` and ``next_deadline()`` read the loop's own queues
    (``_ready``, ``_scheduled``): the simulator needs to know when every task
    is blocked, which asyncio offers no public way to ask."""

    def __init__(self) -> None:
        super().__init__()
        self._virtual = 0.0

    def time(self) -> float:
        return self._virtual

    def call_at(  # type: ignore[override]
        self,
        when: float,
        callback: Callable[..., object],
        *args: Any,
        context: Any = None,
    ) -> asyncio.TimerHandle:
        when = math.ceil(when * _GRID - 1e-3) / _GRID
        return super().call_at(when, callback, *args, context=context)

    def advance(self, seconds: float) -> None:
        """Move time forward; timers now due fire at the next iterations."""
        self._virtual = round(self._virtual + max(0.0, seconds), 6)

    def advance_to(self, when: float) -> None:
        self._virtual = max(self._virtual, when)

    def pending(self) -> int:
        """Callbacks ready to run now, besides the one running."""
        return len(self._ready)  # type: ignore[attr-defined]

    def next_deadline(self) -> float | None:
        """The deadline of the earliest live timer, if any."""
        scheduled: list[asyncio.TimerHandle] = self._scheduled  # type: ignore[attr-defined]
        live = [handle.when() for handle in scheduled if not handle.cancelled()]
        return min(live) if live else None


def still() -> float:
    """The replicas' elapsed-time clock (``time.monotonic`` in a server): it
    never moves. A history takes milliseconds of real time, which the 10 ms
    grid absorbs; on a loaded machine it can take seconds, and a follower
    that subtracted them from its virtual poll, or a delta watch that ran
    out, made the same seed another history (and a few ran for minutes).
    Still time is what an unloaded run measures, so the seeds replay as they
    were found."""
    return 0.0


class VirtualClock:
    """The wall clock every replica and store reads: the loop's time, as a datetime."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        self._loop = loop

    def __call__(self) -> datetime:
        return _START + timedelta(seconds=self._loop.time())
