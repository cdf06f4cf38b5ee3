"""Retention run by the servers: ``TETHER_RETENTION``, one replica at a time.

Each run is driven directly (``run_once``) over real stores, on every shipped
backend (Redis paired with one in-memory conversation store that all its
replicas share: it has none of its own). Two replicas are two sets of store
objects on the same URL (one set in memory, which no other process sees). A
race is staged with ``tether.testing.interleavings.hold``, and the loop's wait
between runs is a ``sleep`` the test releases, so no test sleeps.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from tests.support.backends import BACKENDS
from tests.support.clusters import ReplicaStores
from tests.support.inprocess import build
from tests.support.scripted import question
from tests.support.seed_only import SeedOnlyConversationStore
from tether.adapters.memory import InMemoryChatConversationStore
from tether.domain.chat_message import ChatMessage, ChatMessageSender
from tether.domain.chat_stream_recording_store import RecordedStreamEvent
from tether.domain.chat_stream_supervision_store import ChatStreamStatus, ChatStreamSupervision
from tether.domain.store_errors import StoreUnavailableError
from tether.handlers.retention import (
    LEASE_KEY,
    RetentionOff,
    RetentionRunner,
)
from tether.runtime.turn_stores import TurnStores
from tether.settings import settings_from_env
from tether.stores import from_url
from tether.testing.interleavings import hold

DAY = 86400.0
INTERVAL = timedelta(hours=1)
_WITHIN = 10.0
"""Seconds a test waits for the background task before it fails."""


def _runner(
    replica_stores: ReplicaStores, stores: TurnStores, holder: str, **extra: Any
) -> RetentionRunner:
    return RetentionRunner(
        stores,
        older_than=timedelta(days=30),
        interval=INTERVAL,
        dead_after=timedelta(seconds=3),
        clock=replica_stores.clock,
        holder=holder,
        **extra,
    )


async def _forget_the_lease(stores: TurnStores) -> None:
    """The tests of a module share one PostgreSQL database: a lease row left
    by an earlier test (under another clock) is removed, as the store allows."""
    assert stores.supervision is not None
    key = LEASE_KEY
    row = await stores.supervision.read(key.tenant, key.requester_uuid, key.session_id)
    if row is not None:
        await stores.supervision.delete(
            key.tenant, key.requester_uuid, key.session_id, row.message_id, row.epoch
        )


async def _seed(replica_stores: ReplicaStores, session: str) -> None:
    """A finished turn of Alice's: transcript, checkpoint, recording, supervision row."""
    s, tenant, message_id = replica_stores.a, replica_stores.tenant, f"m-{session}"
    assert s.conversation and s.agent_state and s.recording and s.supervision
    await s.conversation.append_messages(
        tenant,
        "alice",
        session,
        "scripted",
        [question("keep this for me")],
        last_turn_status="complete",
    )
    await s.agent_state.save(tenant, "alice", session, {"notebook": {"pages": 1}})
    answer = ChatMessage(sender=ChatMessageSender.BOT, content="kept")
    await s.recording.put(
        tenant,
        "alice",
        session,
        RecordedStreamEvent(index=0, message=answer, message_id=message_id, epoch=1),
    )
    row = ChatStreamSupervision(
        status=ChatStreamStatus.DONE,
        heartbeat_at=replica_stores.clock(),
        message_id=message_id,
        epoch=1,
    )
    assert await s.supervision.compare_and_swap(tenant, "alice", session, None, row)


async def _everything(replica_stores: ReplicaStores, session: str) -> dict[str, Any]:
    """What every store holds of Alice's conversation (read by replica b)."""
    s, tenant = replica_stores.b, replica_stores.tenant
    assert s.conversation and s.agent_state and s.recording and s.supervision
    return {
        "transcript": await s.conversation.get_transcript(tenant, "alice", session),
        "conversation": await s.conversation.get_conversation(tenant, "alice", session),
        "checkpoint": await s.agent_state.load(tenant, "alice", session),
        "recording": await s.recording.read(tenant, "alice", session),
        "supervision": await s.supervision.read(tenant, "alice", session),
    }


