"""Races for a dead turn against every shared backend's real stores.

``tests/test_takeover.py`` stages the takeover's decisions on memory stores;
here the race that matters is the store's own: two survivors scanning at
once, or a survivor's scan against a client's resume, both reaching the
backend's compare-and-swap (SQLite's and PostgreSQL's statements, Redis's
script, the file store's lock) concurrently. Exactly one wins the epoch and
produces; the transcript holds one answer.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from tests.support.backends import CROSS_PROCESS_BACKENDS
from tests.support.scripted import Script, ScriptedCluster
from tether.domain.chat_message import ChatMessageSender
from tether.handlers.chat_handler import ChatHandler
from tether.handlers.errors import ConversationBusyError, TurnEndedError
from tether.handlers.turn import Turn

pytestmark = [
    pytest.mark.parametrize("backend", CROSS_PROCESS_BACKENDS, indirect=True),
    # Dead by age, on the manual clock (presence locks are raced in
    # tests/test_takeover_processes.py, with real processes). Redis keeps no
    # transcripts: the answer is read from a memory one there.
    pytest.mark.cluster(takeover_scan_interval=0.01, presence=False),
]


async def _started(cluster: ScriptedCluster, message_id: str, producer: int) -> Script:
    script = cluster.scripts.of(message_id, producer)
    async with asyncio.timeout(10):
        await script.started.wait()
    return script


async def _a_dead_turn(cluster: ScriptedCluster) -> tuple[str, Turn, ChatHandler, ChatHandler]:
    """A turn of a fresh conversation whose producer died (as SIGKILL leaves
    it: no verdict, its heartbeat aging past the threshold), and two survivors."""
    session = f"race-{uuid.uuid4().hex[:12]}"
    a, b, c = cluster.replica(), cluster.replica(), cluster.replica()
    turn = await cluster.start(a, session)
    first = await _started(cluster, turn.message_id, 0)
    first.say("Half an answer")
    await first.spoken()
    await a.shutdown()
    cluster.kill_by_silence()
    return session, turn, b, c


async def _one_answer(cluster: ScriptedCluster, session: str, producer: Turn) -> None:
    script = await _started(cluster, producer.message_id, 1)
    assert not cluster.scripts.of(producer.message_id, 2).started.is_set()
    script.say("One answer.")
    script.finish()
    assert await cluster.ended(producer) == "done"
    bots = [m for m in await cluster.transcript(session) if m.sender is ChatMessageSender.BOT]
    assert [m.content for m in bots] == ["One answer."]


async def test_two_survivors_racing_for_a_dead_turn_leave_one_producer(
    backend_cluster: ScriptedCluster,
) -> None:
    session, turn, b, c = await _a_dead_turn(backend_cluster)
    taken = await asyncio.gather(b.takeovers.scan(), c.takeovers.scan())
    assert sorted(taken) == [0, 1]
    [producer] = [
        r.local_turn(turn.message_id) for r in (b, c) if r.local_turn(turn.message_id) is not None
    ]
    await _one_answer(backend_cluster, session, producer)


async def test_a_clients_resume_racing_a_survivors_takeover_leaves_one_producer(
    backend_cluster: ScriptedCluster,
) -> None:
    session, turn, b, c = await _a_dead_turn(backend_cluster)
    scanned, resumed = await asyncio.gather(
        b.takeovers.scan(),
        backend_cluster.start(c, session, resume=turn.message_id),
        return_exceptions=True,
    )
    won_by_client = isinstance(resumed, Turn)
    assert won_by_client != (scanned == 1), (scanned, resumed)
    if not won_by_client:
        assert isinstance(resumed, ConversationBusyError | TurnEndedError)
    winner = c if won_by_client else b
    await _one_answer(backend_cluster, session, winner.local_turn(turn.message_id))
