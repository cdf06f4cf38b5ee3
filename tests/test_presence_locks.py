"""The presence locks themselves, held by real processes and ended by real signals.

A child process takes a replica's lock and reports it; this process tests
it: held while the child lives, even SIGSTOP'd (a slow replica is not a dead
one); free once the child is SIGKILLed (the kernel, or PostgreSQL ending the
session, drops it with no help from the dead process).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.support.proxy import TcpProxy
from tests.support.services import postgres_database, redis_prefix
from tether.adapters.flock_presence import FlockPresenceLock
from tether.adapters.postgres.database import PostgresDatabase
from tether.adapters.postgres.presence import PostgresPresenceLock
from tether.adapters.redis.connection import RedisConnection
from tether.adapters.redis.presence import RedisPresenceLock
from tether.domain.chat_stream_supervision_store import PresenceLock
from tether.runtime.presence import ReplicaPresence

pytestmark = [pytest.mark.processes, pytest.mark.timeout(60)]

_HOLDER = """
import asyncio, sys
from tether.adapters.flock_presence import FlockPresenceLock
from tether.adapters.postgres.database import PostgresDatabase
from tether.adapters.postgres.presence import PostgresPresenceLock
from tether.adapters.redis.connection import RedisConnection
from tether.adapters.redis.presence import RedisPresenceLock

async def main(kind, where, replica_id):
    if kind == "flock":
        lock = FlockPresenceLock(where)
    elif kind == "postgres":
        database = PostgresDatabase.from_url(where)
        await database.open()
        lock = PostgresPresenceLock(database)
    else:
        lock = RedisPresenceLock(RedisConnection.from_url(where))
    await lock.hold(replica_id)
    print("held", flush=True)
    await asyncio.Event().wait()

asyncio.run(main(*sys.argv[1:]))
"""


@pytest.fixture(
    params=[
        "flock",
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("redis", marks=pytest.mark.redis),
    ]
)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    if request.param == "flock":
        yield "flock", str(tmp_path / "presence")
    elif request.param == "postgres":
        with postgres_database() as url:
            yield "postgres", url
    else:
        with redis_prefix() as url:
            yield "redis", url


@pytest.fixture
async def checker(backend: tuple[str, str]) -> AsyncIterator[PresenceLock]:
    kind, where = backend
    if kind == "flock":
        yield FlockPresenceLock(where)
    elif kind == "postgres":
        async with PostgresDatabase.from_url(where) as database:
            yield PostgresPresenceLock(database)
    else:
        async with RedisConnection.from_url(where) as connection:
            yield RedisPresenceLock(connection)


@contextlib.contextmanager
def _holder(backend: tuple[str, str], replica_id: str) -> Iterator[subprocess.Popen[str]]:
    """A process holding ``replica_id``'s lock; killed at the end if still alive."""
    with subprocess.Popen(
        [sys.executable, "-c", _HOLDER, *backend, replica_id], stdout=subprocess.PIPE, text=True
    ) as child:
        try:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "held"
            yield child
        finally:
            child.kill()


async def _first_free(checker: PresenceLock, replica_ids: set[str]) -> set[str]:
    """What ``find_free`` answers once it finds any id free (the flock backend
    judges a freed id once: it removes the file it found unlocked).

    PostgreSQL ends a dead client's session when it reads the closed socket:
    a moment after the kill, not at it. Polling the outcome, bounded."""
    async with asyncio.timeout(10):
        while not (free := await checker.find_free(replica_ids)):  # noqa: ASYNC110
            await asyncio.sleep(0.02)
    return free


async def test_a_live_or_stopped_holders_lock_is_held_and_a_killed_ones_is_free(
    backend: tuple[str, str], checker: PresenceLock
) -> None:
    replica_id = uuid.uuid4().hex
    with _holder(backend, replica_id) as child:
        assert await checker.find_free({replica_id}) == set()
        child.send_signal(signal.SIGSTOP)
        assert await checker.find_free({replica_id}) == set()
        child.send_signal(signal.SIGKILL)
        child.wait()
        assert await _first_free(checker, {replica_id}) == {replica_id}


async def test_two_holders_are_told_apart(backend: tuple[str, str], checker: PresenceLock) -> None:
    one, two = uuid.uuid4().hex, uuid.uuid4().hex
    with _holder(backend, one) as first, _holder(backend, two):
        first.send_signal(signal.SIGKILL)
        first.wait()
        assert await _first_free(checker, {one, two}) == {one}


