"""One sqlite3 connection confined to one thread, and the edge where its errors are translated."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from typing import TypeVar

from tether.adapters.sqlite import queries
from tether.domain.store_errors import StoreCorruptedError, StoreError, StoreUnavailableError

_T = TypeVar("_T")

# Primary result codes (the low byte of an extended code) and what they mean to a caller.
_UNAVAILABLE = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_CANTOPEN})
_CORRUPT = frozenset({sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB})


class ConnectionThread:
    """A single-thread executor owning one connection, created and closed in that thread.

    Work runs in submission order, one step at a time, so the connection needs
    no lock and is never touched by two threads (sqlite3's ``check_same_thread``
    stays on to prove it).
    """

    def __init__(self, lane: str, database: str) -> None:
        """``lane`` names the thread; ``database`` is how error messages name the database."""
        self._executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"tether-sqlite-{lane}"
        )
        self._database = database
        self._connection: sqlite3.Connection | None = None

    async def connect(self, connect: Callable[[], sqlite3.Connection]) -> None:
        """Open the connection with ``connect``, inside the thread."""

        def opened(_: sqlite3.Connection | None) -> None:
            self._connection = connect()

        await self._submit(opened)

    async def run(self, step: Callable[[sqlite3.Connection], _T]) -> _T:
        """``step(connection)`` in the thread. sqlite3 errors and OS errors leave as
        ``StoreError`` naming the database, with the original as ``__cause__``;
        anything else ``step`` raises (a fence, a refusal) leaves unchanged."""

        def call(connection: sqlite3.Connection | None) -> _T:
            if connection is None:
                raise StoreError(f"SQLite store {self._database} is not open")
            return step(connection)

        return await self._submit(call)

    async def close(self) -> None:
        """Close the connection after the work already submitted, then stop the thread."""

        def closed(connection: sqlite3.Connection | None) -> None:
            self._connection = None
            if connection is not None:
                connection.close()

        try:
            await self._submit(closed)
        finally:
            # The queue is empty by now, so this only joins an idle thread.
            self._executor.shutdown(wait=True)

    async def _submit(self, step: Callable[[sqlite3.Connection | None], _T]) -> _T:
        def call() -> _T:
            try:
                return step(self._connection)
            except sqlite3.Error as exc:
                raise translate(exc, self._database) from exc
            except OSError as exc:
                raise StoreError(f"SQLite store {self._database}: {exc}") from exc

        return await asyncio.get_running_loop().run_in_executor(self._executor, call)


def in_transaction(
    step: Callable[[sqlite3.Connection], _T],
) -> Callable[[sqlite3.Connection], _T]:
    """``step`` wrapped in ``BEGIN IMMEDIATE`` ... ``COMMIT``, rolled back if anything raises."""

    def transaction(connection: sqlite3.Connection) -> _T:
        connection.execute(queries.BEGIN_IMMEDIATE)
        try:
            result = step(connection)
            connection.execute(queries.COMMIT)
        except BaseException:
            if connection.in_transaction:
                # The original error is the one worth reporting; SQLite has already
                # rolled back itself when a rollback fails.
                with suppress(sqlite3.Error):
                    connection.execute(queries.ROLLBACK)
            raise
        return result

    return transaction


def translate(error: sqlite3.Error, name: str) -> StoreError:
    """The store error for a driver error (the caller chains the original)."""
    code = getattr(error, "sqlite_errorcode", None)
    primary = None if code is None else code & 0xFF
    message = f"SQLite store {name}: {error}"
    if primary in _CORRUPT:
        return StoreCorruptedError(f"{message}; left as is")
    if primary in _UNAVAILABLE:
        return StoreUnavailableError(message)
    return StoreError(message)
