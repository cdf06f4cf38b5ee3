"""Push over PostgreSQL LISTEN/NOTIFY, Redis pub/sub and (SQLite, the file store)
Unix datagrams between the processes of one host: ``subscribe`` on the recording store.

Every test runs two "replicas" (two bundles on one store URL): one writes, the
other subscribes, so each announcement really travels through the server.
Each test first waits until the subscribing replica's channel is in effect
(``listen``), so no catch-up announcement (both kinds, sent to subscriptions
made before the channel was up) can mix in, and then checks exactly which
kinds arrive.

Synchronisation never sleeps: a test waits for an announcement under an
``asyncio.timeout``, and proves that something was *not* announced by writing
a marker of the other kind afterwards (each channel delivers announcements in
the order of their writes, so an announcement that should not exist would
come first). The only timed waits are the ``wait(0.3)`` checks that a
heartbeat announces nothing, which are timeouts, not synchronisation.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.support.backends import BACKENDS, Backend, open_bundle
from tether import stores
from tether.domain.chat_message import ChatMessage, ChatMessageSender
from tether.domain.chat_stream_recording_store import (
    ChangeSubscription,
    RecordedStreamEvent,
    RecordingPut,
    StreamChange,
)
from tether.domain.chat_stream_supervision_store import (
    ChatStreamStatus,
    ChatStreamSupervision,
    SupervisionSwap,
)
from tether.runtime.follower import has_push

PUSH_BACKENDS = [
    param for param in BACKENDS if param.values[0].name in ("file", "sqlite", "postgres", "redis")
]
"""The backends with a push channel (their marks come along)."""

RECORDING = frozenset({StreamChange.RECORDING})
SUPERVISION = frozenset({StreamChange.SUPERVISION})
NOTHING: frozenset[StreamChange] = frozenset()

_LONG = 60.0
"""A ``max_wait`` no test may sleep out: an announcement is due long before."""
_PROMPTLY = 5.0
"""How long an announcement may take to arrive (it takes milliseconds)."""


@pytest.fixture(params=PUSH_BACKENDS)
def backend(request: pytest.FixtureRequest) -> Backend:
    backend: Backend = request.param
    return backend


@dataclass
class Replica:
    """One replica's stores (typed loosely: ``listen`` is the adapters' own)."""

    recording: Any
    supervision: Any


@pytest.fixture
async def replicas(store_url: str) -> AsyncIterator[tuple[Replica, Replica]]:
    """The follower's and the producer's stores: two bundles, two connections."""
    async with (
        open_bundle(stores.from_url(store_url)) as follower,
        open_bundle(stores.from_url(store_url)) as producer,
    ):
        yield (
            Replica(follower.chat_stream_recording_store, follower.chat_stream_supervision_store),
            Replica(producer.chat_stream_recording_store, producer.chat_stream_supervision_store),
        )
        # Leave nothing running between tests: every subscription was closed.


@pytest.fixture
def conversation() -> tuple[str, str, str]:
    """Fresh ids: the PostgreSQL database is shared by the module's tests."""
    return ("tenant", "user", f"session-{uuid.uuid4().hex[:8]}")


_AT = datetime(2030, 1, 1, tzinfo=UTC)


def _row(
    epoch: int,
    *,
    status: ChatStreamStatus = ChatStreamStatus.RUNNING,
    seconds: int = 0,
    message_id: str = "m-1",
) -> ChatStreamSupervision:
    return ChatStreamSupervision(
        status=status,
        heartbeat_at=_AT + timedelta(seconds=seconds),
        message_id=message_id,
        epoch=epoch,
    )


def _event(index: int, epoch: int = 1, message_id: str = "m-1") -> RecordedStreamEvent:
    message = ChatMessage(sender=ChatMessageSender.BOT, content="so far" + " more" * index)
    return RecordedStreamEvent(index=index, message=message, message_id=message_id, epoch=epoch)


