"""What the three Redis stores share: a connection, its lifecycle, reading JSON back."""

from __future__ import annotations

from types import TracebackType
from typing import Self, TypeVar

from pydantic import BaseModel, ValidationError

from tether.adapters.redis.connection import RedisConnection
from tether.domain.store_errors import StoreCorruptedError

_M = TypeVar("_M", bound=BaseModel)


class RedisStore:
    """Base of the Redis stores: each works over a ``RedisConnection``.

    ``open``/``aclose`` (and ``async with``) act on the connection, so closing
    any store closes it for every store sharing it; ``setup_app`` closes them
    all at shutdown anyway.
    """

    def __init__(self, connection: RedisConnection) -> None:
        self._connection = connection

    @classmethod
    def from_url(cls, url: str) -> Self:
        """The store over a connection of its own (see ``RedisConnection.from_url``)."""
        return cls(RedisConnection.from_url(url))

    @property
    def connection(self) -> RedisConnection:
        """The connection this store works over."""
        return self._connection

    async def open(self) -> None:
        """Ping the server once (see ``RedisConnection.open``)."""
        await self._connection.open()

    async def aclose(self) -> None:
        """Close the shared connection (idempotent)."""
        await self._connection.aclose()

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


def parse_row(model: type[_M], document: bytes | str, epoch: bytes | str, key: str) -> _M:
    """A row's JSON validated as ``model``, checked against the epoch the scripts
    fence on (the hash field) so the two can never silently disagree."""
    try:
        row = model.model_validate_json(document)
        matches = getattr(row, "epoch", None) == int(epoch)
    except (ValidationError, ValueError) as error:
        raise corrupt(key, f"holds no valid row ({error})") from error
    if not matches:
        raise corrupt(key, "holds a row whose epoch differs from its epoch field")
    return row


def corrupt(key: str, problem: str) -> StoreCorruptedError:
    """The error for a key whose contents cannot be read back."""
    return StoreCorruptedError(f"Redis key {_shown(key)} {problem}; left as is")


def _shown(key: str) -> str:
    # Ids may be 10,000 characters long; a message needs only enough to find the key.
    return repr(key if len(key) <= 200 else f"{key[:200]}...")