_ERASED = {
    "transcript": [],
    "conversation": None,
    "checkpoint": {},
    "recording": None,
    "supervision": None,
}


async def _old_and_fresh(replica_stores: ReplicaStores) -> None:
    """``s-old``, last updated 40 days ago, and ``s-fresh``, updated now (and
    no lease left by an earlier test)."""
    await _forget_the_lease(replica_stores.a)
    await _seed(replica_stores, "s-old")
    replica_stores.clock.advance(40 * DAY)
    await _seed(replica_stores, "s-fresh")


def _sessions(replica_stores: ReplicaStores, summaries: list[Any]) -> list[str]:
    return [s.session_id for s in summaries if s.tenant == replica_stores.tenant]


def _is_renewal(tenant: str, owner: str, session: str, expected: int | None, row: Any) -> bool:
    """A compare-and-swap that renews the retention lease (same epoch)."""
    return tenant == LEASE_KEY.tenant and row.epoch == expected


# (a) a run erases what is old, with everything it owns ----------------------------------


async def test_a_run_erases_an_old_conversation_and_all_it_owns_and_keeps_a_recent_one(
    replica_stores: ReplicaStores,
) -> None:
    await _old_and_fresh(replica_stores)
    fresh = await _everything(replica_stores, "s-fresh")
    assert all(fresh[name] != erased for name, erased in _ERASED.items()), fresh

    run = await _runner(replica_stores, replica_stores.a, "replica-a").run_once()

    assert run.report is not None and not run.lease_lost
    assert _sessions(replica_stores, run.report.removed) == ["s-old"]
    assert run.report.cutoff == replica_stores.clock() - timedelta(days=30)
    assert await _everything(replica_stores, "s-old") == _ERASED
    assert await _everything(replica_stores, "s-fresh") == fresh


# (b) one replica at a time ---------------------------------------------------------------


async def test_of_two_replicas_racing_for_a_period_only_one_prunes(
    replica_stores: ReplicaStores,
) -> None:
    await _old_and_fresh(replica_stores)
    a = _runner(replica_stores, replica_stores.a, "replica-a")
    b = _runner(replica_stores, replica_stores.b, "replica-b")
    assert replica_stores.a.conversation is not None
    # Replica a takes the lease, then waits here, before it lists anything.
    held = hold(replica_stores.a.conversation, "list_stale_conversations")
    first = asyncio.create_task(a.run_once())
    await held.reached()

    other = await b.run_once()
    assert other.report is None and other.held_by == "replica-a"
    assert await _everything(replica_stores, "s-old") != _ERASED

    held.release()
    run = await first
    assert run.report is not None and _sessions(replica_stores, run.report.removed) == ["s-old"]
    assert await _everything(replica_stores, "s-old") == _ERASED

    # The lease covers the period: b keeps out of it even after a's run ended,
    # while a's own next run takes it again.
    replica_stores.clock.advance(INTERVAL.total_seconds() / 2)
    assert (await b.run_once()).held_by == "replica-a"
    assert (await a.run_once()).report is not None
    # Once a period passes without a, b takes over.
    replica_stores.clock.advance(INTERVAL.total_seconds() + 1)
    taken = await b.run_once()
    assert taken.report is not None and taken.held_by is None
    assert (await a.run_once()).held_by == "replica-b"


