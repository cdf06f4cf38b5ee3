"""How long a client waits between tries that failed in a row: growing, and jittered.

A replica that dies drops every client streaming from it at the same moment.
Without jitter they would all try again at the same moments too, 50 ms, 100
ms, 200 ms later, in lockstep, and land on the survivors as one burst each
time. Each pause is therefore drawn between half its step and the whole step
("equal jitter"): spread out, yet never shorter than half, so a client does
not come back at once after a failure.
"""

from __future__ import annotations

import random as _random
from collections.abc import Callable


class Backoff:
    """Pauses that double from ``first`` up to ``longest`` seconds, each one
    drawn by ``random`` (a source of numbers in [0, 1); tests inject one)
    between half its step and the step."""

    def __init__(
        self, first: float, longest: float, *, random: Callable[[], float] = _random.random
    ) -> None:
        self.first = first
        self.longest = longest
        self._random = random
        self._step = first

    def next(self, at_least: float | None = None) -> float:
        """The next pause, in seconds; at least ``at_least`` (a server's
        ``Retry-After``), up to ``longest``. The step after it doubles."""
        step = self._step
        self._step = min(step * 2, self.longest)
        pause = step / 2 + self._random() * step / 2
        return max(pause, min(at_least or 0.0, self.longest))

    def reset(self) -> None:
        """Progress was made: the next failure waits the shortest pause again."""
        self._step = self.first
