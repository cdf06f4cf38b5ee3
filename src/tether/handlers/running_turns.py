"""The turns this replica produces: those it is starting, and those it runs.

A turn is *starting* from the moment its claim names it in the conversation's
row until it runs here (or fails to start): an attach to it on this replica
waits for it rather than reading it from the stores. It is *held* from then
on until the grace period after its end, so late readers here are served
from its live buffer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import TYPE_CHECKING

from tether.runtime.lease import ConversationKey

if TYPE_CHECKING:
    from tether.handlers.turn import Turn


class RunningTurns:
    """The turns of one replica, by message id."""

    def __init__(self) -> None:
        self._held: dict[str, Turn] = {}
        self._starting: dict[str, asyncio.Future[None]] = {}

    def starting(self, message_id: str) -> asyncio.Future[None]:
        """Mark ``message_id`` as starting: the future is done once it is held
        (``hold``) or failed to start (``started``)."""
        future = self._starting[message_id] = asyncio.get_running_loop().create_future()
        return future

    def started(self, message_id: str, future: asyncio.Future[None]) -> None:
        """``message_id``'s start is over, held or not."""
        if self._starting.get(message_id) is future:
            del self._starting[message_id]
        future.set_result(None)

    def start_of(self, message_id: str) -> asyncio.Future[None] | None:
        """The start in progress of ``message_id``, if this replica is starting it."""
        return self._starting.get(message_id)

    def hold(self, turn: Turn) -> None:
        self._held[turn.message_id] = turn

    def forget(self, message_id: str) -> None:
        self._held.pop(message_id, None)

    def get(self, message_id: str) -> Turn | None:
        return self._held.get(message_id)

    def __iter__(self) -> Iterator[Turn]:
        """The held turns, oldest first."""
        return iter(list(self._held.values()))

    def producing(self, key: ConversationKey) -> str | None:
        """The message id of a turn this replica is producing for ``key``, if any."""
        for turn in self._held.values():
            if turn.key == key and turn.buffer.end is None:
                return turn.message_id
        return None

    def with_tasks(self) -> list[Turn]:
        """The held turns whose tasks still run."""
        return [t for t in self._held.values() if t.task is not None and not t.task.done()]
