"""Watching a turn's client at work: every connection it opens, every event on it.

The client keeps a ``Connection`` record per request for a turn's stream
(``Turn.connections``), and tells a ``TurnObserver``, if it was given
one, as each happens; the crash test keeps them as its evidence. The observer
also hears the turn's events (``TurnObserver.event``: ``turn``, ``stream``,
``queued``, ``message``, ``dropped``, ``recovering``, ``end``), the ones
``Turn.events()`` yields and the TypeScript client's ``Turn.events()`` yields.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import httpx2

from tether.client.errors import TetherHTTPError
from tether.client.events import ErrorEvent
from tether.client.held_message import taken_back
from tether.client.models import TurnUpdate
from tether.client.sse import SSEEvent
from tether.client.turn_events import TurnEvent


@dataclass
class Connection:
    """One request for the turn's stream, and how it went."""

    kind: str
    """start, attach or resume."""
    url: str
    """The base URL it was sent to."""
    opened_at: float
    status_code: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    failure: httpx2.TransportError | None = None
    """The connection could not be made, or broke."""
    refusal: TetherHTTPError | None = None
    """An error status instead of a stream."""
    verdict: str | None = None
    """The ``stream_status`` it ended with."""
    error: ErrorEvent | None = None
    """The ``event: error`` it carried."""
    closed_at: float | None = None

    @property
    def label(self) -> str:
        """``attach``, or ``resume:409`` for a refused one."""
        return f"{self.kind}:{self.status_code}" if self.refusal is not None else self.kind


class TurnObserver:
    """Hears every connection a turn's client opens and every event on it, as
    they happen (the crash test keeps them as evidence), and the turn's own
    events (``event``). Does nothing here but count the updates the client
    dropped.

    ``opened``, ``responded``, ``received`` and ``closed`` are the Python
    client's alone (the TypeScript client tells no connection apart from its
    ``stream`` event); ``event`` hears what both clients' ``Turn.events()``
    yield."""

    dropped_updates: int = 0
    """Updates not shown because they would have taken text back."""
    dropped_characters: int = 0
    """What they would have taken back, in characters of the text shown."""

    def opened(self, connection: Connection) -> None:
        """A request is about to be sent."""

    def responded(self, connection: Connection) -> None:
        """Its status and headers arrived."""

    def received(self, connection: Connection, event: SSEEvent) -> None:
        """One event arrived, before the client acts on it."""

    def closed(self, connection: Connection) -> None:
        """It is over (ended, refused, broken, or given up)."""

    def event(self, event: TurnEvent) -> None:
        """One of the turn's events (``tether.client.turn_events``), as it happens:
        the same ``type`` and fields as the TypeScript client's ``TurnEvent``."""

    def dropped(self, connection: Connection, update: TurnUpdate, shown: TurnUpdate) -> None:
        """``update`` arrived on ``connection`` and was not shown: its text does
        not extend ``shown`` (it is shorter, or says something else). Counted
        here; an override calls ``super().dropped`` to keep the counts."""
        self.dropped_updates += 1
        self.dropped_characters += taken_back(shown.message, update.message)
