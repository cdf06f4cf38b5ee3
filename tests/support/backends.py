"""Every shipped backend's stores, for suites that run once per backend.

``BACKENDS`` are pytest params with readable ids (``memory``, ``file``,
``sqlite``, ``postgres``, ``redis``) and the marks their servers need; each
value is a :class:`Backend`, which knows where one test's stores live and what
sets the backend apart (the ids it refuses, whether it has a conversation
store, whether other processes see its rows). Tests never branch on the
backend: whatever differs is an attribute or a method here.

``open_bundle`` opens the stores of one bundle (Redis has no conversation
store) and closes them afterwards.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.support.services import postgres_database, redis_prefix
from tether import stores
from tether.domain.chat_conversation_store import ChatConversationStore
from tether.runtime.turn_stores import TurnStores
from tether.stores import StoreBundle
from tether.testing.contracts import TRICKY_IDS, StoreFactory

Clock = Callable[[], datetime]

POSTGRES_TRICKY_IDS = tuple(value for value in TRICKY_IDS if "\x00" not in value)
"""PostgreSQL text cannot hold NUL; such ids are refused up front (a test of
test_postgres_stores.py shows it), so the contract kit leaves them out there."""


class Backend:
    """One shipped backend, as the per-backend suites need it."""

    name: ClassVar[str]
    tricky_ids: ClassVar[tuple[str, ...]] = TRICKY_IDS
    """The awkward ids the contract kit checks this backend with."""
    has_conversations: ClassVar[bool] = True
    """Whether the backend serves a conversation store."""
    shared_by_processes: ClassVar[bool] = True
    """Whether other processes see its rows (not so in memory)."""
    has_server_time: ClassVar[bool] = False
    """Whether its supervision store reads its own clock (``server_time``)."""

    def shared(self) -> AbstractContextManager[str | None]:
        """What all the tests of a module may share (a database); default: nothing."""
        return contextlib.nullcontext()

    def url(self, shared: str | None, tmp_path: Path) -> AbstractContextManager[str]:
        """The store URL of one test, given what :meth:`shared` gave."""
        raise NotImplementedError

    def conversation_store(
        self, bundle: StoreBundle, url: str, clock: Clock
    ) -> ChatConversationStore | None:
        """The bundle's conversation store, but stamping times with ``clock``."""
        return None

    def stored_text(self, stores: TurnStores, url: str) -> str:
        """Everything the backend holds (names, keys and values), as text, so a
        test can look for ids in it; bytes are decoded as UTF-8 where they can be."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<backend {self.name}>"


def _text(value: object) -> str:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


class _Memory(Backend):
    name = "memory"
    shared_by_processes = False

    @contextlib.contextmanager
    def url(self, shared: str | None, tmp_path: Path) -> Iterator[str]:
        yield "memory://"

    def conversation_store(
        self, bundle: StoreBundle, url: str, clock: Clock
    ) -> ChatConversationStore:
        from tether.adapters.memory import InMemoryChatConversationStore

        return InMemoryChatConversationStore(clock=clock)

    def stored_text(self, stores: TurnStores, url: str) -> str:
        # The stores' own attributes are all they hold.
        held = (stores.agent_state, stores.recording, stores.supervision, stores.conversation)
        return repr([vars(store) for store in held if store is not None])


class _File(Backend):
    name = "file"

    @contextlib.contextmanager
    def url(self, shared: str | None, tmp_path: Path) -> Iterator[str]:
        yield f"file://{tmp_path / 'stores'}"

    def conversation_store(
        self, bundle: StoreBundle, url: str, clock: Clock
    ) -> ChatConversationStore:
        from tether.adapters.file import LocalFileChatConversationStore

        # Where ``tether.stores.from_url`` puts the conversations of ``url``.
        return LocalFileChatConversationStore(Path(urlsplit(url).path) / "conversations", clock)

    def stored_text(self, stores: TurnStores, url: str) -> str:
        root = Path(urlsplit(url).path)
        return "\n".join(
            f"{path.relative_to(root)}\n{_text(path.read_bytes()) if path.is_file() else ''}"
            for path in sorted(root.rglob("*"))
        )


class _Database(Backend):
    """SQLite and PostgreSQL: the conversation store is built over a database."""

    def conversation_store(
        self, bundle: StoreBundle, url: str, clock: Clock
    ) -> ChatConversationStore:
        store: Any = bundle.chat_conversation_store
        clocked: ChatConversationStore = type(store)(store.database, clock=clock)
        return clocked


class _SQLite(_Database):
    name = "sqlite"

    @contextlib.contextmanager
    def url(self, shared: str | None, tmp_path: Path) -> Iterator[str]:
        yield f"sqlite:///{tmp_path / 'stores.db'}"

    def stored_text(self, stores: TurnStores, url: str) -> str:
        import sqlite3

        connection = sqlite3.connect(url.removeprefix("sqlite:///"))
        try:
            tables = [
                name
                for (name,) in connection.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'table'"
                )
            ]
            return "\n".join(
                f"{table}: " + " ".join(_text(value) for value in row)
                for table in tables
                for row in connection.execute(f'SELECT * FROM "{table}"')
            )
        finally:
            connection.close()


class _Postgres(_Database):
    name = "postgres"
    tricky_ids = POSTGRES_TRICKY_IDS
    has_server_time = True

    def shared(self) -> AbstractContextManager[str | None]:
        return postgres_database()  # one database serves all the tests of a module

    @contextlib.contextmanager
    def url(self, shared: str | None, tmp_path: Path) -> Iterator[str]:
        assert shared is not None
        yield shared

    def stored_text(self, stores: TurnStores, url: str) -> str:
        import psycopg

        with psycopg.connect(url) as connection:
            tables = [
                name
                for (name,) in connection.execute(
                    "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
                )
            ]
            return "\n".join(
                f"{table}: {row[0]}"
                for table in tables
                for row in connection.execute(f'SELECT t::text FROM "{table}" t')
            )


class _Redis(Backend):
    name = "redis"
    has_conversations = False
    has_server_time = True

    @contextlib.contextmanager
    def url(self, shared: str | None, tmp_path: Path) -> Iterator[str]:
        with redis_prefix() as url:  # a key prefix is cheap: one per test
            yield url

    def stored_text(self, stores: TurnStores, url: str) -> str:
        import redis

        prefix = parse_qs(urlsplit(url).query)["prefix"][0]
        client = redis.Redis.from_url(url.split("?")[0])
        try:
            lines = []
            for key in client.scan_iter(match=f"{prefix}*", count=500):
                kind = _text(client.type(key))
                value: object = None
                if kind == "string":
                    value = client.get(key)
                elif kind == "hash":
                    value = client.hgetall(key)
                elif kind in ("zset", "list"):
                    value = (
                        client.zrange(key, 0, -1) if kind == "zset" else client.lrange(key, 0, -1)
                    )
                elif kind == "set":
                    value = client.smembers(key)
                lines.append(f"{_text(key)} {_text(value)}")
            return "\n".join(lines)
        finally:
            client.close()


def _param(backend: Backend, *marks: pytest.MarkDecorator) -> Any:
    return pytest.param(backend, id=backend.name, marks=marks)


BACKENDS = [
    _param(_Memory()),
    _param(_File()),
    _param(_SQLite()),
    _param(_Postgres(), pytest.mark.postgres),
    _param(_Redis(), pytest.mark.redis),
]
"""Every backend that ships with tether."""

CONVERSATION_BACKENDS = [param for param in BACKENDS if param.values[0].has_conversations]
"""The backends with a conversation store (Redis has none)."""

CROSS_PROCESS_BACKENDS = [param for param in BACKENDS if param.values[0].shared_by_processes]
"""The backends whose rows several processes share (all but memory)."""

SERVER_TIME_BACKENDS = [param for param in BACKENDS if param.values[0].has_server_time]
"""The backends with a clock of their own (PostgreSQL, Redis); the others are
on one host and replicas keep the local clock."""


class SharedPlaces:
    """What each backend's tests of one module share, set up on first use.

    Only PostgreSQL shares anything (one database: creating one is most of a
    contract test's time, and the kit gives every test fresh ids). A failure to
    set up (no server: a skip, or with ``TETHER_REQUIRE_SERVICES=1`` a failure)
    is remembered and repeated for that backend's later tests.
    """

    def __init__(self, stack: contextlib.ExitStack) -> None:
        self._stack = stack
        self._places: dict[str, str | None] = {}
        self._failures: dict[str, BaseException] = {}

    def of(self, backend: Backend) -> str | None:
        if backend.name in self._failures:
            raise self._failures[backend.name]
        if backend.name not in self._places:
            try:
                self._places[backend.name] = self._stack.enter_context(backend.shared())
            except BaseException as error:
                self._failures[backend.name] = error
                raise
        return self._places[backend.name]


@contextlib.contextmanager
def shared_places() -> Iterator[SharedPlaces]:
    """A :class:`SharedPlaces`; everything it set up is torn down on exit."""
    with contextlib.ExitStack() as stack:
        yield SharedPlaces(stack)


def bundle_of(backend: Backend, url: str, clock: Clock) -> StoreBundle:
    """The stores of ``url``, the conversation store stamping times with ``clock``."""
    bundle = stores.from_url(url)
    if bundle.chat_conversation_store is None:
        return bundle
    return replace(bundle, chat_conversation_store=backend.conversation_store(bundle, url, clock))


@contextlib.asynccontextmanager
async def open_bundle(bundle: StoreBundle) -> AsyncIterator[StoreBundle]:
    """``bundle``, its stores opened; closed on exit (as ``setup_app`` does:
    also a store that has nothing to open but something to close)."""
    opened: list[Any] = []
    try:
        for store in bundle.setup_kwargs().values():
            if store is not None and hasattr(store, "open"):
                await store.open()
            if store is not None and hasattr(store, "aclose"):
                opened.append(store)
        yield bundle
    finally:
        for store in reversed(opened):
            await store.aclose()


# Picklable store factories: top level, so a spawned child process can import
# them and build its own store (and connections) from the URL.


def supervision_store(url: str) -> Any:
    """The supervision store of ``url``, unopened."""
    return stores.from_url(url).chat_stream_supervision_store


def recording_store(url: str) -> Any:
    """The recording store of ``url``, unopened."""
    return stores.from_url(url).chat_stream_recording_store


def supervision_store_factory(url: str) -> StoreFactory:
    """A picklable factory of fresh supervision stores on ``url``."""
    return functools.partial(supervision_store, url)


def recording_store_factory(url: str) -> StoreFactory:
    """A picklable factory of fresh recording stores on ``url``."""
    return functools.partial(recording_store, url)
