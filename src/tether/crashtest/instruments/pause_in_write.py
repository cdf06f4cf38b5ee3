"""Pause a replica inside a store write: the crash test's ``pause-in-write`` fault.

A replica that ``tether crash-test`` starts may carry the environment variable
``TETHER_CRASHTEST_PAUSE_IN=KIND:N`` (KIND one of ``checkpoint``,
``transcript``, ``recording``; N counts from 1). At start-up the server,
seeing it, replaces one write method on one store instance with a wrapper
that, on the N-th eligible call, stops its own process with SIGSTOP just
before passing the call on to the store. The crash test sees the process
stopped, lets its turns read dead, resumes them elsewhere, and then continues
the process: the paused write lands late, at an epoch the stores have fenced
since, and must change nothing.

The pause waits (at most ``QUIET_WITHIN`` seconds) until no other call of this
process to any of its stores is in flight, so the replica is stopped inside
this one write rather than in the middle of another: an embedded store
(SQLite) runs its transactions in the server process, and one stopped
half-way would hold the database's write lock and stall every replica (that
is what a plain SIGSTOP may do; the ``stop`` fault covers it).

The eligible calls are the producer writes of a turn in flight:

- ``checkpoint``: ``save_fenced`` of the agent state with progress (after a
  tool call, the periodic ones, the one at the end; not the marker written
  before the agent runs);
- ``transcript``: ``append_fenced`` of a finished answer (the seal; not the
  user's message, which is written before the stream starts);
- ``recording``: every recording batch (``put_many``) or single ``put``.

Only the instance is patched; the store's class is untouched, so code that
asks which methods a store implements sees it as it is. Without the variable
nothing is patched at all: ordinary ``tether serve`` never pauses.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import logging
import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from tether.domain.chat_agent_state_store import TURN_STATE_KEY
from tether.domain.store_bundle import StoreBundle

logger = logging.getLogger(__name__)

PAUSE_IN_VARIABLE = "TETHER_CRASHTEST_PAUSE_IN"
QUIET_WITHIN = 2.0
"""Seconds the pause waits for the process's other store calls to finish."""
_UNCOUNTED = frozenset({"open", "aclose", "wait_for_change"})
"""Store methods that are not calls in flight (lifecycle, a follower's long wait)."""


class WriteKind(StrEnum):
    CHECKPOINT = "checkpoint"
    TRANSCRIPT = "transcript"
    RECORDING = "recording"


@dataclass(frozen=True)
class PauseInWrite:
    """Which write to pause in: the ``call``-th eligible one of ``kind``."""

    kind: WriteKind
    call: int = 1

    def __post_init__(self) -> None:
        if self.call < 1:
            raise ValueError(f"{PAUSE_IN_VARIABLE}: the call number counts from 1, not {self.call}")

    @property
    def value(self) -> str:
        """The variable's value for this pause."""
        return f"{self.kind}:{self.call}"

    @classmethod
    def parse(cls, value: str) -> PauseInWrite:
        kind_text, _, call_text = value.strip().partition(":")
        try:
            kind = WriteKind(kind_text)
        except ValueError:
            kinds = ", ".join(WriteKind)
            raise ValueError(
                f"{PAUSE_IN_VARIABLE}={value!r}: the write is one of {kinds}"
            ) from None
        if not call_text:
            return cls(kind)
        if not call_text.isdigit():
            raise ValueError(f"{PAUSE_IN_VARIABLE}={value!r}: the call number is not a number")
        return cls(kind, int(call_text))


def stop_this_process() -> None:
    """SIGSTOP ourselves: nothing of this process runs until a SIGCONT."""
    os.kill(os.getpid(), signal.SIGSTOP)


class PauseGate:
    """The installed pause: counts eligible calls and pauses on the chosen one."""

    def __init__(
        self, pause: PauseInWrite, stop: Callable[[], None], *, quiet_within: float
    ) -> None:
        self.pause = pause
        self._stop = stop
        self._quiet_within = quiet_within
        self.eligible_calls = 0
        self.fired = False
        self.in_flight = 0
        """Calls of this process to its stores that have not returned yet."""
        self.quiet = False
        """Whether the pause came with no other store call in flight."""
        self._idle: asyncio.Event | None = None

    def entered(self) -> None:
        self.in_flight += 1

    def left(self) -> None:
        self.in_flight -= 1
        if not self.in_flight and self._idle is not None:
            self._idle.set()

    async def passing(self) -> None:
        """An eligible call is about to reach the store: pause on the chosen one."""
        self.eligible_calls += 1
        if self.fired or self.eligible_calls != self.pause.call:
            return
        self.fired = True
        deadline = time.monotonic() + self._quiet_within
        # Another call may start between the moment the last one returns and
        # this task running again: wait for a moment with none, within bounds.
        while self.in_flight and time.monotonic() < deadline:
            self._idle = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(
                    asyncio.get_running_loop().time() + deadline - time.monotonic()
                ):
                    await self._idle.wait()
        self._idle = None
        self.quiet = not self.in_flight
        logger.warning(
            "crash test: pausing this replica inside %s write %d (SIGSTOP)%s",
            self.pause.kind,
            self.pause.call,
            "" if self.quiet else f" with {self.in_flight} other store calls in flight",
        )
        self._stop()


