"""What only Redis promises; the contract kit runs over Redis in ``test_contracts.py``.

Needs a Redis server (``redis_url``: a fresh key prefix per test). The outage
test starts its own ``redis-server`` on a free port so it can kill and restart it.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, cast
from urllib.parse import parse_qs, urlsplit

import pytest
import redis
import redis.asyncio

from tests.support.servers import free_port
from tests.support.services import missing
from tether.adapters.redis import (
    RedisChatAgentStateStore,
    RedisChatStreamRecordingStore,
    RedisChatStreamSupervisionStore,
    RedisConnection,
    stores_from_url,
)
from tether.adapters.redis import supervision as redis_supervision
from tether.domain.chat_message import ChatMessage, ChatMessageSender
from tether.domain.chat_stream_recording_store import RecordedStreamEvent, RecordingPut
from tether.domain.chat_stream_supervision_store import (
    ChatStreamStatus,
    ChatStreamSupervision,
    SupervisionSwap,
)
from tether.domain.store_errors import StoreCorruptedError, StoreError, StoreUnavailableError
from tether.domain.tombstones import TombstoneKey
from tether.stores import StoreURLError, from_url
from tether.testing.contracts import ChatStreamSupervisionEpochContract
from tether.testing.contracts.fencing import Expire

pytestmark = pytest.mark.redis


@pytest.fixture
async def connection(redis_url: str) -> AsyncIterator[RedisConnection]:
    async with RedisConnection.from_url(redis_url) as connection:
        yield connection


# Redis-only guarantees ---------------------------------------------------------------


def _row(epoch: int, message_id: str = "m-1") -> ChatStreamSupervision:
    return ChatStreamSupervision(
        status=ChatStreamStatus.RUNNING,
        heartbeat_at=datetime(2030, 1, 1, tzinfo=UTC),
        message_id=message_id,
        epoch=epoch,
    )


def _event(epoch: int, text: str = "so far", message_id: str = "m-1") -> RecordedStreamEvent:
    message = ChatMessage(sender=ChatMessageSender.BOT, content=text)
    return RecordedStreamEvent(index=0, message=message, message_id=message_id, epoch=epoch)


def _with_query(url: str, **parameters: str) -> str:
    return url + "".join(f"&{name}={value}" for name, value in parameters.items())


def _prefix(url: str) -> str:
    return parse_qs(urlsplit(url).query)["prefix"][0]


def _server_url(url: str) -> str:
    return urlsplit(url)._replace(query="").geturl()


@pytest.fixture
def raw(redis_url: str) -> Iterator[redis.Redis]:
    """A plain client on the test server, for looking at keys directly."""
    client = redis.Redis.from_url(_server_url(redis_url))
    yield client
    client.close()


def _keys(client: redis.Redis, pattern: str) -> list[str]:
    return sorted(key.decode() for key in client.scan_iter(match=pattern, count=500))


_Stores = tuple[
    RedisChatAgentStateStore, RedisChatStreamRecordingStore, RedisChatStreamSupervisionStore
]


def _stores(url: str) -> _Stores:
    """The three stores ``tether.stores.from_url`` builds for ``url``."""
    bundle = from_url(url)
    assert bundle.chat_conversation_store is None
    state = bundle.agent_state_store
    recording = bundle.chat_stream_recording_store
    supervision = bundle.chat_stream_supervision_store
    assert isinstance(state, RedisChatAgentStateStore)
    assert isinstance(recording, RedisChatStreamRecordingStore)
    assert isinstance(supervision, RedisChatStreamSupervisionStore)
    return state, recording, supervision


class TestRedisSupervisionEpochsAfterExpiry(ChatStreamSupervisionEpochContract):
    """The epoch contract, with rows removed as their TTL would: gone without a
    script, the conversation's epoch key untouched."""

    @pytest.fixture
    def store(self, connection: RedisConnection) -> RedisChatStreamSupervisionStore:
        return RedisChatStreamSupervisionStore(connection)

    @pytest.fixture
    def expire(self, connection: RedisConnection, raw: redis.Redis) -> Expire:
        layout = connection.keys

        async def expire(tenant: str, requester_uuid: str | None, session_id: str) -> None:
            key = layout.supervision(layout.conversation(tenant, requester_uuid, session_id))
            assert raw.delete(key) == 1

        return expire


