"""SQLite-only guarantees; the contract kit runs over SQLite in ``test_contracts.py``."""

from __future__ import annotations

import asyncio
import multiprocessing
import sqlite3
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import closing, contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tether import stores
from tether.adapters.sqlite import (
    Lane,
    SQLiteChatAgentStateStore,
    SQLiteChatConversationStore,
    SQLiteChatStreamRecordingStore,
    SQLiteChatStreamSupervisionStore,
    SQLiteDatabase,
    queries,
    schema,
    stores_from_url,
)
from tether.domain.chat_message import ChatMessage, ChatMessageSender
from tether.domain.chat_stream_recording_store import RecordedStreamEvent, RecordingFencedError
from tether.domain.chat_stream_supervision_store import (
    ChatStreamStatus,
    ChatStreamSupervision,
    SupervisionSwap,
)
from tether.domain.store_errors import StoreCorruptedError, StoreError, StoreUnavailableError
from tether.domain.tombstones import TombstoneKey
from tether.stores import StoreURLError
from tether.testing.contracts import TRICKY_IDS, ManualClock


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    """The database file of one test."""
    return tmp_path / "sqlite.db"


@pytest.fixture
async def database(db_path: Path) -> AsyncIterator[SQLiteDatabase]:
    async with SQLiteDatabase(db_path) as opened:
        yield opened


# SQLite-only guarantees ---------------------------------------------------------------

_ROW = ChatStreamSupervision(
    status=ChatStreamStatus.RUNNING,
    heartbeat_at=ManualClock()(),
    message_id="m-1",
    epoch=1,
)
_EVENT = RecordedStreamEvent(
    index=0,
    message=ChatMessage(sender=ChatMessageSender.BOT, content="so far"),
    message_id="m-1",
    epoch=1,
)
_USER = ChatMessage(sender=ChatMessageSender.USER, content="hello")


class _Stores:
    """All four stores over one database."""

    def __init__(self, database: SQLiteDatabase) -> None:
        self.state = SQLiteChatAgentStateStore(database)
        self.supervision = SQLiteChatStreamSupervisionStore(database)
        self.recording = SQLiteChatStreamRecordingStore(database)
        self.conversations = SQLiteChatConversationStore(database, clock=ManualClock())

    async def write_everything(self, tenant: str, user: str, session: str) -> None:
        await self.state.save(tenant, user, session, {"dep": {"n": 1}})
        await self.supervision.compare_and_swap(tenant, user, session, None, _ROW)
        await self.recording.put(tenant, user, session, _EVENT)
        await self.conversations.append_messages(tenant, user, session, "agent", [_USER])


@contextmanager
def _raw(path: Path) -> Iterator[sqlite3.Connection]:
    """A plain connection to the file, as an operator (or another program) would open it."""
    with closing(sqlite3.connect(path, isolation_level=None)) as connection:
        yield connection


def _sqlite_threads() -> list[str]:
    return [thread.name for thread in threading.enumerate() if "tether-sqlite" in thread.name]


async def test_the_file_is_in_wal_mode_at_the_current_schema_version(
    database: SQLiteDatabase, db_path: Path
) -> None:
    with _raw(db_path) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert raw.execute("PRAGMA user_version").fetchone() == (len(schema.MIGRATIONS),)
        tables = {name for (name,) in raw.execute("SELECT name FROM sqlite_schema")}
    assert {"agent_state", "stream_supervision", "stream_recording", "conversation"} <= tables
    diagnostics = await database.diagnostics()
    assert diagnostics.journal_mode == "wal"
    assert diagnostics.schema_version == schema.SCHEMA_VERSION == len(schema.MIGRATIONS)


async def test_reopening_keeps_the_data_and_applies_no_migration_twice(db_path: Path) -> None:
    async with SQLiteDatabase(db_path) as first:
        await SQLiteChatAgentStateStore(first).save("t", "u", "s", {"dep": {"n": 1}})
    async with SQLiteDatabase(db_path) as second:
        assert await SQLiteChatAgentStateStore(second).load("t", "u", "s") == {"dep": {"n": 1}}