async def _heard(changes: ChangeSubscription) -> frozenset[StreamChange]:
    """The next announcement(s), which must come promptly."""
    async with asyncio.timeout(_PROMPTLY):
        return await changes.wait(_LONG)


async def test_every_shared_backend_announces_changes_itself(
    replicas: tuple[Replica, Replica],
) -> None:
    follower, _ = replicas
    assert has_push(follower.recording)


async def test_a_change_announced_while_the_holder_is_not_waiting_is_returned_at_once(
    replicas: tuple[Replica, Replica], conversation: tuple[str, str, str]
) -> None:
    follower, producer = replicas
    await follower.recording.listen()
    async with (
        follower.recording.subscribe(*conversation) as held,
        follower.recording.subscribe(*conversation) as probe,
    ):
        await producer.recording.put(*conversation, _event(0))
        # The probe proves the announcement has arrived; ``held`` was not waiting then.
        assert await _heard(probe) == RECORDING
        async with asyncio.timeout(1.0):  # pending already: no wait at all
            assert await held.wait(_LONG) == RECORDING
        # Heard once: the next wait has nothing pending.
        assert await held.wait(0) == NOTHING


async def test_a_subscription_made_before_the_channel_is_up_misses_nothing(
    replicas: tuple[Replica, Replica], conversation: tuple[str, str, str]
) -> None:
    # No listen() first: the subscription starts the channel itself. A write
    # made before the channel is in effect is announced to nobody; the
    # subscription then hears both kinds once the channel is up (a spurious
    # wake-up is allowed, a lost one is not).
    follower, producer = replicas
    async with follower.recording.subscribe(*conversation) as changes:
        await producer.recording.put(*conversation, _event(0))
        assert StreamChange.RECORDING in await _heard(changes)


async def test_a_heartbeat_announces_nothing(
    replicas: tuple[Replica, Replica], conversation: tuple[str, str, str]
) -> None:
    follower, producer = replicas
    await follower.recording.listen()
    async with follower.recording.subscribe(*conversation) as changes:
        assert await producer.supervision.compare_and_swap(*conversation, None, _row(1))
        assert await _heard(changes) == SUPERVISION
        # A heartbeat: a RUNNING swap at the epoch already held.
        assert await producer.supervision.compare_and_swap(*conversation, 1, _row(1, seconds=1))
        assert await changes.wait(0.3) == NOTHING
        # Heartbeats go out in batches too.
        heartbeat = SupervisionSwap(*conversation, 1, _row(1, seconds=2))
        assert await producer.supervision.compare_and_swap_many([heartbeat]) == [True]
        assert await changes.wait(0.3) == NOTHING
        # Had either announced anything, it would come before this put's announcement.
        assert await producer.supervision.compare_and_swap(*conversation, 1, _row(1, seconds=3))
        await producer.recording.put(*conversation, _event(0))
        assert await _heard(changes) == RECORDING


async def test_every_change_of_epoch_announces_supervision(
    replicas: tuple[Replica, Replica], conversation: tuple[str, str, str]
) -> None:
    follower, producer = replicas
    supervision = producer.supervision
    await follower.recording.listen()
    async with follower.recording.subscribe(*conversation) as changes:
        assert await supervision.compare_and_swap(*conversation, None, _row(1))  # a claim
        assert await _heard(changes) == SUPERVISION
        takeover = _row(2, message_id="m-2")
        assert await supervision.compare_and_swap(*conversation, 1, takeover)
        assert await _heard(changes) == SUPERVISION
        cancel = _row(3, status=ChatStreamStatus.CANCELLED, message_id="m-2")
        assert await supervision.compare_and_swap_many([SupervisionSwap(*conversation, 2, cancel)])
        assert await _heard(changes) == SUPERVISION
        await supervision.delete(*conversation, "m-2", 3)  # clean-up: the row is gone
        assert await _heard(changes) == SUPERVISION
        claim = SupervisionSwap(*conversation, None, _row(4, message_id="m-4"))
        assert await supervision.compare_and_swap_many([claim]) == [True]
        assert await _heard(changes) == SUPERVISION
        # Refused writes announce nothing (the put's announcement comes first).
        assert not await supervision.compare_and_swap(*conversation, 3, _row(5))
        assert not await supervision.compare_and_swap(*conversation, None, _row(9))
        await producer.recording.put(*conversation, _event(0, epoch=4, message_id="m-4"))
        assert await _heard(changes) == RECORDING


