"""The one Redis connection the three stores share: client, keys, scripts, change feed."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Self

import redis.asyncio
import redis.exceptions

from tether.adapters.redis._changes import ChangeFeed
from tether.adapters.redis._keys import DEFAULT_PREFIX, KeyLayout
from tether.adapters.redis._scripts import Scripts
from tether.adapters.redis._url import DEFAULT_STREAM_TTL, client_defaults, parse_url
from tether.domain.store_errors import StoreCorruptedError, StoreError, StoreUnavailableError
from tether.stores import StoreURLError

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
    ) -> None:
        """``prefix`` starts every key (verbatim); ``stream_ttl`` (seconds, > 0) is
        set on every supervision and recording write; ``state_ttl`` (seconds, or
        None for never) on every checkpoint save. ``name`` is how messages name
        the server (default: host, port and db of the client)."""
        if stream_ttl <= 0:
            raise ValueError("stream_ttl must be a positive number of seconds")
        if state_ttl is not None and state_ttl <= 0:
            raise ValueError("state_ttl must be a positive number of seconds, or None")
        self._client = client
        self._owns_client = owns_client
        self.name = name or _describe_client(client)
        self.keys = KeyLayout(prefix)
        self.stream_ttl = stream_ttl
        self.state_ttl = state_ttl
        self.scripts = Scripts(client)
        self._changes = ChangeFeed(client, self.keys.channel, self.name)
        self._opened = False
        self._closed = False

    @classmethod
    def from_url(cls, url: str) -> Self:
        """A connection owning a new client for ``redis://host:port/db?prefix=...``.

        Tether's query parameters: ``prefix`` (default ``tether:``), ``stream_ttl``
        (seconds, default 21600) and ``state_ttl`` (seconds; 0 or absent: never).
        The rest of the URL goes to redis-py (``socket_timeout``, ``rediss://``,
        a password, ...). Does not connect yet.
        """
        parsed = parse_url(url)
        try:
            client = redis.asyncio.Redis.from_url(parsed.client_url, **client_defaults())
        except ValueError as error:
            raise StoreURLError(f"store URL {parsed.name}: {error}") from error
        return cls(
            client,
            prefix=parsed.prefix,
            stream_ttl=parsed.stream_ttl,
            state_ttl=parsed.state_ttl,
            name=parsed.name,
            owns_client=True,
        )

    @property
    def client(self) -> redis.asyncio.Redis:
        """The underlying client."""
        return self._client

    async def open(self) -> None:
        """Check the server answers; ``StoreUnavailableError`` naming it if not."""
        if self._opened:
            return
        with self.translate_errors("connect"):
            await self._client.ping()
        self._opened = True

    async def aclose(self) -> None:
        """Stop the change feed and, if owned, close the client. Idempotent."""
        if self._closed:
            return
        self._closed = True
        await self._changes.aclose()
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

    async def wait_for_change(self, conversation: str, max_wait: float) -> bool:
        """Whether a write to ``conversation``'s rows was announced within ``max_wait``."""
        self._check_not_closed("wait for a change")
        return await self._changes.wait(conversation, max_wait)

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
