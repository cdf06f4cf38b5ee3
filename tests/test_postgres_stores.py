"""What only a real PostgreSQL server can show about the PostgreSQL stores.

The contract kit runs over PostgreSQL in ``test_contracts.py`` (one database for
all its tests). Every test here gets a fresh database (``postgres_url``).
Outages are staged with a TCP proxy in front of the server, never by stopping
the server itself.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any, ClassVar
from urllib.parse import quote, urlsplit

import pytest

from tests.support.services import DRIVERS_HOW, missing

try:
    import psycopg
    from psycopg.conninfo import conninfo_to_dict
    from psycopg_pool import AsyncConnectionPool
except ImportError as error:  # the postgres extra is not installed
    missing(f"the PostgreSQL driver is missing ({error}); {DRIVERS_HOW}")

import typer
from typer.testing import CliRunner

from tests.support.proxy import TcpProxy
from tether import stores
from tether.adapters.postgres import (
    LATEST_VERSION,
    MIGRATIONS,
    PostgresChatAgentStateStore,
    PostgresChatConversationStore,
    PostgresChatStreamRecordingStore,
    PostgresChatStreamSupervisionStore,
    PostgresDatabase,
    migrations,
    queries_conversation,
    queries_supervision,
    stores_from_url,
)
from tether.adapters.postgres._conninfo import with_libpq_defaults
from tether.adapters.postgres._keys import row_key, session_key
from tether.cli.db import db_app
from tether.domain.chat_message import ChatMessage, ChatMessageSender
from tether.domain.chat_stream_recording_store import RecordedStreamEvent
from tether.domain.chat_stream_supervision_store import (
    ChatStreamStatus,
    ChatStreamSupervision,
    SupervisionSwap,
)
from tether.domain.store_errors import StoreError, StoreUnavailableError
from tether.domain.tombstones import TombstoneKey

pytestmark = pytest.mark.postgres


def _supervision_store(url: str) -> PostgresChatStreamSupervisionStore:
    return PostgresChatStreamSupervisionStore(PostgresDatabase.from_url(url))


def _recording_store(url: str) -> PostgresChatStreamRecordingStore:
    return PostgresChatStreamRecordingStore(PostgresDatabase.from_url(url))


# Wiring and lifecycle --------------------------------------------------------------------

_T0 = datetime(2030, 1, 1, tzinfo=UTC)


def _row(
    epoch: int, message_id: str = "m-1", seconds: int = 0, producer: str | None = None
) -> ChatStreamSupervision:
    return ChatStreamSupervision(
        status=ChatStreamStatus.RUNNING,
        heartbeat_at=_T0.replace(second=seconds),
        message_id=message_id,
        epoch=epoch,
        producer=producer,
    )


def _event(epoch: int, content: str = "so far", message_id: str = "m-1") -> RecordedStreamEvent:
    message = ChatMessage(sender=ChatMessageSender.BOT, content=content)
    return RecordedStreamEvent(index=0, message=message, message_id=message_id, epoch=epoch)


async def test_a_url_gives_four_stores_on_one_database_opened_once(postgres_url: str) -> None:
    bundle = stores.from_url(postgres_url.replace("postgresql://", "postgres://", 1))
    four: list[Any] = [
        bundle.agent_state_store,
        bundle.chat_stream_recording_store,
        bundle.chat_stream_supervision_store,
        bundle.chat_conversation_store,
    ]
    assert [type(store) for store in four] == [
        PostgresChatAgentStateStore,
        PostgresChatStreamRecordingStore,
        PostgresChatStreamSupervisionStore,
        PostgresChatConversationStore,
    ]
    assert len({id(store.database) for store in four}) == 1
    for store in four:  # what setup_app does, twice over: opening is idempotent
        await store.open()
        await store.open()
    state = four[0]
    await four[1].aclose()
    await four[1].aclose()
    await state.save("t", "u", "s", {"dep": {"n": 1}})  # the others still hold it open
    for store in four:
        await store.aclose()
    with pytest.raises(StoreError, match="not open"):
        await state.load("t", "u", "s")


@pytest.mark.parametrize(
    "query", ["pool_max_size=0", "create_schema=maybe", "timeout=-1", "no_such_libpq_option=1"]
)
def test_bad_url_options_are_refused_up_front(query: str) -> None:
    with pytest.raises(stores.StoreURLError):
        stores_from_url(f"postgresql://tether:s3cret@127.0.0.1:1/db?{query}")


async def test_an_unreachable_server_fails_open_naming_the_url_without_password() -> None:
    bundle = stores_from_url("postgresql://tether:s3cret@127.0.0.1:1/postgres?timeout=3")
    store = bundle.chat_stream_supervision_store
    assert isinstance(store, PostgresChatStreamSupervisionStore)
    started = time.monotonic()
    with pytest.raises(StoreUnavailableError) as caught:
        await store.open()
    assert time.monotonic() - started < 3
    assert "postgresql://tether:***@127.0.0.1:1/postgres" in str(caught.value)
    assert "s3cret" not in str(caught.value)
    assert isinstance(caught.value.__cause__, psycopg.OperationalError)
    with pytest.raises(StoreError, match="not open"):
        await store.read("t", "u", "s")


def test_a_pool_without_autocommit_is_refused() -> None:
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool("", kwargs={}, open=False)
    with pytest.raises(ValueError, match="autocommit"):
        PostgresDatabase(pool)


async def test_ids_postgresql_cannot_hold_are_refused_before_any_write(postgres_url: str) -> None:
    async with _recording_store(postgres_url) as store:
        with pytest.raises(ValueError, match="NUL"):
            await store.put("t", "u", "nul\x00byte", _event(1))
        with pytest.raises(ValueError, match="Unicode"):
            await store.put("t", "\udc80", "s", _event(1))
        # jsonb cannot hold \u0000 either: refused as a store error, nothing written.
        with pytest.raises(StoreError) as caught:
            await store.put("t", "u", "s", _event(1, content="a\x00b"))
        assert isinstance(caught.value.__cause__, psycopg.DataError)
        assert await store.read("t", "u", "s") is None


# Atomicity -------------------------------------------------------------------------------


async def test_two_databases_racing_compare_and_swap_have_one_winner_per_epoch(
    postgres_url: str,
) -> None:
    async with _supervision_store(postgres_url) as one, _supervision_store(postgres_url) as two:
        for epoch in range(1, 21):
            expected = None if epoch == 1 else epoch - 1
            won = await asyncio.gather(
                *(
                    store.compare_and_swap("t", "u", "s", expected, _row(epoch, f"{name}:{epoch}"))
                    for store, name in [(one, "one"), (two, "two"), (one, "one"), (two, "two")]
                )
            )
            assert won.count(True) == 1, (epoch, won)
        final = await two.read("t", "u", "s")
        assert final is not None and final.epoch == 20


def _conversation_store(url: str) -> PostgresChatConversationStore:
    return PostgresChatConversationStore(PostgresDatabase.from_url(url))


def _numbered(turn: int, number: int) -> ChatMessage:
    return ChatMessage(
        sender=ChatMessageSender.USER if number == 0 else ChatMessageSender.BOT,
        content=f"{turn}.{number}",
        message_id=f"m-{turn}-{number}",
    )


async def test_rollbacks_racing_appends_from_another_database_keep_positions_dense(
    postgres_url: str,
) -> None:
    """``remove_fenced`` moves the later messages down under the row lock: the
    positions stay 0 .. message_count - 1 (appends start at ``message_count``),
    whichever of a rollback and a higher turn's append, on two pools, lands first."""
    async with (
        _conversation_store(postgres_url) as one,
        _conversation_store(postgres_url) as two,
        await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as admin,
    ):
        for turn in range(1, 4):
            batch = [_numbered(turn, number) for number in range(3)]
            assert await one.append_fenced("t", "u", "s", "agent", batch, epoch=turn)
        expected = [f"{turn}.{number}" for turn in range(1, 4) for number in range(3)]
        for epoch in range(4, 14, 2):
            # A rollback of a message from the middle at ``epoch`` against the next
            # turn's message at ``epoch + 1``: both orders are right, nothing else.
            victim = expected[len(expected) // 2]
            removed, appended = await asyncio.gather(
                one.remove_fenced("t", "u", "s", [f"m-{victim.replace('.', '-')}"], epoch=epoch),
                two.append_fenced("t", "u", "s", "agent", [_numbered(epoch, 0)], epoch=epoch + 1),
            )
            assert appended
            expected.append(f"{epoch}.0")
            if removed:
                expected.remove(victim)
            transcript = await two.get_transcript("t", "u", "s")
            assert [message.content for message in transcript] == expected
            cursor = await admin.execute(
                "SELECT position FROM tether_conversation_messages"
                " WHERE conversation_key = %s ORDER BY position",
                (row_key("t", "s"),),
            )
            assert [row[0] for row in await cursor.fetchall()] == list(range(len(expected)))
            summary = await one.get_conversation("t", "u", "s")
            assert summary is not None and summary.message_count == len(expected)


async def test_a_session_stopped_inside_a_transaction_lets_go_of_its_row_after_the_timeout(
    postgres_url: str,
) -> None:
    """A replica stopped (SIGSTOP, a frozen VM) inside a transcript append holds
    the conversation's row lock in an open transaction; every fence of that
    conversation, so every takeover of its turn, waits on it. tether's sessions
    ask the server to end one idle in a transaction for longer than a store
    call may take (``timeout``): then the lock goes, and the fence goes through.
    Before, every try failed until the stopped replica came back."""
    url = f"{postgres_url}?timeout=1"
    async with _conversation_store(url) as store:
        await store.append_fenced("t", "u", "s", "agent", [_numbered(1, 0)], epoch=1)
        # The stopped replica: one of tether's own sessions, inside an append's
        # transaction, holding the row, and then doing nothing.
        async with await store.database.connect_directly() as stopped:
            await stopped.execute("BEGIN")
            await stopped.execute(
                queries_conversation.LOCK_CONVERSATION, {"key": row_key("t", "s")}
            )
            failures = 0
            async with asyncio.timeout(10):
                while True:
                    try:
                        await store.fence("t", "u", "s", 2)  # a takeover's fence, tried again
                        break
                    except StoreUnavailableError:
                        failures += 1  # waited out the call's 1 s on the lock: try again
            assert failures <= 2, "the lock went with the stopped session, about 1 s in"
            with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):
                await stopped.execute("SELECT 1")  # the server ended that session
        assert not await store.append_fenced("t", "u", "s", "agent", [_numbered(1, 1)], epoch=1)


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (None, "-c idle_in_transaction_session_timeout=1500"),
        ("-c search_path=app", "-c search_path=app -c idle_in_transaction_session_timeout=1500"),
        (
            "-c idle_in_transaction_session_timeout=0",
            "-c idle_in_transaction_session_timeout=0",
        ),
    ],
)
def test_the_idle_in_transaction_bound_keeps_the_urls_own_options(
    options: str | None, expected: str
) -> None:
    url = "postgresql://tether@db/tether"
    if options is not None:
        url += f"?options={quote(options)}"
    given = conninfo_to_dict(with_libpq_defaults(url, idle_in_transaction=1.5))
    assert given["options"] == expected


