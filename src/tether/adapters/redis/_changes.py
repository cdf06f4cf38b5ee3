"""Push for followers: one pub/sub subscription per connection, fanned out by conversation.

Every supervision and recording script publishes the conversation it changed
on ``{prefix}changes``. A connection subscribes once, lazily, on its first
``wait``, and hands each message to the waiters of that conversation. One
channel for everything keeps the subscription fixed: waiters come and go
without SUBSCRIBE/UNSUBSCRIBE round trips, at the price of every replica
hearing every conversation's writes (a few short messages per running turn
per second).

If the subscription drops, waiters simply sleep out their ``max_wait`` (the
follower then polls) while a background task resubscribes with backoff; once
it is back, every waiter is woken, because changes made while it was away
were never heard. A silent connection is probed with PING and replaced when
the pong does not come.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import suppress

import redis.asyncio
from redis.asyncio.client import PubSub
from redis.exceptions import RedisError

logger = logging.getLogger(__name__)

_READ_INTERVAL = 1.0  # seconds a single read may block before the loop looks around
_PROBE_AFTER = 5.0  # silence after which the connection is probed with PING
_PONG_WITHIN = 5.0  # how long the probe may go unanswered before a resubscribe
_RETRY_FIRST = 0.1
_RETRY_CAP = 2.0


class _Silent(Exception):
    """The subscription stopped answering PING."""


class ChangeFeed:
    """Waiters by conversation, woken by the one shared subscription."""

    def __init__(self, client: redis.asyncio.Redis, channel: str, name: str) -> None:
        self._client = client
        self._channel = channel
        self._name = name
        self._waiters: dict[str, set[asyncio.Future[bool]]] = {}
        self._task: asyncio.Task[None] | None = None

    async def wait(self, conversation: str, max_wait: float) -> bool:
        """True when ``conversation`` was announced (or the feed came back after a
        drop) within ``max_wait`` seconds; False when the time ran out."""
        if max_wait <= 0:
            return False
        self._start()
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        waiters = self._waiters.setdefault(conversation, set())
        waiters.add(future)
        try:
            return await asyncio.wait_for(future, max_wait)
        except TimeoutError:
            return False
        finally:
            waiters.discard(future)
            if not waiters and self._waiters.get(conversation) is waiters:
                del self._waiters[conversation]

    async def aclose(self) -> None:
        """Stop listening and release every waiter (with False). Idempotent."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with suppress(asyncio.CancelledError):
                await task
        for waiters in self._waiters.values():
            for future in waiters:
                if not future.done():
                    future.set_result(False)

    def _start(self) -> None:
        if self._task is not None and not self._task.done():
            return
        self._task = asyncio.get_running_loop().create_task(
            self._listen(), name=f"tether redis change feed ({self._name})"
        )

    def _wake(self, conversation: str) -> None:
        for future in self._waiters.get(conversation, ()):
            if not future.done():
                future.set_result(True)

    def _wake_all(self) -> None:
        for conversation in list(self._waiters):
            self._wake(conversation)

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
                        self._wake(_text(data))
                    elif kind == "subscribe":
                        if heard_before:
                            logger.info("change feed of %s is back", self._name)
                            self._wake_all()
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
