"""One PostgreSQL database as the four stores share it: pool, schema, listener, errors."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from types import TracebackType
from typing import Any, Self, TypeVar

from psycopg import AsyncConnection, AsyncCursor
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool

from tether.adapters.postgres import migrations
from tether.adapters.postgres._conninfo import pool_on, redact, split_store_url
from tether.adapters.postgres._errors import again_on_conflict, translated
from tether.adapters.postgres._notifications import ChangeListener
from tether.domain.chat_stream_recording_store import ChangeSubscription
from tether.domain.store_errors import StoreError, StoreUnavailableError
from tether.domain.tombstones import TombstoneKeyError

logger = logging.getLogger(__name__)

_T = TypeVar("_T")


class PostgresDatabase:
    """A PostgreSQL database shared by the stores built on it.

    It owns (or borrows) an ``AsyncConnectionPool``, keeps the schema current,
    runs the one LISTEN connection followers wait on, and translates every
    driver error at the edge: ``StoreUnavailableError`` when the server cannot
    be reached or does not answer within ``timeout`` seconds, ``StoreError``
    for anything else it refuses, each with the driver's error as ``__cause__``.
    Messages name the server by its URL with the password masked.

    Build one with :meth:`from_url` (it builds and owns the pool), or pass a pool
    you own; its connections must be autocommit (``kwargs={"autocommit": True}``)
    and it should have ``check=AsyncConnectionPool.check_connection`` so that
    connections broken by a server restart are replaced, not handed out.

    ``open()`` and ``aclose()`` are idempotent; so is ``async with``. Stores call
    :meth:`retain` and :meth:`release` instead: the first store opened opens the
    database and the last one closed closes it, unless the database was opened
    directly, which leaves closing it to its owner.

    Durability: transcripts, checkpoints, claims, takeovers, terminal statuses
    and the first recording put of each epoch wait for their commit to be
    flushed, as PostgreSQL commits normally do. Heartbeats (a RUNNING swap at
    the epoch already held) and later puts at the same epoch commit with
    ``synchronous_commit`` off (``SET LOCAL`` for their own transaction, done
    inside the statement): still atomic and crash-consistent, but a *server*
    crash may lose the last few hundred milliseconds of them. Nothing an epoch
    fence depends on is among them, and any durable commit after them flushes
    them too (WAL is flushed in order). After such a crash a follower may see a
    slightly older snapshot or heartbeat, which the producer's next write
    restores.
    """

    def __init__(
        self,
        pool: AsyncConnectionPool[Any],
        *,
        create_schema: bool = True,
        timeout: float = 5.0,
    ) -> None:
        if isinstance(pool.kwargs, Mapping) and not pool.kwargs.get("autocommit"):
            raise ValueError("pool connections must be autocommit: kwargs={'autocommit': True}")
        self._pool = pool
        # Set when this object owns its pools: a closed pool cannot reopen, so
        # closing swaps in a fresh one and the database can be opened again.
        self._pool_factory: Callable[[], AsyncConnectionPool[Any]] | None = None
        self._url: str | None = None  # set by ``from_url``: what ``with_one_connection`` needs
        self._create_schema = create_schema
        self._timeout = timeout
        self.display_url = redact(pool.conninfo) if isinstance(pool.conninfo, str) else "<pool>"
        """The server's URL with its password masked, as error messages show it."""
        self._lock = asyncio.Lock()
        self._is_open = False
        self._holders = 0
        self._opened_by_holders = False
        self._listener = ChangeListener(self._connect_directly, self.display_url)
        self._abandoned: set[asyncio.Future[Any]] = set()

    @classmethod
    def from_url(cls, url: str) -> Self:
        """A database on ``url`` that builds and owns its pool; nothing connects yet.

        ``url`` is a libpq URL plus tether's own query parameters (see
        ``PostgresOptions``): ``create_schema``, ``pool_min_size``,
        ``pool_max_size`` and ``timeout``. Raises ``StoreURLError`` for a bad URL.
        """
        libpq_url, options = split_store_url(url)

        def build_pool() -> AsyncConnectionPool[Any]:
            return pool_on(libpq_url, options, name="tether")

        database = cls(build_pool(), create_schema=options.create_schema, timeout=options.timeout)
        database._pool_factory = build_pool
        database.display_url = redact(libpq_url)
        database._url = url
        return database

    def with_one_connection(self) -> PostgresDatabase:
        """The same database through a pool of one connection of its own, not
        opened yet, for another event loop (psycopg binds a pool to the loop
        that opens it); it checks the schema rather than creating it. Only a
        database built ``from_url`` knows how to connect again."""
        if self._url is None:
            raise NotImplementedError("a database built on a given pool cannot be copied")
        libpq_url, options = split_store_url(self._url)
        pool = pool_on(libpq_url, options, name="tether-leases", size=1)
        database = type(self)(pool, create_schema=False, timeout=options.timeout)
        database.display_url = self.display_url
        return database

    @property
    def timeout(self) -> float:
        """Seconds any store call may take before it raises ``StoreUnavailableError``."""
        return self._timeout

    async def open(self) -> None:
        """Connect, then create or upgrade the schema (``create_schema``) or check it.

        Raises ``StoreUnavailableError`` naming the URL when the server cannot be
        reached within ``timeout``, and ``StoreError`` when ``create_schema`` is
        off and the schema is older than this tether's. Idempotent; a failed
        open may be retried.
        """
        async with self._lock:
            if not self._is_open:
                await self._open()
            self._opened_by_holders = False

    async def aclose(self) -> None:
        """Stop the listener and close the pool if this object owns it. Idempotent."""
        async with self._lock:
            self._holders = 0
            await self._close()

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

    async def retain(self) -> None:
        """One more store uses the database: the first one opens it."""
        async with self._lock:
            if not self._is_open:
                await self._open()
                self._opened_by_holders = True
            self._holders += 1

    async def release(self) -> None:
        """One store less: the last one closes the database, if a store opened it."""
        async with self._lock:
            self._holders = max(0, self._holders - 1)
            if self._holders == 0 and self._opened_by_holders:
                await self._close()

    async def upgrade(self) -> list[int]:
        """Apply pending migrations under the schema advisory lock; their versions.

        Works before ``open()`` too, on a connection of its own (``tether db
        upgrade`` uses it that way). Safe to run from many processes at once.
        """
        async with self._schema_connection() as connection:
            try:
                applied = await migrations.upgrade(connection)
            except TombstoneKeyError as error:
                raise StoreError(f"PostgreSQL at {self.display_url}: {error}") from error
        if applied:
            logger.info("schema of %s upgraded to version %s", self.display_url, applied[-1])
        return applied

    async def schema_version(self) -> int:
        """The schema version recorded in the database; 0 if it has none."""
        async with self._schema_connection() as connection:
            return await migrations.schema_version(connection)

    async def listen(self) -> None:
        """Start the shared LISTEN connection now and wait until it is subscribed.

        Optional: the first ``subscribe`` or ``wait_for_change`` starts it
        anyway. Raises ``StoreUnavailableError`` if it is not subscribed within
        ``timeout``.
        """
        self._require_open()
        if not await self._listener.listening(self._timeout):
            raise StoreUnavailableError(
                f"PostgreSQL at {self.display_url}: LISTEN not in effect after {self._timeout:g} s"
            )

    def subscribe(self, key: bytes) -> ChangeSubscription:
        """Hear the announced writes to the rows ``key`` from now on (see
        ``ChangeListener``); starts the shared LISTEN connection if needed."""
        self._require_open()
        return self._listener.subscribe(key.hex())

    async def wait_for_change(self, key: bytes, max_wait: float) -> bool:
        """Wait until a write to the row ``key`` is announced, or ``max_wait`` passes."""
        self._require_open()
        return await self._listener.wait(key.hex(), max_wait)

    async def run(
        self, work: Callable[[AsyncCursor[DictRow]], Awaitable[_T]], *, transaction: bool = False
    ) -> _T:
        """``await work(cursor)`` on a pooled connection (in one transaction if asked).

        Bounded by ``timeout`` from the first wait for a connection: past it the
        call raises ``StoreUnavailableError`` at once, while the abandoned attempt
        cancels its query on the server in the background (psycopg may take
        seconds over that on a dead network, which no caller should wait out).
        Errors ``work`` raises itself pass through; driver errors are translated.
        """
        pool = self._require_open()
        attempt = asyncio.ensure_future(self._attempt(pool, work, transaction))
        try:
            async with self._translated(self._timeout):
                return await asyncio.shield(attempt)
        except BaseException:
            if not attempt.done():
                attempt.cancel()
                self._abandoned.add(attempt)
                attempt.add_done_callback(self._forget)
            raise

    async def transact(self, work: Callable[[AsyncCursor[DictRow]], Awaitable[_T]]) -> _T:
        """``await work(cursor)`` in one transaction, as :meth:`run` does; a
        transaction that lost a deadlock or serialization conflict is run again.

        The lost transaction was rolled back and changed nothing, so ``work``
        starts over on a fresh transaction: it must not carry state between calls.
        """
        return await again_on_conflict(lambda: self.run(work, transaction=True), "transaction")

    async def fetch_all(self, query: str, params: Mapping[str, Any]) -> list[DictRow]:
        """Run one statement and return its rows; a deadlock victim is sent again."""

        async def fetch(cursor: AsyncCursor[DictRow]) -> list[DictRow]:
            await cursor.execute(query, params)
            return await cursor.fetchall() if cursor.description is not None else []

        return await again_on_conflict(lambda: self.run(fetch), "statement")

    async def fetch_one(self, query: str, params: Mapping[str, Any]) -> DictRow | None:
        """Run one statement and return its first row, or None."""
        rows = await self.fetch_all(query, params)
        return rows[0] if rows else None

    async def execute(self, query: str, params: Mapping[str, Any]) -> None:
        """Run one statement, ignoring any rows it returns."""
        await self.fetch_all(query, params)

    # Internals ------------------------------------------------------------------------

    async def _open(self) -> None:
        # A direct connection first: a refused, misnamed or misconfigured server
        # fails here in milliseconds with libpq's own reason, where the pool would
        # only report a timeout after retrying for the whole of it.
        async with self._translated(self._timeout, "is unreachable"):
            probe = await self._connect_directly()
            await probe.close()
        try:
            async with self._translated(self._timeout, "is unreachable"):
                await self._pool.open(wait=True, timeout=self._timeout)
            self._is_open = True
            if self._create_schema:
                await self.upgrade()
            else:
                await self._check_schema()
        except BaseException:
            await self._close()
            raise

    @staticmethod
    async def _attempt(
        pool: AsyncConnectionPool[Any],
        work: Callable[[AsyncCursor[DictRow]], Awaitable[_T]],
        transaction: bool,
    ) -> _T:
        async with pool.connection() as connection:
            if not connection.autocommit:
                raise StoreError("the pool's connections must be autocommit")
            async with connection.cursor(row_factory=dict_row) as cursor:
                if not transaction:
                    return await work(cursor)
                async with connection.transaction():
                    return await work(cursor)

    def _forget(self, attempt: asyncio.Future[Any]) -> None:
        self._abandoned.discard(attempt)
        if not attempt.cancelled():
            attempt.exception()  # retrieved: nobody is left to report it to

    async def _close(self) -> None:
        self._is_open = False
        await self._listener.aclose()
        if self._abandoned:
            # Let abandoned attempts hand their connections back before the pool goes.
            await asyncio.wait(set(self._abandoned), timeout=10.0)
        if self._pool_factory is not None:
            pool, self._pool = self._pool, self._pool_factory()
            await pool.close()

    async def _check_schema(self) -> None:
        version = await self.schema_version()
        if version < migrations.LATEST_VERSION:
            raise StoreError(
                f"PostgreSQL at {self.display_url} has schema version {version}, this tether "
                f"needs {migrations.LATEST_VERSION}: run `tether db upgrade --store URL` "
                "(or open with create_schema=true)"
            )
        async with self._schema_connection() as connection:
            try:
                await migrations.check_tombstone_key(connection)
            except TombstoneKeyError as error:
                raise StoreError(f"PostgreSQL at {self.display_url}: {error}") from error
        if version > migrations.LATEST_VERSION:
            logger.warning(
                "schema of %s is at version %d, newer than this tether's %d; carrying on",
                self.display_url,
                version,
                migrations.LATEST_VERSION,
            )

    def _require_open(self) -> AsyncConnectionPool[Any]:
        if not self._is_open:
            raise StoreError(
                f"PostgreSQL store on {self.display_url} is not open: "
                "call open() or use it with async with"
            )
        return self._pool

    async def connect_directly(self) -> AsyncConnection[Any]:
        """A connection of the caller's own, outside the pool (autocommit), for
        a session that must live as long as the caller (a replica's presence
        lock); the caller closes it."""
        async with self._translated(self._timeout, "is unreachable"):
            return await self._connect_directly()

    async def _connect_directly(self) -> AsyncConnection[Any]:
        # Outside the pool: the probe, the listener, and schema work before open().
        conninfo = await _resolve(self._pool.conninfo)
        kwargs = dict(await _resolve(self._pool.kwargs) or {})
        kwargs["autocommit"] = True
        connection: AsyncConnection[Any] = await self._pool.connection_class.connect(
            conninfo, **kwargs
        )
        return connection

    @asynccontextmanager
    async def _schema_connection(self) -> AsyncIterator[AsyncConnection[Any]]:
        # Migrations may take long: only connecting is bounded, not the DDL.
        if self._is_open:
            async with self._translated(None), self._pool.connection() as connection:
                yield connection
            return
        async with self._translated(None):
            async with self._translated(self._timeout, "is unreachable"):
                connection = await self._connect_directly()
            async with connection:
                yield connection

    def _translated(
        self, within: float | None, unavailable: str = "is unavailable"
    ) -> AbstractAsyncContextManager[None]:
        """Driver errors (and taking longer than ``within`` s) out as store errors."""
        return translated(self.display_url, within, unavailable)


async def _resolve(value: Any) -> Any:
    # Pool conninfo and kwargs may be values, callables, or async callables.
    if callable(value):
        value = value()
    if inspect.isawaitable(value):
        value = await value
    return value
