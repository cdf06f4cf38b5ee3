"""The one LISTEN connection a database object shares among all its waiting followers."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from psycopg import AsyncConnection

from tether.adapters.postgres import queries

logger = logging.getLogger(__name__)

Connect = Callable[[], Awaitable[AsyncConnection[Any]]]


class ChangeListener:
    """Dispatches NOTIFY payloads (row keys in hex) to the tasks waiting on them.

    The connection is opened by the first waiter, not before: a replica that
    never follows another replica's stream never holds it. When it is lost
    (server restart, network), the listener reconnects in the background with a
    growing delay (``retry_delay`` doubling up to ``max_retry_delay``);
    meanwhile waiters simply sleep out their ``max_wait``, which turns followers
    into pollers until the connection is back. After a reconnect every waiter is
    woken once, because changes made while nobody listened were never announced.
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
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}
        self._task: asyncio.Task[None] | None = None
        self._subscribed = asyncio.Event()

    async def wait(self, payload: str, max_wait: float) -> bool:
        """Wait up to ``max_wait`` seconds for a notification carrying ``payload``."""
        if max_wait <= 0:
            return False
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiters = self._waiters.setdefault(payload, set())
        waiters.add(future)
        try:
            self._start()
            try:
                async with asyncio.timeout(max_wait):
                    await future
            except TimeoutError:
                return False
            return True
        finally:
            waiters.discard(future)
            if not waiters and self._waiters.get(payload) is waiters:
                del self._waiters[payload]

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
        """Stop listening and close the connection; waiters left sleep out their wait."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._subscribed.clear()

    def _start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="tether-postgres-listener"
            )

    async def _run(self) -> None:
        delay = self._retry_delay
        ever_subscribed = False
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
                        if ever_subscribed:
                            self._wake_all()
                        ever_subscribed = True
                        async for notification in connection.notifies():
                            self._wake(notification.payload)
                except psycopg.Error as error:
                    logger.warning(
                        "LISTEN connection to %s lost (%s); followers poll until it is back",
                        self._display_url,
                        error,
                    )
                finally:
                    self._subscribed.clear()
            await asyncio.sleep(delay)
            delay = min(delay * 2, self._max_retry_delay)

    def _wake(self, payload: str) -> None:
        for future in self._waiters.get(payload, ()):
            if not future.done():
                future.set_result(None)

    def _wake_all(self) -> None:
        for payload in list(self._waiters):
            self._wake(payload)