class _CountingCursor(psycopg.AsyncCursor[Any]):
    """Records every statement sent: the test's view of round trips, nothing private."""

    sent: ClassVar[list[str]] = []

    async def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        type(self).sent.append(str(query))
        return await super().execute(query, params, **kwargs)


async def test_compare_and_swap_many_is_one_statement_guarding_each_row(
    postgres_url: str,
) -> None:
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        postgres_url,
        kwargs={"autocommit": True, "cursor_factory": _CountingCursor},
        min_size=1,
        open=False,
    )
    try:
        async with PostgresChatStreamSupervisionStore(PostgresDatabase(pool)) as store:
            for session, epoch in [("a", 1), ("b", 2), ("e", 4), ("f", 4)]:
                await store.compare_and_swap("t", "u", session, None, _row(epoch))
            swaps = [
                SupervisionSwap("t", "u", "a", 1, _row(1, seconds=1)),  # heartbeat: right epoch
                SupervisionSwap("t", "u", "b", 1, _row(2, "m-x")),  # wrong epoch
                SupervisionSwap("t", "u", "c", None, _row(1, "m-c")),  # claim, no row: wins
                SupervisionSwap("t", "u", "d", 3, _row(4)),  # expects a row that is not there
                SupervisionSwap("t", "u", "e", None, _row(9)),  # claim over a row: refused
                SupervisionSwap("t", "u", "f", 4, _row(5, "m-5")),  # takeover: wins
            ]
            _CountingCursor.sent.clear()
            results = await store.compare_and_swap_many(swaps)
            writes = [sql for sql in _CountingCursor.sent if "tether_stream_supervision" in sql]
            assert results == [True, False, True, False, False, True]
            assert len(writes) == 1
            assert await store.read("t", "u", "a") == _row(1, seconds=1)
            assert await store.read("t", "u", "b") == _row(2)
            assert await store.read("t", "u", "c") == _row(1, "m-c")
            assert await store.read("t", "u", "d") is None
            assert await store.read("t", "u", "e") == _row(4)
            assert await store.read("t", "u", "f") == _row(5, "m-5")
            # The same conversation twice: applied in order, one statement per round.
            _CountingCursor.sent.clear()
            repeated = [
                SupervisionSwap("t", "u", "a", 1, _row(2, "m-2")),
                SupervisionSwap("t", "u", "a", 2, _row(3, "m-3")),
                SupervisionSwap("t", "u", "a", 2, _row(4, "m-4")),
            ]
            assert await store.compare_and_swap_many(repeated) == [True, True, False]
            assert await store.read("t", "u", "a") == _row(3, "m-3")
            assert await store.compare_and_swap_many([]) == []
    finally:
        await pool.close()