async def test_epochs_and_fences_have_no_ttl_and_outlive_their_rows(
    redis_url: str, raw: redis.Redis
) -> None:
    prefix = _prefix(redis_url)
    url = _with_query(redis_url, stream_ttl="123", state_ttl="77")
    async with RedisConnection.from_url(url) as connection:
        supervision = RedisChatStreamSupervisionStore(connection)
        recording = RedisChatStreamRecordingStore(connection)
        state = RedisChatAgentStateStore(connection)
        assert await supervision.compare_and_swap("t", "u", "s", None, _row(3))
        await recording.put("t", "u", "s", _event(3))
        assert await state.save_fenced("t", "u", "s", {"dep": {}}, 3)
        kinds = ("supervision-epoch", "recording-fence", "agent-state-fence")
        kept = [key for kind in kinds for key in _keys(raw, f"{prefix}{kind}:*")]
        assert len(kept) == 3
        assert all(raw.get(key) == b"3" and raw.ttl(key) == -1 for key in kept)
        # The rows expire (here: vanish), the epochs stay and keep fencing.
        for kind in ("stream-supervision", "stream-recording", "agent-state"):
            for key in _keys(raw, f"{prefix}{kind}:*"):
                raw.delete(key)
        assert await supervision.last_epoch("t", "u", "s") == 3
        assert not await supervision.compare_and_swap("t", "u", "s", None, _row(3))
        assert await recording.put_many([RecordingPut("t", "u", "s", _event(2))]) == [False]
        assert not await state.save_fenced("t", "u", "s", {"dep": {}}, 2)
        assert all(raw.get(key) == b"3" for key in kept)


async def test_fenced_writes_compare_epochs_beyond_2_to_the_53_exactly(
    connection: RedisConnection,
) -> None:
    supervision = RedisChatStreamSupervisionStore(connection)
    state = RedisChatAgentStateStore(connection)
    big = 2**64 + 1
    assert await supervision.compare_and_swap("t", "u", "s", None, _row(big))
    await supervision.delete("t", "u", "s", "m-1", big)
    assert await supervision.last_epoch("t", "u", "s") == big
    assert not await supervision.compare_and_swap("t", "u", "s", None, _row(big - 1))
    assert await supervision.compare_and_swap("t", "u", "s", None, _row(big + 1))
    assert await state.save_fenced("t", "u", "s", {"dep": {"n": 1}}, big)
    assert not await state.save_fenced("t", "u", "s", {"dep": {"n": 2}}, big - 1)
    await state.fence("t", "u", "s", -big)
    assert await state.save_fenced("t", "u", "s", {"dep": {"n": 3}}, big)
    assert await state.load("t", "u", "s") == {"dep": {"n": 3}}


async def test_from_url_serves_three_stores_on_one_connection_and_no_conversations(
    redis_url: str,
) -> None:
    state, recording, supervision = _stores(redis_url)
    assert state.connection is recording.connection is supervision.connection
    for store in (state, recording, supervision):  # as setup_app does: each opened once
        await store.open()
    await supervision.compare_and_swap("t", "u", "s", None, _row(1))
    assert await supervision.read("t", "u", "s") == _row(1)
    for store in (state, recording, supervision):
        await store.aclose()
    await state.aclose()
    with pytest.raises(StoreUnavailableError, match="closed"):
        await supervision.read("t", "u", "s")


async def test_key_prefixes_keep_deployments_apart(redis_url: str) -> None:
    other_url = redis_url.replace(f"prefix={_prefix(redis_url)}", f"prefix={_prefix(redis_url)}b:")
    one, two = _stores(redis_url), _stores(other_url)
    try:
        for (state, recording, supervision), epoch in ((one, 1), (two, 5)):
            await state.save("t", "u", "s", {"dep": {"epoch": epoch}})
            assert await supervision.compare_and_swap("t", "u", "s", None, _row(epoch))
            await recording.put("t", "u", "s", _event(epoch))
        for (state, recording, supervision), epoch in ((one, 1), (two, 5)):
            assert await state.load("t", "u", "s") == {"dep": {"epoch": epoch}}
            assert await supervision.read("t", "u", "s") == _row(epoch)
            assert await recording.read("t", "u", "s") == _event(epoch)
        # Nor do they hear each other's changes.
        await two[1].wait_for_change("warm", "up", "feed", 0.3)
        waiting = asyncio.create_task(two[1].wait_for_change("t", "u", "s", 0.4))
        await asyncio.sleep(0.05)
        await one[1].put("t", "u", "s", _event(2))
        assert await waiting is False
    finally:
        await one[0].aclose()
        await two[0].aclose()


