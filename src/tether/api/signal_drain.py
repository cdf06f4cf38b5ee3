"""Drain on SIGTERM under the server that runs the app, from the app's own lifespan.

uvicorn (``uvicorn app:app``, gunicorn's uvicorn workers, ``tether serve``)
takes SIGTERM and SIGINT with ``signal.signal`` before it starts the app's
lifespan. On the signal it stops listening, waits for the open connections to
close (an SSE stream keeps its connection open until its turn ends) and only
then runs the lifespan's shutdown: far too late to hand turns off. So the
lifespan's start-up wraps the handler the server installed. The first signal
starts the drain at once (new turns are refused with ``DRAINING``, running ones
get the grace, the rest are handed off and their readers hear ``dead``); when
the drain is over the server's own handler runs, and the server shuts down as
it would have, with no turn left to wait for. A second signal goes straight to
the server's handler.

The drain ends within ``drain_timeout`` whatever the agents do. What the event
loop cannot bound, a watchdog thread does: if the drain has not returned
``EXIT_MARGIN`` seconds after its timeout (an agent blocks the event loop), or
turns whose agents would not stop are still running ``EXIT_MARGIN`` seconds
after the app shut down (asyncio waits for every task before the process can
exit), the process exits at once with status 1.

A server that handles its signals inside its event loop
(``loop.add_signal_handler``) leaves nothing to wrap: the app then does not
drain on the signal, and says so at start-up.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from collections.abc import Awaitable, Callable
from types import FrameType
from typing import Any

from sse_starlette.sse import AppStatus

logger = logging.getLogger(__name__)

EXIT_MARGIN = 2.0
"""Seconds the watchdog allows past the drain timeout, and past the app's
shutdown when turns would not stop, before it ends the process."""
EXIT_STATUS = 1

_SIGNALS = (signal.SIGTERM, signal.SIGINT)

SignalHandler = Callable[[int, FrameType | None], Any] | int | None


def _wrappable(handler: SignalHandler) -> bool:
    """A handler a server installed with ``signal.signal``: a Python callable
    other than Python's own SIGINT default and asyncio's placeholder for
    ``loop.add_signal_handler``."""
    if not callable(handler) or handler is signal.default_int_handler:
        return False
    return getattr(handler, "__name__", "") != "_sighandler_noop"


class SignalDrain:
    """Start ``drain`` on the server's first SIGTERM or SIGINT, then hand the
    signal on to the server. ``install`` in the lifespan's start-up,
    ``uninstall`` then ``closed`` in its shutdown."""

    def __init__(self, drain: Callable[[], Awaitable[list[str]]], timeout: float) -> None:
        self._drain = drain
        self._timeout = timeout
        self._previous: dict[int, SignalHandler] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._received: tuple[int, FrameType | None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._stuck: list[str] = []
        self._wake = threading.Event()  # a signal came, or the app shut down
        self._drained = threading.Event()
        self._closed = threading.Event()

    def install(self) -> bool:
        """Wrap the server's SIGTERM (and SIGINT) handler; False when there is
        none to wrap (not the main thread, or no server took SIGTERM)."""
        if threading.current_thread() is not threading.main_thread():
            return False
        current = signal.getsignal(signal.SIGTERM)
        if not _wrappable(current):
            if callable(current):  # asyncio's placeholder: the loop has the signal
                logger.warning(
                    "the server handles SIGTERM inside its event loop: this replica "
                    "does not drain on it (uvicorn, gunicorn's uvicorn workers and "
                    "tether serve do)"
                )
            return False
        self._loop = asyncio.get_running_loop()
        for sig in _SIGNALS:
            previous = signal.getsignal(sig)
            if _wrappable(previous):
                self._previous[sig] = previous
                signal.signal(sig, self._on_signal)
        threading.Thread(target=self._watch, name="tether-drain-watchdog", daemon=True).start()
        return True

    def uninstall(self) -> None:
        """Give the signals back to the server; stop a drain still running (the
        server is already stopping the app)."""
        self._loop = None  # a signal from now on goes straight to the server
        for sig, previous in self._previous.items():
            if signal.getsignal(sig) == self._on_signal:
                signal.signal(sig, previous)
        if self._task is not None and not self._task.done():
            self._task.cancel()

    def closed(self) -> None:
        """The app has shut down (the end of its lifespan)."""
        self._closed.set()
        self._wake.set()

    # ------------------------------------------------------------ signals

    def _on_signal(self, sig: int, frame: FrameType | None) -> None:
        # Runs in the main thread between two bytecodes, possibly inside the
        # event loop's own code: only flags and a thread-safe call here.
        loop = self._loop
        if self._received is not None or loop is None or loop.is_closed():
            self._hand_on(sig, frame)  # a second signal: the server's own way
            return
        self._received = (sig, frame)
        self._wake.set()
        loop.call_soon_threadsafe(self._start, sig, frame)

    def _start(self, sig: int, frame: FrameType | None) -> None:
        if self._loop is None:  # the app shut down in between: nothing to drain
            self._drained.set()
            self._hand_on(sig, frame)
            return
        self._task = asyncio.get_running_loop().create_task(self._run(sig, frame))

    async def _run(self, sig: int, frame: FrameType | None) -> None:
        logger.warning(
            "%s: draining (new turns refused, running ones handed off within %s s)",
            signal.Signals(sig).name,
            self._timeout,
        )
        try:
            self._stuck = await self._drain()
        except asyncio.CancelledError:
            self._drained.set()
            raise
        except Exception:
            logger.exception("the drain failed; shutting down anyway")
        self._drained.set()
        logger.info("drained; the server shuts down")
        # The streams still open (followers of turns produced on other
        # replicas) would hold the server's shutdown: sse-starlette ends them,
        # after their grace, once told that the server exits (its own hook into
        # uvicorn may not see a signal that went through this wrapper).
        AppStatus.should_exit = True
        self._hand_on(sig, frame)

    def _hand_on(self, sig: int, frame: FrameType | None) -> None:
        previous = self._previous.get(sig)
        if callable(previous):
            previous(sig, frame)

    # ----------------------------------------------------------- watchdog

    def _watch(self) -> None:
        self._wake.wait()
        if self._received is None:
            return  # shut down without a signal
        if not self._drained.wait(self._timeout + EXIT_MARGIN):
            _exit_now(
                f"the drain did not end within {self._timeout} s "
                "(is an agent blocking the event loop?)"
            )
        if not self._stuck:
            return  # the server exits by itself
        # A task that swallows its cancellation keeps asyncio, and so the
        # process, from ending: give the server its shutdown, then end it here.
        self._closed.wait(self._timeout + EXIT_MARGIN)
        threading.Event().wait(EXIT_MARGIN)
        _exit_now(f"turn(s) {', '.join(self._stuck)} did not stop when cancelled")


def _exit_now(reason: str) -> None:
    # Straight to the file descriptor, no logging nor flushing: the stuck main
    # thread may hold their locks.
    try:
        os.write(2, f"tether: exiting now: {reason}\n".encode())
    finally:
        os._exit(EXIT_STATUS)
