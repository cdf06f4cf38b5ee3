"""Events the runtime emits for other systems, and the bus that carries them."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConversationUpdated:
    """A turn completed and its messages are in the transcript (ids only)."""

    tenant: str
    requester_uuid: str
    session_id: str
    message_id: str


Event = ConversationUpdated
Subscriber = Callable[[Event], Awaitable[None]]


class MessageBus:
    """In-process publish/subscribe.

    A subscriber that raises is logged and skipped: a turn never fails because
    of a mirror, and never because nobody subscribes.
    """

    def __init__(self) -> None:
        self._subscribers: list[Subscriber] = []

    def subscribe(self, subscriber: Subscriber) -> Subscriber:
        self._subscribers.append(subscriber)
        return subscriber

    async def publish(self, event: Event) -> None:
        for subscriber in list(self._subscribers):
            try:
                await subscriber(event)
            except Exception:
                logger.exception("message bus subscriber %r failed on %r", subscriber, event)
