"""Store operations per backend: compare-and-swap, recording put and read, checkpoint save.

Each figure is a per-operation latency (median and p99), and its ratio to the
in-memory backend measured in the same run.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from bench._backends import backend_url, close_all, open_bundle
from bench._stats import summary
from tether.domain.chat_message import ChatMessage, ChatMessageSender
from tether.domain.chat_stream_recording_store import RecordedStreamEvent
from tether.domain.chat_stream_supervision_store import ChatStreamStatus, ChatStreamSupervision


async def _timed(operation: Callable[[int], Awaitable[Any]], count: int) -> list[float]:
    samples = []
    for i in range(count):
        started = time.perf_counter()
        await operation(i)
        samples.append(time.perf_counter() - started)
    return samples


async def measure(backend: str, count: int) -> dict[str, dict[str, float]]:
    results: dict[str, dict[str, float]] = {}
    with backend_url(backend) as url:
        bundle, opened = await open_bundle(url)
        try:
            supervision = bundle.chat_stream_supervision_store  # type: ignore[attr-defined]
            recording = bundle.chat_stream_recording_store  # type: ignore[attr-defined]
            state = bundle.agent_state_store  # type: ignore[attr-defined]

            async def cas(i: int) -> None:
                row = ChatStreamSupervision(
                    status=ChatStreamStatus.RUNNING,
                    heartbeat_at=datetime.now(UTC),
                    message_id="m",
                    epoch=i + 1,
                )
                assert await supervision.compare_and_swap("t", "u", "s", i or None, row)

            results["cas"] = summary(await _timed(cas, count))
            message = ChatMessage(sender=ChatMessageSender.BOT, content="x" * 2000)

            async def put(i: int) -> None:
                event = RecordedStreamEvent(index=i, message=message, message_id="m", epoch=1)
                await recording.put("t", "u", "s", event)

            async def read(i: int) -> None:
                assert await recording.read("t", "u", "s") is not None

            results["recording put (2 KB)"] = summary(await _timed(put, count))
            results["recording read"] = summary(await _timed(read, count))
            for label, size, n in (
                ("10 KB", 10_000, count),
                ("1 MB", 1_000_000, max(5, count // 20)),
            ):
                blob = {"chat_client": {"text": "y" * size}}

                async def save(i: int, blob: dict[str, Any] = blob) -> None:
                    await state.save("t", "u", f"s{i % 4}", blob)

                results[f"checkpoint save ({label})"] = summary(await _timed(save, n))
        finally:
            await close_all(opened)
    return results