async def test_a_replica_whose_lease_expired_stops_before_its_next_erase(
    replica_stores: ReplicaStores,
) -> None:
    await _old_and_fresh(replica_stores)
    a = _runner(replica_stores, replica_stores.a, "replica-a")
    b = _runner(replica_stores, replica_stores.b, "replica-b")
    assert replica_stores.a.supervision is not None
    # Replica a has listed s-old and is about to renew its lease before the erase.
    held = hold(replica_stores.a.supervision, "compare_and_swap", when=_is_renewal)
    first = asyncio.create_task(a.run_once())
    await held.reached()

    # a is paused past its lease: b takes it over and prunes.
    replica_stores.clock.advance(INTERVAL.total_seconds() + 1)
    taken = await b.run_once()
    assert taken.report is not None and _sessions(replica_stores, taken.report.removed) == ["s-old"]

    held.release()
    late = await first
    assert late.lease_lost
    assert late.report is not None and late.report.removed == []
    assert await _everything(replica_stores, "s-old") == _ERASED


# (c) the setting and the start-up message ------------------------------------------------


def test_the_setting_reads_ages_as_the_prune_command_does() -> None:
    assert settings_from_env({}).retention is None
    assert settings_from_env({}).retention_interval == 3600.0
    assert settings_from_env({"TETHER_RETENTION": ""}).retention is None
    assert settings_from_env({"TETHER_RETENTION": "30d"}).retention == 30 * DAY
    assert settings_from_env({"TETHER_RETENTION": "12h"}).retention == 12 * 3600
    assert settings_from_env({"TETHER_RETENTION": "7"}).retention == 7 * DAY
    tuned = settings_from_env({"TETHER_RETENTION": "2w", "TETHER_RETENTION_INTERVAL": "600"})
    assert (tuned.retention, tuned.retention_interval) == (14 * DAY, 600.0)
    with pytest.raises(ValueError, match="TETHER_RETENTION: 'soon' is not an age"):
        settings_from_env({"TETHER_RETENTION": "soon"})
    with pytest.raises(ValueError, match="TETHER_RETENTION_INTERVAL must be positive"):
        settings_from_env({"TETHER_RETENTION": "30d", "TETHER_RETENTION_INTERVAL": "0"})


def _memory_stores(**overrides: Any) -> TurnStores:
    bundle = from_url("memory://")
    stores = TurnStores(
        agent_state=bundle.agent_state_store,
        recording=bundle.chat_stream_recording_store,
        supervision=bundle.chat_stream_supervision_store,
        conversation=bundle.chat_conversation_store,
    )
    return replace(stores, **overrides)


@asynccontextmanager
async def _serving(app: Any) -> AsyncIterator[None]:
    """The app's lifespan: start-up on entry, shutdown on exit."""
    async with app.router.lifespan_context(app):
        yield


@pytest.mark.parametrize(
    ("overrides", "retention", "level", "reason"),
    [
        pytest.param({}, None, logging.INFO, "TETHER_RETENTION is unset", id="unset"),
        pytest.param(
            {"conversation": None},
            30 * DAY,
            logging.WARNING,
            "no conversation store is wired",
            id="no-conversations",
        ),
        pytest.param(
            {"supervision": None},
            30 * DAY,
            logging.WARNING,
            "no supervision store is wired, and its compare-and-swap",
            id="no-supervision",
        ),
        pytest.param(
            {"conversation": SeedOnlyConversationStore()},
            30 * DAY,
            logging.WARNING,
            "SeedOnlyConversationStore does not implement list_stale_conversations, "
            "get_conversation, delete_conversation",
            id="seed-only-conversations",
        ),
    ],
)
async def test_the_server_says_at_start_up_why_retention_is_off(
    overrides: dict[str, Any],
    retention: float | None,
    level: int,
    reason: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = build(_memory_stores(**overrides), retention=retention)
    assert isinstance(app.state.retention, RetentionOff)
    with caplog.at_level(logging.INFO, logger="tether.api.app"):
        async with _serving(app):
            pass
    said = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "tether.api.app"]
    assert (level, f"retention is off: {app.state.retention.reason}") in said
    assert reason in app.state.retention.reason