async def test_stream_rows_expire_and_every_write_renews_the_ttl(
    redis_url: str, raw: redis.Redis
) -> None:
    prefix = _prefix(redis_url)
    async with RedisConnection.from_url(_with_query(redis_url, stream_ttl="123")) as connection:
        supervision = RedisChatStreamSupervisionStore(connection)
        recording = RedisChatStreamRecordingStore(connection)
        state = RedisChatAgentStateStore(connection)
        await supervision.compare_and_swap("t", "u", "s", None, _row(1))
        await recording.put("t", "u", "s", _event(1))
        await state.save("t", "u", "s", {"dep": {}})
        stream_keys = _keys(raw, f"{prefix}stream-*")
        assert len(stream_keys) == 2
        for key in stream_keys:
            assert 100 < raw.ttl(key) <= 123
            raw.expire(key, 5)
        (state_key,) = _keys(raw, f"{prefix}agent-state:*")
        assert raw.ttl(state_key) == -1  # checkpoints never expire by default
        # A heartbeat and a put renew what an idle row would lose.
        assert await supervision.compare_and_swap("t", "u", "s", 1, _row(1, "m-1"))
        await recording.put("t", "u", "s", _event(1, "more"))
        for key in stream_keys:
            assert 100 < raw.ttl(key) <= 123
        # A refused write renews nothing.
        raw.expire(stream_keys[0], 5)
        raw.expire(stream_keys[1], 5)
        assert not await supervision.compare_and_swap("t", "u", "s", 7, _row(8))
        assert all(raw.ttl(key) <= 5 for key in stream_keys)
    async with RedisConnection.from_url(_with_query(redis_url, state_ttl="77")) as connection:
        await RedisChatAgentStateStore(connection).save("t", "u", "s", {"dep": {}})
        assert 70 < raw.ttl(state_key) <= 77


@pytest.mark.parametrize(
    "url_suffix", ["stream_ttl=0", "stream_ttl=-5", "stream_ttl=1.5", "state_ttl=soon"]
)
def test_bad_ttl_parameters_are_refused(redis_url: str, url_suffix: str) -> None:
    with pytest.raises(StoreURLError, match=url_suffix.split("=")[0]):
        RedisConnection.from_url(f"{redis_url}&{url_suffix}")


async def test_ids_with_separators_and_escapes_do_not_collide(
    connection: RedisConnection, raw: redis.Redis
) -> None:
    triples = [
        ("a:b", "c", "d"),
        ("a", "b:c", "d"),
        ("a", "b", "c:d"),
        ("a", "", "b:c:d"),
        ("a:b:c", "", "d"),
        ("a%3Ab", "c", "d"),
        ("a%253Ab", "c", "d"),
        ("a", "b", "c"),
        ("a", "b", "c\x00"),
        ("A", "b", "c"),
    ]
    supervision = RedisChatStreamSupervisionStore(connection)
    recording = RedisChatStreamRecordingStore(connection)
    state = RedisChatAgentStateStore(connection)
    for number, triple in enumerate(triples, start=1):
        assert await supervision.compare_and_swap(*triple, None, _row(number))
        await recording.put(*triple, _event(number))
        await state.save(*triple, {"dep": {"number": number}})
    for number, triple in enumerate(triples, start=1):
        assert await supervision.read(*triple) == _row(number)
        assert await recording.read(*triple) == _event(number)
        assert await state.load(*triple) == {"dep": {"number": number}}
    prefix = connection.keys.prefix
    for kind in ("stream-supervision", "stream-recording", "agent-state"):
        assert len(_keys(raw, f"{prefix}{kind}:*")) == len(triples)
    assert f"{prefix}stream-supervision:a%3Ab:c:d" in _keys(raw, f"{prefix}stream-supervision:*")


class _CountingRedis(redis.asyncio.Redis):
    """Records the name of every command sent."""

    sent: list[str]

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        self.sent.append(str(args[0]))
        return await super().execute_command(*args, **options)

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
        pipe = super().pipeline(transaction=transaction, shard_hint=shard_hint)
        execute, sent = pipe.execute, self.sent

        async def counted(raise_on_error: bool = True) -> Any:
            names = sorted({str(args[0]) for args, _ in pipe.command_stack})
            sent.append(f"PIPELINE of {len(pipe.command_stack)} {' '.join(names)}")
            return await execute(raise_on_error)

        pipe.execute = counted
        return pipe


