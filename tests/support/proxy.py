"""A TCP hop to a real server that a test can cut, stall and bring back.

It stands in for a database restart or a dead network without touching the
server the rest of the suite shares. The proxy runs its own event loop in a
thread, so it keeps forwarding while the test blocks (starting a server
process, waiting on a subprocess) and works the same from sync and async tests.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

_T = TypeVar("_T")


class TcpProxy:
    """Forwards ``127.0.0.1:port`` to ``host:target_port`` until cut.

    - ``cut()``: refuse new connections and reset every open one, as a server
      that went away does.
    - ``stalled = True``: keep connections open but swallow every byte, as a
      dead network does (no reset, no answer).
    - ``start()`` again: the server is back, on the same address.
    """

    def __init__(self, host: str, target_port: int) -> None:
        self._target = (host, target_port)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._links: set[asyncio.Task[Any]] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.port = 0
        self.stalled = False

    def url_for(self, url: str) -> str:
        """``url`` with its ``host:target_port`` pointed at this proxy."""
        host, port = self._target
        return url.replace(f"{host}:{port}", f"127.0.0.1:{self.port}", 1)

    def start(self) -> None:
        self._call(self._start())

    def cut(self) -> None:
        self._call(self._cut())

    def close(self) -> None:
        """Cut, then stop the proxy's thread."""
        if self._loop.is_closed():
            return
        self.cut()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def __enter__(self) -> TcpProxy:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _call(self, work: Coroutine[Any, Any, _T]) -> _T:
        return asyncio.run_coroutine_threadsafe(work, self._loop).result(timeout=10)

    async def _start(self) -> None:
        # The same port on a restart, so clients reconnect to the address they know.
        self._server = await asyncio.start_server(self._link, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _cut(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for writer in list(self._writers):
            writer.transport.abort()
        for link in list(self._links):
            link.cancel()
        await asyncio.gather(*self._links, return_exceptions=True)
        self.stalled = False

    async def _link(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link = asyncio.current_task()
        assert link is not None
        self._links.add(link)
        ends = [writer]
        self._writers.add(writer)
        try:
            upstream_reader, upstream = await asyncio.open_connection(*self._target)
            ends.append(upstream)
            self._writers.add(upstream)
            await asyncio.gather(self._pump(reader, upstream), self._pump(upstream_reader, writer))
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            for end in ends:
                end.transport.abort()
                self._writers.discard(end)
            self._links.discard(link)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                if not self.stalled:
                    writer.write(data)
                    await writer.drain()
        finally:
            writer.transport.abort()
