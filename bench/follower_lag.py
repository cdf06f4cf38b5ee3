"""Follower lag: from a producer's recording put to the follower's next event, on
another store object (another replica), with push against poll."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

from bench._backends import backend_url, close_all, open_bundle
from bench._stats import summary
from tether.domain.chat_message import ChatMessage, ChatMessageSender
from tether.domain.chat_stream_recording_store import ChatStreamRecordingStore, RecordedStreamEvent
from tether.domain.chat_stream_supervision_store import ChatStreamStatus, ChatStreamSupervision
from tether.runtime.follower import RecordingFollower, has_push
from tether.runtime.lease import ConversationKey
from tether.runtime.live_buffer import StreamEvent
from tether.settings import TetherSettings


class _PollOnly(ChatStreamRecordingStore):
    """The same backend without its push channel: what a poll-only follower sees."""

    def __init__(self, inner: ChatStreamRecordingStore) -> None:
        self._inner = inner

    async def put(self, tenant, requester_uuid, session_id, event):
        await self._inner.put(tenant, requester_uuid, session_id, event)

    async def read(self, tenant, requester_uuid, session_id):
        return await self._inner.read(tenant, requester_uuid, session_id)

    async def delete(self, tenant, requester_uuid, session_id, message_id):
        await self._inner.delete(tenant, requester_uuid, session_id, message_id)


async def measure(backend: str, flushes: int) -> dict[str, dict[str, float]]:
    settings = TetherSettings()
    results: dict[str, dict[str, float]] = {}
    with backend_url(backend) as url:
        producer, opened = await open_bundle(url)
        follower_bundle, opened_too = (
            await open_bundle(url) if backend != "memory" else (producer, [])
        )
        try:
            recording = follower_bundle.chat_stream_recording_store  # type: ignore[attr-defined]
            modes = {"poll": _PollOnly(recording)}
            if has_push(recording):
                modes["push"] = recording
            for mode, store in modes.items():
                session = f"lag-{mode}"
                results[mode] = summary(
                    await _lag(producer, follower_bundle, store, session, flushes, settings, mode)
                )
        finally:
            await close_all(opened_too)
            await close_all(opened)
    return results


async def _lag(producer, follower_bundle, store, session, flushes, settings, mode):
    supervision = producer.chat_stream_supervision_store
    row = ChatStreamSupervision(
        status=ChatStreamStatus.RUNNING, heartbeat_at=datetime.now(UTC), message_id="m", epoch=1
    )
    await supervision.compare_and_swap("t", "u", session, None, row)
    follower = RecordingFollower(
        store,
        follower_bundle.chat_stream_supervision_store,
        ConversationKey("t", "u", session),
        "m",
        clock=lambda: datetime.now(UTC),
        dead_after=timedelta(seconds=60),
        poll_interval=(
            settings.follower_push_fallback_interval
            if mode == "push"
            else settings.follower_poll_interval
        ),
    )
    put_at: dict[int, float] = {}
    lags: list[float] = []

    async def produce() -> None:
        for i in range(flushes):
            await asyncio.sleep(0.05 + (i % 7) * 0.013)  # off the poll grid
            message = ChatMessage(sender=ChatMessageSender.BOT, content="word " * (i + 1))
            event = RecordedStreamEvent(index=i, message=message, message_id="m", epoch=1)
            await producer.chat_stream_recording_store.put("t", "u", session, event)
            put_at[i] = time.monotonic()
        done = row.model_copy(update={"status": ChatStreamStatus.DONE})
        await supervision.compare_and_swap("t", "u", session, 1, done)

    task = asyncio.ensure_future(produce())
    async for item in follower.follow(0):
        if isinstance(item, StreamEvent) and item.index in put_at:
            lags.append(time.monotonic() - put_at[item.index])
    await task
    return lags
