"""uvicorn, with a graceful drain before it shuts down.

On the first SIGTERM (or SIGINT) the replica stops taking turns, lets running
ones finish within the drain grace, and hands the rest off (their rows read
as dead at once, their readers hear ``stream_status: dead``). Only then does
uvicorn's own shutdown start. A second signal skips the drain.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from types import FrameType

import uvicorn
from fastapi import FastAPI

from tether.handlers.chat_handler import ChatHandler

logger = logging.getLogger(__name__)


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, app: FastAPI) -> None:
        super().__init__(config)
        self._handler: ChatHandler = app.state.chat_handler
        self._drain: asyncio.Task[None] | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._drain is not None or sig not in (signal.SIGTERM, signal.SIGINT):
            super().handle_exit(sig, frame)
            return
        # Signal handlers run on the event loop's thread, between its callbacks.
        loop = asyncio.get_event_loop()
        self._drain = loop.create_task(self._drain_then_exit(sig, frame))

    async def _drain_then_exit(self, sig: int, frame: FrameType | None) -> None:
        try:
            logger.info("draining: handing off running turns")
            await self._handler.drain()
        except Exception:
            logger.exception("drain failed; shutting down anyway")
        finally:
            super().handle_exit(sig, frame)
