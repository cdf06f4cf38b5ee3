"""The one Redis connection the three stores share: client, keys, scripts, change feed."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any, Self, TypeVar

import redis.asyncio
import redis.exceptions

from tether.adapters.redis._changes import ChangeFeed
from tether.adapters.redis._keys import DEFAULT_PREFIX, TOMBSTONE_KINDS, KeyLayout
from tether.adapters.redis._scripts import Scripts
from tether.adapters.redis._url import DEFAULT_STREAM_TTL, client_defaults, parse_url, pool_defaults
from tether.domain.chat_stream_recording_store import ChangeSubscription
from tether.domain.store_bundle import StoreURLError
from tether.domain.store_errors import StoreCorruptedError, StoreError, StoreUnavailableError
from tether.domain.tombstones import TombstoneKey, TombstoneKeyError

_T = TypeVar("_T")

# Errors that mean "the server cannot serve us right now", not "we asked wrongly":
# connection loss, timeouts, a replica that became read-only in a failover.
_UNAVAILABLE = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.ClusterDownError,
    OSError,
)


class RedisConnection:
    """A ``redis.asyncio.Redis`` client with everything the Redis stores share.

    Give it a ready client (which stays yours: ``aclose`` leaves it open unless
    ``owns_client``), or build one with ``from_url``, which owns it. Nothing
    needs ``open()`` to work (the client connects on first use); ``open()`` pings
    so an unreachable server fails start-up with a ``StoreUnavailableError``
    naming the URL (never its password). ``open`` and ``aclose`` are idempotent,
    so each of the three stores sharing a connection may call both.

    Outages: every call is bounded by the socket timeouts (from ``from_url``: 1 s
    to connect, 2 s per reply, one quick retry) and raises
    ``StoreUnavailableError`` when the server is away; the pool reconnects by
    itself on the next call once the server is back, and the change feed
    resubscribes in the background.

    Load: ``from_url`` builds a bounded ``BlockingConnectionPool`` (32
    connections, one of them the change feed's subscription), so a burst of a
    thousand turns queues for connections instead of failing with "Too many
    connections"; a call that waits longer than the pool timeout (5 s) for one
    raises ``StoreUnavailableError``. Every store call runs through :meth:`call`,
    in a task of its own that the caller's cancellation does not interrupt:
    redis-py can strand a pooled connection, or swallow the cancellation, when
    a task is cancelled inside it, and a stranded connection never comes back.
    """

    def __init__(
        self,
        client: redis.asyncio.Redis,
        *,
        prefix: str = DEFAULT_PREFIX,
        stream_ttl: int = DEFAULT_STREAM_TTL,
        state_ttl: int | None = None,
        name: str | None = None,
        owns_client: bool = False,
        tombstone_key: TombstoneKey | None = None,
    ) -> None:
        """``prefix`` starts every key (verbatim); ``stream_ttl`` (seconds, > 0) is
        set on every supervision and recording write; ``state_ttl`` (seconds, or
        None for never) on every checkpoint save. ``name`` is how messages name
        the server (default: host, port and db of the client).
        ``tombstone_key`` names the keys of the numbers kept for ever per
        conversation (default: ``TETHER_TOMBSTONE_KEY``; ``domain.tombstones``)."""
        if stream_ttl <= 0:
            raise ValueError("stream_ttl must be a positive number of seconds")
        if state_ttl is not None and state_ttl <= 0:
            raise ValueError("state_ttl must be a positive number of seconds, or None")
        self._client = client
        self._owns_client = owns_client
        self.name = name or _describe_client(client)
        self.keys = KeyLayout(prefix, tombstone_key or TombstoneKey.from_env())
        self.stream_ttl = stream_ttl
        self.state_ttl = state_ttl
        self.scripts = Scripts(client)
        self._changes = ChangeFeed(client, self.keys.channel, self.name)
        self._opened = False
        self._closed = False
        self._abandoned: set[asyncio.Future[Any]] = set()
        self._url: str | None = None  # set by ``from_url``: what ``for_another_loop`` needs

    @classmethod
    def from_url(cls, url: str) -> Self:
        """A connection owning a new client for ``redis://host:port/db?prefix=...``.

        Tether's query parameters: ``prefix`` (default ``tether:``), ``stream_ttl``
        (seconds, default 21600) and ``state_ttl`` (seconds; 0 or absent: never).
        The rest of the URL goes to redis-py (``socket_timeout``, ``rediss://``,
        a password, ...), including the pool's bounds: ``max_connections``
        (default 32) and ``timeout`` (seconds a call may wait for a free
        connection, default 5). Does not connect yet.
        """
        parsed = parse_url(url)
        try:
            pool = redis.asyncio.BlockingConnectionPool.from_url(
                parsed.client_url, **pool_defaults(), **client_defaults()
            )
            client = redis.asyncio.Redis.from_pool(pool)
        except ValueError as error:
            raise StoreURLError(f"store URL {parsed.name}: {error}") from error
        connection = cls(
            client,
            prefix=parsed.prefix,
            stream_ttl=parsed.stream_ttl,
            state_ttl=parsed.state_ttl,
            name=parsed.name,
            owns_client=True,
        )
        connection._url = url
        return connection

    def for_another_loop(self) -> Self:
        """The same server and prefix through a client of its own, not connected
        yet, for another event loop (redis-py binds its connections to the loop
        that makes them). Only a connection built ``from_url`` can be copied."""
        if self._url is None:
            raise NotImplementedError("a connection over a given client cannot be copied")
        return type(self).from_url(self._url)

    @property
    def client(self) -> redis.asyncio.Redis:
        """The underlying client."""
        return self._client

    async def open(self) -> None:
        """Check the server answers; ``StoreUnavailableError`` naming it if not."""
        if self._opened:
            return
        await self.call("connect", self._client.ping)
        await self._check_tombstone_key()
        await self._move_named_tombstones()
        self._opened = True

    async def _check_tombstone_key(self) -> None:
        """Record the key's check value on first use; refuse another key after."""
        check = self.keys.tombstones.check
        key = self.keys.tombstone_key
        await self.call("record the tombstone key", lambda: self._client.set(key, check, nx=True))
        recorded = await self.call("read the tombstone key", lambda: self._client.get(key))
        try:
            self.keys.tombstones.verify(_decoded(recorded), f"Redis store {self.name}")
        except TombstoneKeyError as error:
            raise StoreError(str(error)) from error

    async def _move_named_tombstones(self) -> None:
        """Keys of numbers kept for ever that an earlier release named by the
        conversation's ids (``{kind}{tenant}:{requester}:{session}``) move to
        their tombstone's key, keeping the higher number: an upgraded store
        keeps every epoch and, once moved, names no id. A tombstone has no
        ``:``, so what is left to move is found by the pattern."""
        for kind in TOMBSTONE_KINDS:
            named = f"{self.keys.prefix}{kind}"
            found = await self.call("find named tombstones", functools.partial(self._scan, named))
            for old in found:
                try:
                    new = named + self.keys.tombstone(old.removeprefix(named))
                except ValueError:
                    continue  # not a key this layout made: left alone
                await self.call(
                    "move a named tombstone",
                    functools.partial(self.scripts.tombstone_move, [old, new]),
                )

    async def _scan(self, named: str) -> list[str]:
        return [
            _decoded(key) or ""
            async for key in self._client.scan_iter(match=f"{named}*:*", count=500)
        ]

    async def aclose(self) -> None:
        """Stop the change feed and, if owned, close the client. Idempotent."""
        if self._closed:
            return
        self._closed = True
        await self._changes.aclose()
        if self._abandoned:
            # Calls whose callers were cancelled finish within the socket
            # timeouts; let them hand their connections back first.
            await asyncio.wait(set(self._abandoned), timeout=10.0)
        if self._owns_client:
            await self._client.aclose()

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    def subscribe(self, conversation: str) -> ChangeSubscription:
        """Hear the announced changes of ``conversation`` from now on (see
        ``ChangeFeed``); starts the change feed if needed."""
        self._check_not_closed("subscribe to changes")
        return self._changes.subscribe(conversation)

    async def listen(self, within: float = 5.0) -> None:
        """Start the change feed now and wait until its channel is subscribed;
        ``StoreUnavailableError`` if it is not within ``within`` seconds."""
        self._check_not_closed("listen for changes")
        if not await self._changes.listening(within):
            raise StoreUnavailableError(
                f"Redis at {self.name}: the change feed is not subscribed after {within:g} s"
            )

    async def wait_for_change(self, conversation: str, max_wait: float) -> bool:
        """Whether a write to ``conversation``'s rows was announced within ``max_wait``."""
        self._check_not_closed("wait for a change")
        return await self._changes.wait(conversation, max_wait)

    async def call(self, action: str, work: Callable[[], Awaitable[_T]]) -> _T:
        """``await work()`` with driver errors translated (see ``translate_errors``),
        in a task of its own: cancelling the caller raises ``CancelledError`` in
        the caller at once, while the command itself runs to its end (bounded by
        the socket timeouts) and hands its connection back to the pool.

        A cancelled write may therefore still happen, as a write whose reply was
        lost may; every write is one atomic, epoch-guarded step either way.
        """
        self._check_not_closed(action)
        attempt = asyncio.ensure_future(self._translated(action, work))
        try:
            return await asyncio.shield(attempt)
        except asyncio.CancelledError:
            if not attempt.done():
                self._abandoned.add(attempt)
                attempt.add_done_callback(self._forget)
            raise

    async def _translated(self, action: str, work: Callable[[], Awaitable[_T]]) -> _T:
        with self.translate_errors(action):
            return await work()

    def _forget(self, attempt: asyncio.Future[Any]) -> None:
        self._abandoned.discard(attempt)
        if not attempt.cancelled():
            attempt.exception()  # retrieved: nobody is left to report it to

    @contextmanager
    def translate_errors(self, action: str) -> Iterator[None]:
        """Raise the driver's errors inside as ``StoreError`` types, original as cause."""
        self._check_not_closed(action)
        try:
            yield
        except _UNAVAILABLE as error:
            raise StoreUnavailableError(
                f"Redis at {self.name} is unavailable: cannot {action}: {error}"
            ) from error
        except redis.exceptions.ResponseError as error:
            # WRONGTYPE: something else wrote the key; CORRUPT: our scripts found a
            # row they did not write. Neither is treated as empty or overwritten.
            if str(error).startswith(("WRONGTYPE", "CORRUPT")):
                raise StoreCorruptedError(
                    f"Redis at {self.name}: cannot {action}: {error}; left as is"
                ) from error
            raise StoreError(f"Redis at {self.name}: cannot {action}: {error}") from error
        except redis.exceptions.RedisError as error:
            raise StoreError(f"Redis at {self.name}: cannot {action}: {error}") from error

    def _check_not_closed(self, action: str) -> None:
        if self._closed:
            raise StoreUnavailableError(f"Redis at {self.name}: cannot {action}: closed")


def _describe_client(client: redis.asyncio.Redis) -> str:
    options = client.connection_pool.connection_kwargs
    if "path" in options:
        return f"unix://{options['path']}"
    host, port = options.get("host", "localhost"), options.get("port", 6379)
    return f"redis://{host}:{port}/{options.get('db', 0)}"


def _decoded(value: bytes | str | None) -> str | None:
    return value.decode() if isinstance(value, bytes) else value