async def test_compare_and_swap_many_decides_each_swap_in_one_round_trip(
    redis_url: str,
) -> None:
    client = cast(_CountingRedis, _CountingRedis.from_url(_server_url(redis_url)))
    client.sent = []
    async with RedisConnection(client, prefix=_prefix(redis_url), owns_client=True) as connection:
        store = RedisChatStreamSupervisionStore(connection)
        await store.compare_and_swap("t", "u", "a", None, _row(1, "a"))
        await store.compare_and_swap("t", "u", "b", None, _row(3, "b"))
        swaps = [
            SupervisionSwap("t", "u", "a", 1, _row(2, "a-takeover")),  # right epoch
            SupervisionSwap("t", "u", "b", 2, _row(3, "b-stale")),  # wrong epoch
            SupervisionSwap("t", "u", "c", None, _row(1, "c")),  # claim, no row
            SupervisionSwap("t", "u", "d", 5, _row(6, "d")),  # epoch, no row
            SupervisionSwap("t", "u", "a", 1, _row(2, "a-late")),  # fenced by the first
            SupervisionSwap("t", "u", "a", 2, _row(2, "a-heartbeat")),  # sees the first
        ]
        client.sent.clear()
        results = await store.compare_and_swap_many(swaps)
        assert client.sent == ["EVALSHA"]
        assert results == [True, False, True, False, False, True]
        assert await store.read("t", "u", "a") == _row(2, "a-heartbeat")
        assert await store.read("t", "u", "b") == _row(3, "b")
        assert await store.read("t", "u", "c") == _row(1, "c")
        assert await store.read("t", "u", "d") is None
        client.sent.clear()
        assert await store.compare_and_swap_many([]) == []
        assert client.sent == []


class _ResendingRedis(redis.asyncio.Redis):
    """Sends every script call twice and answers with the second reply: what the
    driver does when the first reply is lost to a timeout and it retries."""

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        result = await super().execute_command(*args, **options)
        if args[0] == "EVALSHA":
            result = await super().execute_command(*args, **options)
        return result


async def test_a_resent_compare_and_swap_recognises_its_own_write(redis_url: str) -> None:
    client = _ResendingRedis.from_url(_server_url(redis_url))
    async with RedisConnection(client, prefix=_prefix(redis_url), owns_client=True) as connection:
        store = RedisChatStreamSupervisionStore(connection)
        assert await store.compare_and_swap("t", "u", "s", None, _row(1))
        assert await store.compare_and_swap("t", "u", "s", 1, _row(2, "takeover"))
        assert await store.read("t", "u", "s") == _row(2, "takeover")
        # Another call, even with an identical row, is still fenced.
        assert not await store.compare_and_swap("t", "u", "s", 1, _row(2, "takeover"))
        assert not await store.compare_and_swap("t", "u", "s", None, _row(9, "other"))
        assert await store.compare_and_swap_many(
            [
                SupervisionSwap("t", "u", "s", 2, _row(3, "x")),
                SupervisionSwap("t", "u", "s", 2, _row(4, "y")),
            ]
        ) == [True, False]
        assert await store.read("t", "u", "s") == _row(3, "x")


# Dead turns: the running set ---------------------------------------------------------

_MICROSECOND = timedelta(microseconds=1)


def _at(moment: datetime, epoch: int, message_id: str, status: ChatStreamStatus) -> Any:
    return ChatStreamSupervision(
        status=status, heartbeat_at=moment, message_id=message_id, epoch=epoch
    )


