"""The SQLite database every store of this backend shares: two connections, two threads.

Concurrency. The database file is shared by any number of processes on one
host. It runs in WAL mode, so readers never wait for the writer; every write,
read-then-write or not, is a ``BEGIN IMMEDIATE`` transaction, which takes the
write lock before reading, so a check and the write it decides stay atomic
across processes, and waiting for another process's lock goes through the busy
timeout (default 5 s) instead of failing half-way. A timeout raises
``StoreUnavailableError``.

Threads. sqlite3 blocks, so nothing runs on the event loop: each connection
lives in its own single-thread executor (a *lane*) and is only ever used there.
One thread per connection rather than ``asyncio.to_thread`` with a connection
per thread, because it gives a fixed number of connections, opened and closed
deterministically by ``open``/``aclose`` (no connection left to the garbage
collector, no ResourceWarning), keeps blocking lock waits out of the loop's
shared default executor, and serializes each connection's work in submission
order without any lock of ours.

Durability. ``PRAGMA synchronous`` is per connection, so the lanes differ:

- ``Lane.DURABLE`` (agent state, conversations) runs ``synchronous = FULL``: the
  WAL is fsynced at every commit, so a checkpoint or transcript write survives
  power loss once acknowledged.
- ``Lane.STREAM`` (supervision rows, recordings) runs ``synchronous = NORMAL``:
  commits are atomic and survive a process crash, but skip the fsync, since
  heartbeats and recordings are rewritten every second and an OS crash takes
  the host's producers down with them anyway.

Mixing them in one WAL is safe: a FULL commit syncs the whole WAL up to itself,
and checkpoints sync before the WAL is reused, so a NORMAL commit can only lose
itself, never a durable commit before or after it. The two lanes also let a
heartbeat proceed while a transcript write waits for its fsync.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from types import TracebackType
from typing import Self, TypeVar

from tether.adapters.sqlite import schema
from tether.adapters.sqlite._connection_thread import ConnectionThread, in_transaction
from tether.adapters.sqlite._url import DEFAULT_BUSY_TIMEOUT, parse_url
from tether.domain.store_errors import StoreError
from tether.domain.tombstones import TombstoneKey, TombstoneKeyError

_T = TypeVar("_T")

MINIMUM_SQLITE = (3, 37, 0)
"""``STRICT`` tables (3.37) and upserts (3.24)."""


class Lane(Enum):
    """Which connection a store uses; see the module docstring for the difference."""

    STREAM = "stream"
    DURABLE = "durable"


@dataclass(frozen=True)
class SQLiteDiagnostics:
    """What ``SQLiteDatabase.diagnostics`` reports, for probes and tests."""

    path: str
    sqlite_version: str
    schema_version: int
    journal_mode: str
    synchronous: dict[Lane, int]
    """``PRAGMA synchronous`` per lane: 1 is NORMAL, 2 is FULL."""


class SQLiteDatabase:
    """One SQLite file holding the tables of all four stores.

    ``open`` creates missing parent directories and the file, switches it to WAL,
    and applies the schema migrations it lacks (versioned by ``PRAGMA
    user_version``; a file from a newer tether is refused). Opens nest:
    every ``open`` (or ``async with``) needs one ``aclose``, and the connections
    close with the last one, after the work already submitted. That lets each
    store sharing the database open and close it on its own.

    Use it from one event loop at a time. A cancelled call may still complete
    in its lane: every write is one transaction, so it happens wholly or not.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
        name: str | None = None,
        tombstone_key: TombstoneKey | None = None,
    ) -> None:
        """``path`` is the database file (relative paths resolve now);
        ``busy_timeout`` the seconds to wait for another process's write lock;
        ``name`` how error messages name the database (default: the path);
        ``tombstone_key`` what conversations' epochs and fences are kept
        under (default: ``TETHER_TOMBSTONE_KEY``; see ``domain.tombstones``)."""
        self._tombstones = tombstone_key or TombstoneKey.from_env()
        self._path = Path(os.path.abspath(os.fspath(path)))
        self._busy_timeout = busy_timeout
        self._name = name or str(self._path)
        self._holders = 0
        self._opening: asyncio.Future[dict[Lane, ConnectionThread]] | None = None
        self._lanes: dict[Lane, ConnectionThread] | None = None

    @classmethod
    def from_url(cls, url: str) -> Self:
        """The database of ``sqlite:///relative.db`` or ``sqlite:////abs.db``
        (``?busy_timeout=SECONDS``); error messages name the URL."""
        parsed = parse_url(url)
        return cls(parsed.path, busy_timeout=parsed.busy_timeout, name=url)

    @property
    def path(self) -> Path:
        """The absolute path of the database file."""
        return self._path

    @property
    def name(self) -> str:
        """How messages name this database: its URL, or its path."""
        return self._name

    async def open(self) -> None:
        """Take one hold on the database, connecting on the first.

        Raises ``StoreError`` naming the database when the file cannot be
        created or opened, is not a database, or has a newer schema.
        """
        opening = self._opening
        if self._holders == 0 or opening is None:
            opening = self._opening = asyncio.ensure_future(self._connect())
        self._holders += 1
        try:
            # Shielded: one opener being cancelled must not abort the others' open.
            self._lanes = await asyncio.shield(opening)
        except BaseException:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        """Release one hold; the last closes both connections. Extra calls are no-ops."""
        if self._holders == 0:
            return
        self._holders -= 1
        if self._holders:
            return
        opening, self._opening, self._lanes = self._opening, None, None
        if opening is None:
            return
        try:
            lanes = await asyncio.shield(opening)
        except BaseException:
            return  # nothing opened; the opener reports why
        for lane in lanes.values():
            await lane.close()

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

    async def read(self, lane: Lane, step: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run ``step`` on ``lane``'s connection in autocommit mode (for one SELECT,
        which is its own consistent snapshot). sqlite3 errors leave as ``StoreError``."""
        return await self._lane(lane).run(step)

    async def write(self, lane: Lane, step: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run ``step`` inside ``BEGIN IMMEDIATE`` ... ``COMMIT`` on ``lane``.

        An exception from ``step`` (a fence, an ownership refusal) rolls the
        transaction back and propagates unchanged.
        """
        return await self._lane(lane).run(in_transaction(step))

    async def diagnostics(self) -> SQLiteDiagnostics:
        """The file's journal mode and schema version, and each lane's sync level."""
        durable = self._lane(Lane.DURABLE)
        mode, version, full = await durable.run(_durable_settings)
        normal = await self._lane(Lane.STREAM).run(_synchronous)
        return SQLiteDiagnostics(
            path=str(self._path),
            sqlite_version=sqlite3.sqlite_version,
            schema_version=version,
            journal_mode=mode,
            synchronous={Lane.DURABLE: full, Lane.STREAM: normal},
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._name!r})"

    def _lane(self, lane: Lane) -> ConnectionThread:
        if self._lanes is None:
            raise StoreError(
                f"SQLite store {self._name} is not open: call open() (setup_app does) "
                "or use it as `async with`"
            )
        return self._lanes[lane]

    async def _connect(self) -> dict[Lane, ConnectionThread]:
        if sqlite3.sqlite_version_info < MINIMUM_SQLITE:
            raise StoreError(
                f"SQLite store {self._name}: needs SQLite "
                f"{'.'.join(map(str, MINIMUM_SQLITE))} or newer, Python links "
                f"{sqlite3.sqlite_version}"
            )
        durable = ConnectionThread(Lane.DURABLE.value, self._name)
        stream = ConnectionThread(Lane.STREAM.value, self._name)
        try:
            # The durable connection creates the file and the schema first, so
            # the stream connection only ever opens a ready database.
            await durable.connect(self._connector(schema.SET_SYNCHRONOUS_FULL))
            await durable.run(self._prepare)
            await stream.connect(self._connector(schema.SET_SYNCHRONOUS_NORMAL))
        except BaseException:
            await durable.close()
            await stream.close()
            raise
        return {Lane.DURABLE: durable, Lane.STREAM: stream}

    def _connector(self, synchronous: str) -> Callable[[], sqlite3.Connection]:
        def connect() -> sqlite3.Connection:
            self._make_parents()
            # isolation_level=None: we issue BEGIN IMMEDIATE/COMMIT ourselves.
            connection = sqlite3.connect(
                self._path, timeout=self._busy_timeout, isolation_level=None
            )
            try:
                mode = self._while_busy(
                    lambda: connection.execute(schema.SET_JOURNAL_MODE_WAL).fetchone()[0]
                )
                if str(mode).lower() != "wal":
                    raise StoreError(
                        f"SQLite store {self._name}: the file system refused WAL mode "
                        f"(journal mode is {mode!r}); use a local disk"
                    )
                connection.execute(synchronous)
                connection.create_function(
                    "tether_tombstone", 3, self._tombstone_of, deterministic=True
                )
            except BaseException:
                connection.close()
                raise
            return connection

        return connect

    def _while_busy(self, step: Callable[[], _T]) -> _T:
        """``step()``, tried again while SQLite answers SQLITE_BUSY, until the busy timeout.

        Switching to WAL can be refused at once, without the busy handler
        (which only waits for ordinary locks): for example while another
        process's last connection checkpoints and removes the WAL on close, or
        while it recovers the WAL index. Those last milliseconds, so opening
        waits as long as a write would, then fails as a write would.
        """
        deadline = time.monotonic() + self._busy_timeout
        pause = 0.001
        while True:
            try:
                return step()
            except sqlite3.OperationalError as exc:
                code = getattr(exc, "sqlite_errorcode", None)
                busy = code is not None and code & 0xFF == sqlite3.SQLITE_BUSY
                if not busy or time.monotonic() + pause > deadline:
                    raise
            time.sleep(pause)  # in the lane's own thread, never on the event loop
            pause = min(pause * 2, 0.05)

    def _make_parents(self) -> None:
        directory = self._path.parent
        missing: list[Path] = []
        current = directory
        while not current.exists():
            missing.append(current)
            current = current.parent
        try:
            for created in reversed(missing):
                created.mkdir(exist_ok=True)
                # A new directory entry is only durable once its parent is synced.
                _fsync_directory(created.parent)
        except OSError as exc:
            raise StoreError(
                f"SQLite store {self._name}: cannot create the directory {directory}: {exc}"
            ) from exc
        if not directory.is_dir():
            raise StoreError(f"SQLite store {self._name}: {directory} is not a directory")

    def _tombstone_of(self, tenant: object, user: object, session: object) -> str:
        # Called by SQLite with the ids as bound (BLOBs): anything else is a
        # bug in a query, and raising makes SQLite fail the statement.
        if not (
            isinstance(tenant, bytes) and isinstance(user, bytes) and isinstance(session, bytes)
        ):
            raise TypeError("tether_tombstone takes the three ids as BLOBs")
        return self._tombstones.of_bytes(tenant, user, session)

    def _prepare(self, connection: sqlite3.Connection) -> None:
        in_transaction(self._migrate)(connection)
        in_transaction(self._check_tombstone_key)(connection)
        # The file and its WAL are new directory entries: sync the directory
        # once, so a durable first write cannot lose the file that holds it.
        _fsync_directory(self._path.parent)

    def _migrate(self, connection: sqlite3.Connection) -> None:
        (version,) = connection.execute(schema.READ_USER_VERSION).fetchone()
        if version > schema.SCHEMA_VERSION:
            raise StoreError(
                f"SQLite store {self._name}: the schema is at version {version}, newer "
                f"than this tether's {schema.SCHEMA_VERSION}; upgrade tether"
            )
        for migration in schema.MIGRATIONS[version:]:
            for statement in migration:
                connection.execute(statement)
        if version < schema.SCHEMA_VERSION:
            connection.execute(schema.set_user_version(schema.SCHEMA_VERSION))

    def _check_tombstone_key(self, connection: sqlite3.Connection) -> None:
        """Record the key's check value on first use; refuse another key after."""
        row = connection.execute(schema.TOMBSTONE_KEY_READ).fetchone()
        try:
            self._tombstones.verify(
                None if row is None else str(row[0]), f"SQLite store {self._name}"
            )
        except TombstoneKeyError as error:
            raise StoreError(str(error)) from error
        if row is None:
            connection.execute(schema.TOMBSTONE_KEY_RECORD, {"check_value": self._tombstones.check})


def _durable_settings(connection: sqlite3.Connection) -> tuple[str, int, int]:
    (mode,) = connection.execute(schema.READ_JOURNAL_MODE).fetchone()
    (version,) = connection.execute(schema.READ_USER_VERSION).fetchone()
    return str(mode), int(version), _synchronous(connection)


def _synchronous(connection: sqlite3.Connection) -> int:
    (level,) = connection.execute(schema.READ_SYNCHRONOUS).fetchone()
    return int(level)


def _fsync_directory(directory: Path) -> None:
    try:
        descriptor = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return  # no directory handles on this platform (Windows): nothing to sync
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
