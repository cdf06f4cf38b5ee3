"""``Turn``: one turn as its client follows it, message after message."""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType

from tether.client.errors import TurnFailedError
from tether.client.models import TurnUpdate
from tether.client.observer import Connection
from tether.client.recovery import Accepted, TurnDriver, TurnKnowledge
from tether.client.turn_events import TurnEvent
from tether.domain.chat_message import ChatMessage


@dataclass(frozen=True)
class Dropped:
    """Updates not shown because their text does not extend the answer so far
    (shorter, or other text), and the characters they would have taken back."""

    updates: int = 0
    characters: int = 0


class Turn:
    """A turn being streamed: iterate it for the whole answer so far, again and
    again, until the turn ends; reconnects, takeovers and replica failures
    happen inside the iteration.

    The iteration ends normally when the turn is done or cancelled
    (``outcome`` says which); it raises ``TurnFailedError`` when the turn
    errored and ``RecoveryError`` when no replica served it within the
    client's recovery bound. Use it as ``async with`` (or call ``aclose``) to
    hang up early; the turn goes on on the server.

    A turn sent with ``multitask_strategy="enqueue"`` to a busy conversation
    waits in its queue: ``queued`` is then True and ``queue_position`` its
    place in line, and the iteration yields its messages once it starts.
    ``await start()`` sends the turn and returns once a replica accepted it,
    so that ``message_id`` and ``queue_position`` are known before its first
    message (``TetherClient.start_turn`` returns it so).

    Read it once: its updates (``async for``, ``answer()``), or everything
    that happens to it (``events()``), as the TypeScript client's ``Turn``.
    """

    def __init__(self, driver: TurnDriver, cancel: Callable[[str, str], Awaitable[bool]]) -> None:
        self._driver = driver
        self._state: TurnKnowledge = driver.state
        self._cancel = cancel
        self._updates: AsyncGenerator[TurnUpdate | Accepted, None] | None = None
        self._pending: TurnUpdate | None = None
        """An update ``start`` read before the acceptance it waited for."""
        self._accepted = False
        self._reading: str | None = None
        """How the turn is read: ``updates`` or ``events`` (once chosen, for good)."""
        self._events: deque[TurnEvent] | None = deque()
        """The events not yet handed on, kept until the turn is read by its
        updates (``start`` may tell some before ``events()`` is called)."""
        driver.sink = self._events.append

    # ------------------------------------------------------ what is known

    @property
    def session_id(self) -> str:
        return self._state.session_id

    @property
    def message_id(self) -> str | None:
        """The turn's id, once the server named it (at the start's 201 or 202)."""
        return self._state.message_id

    @property
    def queued(self) -> bool:
        """Whether the server queued the turn behind others (``enqueue`` on a
        busy conversation) rather than start it at once."""
        return self._state.queued

    @property
    def queue_position(self) -> int | None:
        """The turn's place in its conversation's queue (1: next) when the
        client last heard it waited (the 202's ``queued`` event, or a status
        read while recovering); None for a turn that never waited."""
        return self._state.queue_position

    @property
    def latest(self) -> TurnUpdate | None:
        """The last update yielded: the answer as far as the client has it."""
        return self._state.latest

    @property
    def message(self) -> ChatMessage | None:
        """The answer so far (``latest.message``): the TypeScript ``Turn.message``."""
        latest = self._state.latest
        return latest.message if latest is not None else None

    @property
    def last_event_id(self) -> str | None:
        """The id of the last event read (``<message_id>:<index>``): what a
        reconnect sends as ``Last-Event-ID``, and what ``follow`` takes to go on
        from there."""
        return self._state.last_event_id

    @property
    def dropped(self) -> Dropped:
        """The updates not shown because they would have taken text back (each
        also told as a ``dropped`` event), and how many characters."""
        return Dropped(self._state.dropped_updates, self._state.dropped_characters)

    @property
    def url(self) -> str | None:
        """The base URL of the stream read last (None before the first)."""
        connections = self._state.connections
        return connections[-1].url if connections else None

    @property
    def outcome(self) -> str | None:
        """``done`` or ``cancelled`` once the iteration has ended normally (a
        queued turn cancelled before it started ends ``cancelled`` too)."""
        return self._state.outcome

    @property
    def path(self) -> list[str]:
        """How the client got the turn: one label per connection (``start``,
        ``attach``, ``resume``, ``resume:409``...) and ``transcript``."""
        return list(self._state.path)

    @property
    def connections(self) -> list[Connection]:
        """Every request made for the turn's stream, with its status and headers."""
        return list(self._state.connections)

    @property
    def recovered(self) -> bool:
        """Whether the client had to reconnect to get the turn."""
        return len(self._state.connections) > 1

    # ----------------------------------------------------------- iterating

    def __aiter__(self) -> Turn:
        return self

    def _run(self) -> AsyncGenerator[TurnUpdate | Accepted, None]:
        if self._updates is None:
            self._updates = self._driver.run()
        return self._updates

    async def start(self) -> Turn:
        """Send the turn (for ``stream``; a ``follow`` has nothing to send) and
        return once a replica started it or queued it: ``message_id`` is then
        known, and ``queue_position`` for a queued turn. Refusals (a busy
        conversation with ``reject``, an unknown agent...) raise here."""
        if self._accepted or self._pending is not None or not self._driver.starts:
            return self
        updates = self._run()
        try:
            item = await updates.__anext__()
        except StopAsyncIteration:
            return self
        self._accepted = True
        if isinstance(item, TurnUpdate):
            self._pending = item
        return self

    async def __anext__(self) -> TurnUpdate:
        if self._reading != "updates":
            if self._reading is not None:
                raise TypeError("a Turn is read once: events() or its updates")
            self._reading = "updates"
            self._driver.sink = self._events = None  # nobody will read them
        if self._pending is not None:
            pending, self._pending = self._pending, None
            return pending
        updates = self._run()
        while True:
            item = await updates.__anext__()
            if not isinstance(item, Accepted):
                return item

    async def events(self) -> AsyncGenerator[TurnEvent, None]:
        """Everything that happens to the turn, in order, until its end: the
        TypeScript client's ``Turn.events()`` (``tether.client.turn_events``:
        ``turn``, ``stream``, ``queued``, ``message``, ``dropped``,
        ``recovering``, ``end``). A turn that ends errored ends with its
        ``end`` event rather than ``TurnFailedError``; ``RecoveryError`` and
        refusals raise as they do for the updates."""
        queue = self._events
        if self._reading is not None or queue is None:
            raise TypeError("a Turn is read once: events() or its updates")
        self._reading = "events"
        self._pending = None  # told already, as its ``message`` event
        updates = self._run()
        while True:
            while queue:
                yield queue.popleft()
            try:
                await updates.__anext__()
            except StopAsyncIteration:
                break
            except TurnFailedError:
                if not any(event.type == "end" for event in queue):
                    raise
                break
        while queue:
            yield queue.popleft()

    async def answer(self) -> TurnUpdate | None:
        """Read the turn to its end; its final answer (None if it had none)."""
        async for _ in self:
            pass
        return self.latest

    async def cancel(self) -> bool:
        """Cancel the turn from any replica (a queued one leaves the queue);
        False when it had already ended. The stream then ends with
        ``outcome == "cancelled"``."""
        if self.message_id is None:
            raise RuntimeError("the turn has not started yet: nothing to cancel")
        return await self._cancel(self.session_id, self.message_id)

    async def aclose(self) -> None:
        """Hang up. The turn goes on on the server; ``follow`` picks it up again."""
        if self._updates is not None:
            await self._updates.aclose()

    async def __aenter__(self) -> Turn:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()


TurnStream = Turn
"""The old name of ``Turn`` (deprecated)."""