async def test_the_producer_is_kept_by_every_write_and_read(postgres_url: str) -> None:
    async with _supervision_store(postgres_url) as store:
        assert await store.compare_and_swap("t", "u", "a", None, _row(1, producer="replica-a"))
        assert await store.compare_and_swap("t", "u", "b", None, _row(1))  # no producer known
        beat = _row(1, seconds=1, producer="replica-a")
        assert await store.compare_and_swap("t", "u", "a", 1, beat)
        assert await store.read("t", "u", "a") == beat
        assert await store.read("t", "u", "b") == _row(1)
        # One batch of each kind of swap: a heartbeat, a takeover naming its own
        # producer, and claims with and without one.
        batch = [
            SupervisionSwap("t", "u", "a", 1, _row(1, seconds=2, producer="replica-a")),
            SupervisionSwap("t", "u", "b", 1, _row(2, seconds=3, producer="replica-b")),
            SupervisionSwap("t", "u", "c", None, _row(1, seconds=4, producer="replica-c")),
            SupervisionSwap("t", "u", "d", None, _row(1, seconds=5)),
        ]
        assert await store.compare_and_swap_many(batch) == [True] * 4
        # Then the hot path: heartbeats only, one autocommit statement.
        beats = [
            SupervisionSwap(
                "t",
                "u",
                swap.session_id,
                swap.supervision.epoch,
                swap.supervision.model_copy(update={"heartbeat_at": _T0.replace(second=10 + n)}),
            )
            for n, swap in enumerate(batch)
        ]
        assert await store.compare_and_swap_many(beats) == [True] * 4
        for swap in beats:
            assert await store.read("t", "u", swap.session_id) == swap.supervision
        listed = await store.list_stale_running(_T0.replace(second=59), limit=10)
        assert [(t.session_id, t.supervision) for t in listed] == [
            (swap.session_id, swap.supervision) for swap in beats
        ]
        assert [t.supervision.producer for t in listed] == [
            "replica-a",
            "replica-b",
            "replica-c",
            None,
        ]
        # A producer no text column can hold is refused before any write.
        with pytest.raises(ValueError, match="NUL"):
            await store.compare_and_swap("t", "u", "e", None, _row(1, producer="nul\x00"))
        with pytest.raises(ValueError, match="NUL"):
            await store.compare_and_swap_many(
                [SupervisionSwap("t", "u", "e", None, _row(1, producer="nul\x00"))]
            )
        assert await store.read("t", "u", "e") is None


