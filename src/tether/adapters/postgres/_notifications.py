"""The one LISTEN connection a database object shares among all its subscriptions."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final

import psycopg
from psycopg import AsyncConnection

from tether.adapters.postgres import queries
from tether.domain.chat_stream_recording_store import (
    EVERYTHING,
    PendingChanges,
    StreamChange,
    deliver,
)
from tether.domain.stream_delta import StreamDelta

logger = logging.getLogger(__name__)

Connect = Callable[[], Awaitable[AsyncConnection[Any]]]

_KINDS: Final = {
    queries.RECORDING_CHANGE: frozenset({StreamChange.RECORDING}),
    queries.SUPERVISION_CHANGE: frozenset({StreamChange.SUPERVISION}),
    queries.WATCH: frozenset({StreamChange.WATCH}),
}


def parse_payload(payload: str) -> tuple[str, frozenset[StreamChange]]:
    """The row key (hex) and the kinds of change a NOTIFY payload announces.

    ``<key hex>:r`` is a recording write, ``<key hex>:s`` a supervision write
    that changed the epoch, ``<key hex>:w`` a follower's watch and
    ``<key hex>:d:<delta>`` a producer's delta (see :func:`delta_text`). A bare
    key (a replica of the previous release) or an unknown kind announces both
    kinds of write: a spurious wake-up is harmless.
    """
    key, _, kind = payload.partition(":")
    if kind.startswith(queries.DELTA + ":"):
        return key, frozenset({StreamChange.DELTA})
    return key, _KINDS.get(kind, EVERYTHING)


def delta_text(payload: str) -> str:
    """The encoded delta a ``<key hex>:d:<delta>`` payload carries (else ``""``)."""
    _, _, rest = payload.partition(":")
    prefix = queries.DELTA + ":"
    return rest[len(prefix) :] if rest.startswith(prefix) else ""


def delta_payload(key: bytes, delta: StreamDelta) -> str:
    """The NOTIFY payload of ``delta`` for the conversation of row ``key``."""
    return f"{key.hex()}:{queries.DELTA}:{delta.encode()}"


def watch_payload(key: bytes) -> str:
    """The NOTIFY payload of a follower's watch of the conversation of row ``key``."""
    return f"{key.hex()}:{queries.WATCH}"


class ChangeListener:
    """Dispatches NOTIFY payloads (``<row key in hex>:<kind>``) to the subscriptions
    of that row key.

    The connection is opened by the first subscription, not before: a replica
    that never follows another replica's stream never holds it. When it is lost
    (server restart, network), the listener reconnects in the background with a
    growing delay (``retry_delay`` doubling up to ``max_retry_delay``);
    meanwhile subscriptions hear nothing and their ``wait`` sleeps out its
    ``max_wait``, which turns followers into pollers until the connection is
    back. Once LISTEN is in effect again every subscription that existed while
    it was not hears both kinds of change, because changes made while nobody
    listened were never announced: the ones that lived through an outage, and
    the ones made before the first LISTEN of the connection took effect (a
    follower subscribes before its first read; what changes between that read
    and LISTEN taking effect must not be lost).
    """

    def __init__(
        self,
        connect: Connect,
        display_url: str,
        *,
        retry_delay: float = 0.2,
        max_retry_delay: float = 5.0,
    ) -> None:
        self._connect = connect
        self._display_url = display_url
        self._retry_delay = retry_delay
        self._max_retry_delay = max_retry_delay
        self._subscriptions: dict[str, set[PendingChanges[str]]] = {}
        self._task: asyncio.Task[None] | None = None
        self._subscribed = asyncio.Event()

    def subscribe(self, key: str, *, catch_up: bool = True) -> PendingChanges[str]:
        """Hear the announcements of row ``key`` (hex) from now on; starts
        listening if needed.

        With ``catch_up`` (the default), a subscription made before LISTEN is in
        effect hears both kinds of change once it is, since what changed in
        between was announced to nobody. Without it the subscription hears only
        what is announced once LISTEN is in effect (and both kinds after a
        reconnect, as every subscription does).
        """
        subscription = PendingChanges(key, self.drop)
        subscription.missed = catch_up and not self._subscribed.is_set()
        self._subscriptions.setdefault(key, set()).add(subscription)
        self._start()
        return subscription

    def drop(self, subscription: PendingChanges[str]) -> None:
        """Forget ``subscription`` (its ``aclose`` calls this)."""
        subscriptions = self._subscriptions.get(subscription.key)
        if subscriptions is not None:
            subscriptions.discard(subscription)
            if not subscriptions:
                del self._subscriptions[subscription.key]

    async def wait(self, key: str, max_wait: float) -> bool:
        """Wait up to ``max_wait`` seconds for an announcement of row ``key`` (hex),
        on a subscription of its own: only what is announced meanwhile counts."""
        if max_wait <= 0:
            return False
        async with self.subscribe(key, catch_up=False) as subscription:
            return bool(await subscription.wait(max_wait))

    async def listening(self, within: float) -> bool:
        """Start listening if needed; whether LISTEN is in effect within ``within`` s."""
        self._start()
        try:
            async with asyncio.timeout(within):
                await self._subscribed.wait()
        except TimeoutError:
            return False
        return True

    async def aclose(self) -> None:
        """Stop listening and close the connection; subscriptions left hear nothing
        more until listening starts again (then everything, once)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._stopped_listening()

    def _start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="tether-postgres-listener"
            )

    async def _run(self) -> None:
        delay = self._retry_delay
        while True:
            try:
                connection = await self._connect()
            except (psycopg.Error, OSError) as error:
                logger.warning("LISTEN on %s failed to connect: %s", self._display_url, error)
            else:
                try:
                    async with connection:
                        await connection.execute(queries.LISTEN)
                        self._subscribed.set()
                        delay = self._retry_delay
                        self._catch_up()
                        async for notification in connection.notifies():
                            self._dispatch(notification.payload)
                except psycopg.Error as error:
                    logger.warning(
                        "LISTEN connection to %s lost (%s); followers poll until it is back",
                        self._display_url,
                        error,
                    )
                finally:
                    self._stopped_listening()
            await asyncio.sleep(delay)
            delay = min(delay * 2, self._max_retry_delay)

    def _dispatch(self, payload: str) -> None:
        key, changes = parse_payload(payload)
        subscriptions = self._subscriptions.get(key)
        if subscriptions:  # most payloads are for turns nobody here reads
            deliver(subscriptions, changes, delta_text(payload))

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
