"""What happens to a turn, in order: the TypeScript client's ``TurnEvent``s, in Python.

``Turn.events()`` yields them, and a ``TurnObserver`` hears each one
(``TurnObserver.event``) as the client works. Each has the ``type`` of the
TypeScript client's event and its fields, in snake_case:

- ``turn`` (``TurnKnown``): the turn followed is known (its ``message_id``);
- ``stream`` (``StreamOpened``): a stream of it is open, ``via`` the start, an
  attach or this client's resume of a dead turn, at ``url``;
- ``queued`` (``TurnQueued``): it waits in the conversation's queue
  (``enqueue``), at ``position`` (1: next); its messages come once it starts;
- ``message`` (``MessageShown``): the answer so far (cumulative), with its
  stream's ``event_id`` and ``index`` (both None for a final message read from
  the transcript);
- ``dropped`` (``MessageDropped``): an update not shown, for its text does not
  extend the answer shown so far (``shown``);
- ``recovering`` (``Recovering``): the stream is over without a verdict, or a
  request got no usable answer; the client looks again (``cause`` says why);
- ``end`` (``TurnEnded``): the last event: ``done``, ``errored`` (with the
  stream's ``error``) or ``cancelled``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tether.client.events import ErrorEvent
from tether.domain.chat_message import ChatMessage

StreamFailure = ErrorEvent
"""An error the turn ended with, after its stream started (``event: error``):
its ``code`` and ``message``."""

RecoveryCause = Literal[
    "disconnected", "unreachable", "unavailable", "dead", "gone", "interrupted", "refused"
]
"""Why the client is recovering: ``disconnected`` (the stream broke or went
silent), ``unreachable`` (no replica answered), ``unavailable`` (503: draining,
a store unavailable; or a proxy's 502, 504), ``dead`` (the producer stopped),
``gone`` (another producer carries the turn now), ``interrupted`` (the stream
ended without a verdict, or with a passing error), ``refused`` (an attach or
resume was refused because the turn changed meanwhile)."""

EndReason = Literal["done", "errored", "cancelled", "none", "unknown"]
"""How a turn ended: the server's verdicts ``done``, ``errored`` and
``cancelled`` (a queued turn that left the queue without starting ends
``cancelled``). ``none`` and ``unknown`` are the TypeScript client's (a
``follow`` of a conversation with no turn; a turn whose verdict is no longer
kept): the Python client's ``follow`` names its turn, and a turn it can no
longer tell the end of raises ``RecoveryError``."""


@dataclass(frozen=True)
class TurnKnown:
    """``turn``: the turn followed is known (or, for ``follow``, found)."""

    message_id: str
    type: Literal["turn"] = "turn"


@dataclass(frozen=True)
class StreamOpened:
    """``stream``: a stream of the turn is open: the one that started it
    (``start``), an ``attach``, or this client's ``resume`` of a dead turn."""

    via: str
    url: str
    type: Literal["stream"] = "stream"


@dataclass(frozen=True)
class TurnQueued:
    """``queued``: the turn waits in its conversation's queue, at ``position`` (1: next)."""

    message_id: str
    position: int | None
    type: Literal["queued"] = "queued"


@dataclass(frozen=True)
class MessageShown:
    """``message``: the answer so far, with its stream event's id and index
    (both None for a final message read from the transcript)."""

    message: ChatMessage
    event_id: str | None
    index: int | None
    type: Literal["message"] = "message"


@dataclass(frozen=True)
class MessageDropped:
    """``dropped``: an update not shown, for its text does not extend the
    answer shown so far (``shown``): shorter, or other text."""

    message: ChatMessage
    shown: ChatMessage
    event_id: str
    index: int | None
    type: Literal["dropped"] = "dropped"


@dataclass(frozen=True)
class Recovering:
    """``recovering``: the client looks for the turn again, because of ``cause``;
    ``error`` is what failed (an exception, the stream's error, or None)."""

    cause: RecoveryCause
    error: BaseException | StreamFailure | None = None
    type: Literal["recovering"] = "recovering"


@dataclass(frozen=True)
class TurnEnded:
    """``end``: the last event, with the turn's verdict and, for ``errored``,
    the error its stream told (None when it told none)."""

    reason: EndReason
    error: StreamFailure | None = None
    type: Literal["end"] = "end"


TurnEvent = (
    TurnKnown | StreamOpened | TurnQueued | MessageShown | MessageDropped | Recovering | TurnEnded
)
"""One of the events above; ``type`` tells which."""

EVENT_TYPES: tuple[str, ...] = (
    "turn",
    "stream",
    "queued",
    "message",
    "dropped",
    "recovering",
    "end",
)
"""Every event's ``type``, as the TypeScript client names them (``TurnEvent`` in
``clients/typescript/src/types.js``)."""
