"""The replica's background loops (heartbeats, flushes, deltas, takeovers, the
clock): how one is stopped."""

from __future__ import annotations

import asyncio
import contextlib


async def stop(task: asyncio.Task[None] | None) -> None:
    """Cancel ``task`` (None: nothing to stop) and wait until it has ended, so
    nothing of it runs once its owner is closed."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