# Push ------------------------------------------------------------------------------------


async def _waiting(store: PostgresChatStreamRecordingStore, session: str, max_wait: float) -> Any:
    waiter = asyncio.ensure_future(store.wait_for_change("t", "u", session, max_wait))
    await asyncio.sleep(0.05)  # let it register before anything is written
    return waiter


async def test_wait_for_change_wakes_promptly_on_writes_from_another_database(
    postgres_url: str,
) -> None:
    async with (
        _recording_store(postgres_url) as follower,
        _recording_store(postgres_url) as producer,
        _supervision_store(postgres_url) as supervisor,
    ):
        await follower.database.listen()
        writes = [
            lambda: producer.put("t", "u", "s", _event(1)),
            lambda: supervisor.compare_and_swap("t", "u", "s", None, _row(1)),
            # A takeover (a new epoch); heartbeats are not announced (test_push_channels.py).
            lambda: supervisor.compare_and_swap("t", "u", "s", 1, _row(2, seconds=1)),
            lambda: producer.delete("t", "u", "s", "m-1"),
        ]
        for write in writes:
            waiters = [await _waiting(follower, "s", 5.0) for _ in range(3)]
            started = time.monotonic()
            await write()
            assert await asyncio.gather(*waiters) == [True, True, True]
            assert time.monotonic() - started < 0.5
        async with await psycopg.AsyncConnection.connect(postgres_url) as admin:
            cursor = await admin.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND query LIKE 'LISTEN%'"
            )
            assert await cursor.fetchone() == (1,)  # one shared LISTEN connection


