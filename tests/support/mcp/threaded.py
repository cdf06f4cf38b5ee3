"""An ASGI app served by uvicorn in a background thread, on a free loopback port.

The port is bound at construction, so an app that must know its own URL (a
resource server naming itself in its metadata) can be built before it starts.
"""

from __future__ import annotations

import socket
import threading
import time

import uvicorn
from starlette.types import ASGIApp


class ThreadedServer:
    """``start(app)`` returns once the server accepts connections; ``stop()`` joins it."""

    def __init__(self) -> None:
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.bind(("127.0.0.1", 0))
        self.port: int = self._socket.getsockname()[1]
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, app: ASGIApp, *, lifespan: str = "off", access_log: bool = False) -> None:
        """``access_log`` logs every request at INFO on ``uvicorn.access``, as a
        deployed server does (and sets that logger's level to INFO)."""
        config = uvicorn.Config(
            app,
            log_level="info" if access_log else "warning",
            access_log=access_log,
            lifespan=lifespan,
            ws="none",
            http="h11",
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("a test server did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)
        self._socket.close()