async def test_a_schema_newer_than_this_tether_is_refused(db_path: Path) -> None:
    async with SQLiteDatabase(db_path):
        pass
    with _raw(db_path) as raw:
        raw.execute(schema.set_user_version(schema.SCHEMA_VERSION + 1))
    with pytest.raises(StoreError, match="newer than this tether"):
        await SQLiteDatabase(db_path).open()
    assert _sqlite_threads() == []


async def test_an_upgraded_file_lists_its_dead_turns_by_the_heartbeat_index(
    db_path: Path,
) -> None:
    # Up to schema version 3 a heartbeat is only isoformat() text, its fraction
    # left out when zero; migration 4 derives heartbeat_us from it, exactly.
    moments = [
        datetime(2001, 1, 1, 0, 0, 1, tzinfo=UTC),
        datetime(2001, 1, 1, 0, 0, 0, 999_999, tzinfo=UTC),
        datetime(2001, 1, 1, 0, 0, 1, 1, tzinfo=UTC),
        datetime(1969, 12, 31, 23, 59, 59, 5, tzinfo=UTC),
    ]
    with _raw(db_path) as raw:
        for migration in schema.MIGRATIONS[:3]:
            for statement in migration:
                raw.execute(statement)
        raw.execute(schema.set_user_version(3))
        for number, moment in enumerate(moments):
            raw.execute(
                "INSERT INTO stream_supervision VALUES (?, ?, ?, 1, ?, 'running', ?)",
                (b"t", b"", f"s-{number}".encode(), f"m-{number}".encode(), moment.isoformat()),
            )
    async with SQLiteDatabase(db_path) as database:
        store = SQLiteChatStreamSupervisionStore(database)
        listed = await store.list_stale_running(moments[2], limit=10)
        assert [t.session_id for t in listed] == ["s-3", "s-1", "s-0"]
        assert [t.supervision.heartbeat_at for t in listed] == [moments[3], moments[1], moments[0]]
        assert {(t.tenant, t.requester_uuid) for t in listed} == {("t", None)}
        assert len(await store.list_stale_running(moments[2], limit=2)) == 2
    with _raw(db_path) as raw:
        assert raw.execute("PRAGMA user_version").fetchone() == (schema.SCHEMA_VERSION,)
        values = {"running": "running", "before_us": 0, "limit": 10}
        plan = str(
            raw.execute(f"EXPLAIN QUERY PLAN {queries.SUPERVISION_LIST_STALE}", values).fetchall()
        )
    # A range read of the index, in its order: no scan, no sort.
    assert "USING INDEX stream_supervision_by_heartbeat" in plan
    assert "TEMP B-TREE" not in plan


async def test_the_producer_is_kept_by_every_write_and_read(database: SQLiteDatabase) -> None:
    store = SQLiteChatStreamSupervisionStore(database)
    clock = ManualClock()
    claimed = _ROW.model_copy(update={"producer": "replica-a"})
    assert await store.compare_and_swap("t", "u", "a", None, claimed)
    assert await store.compare_and_swap("t", "u", "b", None, _ROW)  # no producer known
    assert await store.read("t", "u", "a") == claimed
    assert await store.read("t", "u", "b") == _ROW
    # A heartbeat batch writes the producer it is given, and a takeover its own.
    beat = claimed.model_copy(update={"heartbeat_at": clock.advance(1)})
    taken = _ROW.model_copy(update={"epoch": 2, "producer": "replica-b"})
    batch = [SupervisionSwap("t", "u", "a", 1, beat), SupervisionSwap("t", "u", "b", 1, taken)]
    assert await store.compare_and_swap_many(batch) == [True, True]
    assert await store.read("t", "u", "a") == beat
    assert await store.read("t", "u", "b") == taken
    listed = await store.list_stale_running(clock.advance(1), limit=10)
    assert [(t.session_id, t.supervision.producer) for t in listed] == [
        ("b", "replica-b"),
        ("a", "replica-a"),
    ]
    # And a swap that knows no producer clears it rather than keeping a stale one.
    unknown = beat.model_copy(update={"producer": None})
    assert await store.compare_and_swap("t", "u", "a", 1, unknown)
    assert await store.read("t", "u", "a") == unknown