async def test_wait_for_change_is_false_after_max_wait_without_a_change(
    postgres_url: str,
) -> None:
    async with _recording_store(postgres_url) as follower, _recording_store(postgres_url) as other:
        await follower.database.listen()
        waiter = await _waiting(follower, "quiet", 0.4)
        started = time.monotonic()
        await other.put("t", "u", "busy", _event(1))  # another conversation's change
        assert await waiter is False
        assert 0.3 <= time.monotonic() - started < 1.0


# Schema ----------------------------------------------------------------------------------


async def test_upgrade_is_idempotent_and_records_the_schema_version(postgres_url: str) -> None:
    database = PostgresDatabase.from_url(f"{postgres_url}?create_schema=false")
    assert await database.schema_version() == 0
    assert await database.upgrade() == [migration.version for migration in MIGRATIONS]
    assert await database.upgrade() == []
    assert await database.schema_version() == LATEST_VERSION
    async with await psycopg.AsyncConnection.connect(postgres_url) as admin:
        cursor = await admin.execute(
            "SELECT version, description FROM tether_schema_version ORDER BY version"
        )
        recorded = await cursor.fetchall()
    assert recorded == [(m.version, m.description) for m in MIGRATIONS]


async def test_concurrent_upgrades_apply_each_migration_once(postgres_url: str) -> None:
    databases = [PostgresDatabase.from_url(postgres_url) for _ in range(4)]
    applied = await asyncio.gather(*(database.upgrade() for database in databases))
    assert sorted(version for versions in applied for version in versions) == [
        migration.version for migration in MIGRATIONS
    ]
    # Opening with create_schema (the default) upgrades too; all at once is safe.
    opened = [_supervision_store(postgres_url) for _ in range(4)]
    await asyncio.gather(*(store.open() for store in opened))
    for store in opened:
        await store.aclose()


async def test_without_create_schema_open_refuses_an_old_schema(postgres_url: str) -> None:
    store = _supervision_store(f"{postgres_url}?create_schema=false")
    with pytest.raises(StoreError, match="tether db upgrade"):
        await store.open()
    await PostgresDatabase.from_url(postgres_url).upgrade()
    async with store:
        assert await store.read("t", "u", "s") is None


