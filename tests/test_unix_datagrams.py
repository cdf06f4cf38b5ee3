"""The local push channel's edges: dead replicas' sockets, deep directories,
large deltas, full queues, and a directory it cannot listen in.

Two channels on one directory stand for two replicas (each binds its own
socket, exactly as two processes would); a dead replica is a real process,
killed. Waits are on the announcement itself, under a timeout that only bounds
a failure.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tether.adapters.unix_datagrams import UnixDatagramChannel, conversation_key
from tether.domain.chat_message import ChatMessage, ChatMessageSender
from tether.domain.chat_stream_recording_store import EVERYTHING, StreamChange
from tether.domain.stream_delta import Append, StreamDelta

RECORDING = frozenset({StreamChange.RECORDING})
_LONG = 60.0
"""A ``max_wait`` no test may sleep out."""
_PROMPTLY = 5.0
"""How long an announcement may take to arrive (it takes microseconds)."""

KEY = conversation_key("tenant", "user", "session")


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[tuple[UnixDatagramChannel, UnixDatagramChannel]]:
    """A listening replica's channel and a sending replica's, on one directory."""
    listener = UnixDatagramChannel(tmp_path / "wake")
    sender = UnixDatagramChannel(tmp_path / "wake")
    try:
        yield listener, sender
    finally:
        await listener.aclose()
        await sender.aclose()


def _sockets(directory: Path) -> list[str]:
    return sorted(os.listdir(directory))


def test_conversation_keys_are_short_stable_and_distinct() -> None:
    # The same in every process (no per-process hash seed), whatever the ids hold.
    assert KEY == conversation_key("tenant", "user", "session")
    assert len(KEY) == 32
    assert conversation_key("t", None, "s") == conversation_key("t", "", "s")
    assert conversation_key("a\0b", "", "c") != conversation_key("a", "b", "c")


async def test_a_subscription_hears_another_channels_announcement_and_no_other_key(
    pair: tuple[UnixDatagramChannel, UnixDatagramChannel],
) -> None:
    listener, sender = pair
    other = conversation_key("tenant", "user", "other")
    async with listener.subscribe(KEY) as changes, listener.subscribe(other) as others:
        sender.announce([(KEY, StreamChange.RECORDING), (KEY, StreamChange.WATCH)])
        async with asyncio.timeout(_PROMPTLY):
            heard = await changes.wait(_LONG)
        assert heard == {StreamChange.RECORDING, StreamChange.WATCH}
        assert await others.wait(0) == frozenset()


async def test_a_dead_replicas_socket_is_removed_by_the_next_sender(
    pair: tuple[UnixDatagramChannel, UnixDatagramChannel], tmp_path: Path
) -> None:
    """A SIGKILLed replica leaves its socket file; the next announcement is
    refused there (nobody is bound) and removes it, and still reaches the living."""
    listener, sender = pair
    directory = tmp_path / "wake"
    async with listener.subscribe(KEY) as changes:
        mine = _sockets(directory)
        script = (
            "import asyncio, sys\n"
            "from tether.adapters.unix_datagrams import UnixDatagramChannel\n"
            "async def main():\n"
            f"    UnixDatagramChannel({str(directory)!r}).listen()\n"
            "    print('listening', flush=True)\n"
            "    await asyncio.Event().wait()\n"
            "asyncio.run(main())\n"
        )
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-c", script, stdout=asyncio.subprocess.PIPE
        )
        try:
            assert child.stdout is not None
            async with asyncio.timeout(_PROMPTLY * 6):  # a cold interpreter on a busy host
                assert await child.stdout.readline() == b"listening\n"
        finally:
            child.send_signal(signal.SIGKILL)
            await child.wait()
        left = set(_sockets(directory)) - set(mine)
        assert len(left) == 1, "the killed replica left its socket behind"

        sender.announce([(KEY, StreamChange.RECORDING)])

        assert _sockets(directory) == mine
        async with asyncio.timeout(_PROMPTLY):
            assert await changes.wait(_LONG) == RECORDING


async def test_a_directory_too_deep_for_a_socket_address_still_carries_announcements(
    tmp_path: Path,
) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60) / "wake"
    assert len(os.fsencode(deep)) > 107
    listener, sender = UnixDatagramChannel(deep), UnixDatagramChannel(deep)
    try:
        async with listener.subscribe(KEY) as changes:
            assert listener.listening
            sender.announce([(KEY, StreamChange.SUPERVISION)])
            async with asyncio.timeout(_PROMPTLY):
                assert await changes.wait(_LONG) == {StreamChange.SUPERVISION}
    finally:
        await listener.aclose()
        await sender.aclose()


def _delta(text: str, first_index: int = 1) -> StreamDelta:
    return StreamDelta("m-1", 1, first_index, (Append(text),))


async def test_a_delta_travels_whole_and_one_too_large_for_a_datagram_as_a_wake_up(
    pair: tuple[UnixDatagramChannel, UnixDatagramChannel],
) -> None:
    listener, sender = pair
    async with listener.subscribe(KEY) as changes:
        changes.want_deltas()
        sender.announce_deltas([(KEY, _delta("a token"))])
        async with asyncio.timeout(_PROMPTLY):
            assert await changes.wait(_LONG) == {StreamChange.DELTA}
        assert changes.take_deltas() == [_delta("a token")]

        sender.announce_deltas([(KEY, _delta("x" * 100_000, first_index=2))])
        async with asyncio.timeout(_PROMPTLY):
            assert await changes.wait(_LONG) == RECORDING  # read the snapshot
        assert changes.take_deltas() == []


async def test_a_whole_message_delta_keeps_its_text_across_the_channel(
    pair: tuple[UnixDatagramChannel, UnixDatagramChannel],
) -> None:
    listener, sender = pair
    message = ChatMessage(sender=ChatMessageSender.BOT, content="line one\nline two \u2028 ü")
    delta = StreamDelta("m-1", 3, 0, (message,))
    async with listener.subscribe(KEY) as changes:
        changes.want_deltas()
        sender.announce_deltas([(KEY, delta)])
        async with asyncio.timeout(_PROMPTLY):
            await changes.wait(_LONG)
        assert changes.take_deltas() == [delta]


async def test_a_thousand_announcements_of_one_call_all_arrive(
    pair: tuple[UnixDatagramChannel, UnixDatagramChannel],
) -> None:
    """The kernel queues only a few datagrams per socket (often 10): one call's
    announcements travel together, so a replica's flush of a thousand turns
    reaches every follower."""
    listener, sender = pair
    keys = [conversation_key("tenant", "user", f"session-{n}") for n in range(1000)]
    subscriptions = [listener.subscribe(key) for key in keys]
    try:
        sender.announce((key, StreamChange.RECORDING) for key in keys)
        # Datagrams arrive in order: once the last key is heard, all were.
        async with asyncio.timeout(_PROMPTLY):
            assert await subscriptions[-1].wait(_LONG) == RECORDING
        assert [await s.wait(0) for s in subscriptions[:-1]] == [RECORDING] * 999
    finally:
        for subscription in subscriptions:
            await subscription.aclose()


async def test_a_full_queue_loses_announcements_without_blocking_the_sender(
    pair: tuple[UnixDatagramChannel, UnixDatagramChannel],
) -> None:
    listener, sender = pair
    async with listener.subscribe(KEY) as changes:
        # The listener's loop does not run between these: its queue fills up,
        # and the sender neither blocks nor raises.
        for _ in range(1000):
            sender.announce([(KEY, StreamChange.RECORDING)])
        async with asyncio.timeout(_PROMPTLY):
            assert await changes.wait(_LONG) == RECORDING


async def test_a_replica_that_cannot_listen_polls(tmp_path: Path) -> None:
    """The directory cannot be made (a file is in its way): a follower's
    subscription (it wants deltas) polls, each wait answering both kinds of
    write after the poll interval; any other holder's hears nothing, as
    without a channel; and announcing there does nothing."""
    blocked = tmp_path / "wake"
    blocked.write_text("not a directory")
    channel = UnixDatagramChannel(blocked, poll_interval=0.01)
    try:
        async with channel.subscribe(KEY) as follower, channel.subscribe(KEY) as producer:
            assert not channel.listening
            follower.want_deltas()
            async with asyncio.timeout(_PROMPTLY):
                assert await follower.wait(_LONG) == EVERYTHING
            assert await follower.wait(0) == frozenset()
            assert await producer.wait(0.02) == frozenset()
        channel.announce([(KEY, StreamChange.RECORDING)])
    finally:
        await channel.aclose()


async def test_closing_removes_the_socket_file_and_ends_a_wait(
    pair: tuple[UnixDatagramChannel, UnixDatagramChannel], tmp_path: Path
) -> None:
    listener, _ = pair
    changes = listener.subscribe(KEY)
    assert len(_sockets(tmp_path / "wake")) == 1
    waiting = asyncio.ensure_future(changes.wait(_LONG))
    await listener.aclose()
    async with asyncio.timeout(_PROMPTLY):
        assert await waiting == frozenset()
    assert _sockets(tmp_path / "wake") == []
    await changes.aclose()