async def test_a_file_of_schema_version_4_gains_the_producer_column_on_open(
    db_path: Path,
) -> None:
    # A file written before rows named their producer, with a turn running in it.
    with _raw(db_path) as raw:
        for migration in schema.MIGRATIONS[:4]:
            for statement in migration:
                raw.execute(statement)
        raw.execute(schema.set_user_version(4))
        raw.execute(
            "INSERT INTO stream_supervision"
            " (tenant, requester_uuid, session_id, epoch, message_id, status, heartbeat_at)"
            " VALUES (?, ?, ?, 1, ?, 'running', ?)",
            (b"t", b"u", b"old", b"m-1", _ROW.heartbeat_at.isoformat()),
        )
    async with SQLiteDatabase(db_path) as database:
        store = SQLiteChatStreamSupervisionStore(database)
        assert await store.read("t", "u", "old") == _ROW
        (listed,) = await store.list_stale_running(ManualClock().advance(1), limit=10)
        assert (listed.session_id, listed.supervision) == ("old", _ROW)
        named = _ROW.model_copy(update={"producer": "replica-a"})
        assert await store.compare_and_swap("t", "u", "old", 1, named)
        assert await store.read("t", "u", "old") == named
    with _raw(db_path) as raw:
        assert raw.execute("PRAGMA user_version").fetchone() == (schema.SCHEMA_VERSION,)
        columns = {row[1]: row for row in raw.execute("PRAGMA table_info(stream_supervision)")}
    assert columns["producer"][2:4] == ("TEXT", 0)  # its type, and nullable


async def test_dead_turns_are_listed_with_their_exact_ids(database: SQLiteDatabase) -> None:
    store = SQLiteChatStreamSupervisionStore(database)
    ids = [*TRICKY_IDS, "x" * 2_000, "\udc80"]
    for number, value in enumerate(ids):
        row = _ROW.model_copy(
            update={"heartbeat_at": _ROW.heartbeat_at + timedelta(microseconds=number)}
        )
        assert await store.compare_and_swap(value, value, value, None, row)
    naive_bound = (_ROW.heartbeat_at + timedelta(seconds=1)).replace(tzinfo=None)
    listed = await store.list_stale_running(naive_bound, limit=1_000)
    assert [(t.tenant, t.requester_uuid, t.session_id) for t in listed] == [
        (value, value or None, value) for value in ids
    ]
    assert await store.list_stale_running(naive_bound, limit=0) == []