async def test_an_existing_database_is_upgraded_to_list_dead_turns_by_their_index(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A database at version 3, with a turn already running in it.
    with monkeypatch.context() as patched:
        patched.setattr(migrations, "MIGRATIONS", MIGRATIONS[:3])
        assert await PostgresDatabase.from_url(postgres_url).upgrade() == [1, 2, 3]
    async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as admin:
        await admin.execute(
            "INSERT INTO tether_stream_supervision "
            "(key, tenant, requester_uuid, session_id, status, heartbeat_at, message_id, epoch) "
            "VALUES (%s, 't', '', 's', 'running', %s, 'm-old', 1)",
            (session_key("t", None, "s"), _T0),
        )
    assert await PostgresDatabase.from_url(postgres_url).upgrade() == [
        migration.version for migration in MIGRATIONS[3:]
    ]
    awkward = ["../../x", "a/b", "会話", "x" * 2_000, "Session"]
    async with _supervision_store(f"{postgres_url}?create_schema=false") as store:
        for number, value in enumerate(awkward, start=1):
            row = _row(1, f"m-{number}", seconds=number)
            assert await store.compare_and_swap(value, value, value, None, row)
        listed = await store.list_stale_running(_T0.replace(second=59), limit=100)
        assert [(t.tenant, t.requester_uuid, t.session_id) for t in listed] == [
            ("t", None, "s"),
            *[(value, value, value) for value in awkward],
        ]
        assert [t.supervision.message_id for t in listed] == [
            "m-old",
            *[f"m-{n}" for n in range(1, len(awkward) + 1)],
        ]
        assert await store.list_stale_running(_T0.replace(second=2), limit=100) == listed[:2]
        assert await store.list_stale_running(_T0.replace(second=59), limit=0) == []
    async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as admin:
        await admin.execute("SET enable_seqscan = off")  # a tiny table: ask for the index
        cursor = await admin.execute(
            "EXPLAIN " + queries_supervision.LIST_STALE_SUPERVISION,
            {"heartbeat_before": _T0, "limit": 10},
        )
        plan = "\n".join(row[0] for row in await cursor.fetchall())
    assert "tether_stream_supervision_running_by_heartbeat" in plan, plan
    assert "Sort" not in plan, plan


async def test_an_existing_database_is_upgraded_to_name_each_turns_producer(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A database at version 4, with a turn its release wrote running in it.
    with monkeypatch.context() as patched:
        patched.setattr(migrations, "MIGRATIONS", MIGRATIONS[:4])
        assert await PostgresDatabase.from_url(postgres_url).upgrade() == [1, 2, 3, 4]
    async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as admin:
        await admin.execute(
            "INSERT INTO tether_stream_supervision "
            "(key, tenant, requester_uuid, session_id, status, heartbeat_at, message_id, epoch) "
            "VALUES (%s, 't', 'u', 's', 'running', %s, 'm-1', 1)",
            (session_key("t", "u", "s"), _T0),
        )
    assert await PostgresDatabase.from_url(postgres_url).upgrade() == [
        migration.version for migration in MIGRATIONS[4:]
    ]
    async with _supervision_store(f"{postgres_url}?create_schema=false") as store:
        assert await store.read("t", "u", "s") == _row(1)
        (listed,) = await store.list_stale_running(_T0.replace(second=59), limit=10)
        assert listed.supervision == _row(1)
        named = _row(1, seconds=1, producer="replica-a")
        assert await store.compare_and_swap("t", "u", "s", 1, named)
        assert await store.read("t", "u", "s") == named


async def test_an_existing_database_keeps_its_epochs_and_fences_under_tombstones(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before version 6 the numbers kept for ever per conversation were keyed by
    the SHA-256 of its ids and held the ids too. The upgrade re-keys every row
    of a conversation by its tombstone (a keyed hash) and drops the ids from
    those numbers, keeping each one."""
    with monkeypatch.context() as patched:
        patched.setattr(migrations, "MIGRATIONS", MIGRATIONS[:5])
        assert await PostgresDatabase.from_url(postgres_url).upgrade() == [1, 2, 3, 4, 5]
    old = row_key("t", "u", "erased")
    async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as admin:
        for table, requester, epoch in (
            ("tether_stream_supervision_epoch", "requester_uuid", 7),
            ("tether_stream_recording_fence", "requester_uuid", 6),
            ("tether_agent_state_fence", "user_uuid", 5),
        ):
            await admin.execute(
                f"INSERT INTO {table} (key, tenant, {requester}, session_id, epoch) "
                "VALUES (%s, 't', 'u', 'erased', %s)",
                (old, epoch),
            )
    assert await PostgresDatabase.from_url(postgres_url).upgrade() == [6]
    async with _supervision_store(f"{postgres_url}?create_schema=false") as store:
        assert await store.last_epoch("t", "u", "erased") == 7
        assert not await store.compare_and_swap("t", "u", "erased", None, _row(7))
    async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as admin:
        for table in (
            "tether_stream_supervision_epoch",
            "tether_stream_recording_fence",
            "tether_agent_state_fence",
        ):
            cursor = await admin.execute(f"SELECT * FROM {table}")
            assert [column.name for column in cursor.description or []] == ["key", "epoch"]
            keys = [row[0] for row in await cursor.fetchall()]
            assert keys == [session_key("t", "u", "erased")] and old not in keys


async def test_a_database_keyed_with_another_tombstone_key_is_refused(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await PostgresDatabase.from_url(postgres_url).upgrade()
    another = TombstoneKey(b"another secret key, not this one")
    monkeypatch.setattr(migrations, "tombstones", lambda: another)
    with pytest.raises(StoreError, match="TETHER_TOMBSTONE_KEY"):
        await PostgresDatabase.from_url(postgres_url).upgrade()
    with pytest.raises(StoreError, match="TETHER_TOMBSTONE_KEY"):
        async with _supervision_store(f"{postgres_url}?create_schema=false"):
            pass


def _cli() -> typer.Typer:
    app = typer.Typer()  # mounted the way tether.cli.main mounts it
    app.add_typer(db_app, name="db")
    return app


def test_tether_db_upgrade_creates_the_schema_then_has_nothing_to_do(postgres_url: str) -> None:
    first = CliRunner().invoke(_cli(), ["db", "upgrade", "--store", postgres_url])
    assert first.exit_code == 0, first.output
    assert f"schema at version {LATEST_VERSION}" in first.output
    again = CliRunner().invoke(_cli(), ["db", "upgrade", "--store", postgres_url])
    assert again.exit_code == 0, again.output
    assert "nothing to do" in again.output


def test_tether_db_upgrade_reports_an_unreachable_server_without_password() -> None:
    url = "postgresql://tether:s3cret@127.0.0.1:1/postgres"
    result = CliRunner().invoke(_cli(), ["db", "upgrade", "--store", url])
    assert result.exit_code == 1
    assert "tether:***@127.0.0.1:1" in result.output and "s3cret" not in result.output
    other = CliRunner().invoke(_cli(), ["db", "upgrade", "--store", "file://.tether"])
    assert other.exit_code == 2


# Outages ---------------------------------------------------------------------------------


def _through(proxy: TcpProxy, url: str, options: str) -> str:
    return proxy.url_for(url) + options


async def _eventually(check: Any, within: float) -> None:
    deadline = time.monotonic() + within
    while True:
        try:
            await check()
            return
        except StoreUnavailableError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def test_an_outage_fails_calls_promptly_and_the_stores_recover_by_themselves(
    postgres_url: str,
) -> None:
    server = urlsplit(postgres_url)
    if server.hostname is None or f"{server.hostname}:{server.port}" not in postgres_url:
        missing(f"the proxy test needs the server's host:port in its URL ({postgres_url})")
    proxy = TcpProxy(server.hostname, server.port)
    proxy.start()
    url = _through(proxy, postgres_url, "?timeout=1&connect_timeout=2")
    try:
        async with _recording_store(url) as store, _recording_store(postgres_url) as direct:
            await store.put("t", "u", "s", _event(1))
            await store.database.listen()
            proxy.cut()
            started = time.monotonic()
            with pytest.raises(StoreUnavailableError):
                await store.read("t", "u", "s")
            assert time.monotonic() - started < 2.5
            # With the LISTEN connection gone, waiting degrades to sleeping it out.
            started = time.monotonic()
            assert await store.wait_for_change("t", "u", "s", 0.3) is False
            assert time.monotonic() - started < 1.0
            proxy.start()  # the server is back, on the same address
            await _eventually(lambda: store.read("t", "u", "s"), within=15)
            await _eventually(store.database.listen, within=15)
            waiter = await _waiting(store, "s", 5.0)
            await direct.put("t", "u", "s", _event(2))
            assert await waiter is True
            # A stalled network (no reset, no answer) is bounded by the timeout too.
            proxy.stalled = True
            started = time.monotonic()
            with pytest.raises(StoreUnavailableError):
                await store.read("t", "u", "s")
            assert time.monotonic() - started < 2.0
            proxy.cut()
    finally:
        proxy.close()