# Set while a patched write runs, so a ``put_many`` that calls ``put`` (the
# interface's default), or a ``put`` that calls ``put_many`` (the in-memory
# store), counts as the one call it is.
_inside: contextvars.ContextVar[bool] = contextvars.ContextVar("inside", default=False)


def install_from_env(
    stores: StoreBundle,
    environ: Mapping[str, str] | None = None,
    *,
    stop: Callable[[], None] = stop_this_process,
) -> PauseGate | None:
    """Install the pause named by ``TETHER_CRASHTEST_PAUSE_IN``, if it is set.

    Raises ``ValueError`` for a malformed value or a write the stores cannot
    make (no conversation store for ``transcript``).
    """
    value = (os.environ if environ is None else environ).get(PAUSE_IN_VARIABLE)
    if not value:
        return None
    return install(stores, PauseInWrite.parse(value), stop=stop)


def install(
    stores: StoreBundle,
    pause: PauseInWrite,
    *,
    stop: Callable[[], None] = stop_this_process,
    quiet_within: float = QUIET_WITHIN,
) -> PauseGate:
    gate = PauseGate(pause, stop, quiet_within=quiet_within)
    instances = {
        id(store): store
        for store in (
            stores.agent_state_store,
            stores.chat_stream_recording_store,
            stores.chat_stream_supervision_store,
            stores.chat_conversation_store,
        )
        if store is not None
    }
    for store in instances.values():
        _count_calls(store, gate)
    if pause.kind is WriteKind.CHECKPOINT:
        _patch(_needed(stores.agent_state_store, pause), "save_fenced", gate, _has_progress)
    elif pause.kind is WriteKind.TRANSCRIPT:
        _patch(_needed(stores.chat_conversation_store, pause), "append_fenced", gate, _is_seal)
    else:
        store = _needed(stores.chat_stream_recording_store, pause)
        _patch(store, "put_many", gate, _always)
        _patch(store, "put", gate, _always)
    logger.warning("crash test: armed to pause inside %s write %d", pause.kind, pause.call)
    return gate


def _needed(store: Any, pause: PauseInWrite) -> Any:
    if store is None:
        raise ValueError(
            f"{PAUSE_IN_VARIABLE}={pause.value}: this server has no store for that write"
        )
    return store


def _count_calls(store: object, gate: PauseGate) -> None:
    """Count the calls in flight of every coroutine method of ``store`` (its instance)."""
    for name in dir(type(store)):
        if name.startswith("_") or name in _UNCOUNTED:
            continue
        method = getattr(store, name, None)
        if method is None or not inspect.iscoroutinefunction(method):
            continue
        setattr(store, name, _counted(method, gate))


def _counted(method: Callable[..., Any], gate: PauseGate) -> Callable[..., Any]:
    @functools.wraps(method)
    async def counted(*args: Any, **kwargs: Any) -> Any:
        gate.entered()
        try:
            return await method(*args, **kwargs)
        finally:
            gate.left()

    return counted


def _patch(
    store: object,
    method: str,
    gate: PauseGate,
    eligible: Callable[..., bool],
) -> None:
    """Put the pause in front of ``method`` (outside its call counting, so the
    paused call waits only for the others)."""
    original = getattr(store, method)

    @functools.wraps(original)
    async def paused_inside(*args: Any, **kwargs: Any) -> Any:
        if _inside.get():
            return await original(*args, **kwargs)
        if eligible(*args, **kwargs):
            await gate.passing()
        token = _inside.set(True)
        try:
            return await original(*args, **kwargs)
        finally:
            _inside.reset(token)

    setattr(store, method, paused_inside)


def _always(*args: Any, **kwargs: Any) -> bool:
    return True


def _has_progress(*args: Any, **kwargs: Any) -> bool:
    """``save_fenced(tenant, user_uuid, session_id, state, epoch)`` of a turn
    that has made progress (not the marker saved before the agent runs)."""
    state = kwargs["state"] if "state" in kwargs else (args[3] if len(args) > 3 else None)
    if not isinstance(state, Mapping):
        return False
    marker = state.get(TURN_STATE_KEY)
    return isinstance(marker, Mapping) and bool(marker.get("progress"))


def _is_seal(*args: Any, **kwargs: Any) -> bool:
    """``append_fenced(...)`` of a finished answer."""
    return kwargs.get("last_turn_status") == "complete"