def _score(moment: datetime) -> float:
    return float((moment - datetime(1970, 1, 1, tzinfo=UTC)) // _MICROSECOND)


async def test_every_write_keeps_the_running_set_in_the_same_script(
    redis_url: str, raw: redis.Redis
) -> None:
    running, done = ChatStreamStatus.RUNNING, ChatStreamStatus.DONE
    heartbeats = f"{_prefix(redis_url)}running-heartbeats"
    t0 = datetime(2030, 1, 1, 0, 0, 0, 123_457, tzinfo=UTC)
    client = cast(_CountingRedis, _CountingRedis.from_url(_server_url(redis_url)))
    client.sent = []
    async with RedisConnection(client, prefix=_prefix(redis_url), owns_client=True) as connection:
        store = RedisChatStreamSupervisionStore(connection)
        member = connection.keys.conversation("t", "u", "s")
        assert await store.compare_and_swap("t", "u", "s", None, _at(t0, 1, "m-1", running))
        assert raw.zrange(heartbeats, 0, -1, withscores=True) == [(member.encode(), _score(t0))]
        # The batched heartbeat moves it; a refused swap does not.
        later = t0 + timedelta(seconds=1, microseconds=1)
        renewed = _at(later, 1, "m-1", running)
        assert await store.compare_and_swap_many(
            [
                SupervisionSwap("t", "u", "s", 1, renewed),
                SupervisionSwap("t", "u", "s", 7, _at(t0, 8, "m-x", running)),
            ]
        ) == [True, False]
        assert raw.zscore(heartbeats, member) == _score(later)
        assert await store.list_stale_running(t0, limit=10) == []  # the script is loaded
        client.sent.clear()
        listed = await store.list_stale_running(later + _MICROSECOND, limit=10)
        assert client.sent == ["EVALSHA"]  # the set and the rows: one round trip
        assert [(t.tenant, t.requester_uuid, t.session_id) for t in listed] == [("t", "u", "s")]
        assert listed[0].supervision == renewed
        # A verdict takes it out, a new turn's claim puts it back, a delete removes it.
        assert await store.compare_and_swap("t", "u", "s", 1, _at(t0, 2, "m-1", done))
        assert raw.zcard(heartbeats) == 0
        assert await store.compare_and_swap("t", "u", "s", 2, _at(t0, 3, "m-2", running))
        assert raw.zscore(heartbeats, member) == _score(t0)
        await store.delete("t", "u", "s", "m-2", 2)  # refused: the row stays, and its member
        assert raw.zscore(heartbeats, member) == _score(t0)
        await store.delete("t", "u", "s", "m-2", 3)
        assert raw.zcard(heartbeats) == 0
        assert await store.list_stale_running(later, limit=10) == []


async def test_dead_turns_are_listed_by_the_microsecond_with_their_exact_ids(
    connection: RedisConnection,
) -> None:
    store = RedisChatStreamSupervisionStore(connection)
    base = datetime(2030, 6, 1, 12, 0, 0, 999_990, tzinfo=UTC)
    awkward = ["../../x", "a:b", "a/b", "100%", "{tag}", "会話", "\udc80", "x" * 2_000, ""]
    for number, value in enumerate(awkward):
        row = _at(base + number * _MICROSECOND, 1, f"m-{number}", ChatStreamStatus.RUNNING)
        assert await store.compare_and_swap(value, value, value, None, row)
    listed = await store.list_stale_running(base + len(awkward) * _MICROSECOND, limit=100)
    assert [(t.tenant, t.requester_uuid, t.session_id) for t in listed] == [
        (value, value or None, value) for value in awkward
    ]
    assert [t.supervision.message_id for t in listed] == [f"m-{n}" for n in range(len(awkward))]
    # The bound is exclusive, to the microsecond.
    assert await store.list_stale_running(base + 3 * _MICROSECOND, limit=100) == listed[:3]
    assert await store.list_stale_running(base, limit=100) == []
    assert await store.list_stale_running(base + _MICROSECOND, limit=0) == []
    naive = (base + 2 * _MICROSECOND).replace(tzinfo=None)  # UTC, as heartbeats are
    assert await store.list_stale_running(naive, limit=100) == listed[:2]


async def test_members_without_a_listable_row_are_dropped_as_the_listing_meets_them(
    redis_url: str, raw: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    running = ChatStreamStatus.RUNNING
    prefix = _prefix(redis_url)
    heartbeats = f"{prefix}running-heartbeats"
    t0 = datetime(2030, 1, 1, tzinfo=UTC)
    async with RedisConnection.from_url(redis_url) as connection:
        store = RedisChatStreamSupervisionStore(connection)
        layout = connection.keys
        for n, session in enumerate(["expired", "foreign", "dead"]):
            row = _at(t0 + timedelta(seconds=n), 1, f"m-{session}", running)
            assert await store.compare_and_swap("t", "u", session, None, row)
        # One row expired; another was last written by a script that keeps no
        # set (an earlier release's, during a rolling deploy): its token moved on.
        raw.delete(layout.supervision(layout.conversation("t", "u", "expired")))
        raw.hset(layout.supervision(layout.conversation("t", "u", "foreign")), "token", "old")
        listed = await store.list_stale_running(t0 + timedelta(minutes=1), limit=10)
        assert [t.session_id for t in listed] == ["dead"]
        assert raw.zrange(heartbeats, 0, -1) == [layout.conversation("t", "u", "dead").encode()]
        # A current replica's write puts the foreign row back in the set.
        renewed = _at(t0 + timedelta(seconds=5), 1, "m-foreign", running)
        assert await store.compare_and_swap("t", "u", "foreign", 1, renewed)
        listed = await store.list_stale_running(t0 + timedelta(minutes=1), limit=10)
        assert [t.session_id for t in listed] == ["dead", "foreign"]
        # A listing removes a bounded number of members; the next goes on.
        monkeypatch.setattr(redis_supervision, "_CLEANUP", 2)
        for n in range(5):
            row = _at(t0 - timedelta(seconds=10 - n), 1, f"m-gone-{n}", running)
            assert await store.compare_and_swap("t", "u", f"gone-{n}", None, row)
            raw.delete(layout.supervision(layout.conversation("t", "u", f"gone-{n}")))
        passes = [await store.list_stale_running(t0 + timedelta(minutes=1), limit=1)]
        while not passes[-1]:
            passes.append(await store.list_stale_running(t0 + timedelta(minutes=1), limit=1))
        assert len(passes) == 3
        assert [t.session_id for t in passes[-1]] == ["dead"]
        assert raw.zcard(heartbeats) == 2
        # A listed row that cannot be read back raises, and is left as it is.
        dead = layout.supervision(layout.conversation("t", "u", "dead"))
        raw.hset(dead, "row", '{"torn": ')
        with pytest.raises(StoreCorruptedError, match="left as is"):
            await store.list_stale_running(t0 + timedelta(minutes=1), limit=10)
        assert raw.hget(dead, "row") == b'{"torn": '


async def test_wait_for_change_wakes_on_writes_from_another_connection(redis_url: str) -> None:
    async with (
        RedisChatStreamRecordingStore.from_url(redis_url) as follower,
        RedisChatStreamRecordingStore.from_url(redis_url) as producer,
        RedisChatStreamSupervisionStore.from_url(redis_url) as supervisor,
    ):
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await follower.wait_for_change("warm", "up", "feed", 0.3) is False
        assert 0.3 <= loop.time() - started < 0.6

        async def woken_by(write: Any) -> float:
            waiting = asyncio.create_task(follower.wait_for_change("t", "u", "s", 5.0))
            await asyncio.sleep(0.05)
            written_at = loop.time()
            await write
            assert await waiting is True
            return loop.time() - written_at

        assert await woken_by(producer.put("t", "u", "s", _event(1))) < 0.5
        assert await woken_by(supervisor.compare_and_swap("t", "u", "s", None, _row(1))) < 0.5
        assert await woken_by(producer.delete("t", "u", "s", "m-1")) < 0.5
        assert await woken_by(supervisor.delete("t", "u", "s", "m-1", 1)) < 0.5
        # Refused writes and other conversations' writes announce nothing here.
        # (This put's own announcement is taken first: one arriving late under
        # load would otherwise wake the wait below.)
        assert await woken_by(producer.put("t", "u", "s", _event(4))) < 5.0
        waiting = asyncio.create_task(follower.wait_for_change("t", "u", "s", 0.4))
        await asyncio.sleep(0.05)
        assert not await supervisor.compare_and_swap("t", "u", "s", 3, _row(4))
        await producer.put("t", "u", "other", _event(1))
        await producer.delete("t", "u", "s", "someone-else")
        assert await waiting is False
        assert await follower.wait_for_change("t", "u", "s", 0) is False


async def test_an_unreachable_server_fails_open_naming_the_url_without_password() -> None:
    url = "redis://tether:s3cret@127.0.0.1:1/0?prefix=x:"
    bundle = stores_from_url(url)
    store = bundle.chat_stream_supervision_store
    assert isinstance(store, RedisChatStreamSupervisionStore)
    started = time.monotonic()
    with pytest.raises(StoreUnavailableError) as caught:
        await store.open()
    assert time.monotonic() - started < 2.0
    assert "redis://tether@127.0.0.1:1/0" in str(caught.value)
    assert "s3cret" not in str(caught.value)
    assert isinstance(caught.value.__cause__, redis.exceptions.ConnectionError)
    with pytest.raises(StoreUnavailableError, match=re.escape("127.0.0.1:1")):
        await store.read("t", "u", "s")
    await store.aclose()


async def test_foreign_or_damaged_values_raise_and_are_left_alone(
    connection: RedisConnection, raw: redis.Redis
) -> None:
    supervision = RedisChatStreamSupervisionStore(connection)
    recording = RedisChatStreamRecordingStore(connection)
    state = RedisChatAgentStateStore(connection)
    await supervision.compare_and_swap("t", "u", "s", None, _row(1))
    await recording.put("t", "u", "s", _event(1))
    await state.save("t", "u", "s", {"dep": {}})
    prefix = connection.keys.prefix
    (row_key,) = _keys(raw, f"{prefix}stream-supervision:*")
    (record_key,) = _keys(raw, f"{prefix}stream-recording:*")
    (state_key,) = _keys(raw, f"{prefix}agent-state:*")
    raw.delete(row_key)
    raw.set(row_key, "not a hash")
    raw.hset(record_key, "event", '{"torn": ')
    raw.set(state_key, "[1, 2]")
    for operation in (
        supervision.read("t", "u", "s"),
        supervision.compare_and_swap("t", "u", "s", None, _row(2)),
        supervision.delete("t", "u", "s", "m-1", 1),
        recording.read("t", "u", "s"),
        state.load("t", "u", "s"),
    ):
        with pytest.raises(StoreCorruptedError, match="left as is"):
            await operation
    assert raw.get(row_key) == b"not a hash"
    assert raw.hget(record_key, "event") == b'{"torn": '
    raw.hdel(record_key, "epoch")
    with pytest.raises(StoreCorruptedError, match="left as is"):
        await recording.put("t", "u", "s", _event(2))


class _RedisServer:
    """A private redis-server this test may kill and restart on the same port."""

    def __init__(self) -> None:
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        command = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1"]
        command += ["--save", "", "--appendonly", "no"]
        self.process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        try:
            deadline = time.monotonic() + 10
            while True:
                try:
                    client.ping()
                    return
                except redis.ConnectionError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
        finally:
            client.close()

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None


@pytest.fixture
def private_server() -> Iterator[_RedisServer]:
    if shutil.which("redis-server") is None:
        missing("redis-server is not installed (apt-get install redis-server)")
    server = _RedisServer()
    server.start()
    try:
        yield server
    finally:
        server.kill()


async def test_an_outage_fails_calls_promptly_and_everything_recovers_after_it(
    private_server: _RedisServer,
) -> None:
    url = f"redis://127.0.0.1:{private_server.port}/0?prefix=outage:"
    async with (
        RedisChatStreamRecordingStore.from_url(url) as follower,
        RedisChatStreamRecordingStore.from_url(url) as producer,
    ):
        await producer.put("t", "u", "s", _event(1))
        assert await follower.wait_for_change("warm", "up", "feed", 0.3) is False
        loop = asyncio.get_running_loop()
        waiting = asyncio.create_task(follower.wait_for_change("t", "u", "s", 10.0))
        await asyncio.to_thread(private_server.kill)
        started = loop.time()
        with pytest.raises(StoreUnavailableError, match="unavailable"):
            await producer.read("t", "u", "s")
        assert loop.time() - started < 1.0
        await asyncio.to_thread(private_server.start)
        # The pool reconnects by itself (the restarted server kept nothing).
        assert await producer.read("t", "u", "s") is None
        # The feed resubscribes and wakes its waiters: changes may have been missed.
        assert await asyncio.wait_for(waiting, 5.0) is True
        deadline = loop.time() + 5.0
        while loop.time() < deadline:
            waiting = asyncio.create_task(follower.wait_for_change("t", "u", "s", 0.5))
            await asyncio.sleep(0.05)
            await producer.put("t", "u", "s", _event(2))
            if await waiting:
                break
        else:
            pytest.fail("the change feed did not come back within 5 s")


# The connection pool under load --------------------------------------------------------


async def test_a_burst_beyond_the_pool_queues_for_connections(redis_url: str) -> None:
    # A thousand turns starting at once: far more calls than pooled connections.
    # They wait for a free connection; none fails with "Too many connections".
    async with RedisChatStreamRecordingStore.from_url(
        _with_query(redis_url, max_connections="4")
    ) as store:
        await asyncio.gather(*(store.put("t", "u", f"s{i}", _event(1)) for i in range(300)))
        reads = await asyncio.gather(*(store.read("t", "u", f"s{i}") for i in range(300)))
        assert reads == [_event(1)] * 300


async def test_cancelled_calls_strand_no_connection_and_are_not_swallowed(
    redis_url: str,
) -> None:
    async with RedisChatStreamRecordingStore.from_url(
        _with_query(redis_url, max_connections="2", timeout="2")
    ) as store:
        for round_ in range(20):
            calls = [
                asyncio.create_task(store.put("t", "u", f"s{i}", _event(1))) for i in range(40)
            ]
            # Cancel at a different point of the calls' progress each round.
            for _ in range(round_ % 5):
                await asyncio.sleep(0)
            requested = [call.cancel() for call in calls]
            outcomes = await asyncio.gather(*calls, return_exceptions=True)
            # A caller cancelled before its call was done hears it was cancelled,
            # never a normal return (which would leave its task running on).
            for was_requested, outcome in zip(requested, outcomes, strict=True):
                if was_requested:
                    assert isinstance(outcome, asyncio.CancelledError)
        # Every connection came back: a burst on the two-connection pool goes through
        # (a stranded connection would make these wait out the pool timeout and fail).
        await asyncio.gather(*(store.put("t", "u", f"after{i}", _event(1)) for i in range(50)))
        assert await store.read("t", "u", "after49") == _event(1)


async def test_put_many_is_one_round_trip_and_fences_each_put(redis_url: str) -> None:
    client = cast(_CountingRedis, _CountingRedis.from_url(_server_url(redis_url)))
    client.sent = []
    async with RedisConnection(client, prefix=_prefix(redis_url), owns_client=True) as connection:
        store = RedisChatStreamRecordingStore(connection)
        await store.put("t", "u", "taken", _event(3, "successor"))
        await store.put("t", "u", "warm", _event(1))  # loads the script
        puts = [
            RecordingPut("t", "u", "taken", _event(2, "fenced")),
            *(RecordingPut("t", "u", f"s{i}", _event(1, f"text {i}")) for i in range(50)),
        ]
        client.sent.clear()
        results = await store.put_many(puts)
        assert results == [False] + [True] * 50
        assert client.sent == ["PIPELINE of 51 EVALSHA"]
        assert await store.read("t", "u", "taken") == _event(3, "successor")
        assert await store.read("t", "u", "s49") == _event(1, "text 49")
        raw = redis.Redis.from_url(_server_url(redis_url))
        try:
            raw.script_flush()  # the server forgets its scripts (a restart would)
        finally:
            raw.close()
        assert await store.put_many(puts[1:3]) == [True, True]


async def test_numbers_an_earlier_release_kept_under_ids_move_to_their_tombstones(
    redis_url: str, raw: redis.Redis
) -> None:
    """Before tombstones, a conversation's fences and highest epoch were kept
    under keys naming it. A replica opening the store moves each to its
    tombstone's key, keeping the higher number where both exist, so every
    epoch still holds and no key names the conversation."""
    prefix = _prefix(redis_url)
    named = "t:u:erased"  # the escaped conversation, as the old keys held it
    raw.set(f"{prefix}supervision-epoch:{named}", "7")
    raw.set(f"{prefix}recording-fence:{named}", "6")
    raw.set(f"{prefix}agent-state-fence:{named}", "5")
    async with RedisConnection.from_url(redis_url) as connection:
        raw.set(connection.keys.agent_state_fence(named), "9")  # higher: kept
        raw.set(f"{prefix}agent-state-fence:{named}", "5")
    async with RedisConnection.from_url(redis_url) as connection:
        state = RedisChatAgentStateStore(connection)
        supervision = RedisChatStreamSupervisionStore(connection)
        recording = RedisChatStreamRecordingStore(connection)
        assert await supervision.last_epoch("t", "u", "erased") == 7
        assert not await supervision.compare_and_swap("t", "u", "erased", None, _row(7))
        assert not (await recording.put_many([RecordingPut("t", "u", "erased", _event(5))]))[0]
        assert not await state.save_fenced("t", "u", "erased", {}, 8)
        assert await state.save_fenced("t", "u", "erased", {}, 9)
    for kind in ("supervision-epoch", "recording-fence", "agent-state-fence"):
        assert not [key for key in _keys(raw, f"{prefix}{kind}:*") if "erased" in key]


async def test_a_store_written_under_one_tombstone_key_is_refused_under_another(
    redis_url: str,
) -> None:
    first, second = TombstoneKey(b"first secret key!"), TombstoneKey(b"second secret key")
    client = redis.asyncio.Redis.from_url(_server_url(redis_url))
    try:
        prefix = _prefix(redis_url)
        async with RedisConnection(client, prefix=prefix, tombstone_key=first):
            pass
        with pytest.raises(StoreError, match="TETHER_TOMBSTONE_KEY"):
            async with RedisConnection(client, prefix=prefix, tombstone_key=second):
                pass
        async with RedisConnection(client, prefix=prefix, tombstone_key=first):
            pass
    finally:
        await client.aclose()