async def test_a_clean_release_frees_the_lock_and_an_unknown_id_counts_as_held(
    backend: tuple[str, str], checker: PresenceLock
) -> None:
    kind, where = backend
    replica_id = uuid.uuid4().hex
    if kind == "flock":
        mine: PresenceLock = FlockPresenceLock(where)
        await mine.hold(replica_id)
        assert await checker.find_free({replica_id}) == set()
        await mine.release()
        # Its file went with it: nothing left to judge, so not called free.
        assert await checker.find_free({replica_id}) == set()
        assert os.listdir(where) == []
        return
    async with contextlib.AsyncExitStack() as stack:
        if kind == "postgres":
            database = await stack.enter_async_context(PostgresDatabase.from_url(where))
            mine = PostgresPresenceLock(database)
        else:
            connection = await stack.enter_async_context(RedisConnection.from_url(where))
            mine = RedisPresenceLock(connection)
        await mine.hold(replica_id)
        assert await checker.find_free({replica_id}) == set()
        await mine.release()
        # The server drops a closed connection (Redis: from its client list)
        # as it gets to it: on a loaded machine a moment after the close.
        for _ in range(1000):  # 10 s at most
            if await checker.find_free({replica_id}) == {replica_id}:
                break
            await asyncio.sleep(0.01)
        else:
            pytest.fail("the released lock's connection is still listed after 10 s")


_CONNECTION_LOCKS = pytest.mark.parametrize(
    "kind",
    [
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("redis", marks=pytest.mark.redis),
    ],
)
"""The locks that live in a connection to the database (PostgreSQL, Redis)."""


@contextlib.contextmanager
def _through_a_hop(kind: str) -> Iterator[tuple[str, TcpProxy]]:
    """A fresh database of ``kind`` and a TCP hop in front of it that the test
    controls (``proxy.url_for(url)`` goes through it)."""
    with contextlib.ExitStack() as places:
        if kind == "postgres":
            url = places.enter_context(postgres_database())
        else:
            url = places.enter_context(redis_prefix())
        where = urlsplit(url)
        assert where.hostname is not None and where.port is not None
        yield url, places.enter_context(TcpProxy(where.hostname, where.port))


@_CONNECTION_LOCKS
async def test_a_partitioned_holders_lock_stays_held_and_a_reset_one_reads_free(
    kind: str,
) -> None:
    """Through a TCP hop the test controls: a dead network (bytes swallowed,
    no reset) leaves the server's session, and so the lock, in place, as a
    partitioned replica must keep its turns until the dead threshold; a reset
    ends the session, which reads as a gone replica (the needless takeover
    ``tether.runtime.presence`` accepts for a lock lost by a live replica)."""
    replica_id = uuid.uuid4().hex
    with _through_a_hop(kind) as (url, proxy):
        async with _lock(kind, proxy.url_for(url)) as partitioned, _lock(kind, url) as checker:
            await partitioned.hold(replica_id)
            try:
                proxy.stalled = True
                assert await checker.find_free({replica_id}) == set()
                proxy.cut()
                assert await _first_free(checker, {replica_id}) == {replica_id}
            finally:
                await partitioned.release()


@_CONNECTION_LOCKS
async def test_a_replica_whose_lock_is_reset_holds_a_new_one_once_the_server_is_back(
    kind: str,
) -> None:
    """A live replica's lock connection is reset (a database restart): its
    check finds the lock lost, names no producer while the server is out of
    reach, and holds a new lock under a new id once it is back; the old id
    stays free (other replicas may have judged it gone) and the new one reads
    held."""
    with _through_a_hop(kind) as (url, proxy):
        async with _lock(kind, proxy.url_for(url)) as mine, _lock(kind, url) as checker:
            changes: list[str | None] = []
            presence = ReplicaPresence(mine)
            await presence.start(on_change=changes.append)
            try:
                first = presence.producer
                assert first is not None
                assert await presence.keep() is False
                assert await checker.find_free({first}) == set()

                proxy.cut()
                assert await presence.keep() is True
                assert presence.producer is None
                assert await _first_free(checker, {first}) == {first}
                trying = presence.replica_id
                assert await presence.keep() is False  # still out of reach
                assert presence.replica_id == trying  # retried, not a new id per retry

                proxy.start()
                assert await presence.keep() is True
                second = presence.producer
                assert second not in (None, first)
                assert await checker.find_free({first, second}) == {first}
                assert changes == [None, second]
                assert presence.lost == 1
            finally:
                await presence.aclose()


@contextlib.asynccontextmanager
async def _lock(kind: str, url: str) -> AsyncIterator[PresenceLock]:
    if kind == "postgres":
        async with PostgresDatabase.from_url(url) as database:
            yield PostgresPresenceLock(database)
    else:
        async with RedisConnection.from_url(url) as connection:
            yield RedisPresenceLock(connection)
