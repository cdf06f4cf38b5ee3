"""Push for followers: one pub/sub subscription per connection, fanned out by conversation.

Every recording script, and every supervision script that changes the epoch
or deletes the row, publishes the conversation it changed and the kind of
change on ``{prefix}changes`` (see :func:`announcement`); heartbeats publish
nothing. A connection subscribes once, lazily, on its first ``subscribe`` (or
``wait``), and hands each message to the subscriptions of that conversation.
One channel for everything keeps the subscription fixed: subscriptions come
and go without SUBSCRIBE/UNSUBSCRIBE round trips, at the price of every
replica hearing every conversation's announcements (a flush per running turn
per flush interval, plus its claim and verdict).

If the subscription drops, subscriptions hear nothing and their ``wait``
sleeps out its ``max_wait`` (the follower then polls) while a background task
resubscribes with backoff; once it is back, every subscription hears both
kinds of change, because changes made while it was away were never heard. So
does a subscription made before the channel's first SUBSCRIBE took effect. A
silent connection is probed with PING and replaced when the pong does not
come.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import suppress
from typing import Final

import redis.asyncio
from redis.asyncio.client import PubSub
from redis.exceptions import RedisError

from tether.domain.chat_stream_recording_store import (
    EVERYTHING,
    PendingChanges,
    StreamChange,
    deliver,
)
from tether.domain.stream_delta import StreamDelta

logger = logging.getLogger(__name__)

_READ_INTERVAL = 1.0  # seconds a single read may block before the loop looks around
_PROBE_AFTER = 5.0  # silence after which the connection is probed with PING
_PONG_WITHIN = 5.0  # how long the probe may go unanswered before a resubscribe
_RETRY_FIRST = 0.1
_RETRY_CAP = 2.0


_KINDS: Final = {
    "r": StreamChange.RECORDING,
    "s": StreamChange.SUPERVISION,
    "w": StreamChange.WATCH,
    "d": StreamChange.DELTA,
}
_CODES: Final = {change: code for code, change in _KINDS.items()}


def announcement(conversation: str, change: StreamChange) -> str:
    """The message announcing a ``change`` of ``conversation``: the conversation,
    a newline (which no escaped conversation contains) and ``r``, ``s`` or ``w``."""
    return f"{conversation}\n{_CODES[change]}"


def delta_announcement(conversation: str, delta: StreamDelta) -> str:
    """The message carrying ``delta``: the conversation, a newline, ``d`` and the
    encoded delta (JSON, which has no raw newline)."""
    return f"{conversation}\nd{delta.encode()}"


def parse_announcement(message: str) -> tuple[str, frozenset[StreamChange], str]:
    """The conversation, the kinds of change a message announces, and the
    encoded delta it carries (``""`` when it is not a delta). A bare
    conversation (a replica of the previous release) or an unknown kind
    announces both kinds of write: a spurious wake-up is harmless."""
    conversation, separator, code = message.partition("\n")
    if not separator:
        return message, EVERYTHING, ""
    kind = _KINDS.get(code[:1])
    if kind is StreamChange.DELTA:
        return conversation, frozenset({kind}), code[1:]
    if kind is None or len(code) != 1:
        return conversation, EVERYTHING, ""
    return conversation, frozenset({kind}), ""


class _Silent(Exception):
    """The subscription stopped answering PING."""


class ChangeFeed:
    """Subscriptions by conversation, fed by the one shared pub/sub subscription."""

    def __init__(self, client: redis.asyncio.Redis, channel: str, name: str) -> None:
        self._client = client
        self._channel = channel
        self._name = name
        self._subscriptions: dict[str, set[PendingChanges[str]]] = {}
        self._task: asyncio.Task[None] | None = None
        self._subscribed = asyncio.Event()

    def subscribe(self, conversation: str, *, catch_up: bool = True) -> PendingChanges[str]:
        """Hear ``conversation``'s announcements from now on; starts the feed if needed.

        With ``catch_up`` (the default), a subscription made before the channel
        is subscribed hears both kinds of change once it is, since what changed
        in between was announced to nobody. Without it the subscription hears
        only what is announced once the channel is subscribed (and both kinds
        after a resubscribe, as every subscription does).
        """
        subscription = PendingChanges(conversation, self.drop)
        subscription.missed = catch_up and not self._subscribed.is_set()
        self._subscriptions.setdefault(conversation, set()).add(subscription)
        self._start()
        return subscription

    def drop(self, subscription: PendingChanges[str]) -> None:
        """Forget ``subscription`` (its ``aclose`` calls this)."""
        subscriptions = self._subscriptions.get(subscription.key)
        if subscriptions is not None:
            subscriptions.discard(subscription)
            if not subscriptions:
                del self._subscriptions[subscription.key]

    async def wait(self, conversation: str, max_wait: float) -> bool:
        """True when ``conversation`` was announced (or the feed came back after a
        drop) within ``max_wait`` seconds; False when the time ran out. Only what
        is announced during the call counts."""
        if max_wait <= 0:
            return False
        async with self.subscribe(conversation, catch_up=False) as subscription:
            return bool(await subscription.wait(max_wait))

    async def listening(self, within: float) -> bool:
        """Start the feed if needed; whether the channel is subscribed within ``within`` s."""
        self._start()
        try:
            async with asyncio.timeout(within):
                await self._subscribed.wait()
        except TimeoutError:
            return False
        return True

    async def aclose(self) -> None:
        """Stop listening and release every ``wait`` in progress (with what is
        pending, usually nothing). Idempotent."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with suppress(asyncio.CancelledError):
                await task
        self._stopped_listening()
        for subscriptions in self._subscriptions.values():
            for subscription in subscriptions:
                subscription.release()

    def _start(self) -> None:
        if self._task is not None and not self._task.done():
            return
        self._task = asyncio.get_running_loop().create_task(
            self._listen(), name=f"tether redis change feed ({self._name})"
        )

    def _dispatch(self, message: str) -> None:
        conversation, changes, encoded = parse_announcement(message)
        subscriptions = self._subscriptions.get(conversation)
        if subscriptions:  # most messages are for turns nobody here reads
            deliver(subscriptions, changes, encoded)

    def _stopped_listening(self) -> None:
        self._subscribed.clear()
        for subscriptions in self._subscriptions.values():
            for subscription in subscriptions:
                subscription.missed = True

    def _catch_up(self) -> None:
        for subscriptions in self._subscriptions.values():
            for subscription in subscriptions:
                if subscription.missed:
                    subscription.missed = False
                    subscription.hear(EVERYTHING)

    async def _listen(self) -> None:
        delay = _RETRY_FIRST
        heard_before = False
        reported = False  # one warning per outage, not one per reconnect attempt
        while True:
            pubsub = self._client.pubsub()
            try:
                await pubsub.subscribe(self._channel)
                # Runs until the connection fails; redis-py may also reconnect and
                # resubscribe by itself, which shows up as another "subscribe".
                async for kind, data in _messages(pubsub):
                    if kind == "message":
                        self._dispatch(_text(data))
                    elif kind == "subscribe":
                        if heard_before:
                            logger.info("change feed of %s is back", self._name)
                        if self._subscribed.is_set():
                            # redis-py resubscribed by itself: it was away.
                            self._stopped_listening()
                        self._subscribed.set()
                        self._catch_up()
                        heard_before, reported = True, False
                        delay = _RETRY_FIRST
            except Exception as error:
                # Never let the feed die: waiters fall back to polling meanwhile.
                expected = isinstance(error, RedisError | OSError | _Silent)
                logger.log(
                    logging.DEBUG if reported else logging.WARNING,
                    "change feed of %s lost (%s); followers poll until it is back",
                    self._name,
                    error,
                    exc_info=not expected,
                )
                reported = True
            finally:
                self._stopped_listening()
                with suppress(Exception):
                    await pubsub.aclose()
            await asyncio.sleep(delay)
            delay = min(delay * 2, _RETRY_CAP)


async def _messages(pubsub: PubSub) -> AsyncIterator[tuple[str, object]]:
    """``(type, data)`` of every message, probing a silent connection with PING."""
    loop = asyncio.get_running_loop()
    last_heard = loop.time()
    probed_at: float | None = None
    while True:
        message = await pubsub.get_message(timeout=_READ_INTERVAL)
        now = loop.time()
        if message is None:
            if probed_at is not None and now - probed_at > _PONG_WITHIN:
                raise _Silent(f"no pong within {_PONG_WITHIN} s")
            if probed_at is None and now - last_heard > _PROBE_AFTER:
                await pubsub.ping()
                probed_at = now
            continue
        last_heard, probed_at = now, None
        yield _text(message["type"]), message["data"]


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