async def test_transcripts_and_checkpoints_are_fsynced_stream_rows_are_not(
    database: SQLiteDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    diagnostics = await database.diagnostics()
    assert diagnostics.synchronous == {Lane.DURABLE: 2, Lane.STREAM: 1}  # FULL, NORMAL
    lanes: list[Lane] = []
    real_write = database.write

    async def spying_write(lane: Lane, step: Callable[[sqlite3.Connection], Any]) -> Any:
        lanes.append(lane)
        return await real_write(lane, step)

    monkeypatch.setattr(database, "write", spying_write)
    all_four = _Stores(database)
    await all_four.state.save("t", "u", "s", {"dep": {}})
    await all_four.conversations.append_messages("t", "u", "s", "agent", [_USER])
    await all_four.conversations.set_last_turn_status("t", "u", "s", "complete")
    assert lanes == [Lane.DURABLE] * 3
    lanes.clear()
    await all_four.supervision.compare_and_swap("t", "u", "s", None, _ROW)
    await all_four.recording.put("t", "u", "s", _EVENT)
    assert lanes == [Lane.STREAM] * 2


async def test_two_databases_on_one_file_see_each_others_writes(db_path: Path) -> None:
    async with SQLiteDatabase(db_path) as one, SQLiteDatabase(db_path) as other:
        writer, reader = _Stores(one), _Stores(other)
        await writer.write_everything("t", "u", "s")
        assert await reader.state.load("t", "u", "s") == {"dep": {"n": 1}}
        assert await reader.supervision.read("t", "u", "s") == _ROW
        assert await reader.recording.read("t", "u", "s") == _EVENT
        assert await reader.conversations.get_transcript("t", "u", "s") == [_USER]
        # And the fences hold across them: the other database's writes are guarded too.
        assert not await reader.supervision.compare_and_swap("t", "u", "s", None, _ROW)
        await writer.recording.put("t", "u", "s", _EVENT.model_copy(update={"epoch": 5}))
        with pytest.raises(RecordingFencedError):
            await reader.recording.put("t", "u", "s", _EVENT)


async def test_compare_and_swap_many_is_one_transaction_of_guarded_swaps(
    database: SQLiteDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SQLiteChatStreamSupervisionStore(database)
    for session in ("a", "b"):
        await store.compare_and_swap("t", "u", session, None, _ROW)
    beat = _ROW.model_copy(update={"heartbeat_at": ManualClock().advance(1)})
    swaps = [
        SupervisionSwap("t", "u", "a", 1, beat),
        SupervisionSwap("t", "u", "b", 7, beat),  # wrong epoch: refused alone
        SupervisionSwap("t", "u", "new", None, beat),
        SupervisionSwap("t", "u", "new", None, beat),  # sees the claim just before it
    ]
    transactions = 0
    real_write = database.write

    async def counting_write(lane: Lane, step: Callable[[sqlite3.Connection], Any]) -> Any:
        nonlocal transactions
        transactions += 1
        return await real_write(lane, step)

    monkeypatch.setattr(database, "write", counting_write)
    assert await store.compare_and_swap_many(swaps) == [True, False, True, False]
    assert transactions == 1
    assert await store.read("t", "u", "a") == beat
    assert await store.read("t", "u", "b") == _ROW
    assert await store.read("t", "u", "new") == beat
    assert await store.compare_and_swap_many([]) == []


async def test_ids_are_parameters_never_sql(database: SQLiteDatabase) -> None:
    hostile = "x'); DROP TABLE agent_state; --"
    all_four = _Stores(database)
    await all_four.write_everything(hostile, hostile, hostile)
    assert await all_four.state.load(hostile, hostile, hostile) == {"dep": {"n": 1}}
    assert await all_four.state.load("x", "x", "x") == {}
    # A lone surrogate (valid in a JSON request) is an id like any other.
    await all_four.write_everything("t\udc80", "u\ud800", "s\udfff")
    assert await all_four.supervision.read("t\udc80", "u\ud800", "s\udfff") == _ROW
    page = await all_four.conversations.list_conversations("t\udc80", "u\ud800")
    assert [item.session_id for item in page.items] == ["s\udfff"]


_Operation = Callable[[_Stores], Awaitable[Any]]
_CORRUPTIONS: list[tuple[str, str, list[_Operation]]] = [
    (
        "UPDATE agent_state SET state = ?",
        '{"torn": ',
        [lambda s: s.state.load("t", "u", "s")],
    ),
    (
        "UPDATE agent_state SET state = ?",
        '["valid JSON", "wrong shape"]',
        [lambda s: s.state.load("t", "u", "s")],
    ),
    (
        "UPDATE stream_supervision SET status = ?",
        "bogus",
        [lambda s: s.supervision.read("t", "u", "s")],
    ),
    (
        "UPDATE stream_recording SET message = ?",
        "",
        [lambda s: s.recording.read("t", "u", "s")],
    ),
    (
        "UPDATE conversation SET record = ?",
        '{"torn": ',
        [
            lambda s: s.conversations.get_transcript("t", "u", "s"),
            lambda s: s.conversations.get_conversation("t", "u", "s"),
            lambda s: s.conversations.append_messages("t", "u", "s", "agent", [_USER]),
            lambda s: s.conversations.set_last_turn_status("t", "u", "s", "errored"),
            lambda s: s.conversations.set_shared("t", "u", "s", True),
            lambda s: s.conversations.delete_conversation("t", "u", "s"),
            lambda s: s.conversations.remove_fenced("t", "u", "s", ["m-1"], epoch=9),
        ],
    ),
    (
        "UPDATE conversation SET summary = ?",
        "[]",
        [lambda s: s.conversations.list_conversations("t", "u")],
    ),
]


@pytest.mark.parametrize(
    ("statement", "damage", "operations"),
    _CORRUPTIONS,
    ids=["state-torn", "state-shape", "supervision", "recording", "record", "summary"],
)
async def test_a_corrupt_row_raises_and_is_left_untouched(
    database: SQLiteDatabase,
    db_path: Path,
    statement: str,
    damage: str,
    operations: list[_Operation],
) -> None:
    all_four = _Stores(database)
    await all_four.write_everything("t", "u", "s")
    table = statement.split()[1]
    with _raw(db_path) as raw:
        raw.execute(statement, (damage,))
        before = raw.execute(f"SELECT * FROM {table}").fetchall()
    for operation in operations:
        with pytest.raises(StoreCorruptedError, match="left as is"):
            await operation(all_four)
    with _raw(db_path) as raw:
        assert raw.execute(f"SELECT * FROM {table}").fetchall() == before


async def test_a_write_waiting_past_the_busy_timeout_is_unavailable(db_path: Path) -> None:
    async with SQLiteDatabase(db_path, busy_timeout=0.05, name="the-test-db") as database:
        store = SQLiteChatStreamSupervisionStore(database)
        with _raw(db_path) as other_process:
            other_process.execute("BEGIN IMMEDIATE")
            with pytest.raises(StoreUnavailableError, match="the-test-db") as caught:
                await store.compare_and_swap("t", "u", "s", None, _ROW)
            assert isinstance(caught.value.__cause__, sqlite3.OperationalError)
            assert await store.read("t", "u", "s") is None  # WAL: readers never wait
            other_process.execute("ROLLBACK")
        assert await store.compare_and_swap("t", "u", "s", None, _ROW)


async def test_stores_from_url_share_one_database_on_a_relative_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    bundle = stores.from_url("sqlite:///nested/dir/tether.db?busy_timeout=2.5")
    state = bundle.agent_state_store
    assert isinstance(state, SQLiteChatAgentStateStore)
    recording = bundle.chat_stream_recording_store
    assert isinstance(recording, SQLiteChatStreamRecordingStore)
    supervision = bundle.chat_stream_supervision_store
    assert isinstance(supervision, SQLiteChatStreamSupervisionStore)
    conversations = bundle.chat_conversation_store
    assert isinstance(conversations, SQLiteChatConversationStore)
    opened = [state, recording, supervision, conversations]
    database = state.database
    assert all(store.database is database for store in opened)
    assert database.path == tmp_path / "nested" / "dir" / "tether.db"
    # As setup_app does: open each store once, close them all in reverse.
    for store in opened:
        await store.open()
    await _Stores(database).write_everything("t", "u", "s")
    for store in reversed(opened[1:]):
        await store.aclose()
        await store.aclose()  # idempotent: gives back no second hold
    assert await state.load("t", "u", "s") == {"dep": {"n": 1}}
    await state.aclose()
    with pytest.raises(StoreError, match="not open"):
        await state.load("t", "u", "s")
    assert _sqlite_threads() == []
    assert (tmp_path / "nested" / "dir" / "tether.db").is_file()


async def test_stores_from_url_on_an_absolute_path(tmp_path: Path) -> None:
    path = tmp_path / "absolute.db"
    url = f"sqlite:///{path}"
    assert url.startswith("sqlite:////")
    store = stores_from_url(url).agent_state_store
    assert isinstance(store, SQLiteChatAgentStateStore)
    assert store.database.path == path
    async with store:
        await store.save("t", "u", "s", {"dep": {}})
    async with SQLiteChatAgentStateStore.from_url(url) as again:
        assert await again.load("t", "u", "s") == {"dep": {}}


@pytest.mark.parametrize(
    "url",
    [
        "sqlite://host/tether.db",
        "sqlite:///",
        "sqlite:///:memory:",
        "sqlite:///tether.db?journal=delete",
        "sqlite:///tether.db?busy_timeout=soon",
        "sqlite:///tether.db?busy_timeout=-1",
    ],
)
def test_a_malformed_url_is_refused_when_parsed(url: str) -> None:
    with pytest.raises(StoreURLError, match="store URL"):
        stores.from_url(url)


@pytest.mark.parametrize(
    ("relative", "error", "says"),
    [
        ("a-file/tether.db", StoreError, "is not a directory"),
        ("a-file/deeper/tether.db", StoreError, "cannot create the directory"),
        ("a-directory.db", StoreUnavailableError, "unable to open"),
        ("garbage.db", StoreCorruptedError, "not a database"),
    ],
)
async def test_an_unusable_path_fails_open_naming_the_url(
    tmp_path: Path, relative: str, error: type[StoreError], says: str
) -> None:
    (tmp_path / "a-file").write_text("not a directory")
    (tmp_path / "a-directory.db").mkdir()
    (tmp_path / "garbage.db").write_bytes(b"this is not a database file, not at all" * 100)
    url = f"sqlite:///{tmp_path}/{relative}"
    store = stores.from_url(url).chat_stream_supervision_store
    assert isinstance(store, SQLiteChatStreamSupervisionStore)
    with pytest.raises(error, match=says) as caught:
        await store.open()
    assert url in str(caught.value)
    assert _sqlite_threads() == []
    with pytest.raises(StoreError, match="not open"):
        await store.read("t", "u", "s")


async def test_opens_nest_and_the_last_close_stops_the_threads(db_path: Path) -> None:
    database = SQLiteDatabase(db_path)
    state = SQLiteChatAgentStateStore(database)
    conversations = SQLiteChatConversationStore(database)
    await asyncio.gather(state.open(), conversations.open(), database.open())
    assert len(_sqlite_threads()) == 2  # one per connection
    await state.aclose()
    await database.aclose()
    assert await conversations.get_transcript("t", "u", "s") == []
    await conversations.aclose()
    await database.aclose()  # more closes than opens: harmless
    assert _sqlite_threads() == []
    with pytest.raises(StoreError, match="not open"):
        await state.load("t", "u", "s")
    async with state:  # and it opens again
        assert await state.load("t", "u", "s") == {}


# Opening while another process closes ----------------------------------------------
#
# SQLite can refuse ``PRAGMA journal_mode = WAL`` with SQLITE_BUSY at once, without
# its busy handler: for a few milliseconds while another process's last connection
# checkpoints and removes the WAL, or while the WAL index is recovered. CI once
# failed a four-process race on exactly that. Opening must wait it out as a write
# waits out a lock, within the busy timeout.


def _busy() -> sqlite3.OperationalError:
    error = sqlite3.OperationalError("database is locked")
    error.sqlite_errorcode = sqlite3.SQLITE_BUSY  # type: ignore[attr-defined]
    return error


class _RefusesWAL(sqlite3.Connection):
    """A connection whose first ``refusals`` WAL switches fail the way SQLite's do."""

    refusals = 0

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:  # type: ignore[override]
        if "journal_mode = WAL" in sql and _RefusesWAL.refusals > 0:
            _RefusesWAL.refusals -= 1
            raise _busy()
        return super().execute(sql, *args)


@pytest.fixture
def wal_refusals(monkeypatch: pytest.MonkeyPatch) -> Callable[[int], None]:
    connect = sqlite3.connect

    def refusing(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        return connect(*args, factory=_RefusesWAL, **kwargs)

    monkeypatch.setattr(sqlite3, "connect", refusing)

    def refuse(times: int) -> None:
        _RefusesWAL.refusals = times

    return refuse


async def test_opening_waits_out_a_wal_switch_refused_as_busy(
    db_path: Path, wal_refusals: Callable[[int], None]
) -> None:
    wal_refusals(3)
    async with SQLiteDatabase(db_path, busy_timeout=2) as database:
        assert (await database.diagnostics()).journal_mode == "wal"
    assert _RefusesWAL.refusals == 0


async def test_opening_refused_past_the_busy_timeout_is_unavailable(
    db_path: Path, wal_refusals: Callable[[int], None]
) -> None:
    wal_refusals(10**9)
    database = SQLiteDatabase(db_path, busy_timeout=0.05, name="the-test-db")
    with pytest.raises(StoreUnavailableError, match="the-test-db"):
        await database.open()
    assert _sqlite_threads() == []


def _open_and_close(path: str, cycles: int, barrier: Any, results: Any) -> None:
    async def cycle() -> None:
        for _ in range(cycles):
            async with SQLiteDatabase(path):
                pass

    barrier.wait()
    try:
        asyncio.run(cycle())
    except Exception as exc:
        results.put(repr(exc))
    else:
        results.put("ok")


@pytest.mark.processes
def test_processes_opening_and_closing_one_fresh_file_all_succeed(db_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    processes_count, cycles = 4, 150
    barrier = context.Barrier(processes_count)
    results = context.Queue()
    processes = [
        context.Process(target=_open_and_close, args=(str(db_path), cycles, barrier, results))
        for _ in range(processes_count)
    ]
    for process in processes:
        process.start()
    try:
        outcomes = [results.get(timeout=60) for _ in processes]
    finally:
        for process in processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
    assert outcomes == ["ok"] * processes_count


async def test_a_file_of_schema_version_5_keeps_its_epochs_and_fences_under_tombstones(
    db_path: Path,
) -> None:
    """Before version 6 the numbers kept for ever per conversation named it;
    the upgrade re-keys them by its tombstone and keeps every one."""
    with _raw(db_path) as raw:
        for migration in schema.MIGRATIONS[:5]:
            for statement in migration:
                raw.execute(statement)
        raw.execute(schema.set_user_version(5))
        ids = (b"t", b"u", b"erased")
        raw.execute("INSERT INTO stream_epoch VALUES (?, ?, ?, 7)", ids)
        raw.execute("INSERT INTO stream_fence VALUES (?, ?, ?, 6)", ids)
        raw.execute("INSERT INTO agent_state_fence VALUES (?, ?, ?, 5)", ids)
    async with SQLiteDatabase(db_path) as database:
        supervision = SQLiteChatStreamSupervisionStore(database)
        recording = SQLiteChatStreamRecordingStore(database)
        state = SQLiteChatAgentStateStore(database)
        assert await supervision.last_epoch("t", "u", "erased") == 7
        assert not await supervision.compare_and_swap(
            "t", "u", "erased", None, _ROW.model_copy(update={"epoch": 7})
        )
        with pytest.raises(RecordingFencedError):
            await recording.put("t", "u", "erased", _EVENT.model_copy(update={"epoch": 5}))
        assert not await state.save_fenced("t", "u", "erased", {}, 4)
        assert await state.save_fenced("t", "u", "erased", {}, 5)
    with _raw(db_path) as raw:
        for table in ("stream_epoch", "stream_fence", "agent_state_fence"):
            (tombstone, _epoch) = raw.execute(f"SELECT * FROM {table}").fetchone()
            assert tombstone == TombstoneKey.from_env().of("t", "u", "erased")


async def test_a_file_written_under_one_tombstone_key_is_refused_under_another(
    db_path: Path,
) -> None:
    async with SQLiteDatabase(db_path, tombstone_key=TombstoneKey(b"first key, a secret")):
        pass
    with pytest.raises(StoreError, match="TETHER_TOMBSTONE_KEY"):
        async with SQLiteDatabase(db_path, tombstone_key=TombstoneKey(b"another key entirely")):
            pass
    async with SQLiteDatabase(db_path, tombstone_key=TombstoneKey(b"first key, a secret")):
        pass
