"""An event loop on a thread of its own, so that blocking code can use the async client.

The sync client is the async one driven through this portal: one
implementation of every request and of the recovery, usable from plain
scripts and from notebooks alike (where the calling thread may already run a
loop of its own, which ``asyncio.run`` would refuse).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

_T = TypeVar("_T")


class Portal:
    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="tether-client", daemon=True
        )
        self._thread.start()

    def call(self, coroutine: Coroutine[Any, Any, _T]) -> _T:
        """Run ``coroutine`` on the portal's loop and wait for its result."""
        if self._loop.is_closed():
            coroutine.close()
            raise RuntimeError("the client is closed")
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result()
        except BaseException:
            # Interrupted while waiting (Ctrl-C): stop the work too.
            future.cancel()
            raise

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()