async def test_every_recording_write_announces_recording(
    replicas: tuple[Replica, Replica], conversation: tuple[str, str, str]
) -> None:
    follower, producer = replicas
    recording = producer.recording
    await follower.recording.listen()
    async with follower.recording.subscribe(*conversation) as changes:
        await recording.put(*conversation, _event(0))
        assert await _heard(changes) == RECORDING
        assert await recording.put_many([RecordingPut(*conversation, _event(1))]) == [True]
        assert await _heard(changes) == RECORDING
        await recording.delete(*conversation, "m-1")
        assert await _heard(changes) == RECORDING
        # A fence changes no record and announces nothing; nor does a fenced put.
        await recording.fence(*conversation, 5)
        assert await recording.put_many([RecordingPut(*conversation, _event(2))]) == [False]
        assert await producer.supervision.compare_and_swap(*conversation, None, _row(5))
        assert await _heard(changes) == SUPERVISION


async def test_subscriptions_hear_only_their_own_conversation(
    replicas: tuple[Replica, Replica], conversation: tuple[str, str, str]
) -> None:
    follower, producer = replicas
    first = conversation
    second = (conversation[0], conversation[1], conversation[2] + "-other")
    await follower.recording.listen()
    async with (
        follower.recording.subscribe(*first) as first_changes,
        follower.recording.subscribe(*second) as second_changes,
    ):
        await producer.recording.put(*first, _event(0))
        assert await producer.supervision.compare_and_swap(*second, None, _row(1))
        # Announcements arrive in the order of their writes: had the second
        # subscription heard the first conversation's put, it would have it now.
        assert await _heard(second_changes) == SUPERVISION
        assert await first_changes.wait(0) == RECORDING
        assert await second_changes.wait(0) == NOTHING


async def test_wait_for_change_still_wakes_on_a_change(
    replicas: tuple[Replica, Replica], conversation: tuple[str, str, str]
) -> None:
    follower, producer = replicas
    await follower.recording.listen()
    async with follower.recording.subscribe(*conversation) as probe:
        waiting = asyncio.ensure_future(follower.recording.wait_for_change(*conversation, _LONG))
        # Let the waiter register (a wait_for_change hears only what comes after).
        for _ in range(10):
            await asyncio.sleep(0)
        await producer.recording.put(*conversation, _event(0))
        assert await _heard(probe) == RECORDING
        async with asyncio.timeout(_PROMPTLY):
            assert await waiting is True


async def test_a_hand_off_announcement_wakes_every_takeover_loop_and_no_conversation(
    replicas: tuple[Replica, Replica], conversation: tuple[str, str, str]
) -> None:
    """``announce_dead_turns`` (a drain's hand-off) reaches another replica's
    ``subscribe_dead_turns``, whose takeover loop then scans at once; it is no
    conversation's change, and no conversation's change is heard as it."""
    follower, producer = replicas
    await follower.recording.listen()
    async with (
        follower.supervision.subscribe_dead_turns() as dead_turns,
        follower.recording.subscribe(*conversation) as changes,
    ):
        assert await producer.supervision.compare_and_swap(*conversation, None, _row(1))
        await producer.recording.put(*conversation, _event(0))
        heard: set[StreamChange] = set()
        while StreamChange.RECORDING not in heard:
            heard |= await _heard(changes)
        await producer.supervision.announce_dead_turns()
        # Announcements arrive in the order they were sent: had the loop's
        # subscription heard the conversation's writes, it would hold them now.
        assert await _heard(dead_turns) == SUPERVISION
        assert await changes.wait(0) == NOTHING