async def test_the_server_says_when_retention_is_on(caplog: pytest.LogCaptureFixture) -> None:
    stores = _memory_stores(conversation=InMemoryChatConversationStore())
    app = build(stores, retention=30 * DAY, retention_interval=600.0)
    assert isinstance(app.state.retention, RetentionRunner)
    with caplog.at_level(logging.INFO, logger="tether.api.app"):
        async with _serving(app):
            pass
    assert any(
        "retention is on" in r.getMessage() and "every 600.0 s" in r.getMessage()
        for r in caplog.records
    )


# (d) the loop: runs, survives a failure, stops on shutdown -------------------------------


class _Ticks:
    """The loop's ``sleep``: returns only when the test ticks."""

    def __init__(self) -> None:
        self.asked: list[float] = []
        self._asleep = asyncio.Event()
        self._wake = asyncio.Event()

    async def sleep(self, seconds: float) -> None:
        self.asked.append(seconds)
        self._wake.clear()
        self._asleep.set()
        await self._wake.wait()

    async def asleep(self) -> None:
        """Wait until the loop sleeps (its run has ended); bounded."""
        async with asyncio.timeout(_WITHIN):
            await self._asleep.wait()
        self._asleep.clear()

    def tick(self) -> None:
        self._wake.set()


only_memory = pytest.mark.parametrize("backend", BACKENDS[:1], indirect=True)
"""The tests of the runner's loop and the server's wiring: memory is enough."""


@only_memory
async def test_a_failed_run_is_logged_and_the_next_interval_runs_again(
    replica_stores: ReplicaStores, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _old_and_fresh(replica_stores)
    conversations = replica_stores.a.conversation
    assert conversations is not None
    listing = conversations.list_stale_conversations
    failures = [StoreUnavailableError("the database is restarting")]

    async def flaky(*args: Any, **kwargs: Any) -> Any:
        if failures:
            raise failures.pop()
        return await listing(*args, **kwargs)

    monkeypatch.setattr(conversations, "list_stale_conversations", flaky)
    ticks = _Ticks()
    runner = _runner(replica_stores, replica_stores.a, "replica-a", sleep=ticks.sleep)
    with caplog.at_level(logging.INFO, logger="tether.handlers.retention"):
        runner.start()
        await ticks.asleep()
        assert [r.getMessage() for r in caplog.records] == [
            "retention run failed; the next one is in 3600.0 s"
        ]
        assert await _everything(replica_stores, "s-old") != _ERASED
        ticks.tick()
        await ticks.asleep()
        assert ticks.asked == [3600.0, 3600.0]
        assert await _everything(replica_stores, "s-old") == _ERASED
        assert "retention: removed 1 conversation(s)" in caplog.records[-1].getMessage()
        await runner.aclose()
    assert not runner.running


@only_memory
async def test_the_loop_stops_between_runs(replica_stores: ReplicaStores) -> None:
    ticks = _Ticks()
    runner = _runner(replica_stores, replica_stores.a, "replica-a", sleep=ticks.sleep)
    runner.start()
    await ticks.asleep()
    assert runner.running
    await runner.aclose()
    assert not runner.running


@only_memory
async def test_the_server_runs_retention_at_start_up_and_stops_it_on_shutdown(
    replica_stores: ReplicaStores,
) -> None:
    await _old_and_fresh(replica_stores)
    app = build(replica_stores.a, clock=replica_stores.clock, retention=30 * DAY)
    runner = app.state.retention
    assert isinstance(runner, RetentionRunner) and not runner.running
    assert replica_stores.a.conversation is not None
    held = hold(replica_stores.a.conversation, "list_stale_conversations")
    async with _serving(app):
        # The first run starts with the server; shutdown comes while it is in a store call.
        await held.reached()
        assert runner.running
    assert not runner.running
    held.release()
    # Stopped in the middle, before erasing anything; the next run finishes the job.
    assert await _everything(replica_stores, "s-old") != _ERASED
    run = await runner.run_once()
    assert run.report is not None and _sessions(replica_stores, run.report.removed) == ["s-old"]
