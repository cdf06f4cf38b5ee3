"""What the four SQLite stores share: a database, and one hold on it per store."""

from __future__ import annotations

import os
from types import TracebackType
from typing import Any, Self

from tether.adapters.sqlite._url import DEFAULT_BUSY_TIMEOUT
from tether.adapters.sqlite.database import SQLiteDatabase
from tether.adapters.unix_datagrams import UnixDatagramChannel


class SQLiteStore:
    """Base of the SQLite stores: each works over a ``SQLiteDatabase``.

    The constructor takes a database, opened or not; ``from_url``/``from_path``
    build one of the store's own. ``open`` takes one hold on the database and
    ``aclose`` gives it back (both idempotent per store), so any number of
    stores may share a database and each may be opened and closed by itself:
    the connections close with the last hold, whether that is a store's or the
    caller's own ``open``.
    """

    def __init__(self, database: SQLiteDatabase) -> None:
        self._database = database
        self._holding = False

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Self:
        """The store over a database of its own, for ``sqlite:///path.db``;
        ``options`` go to the store's constructor (the conversation store's ``clock``)."""
        return cls(SQLiteDatabase.from_url(url), **options)

    @classmethod
    def from_path(
        cls,
        path: str | os.PathLike[str],
        *,
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
        **options: Any,
    ) -> Self:
        """The store over a database of its own, on the file ``path``."""
        return cls(SQLiteDatabase(path, busy_timeout=busy_timeout), **options)

    @property
    def database(self) -> SQLiteDatabase:
        """The database this store works over."""
        return self._database

    async def open(self) -> None:
        """Hold the database open (connecting it if nobody has yet)."""
        if not self._holding:
            await self._database.open()
            self._holding = True

    async def aclose(self) -> None:
        """Give back this store's hold; a no-op when it holds none."""
        if self._holding:
            self._holding = False
            await self._database.aclose()

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

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._database.name!r})"


def wake_channel(database: SQLiteDatabase) -> UnixDatagramChannel:
    """The push channel of the replicas sharing ``database``: Unix datagram
    sockets in ``{file}.wake`` beside it, as presence keeps ``{file}.presence``."""
    path = database.path
    return UnixDatagramChannel(path.with_name(f"{path.name}.wake"))
