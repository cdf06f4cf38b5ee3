"""Switch points: every store call parks until the seeded scheduler lets it through.

Each store instance's async methods are replaced on the instance (its class
is untouched, so code asking which methods a store implements sees it as it
is, as ``tether.testing.interleavings.hold`` does). A call parks with the
replica that made it, named by a context variable every task of that
replica inherits; the scheduler picks which parked call proceeds next. A
call made from inside a store call (a default ``compare_and_swap_many``
calling ``compare_and_swap``) is part of it and passes through.

A killed replica's parked calls never land, and its later calls are refused
before they reach a store: a SIGKILLed process writes nothing more.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

REPLICA: contextvars.ContextVar[str | None] = contextvars.ContextVar("sim_replica", default=None)
"""The replica on whose behalf the current task runs (None: the simulator itself)."""
OPERATION: contextvars.ContextVar[str] = contextvars.ContextVar("sim_operation", default="")
"""The client request (or fault) whose work the current task does: turns and
background work started for it inherit it, so the schedule says on whose
behalf each store call is made."""
_INSIDE: contextvars.ContextVar[bool] = contextvars.ContextVar("sim_inside", default=False)

Observer = Callable[[str, str, dict[str, Any], object, BaseException | None], None]
"""Told of every finished store call: store, method, bound arguments, result, error."""


class ReplicaKilledError(asyncio.CancelledError):
    """A call of a killed replica: it never reaches the store."""


@dataclass
class Parked:
    """One store call waiting at its switch point."""

    number: int
    replica: str | None
    store: str
    method: str
    arguments: dict[str, Any]
    go: asyncio.Future[None]
    operation: str = ""

    def describe(self) -> str:
        call = f"{self.store}.{self.method}({_brief(self.arguments)})"
        return f"{self.replica or 'sim'} {call} [{self.operation}]"


@dataclass
class Gate:
    """The switch points of every store of the world."""

    observer: Observer
    parked: list[Parked] = field(default_factory=list)
    dead: set[str] = field(default_factory=set)
    paused: set[str] = field(default_factory=set)
    in_flight: int = 0
    _numbers: int = 0

    def wrap(self, name: str, store: object, *, skip: set[str] | None = None) -> None:
        """Make every public async method of ``store`` a switch point."""
        for method in dir(type(store)):
            if method.startswith("_") or method in (skip or set()):
                continue
            original = getattr(store, method)
            if inspect.iscoroutinefunction(original):
                setattr(store, method, self._gated(name, method, original))

    def eligible(self) -> list[Parked]:
        """Parked calls the scheduler may let through (not of a paused replica)."""
        return [p for p in self.parked if p.replica not in self.paused]

    def release(self, parked: Parked) -> None:
        self.parked.remove(parked)
        if not parked.go.done():
            parked.go.set_result(None)

    def kill(self, replica: str) -> None:
        """``replica`` dies: its parked calls never land."""
        self.dead.add(replica)
        self.paused.discard(replica)
        for parked in [p for p in self.parked if p.replica == replica]:
            self.parked.remove(parked)
            if not parked.go.done():
                parked.go.set_exception(ReplicaKilledError(replica))

    def _gated(self, store: str, method: str, original: Callable[..., Any]) -> Callable[..., Any]:
        signature = _signature(original.__func__)  # type: ignore[attr-defined]

        @functools.wraps(original)
        async def gated(*args: Any, **kwargs: Any) -> Any:
            if _INSIDE.get():
                return await original(*args, **kwargs)
            replica = REPLICA.get()
            if replica in self.dead:
                raise ReplicaKilledError(replica)
            bound = signature.bind(*args, **kwargs)
            arguments = dict(bound.arguments)
            self._numbers += 1
            go = asyncio.get_running_loop().create_future()
            parked = Parked(self._numbers, replica, store, method, arguments, go, OPERATION.get())
            self.parked.append(parked)
            await go
            if replica in self.dead:
                raise ReplicaKilledError(replica)
            token = _INSIDE.set(True)
            self.in_flight += 1
            try:
                result = await original(*args, **kwargs)
            except BaseException as error:
                self.observer(store, method, arguments, None, error)
                raise
            finally:
                self.in_flight -= 1
                _INSIDE.reset(token)
            self.observer(store, method, arguments, result, None)
            return result

        return gated


@functools.cache
def _signature(function: Callable[..., Any]) -> inspect.Signature:
    """A store method's signature without ``self``: read once per class, not
    once per history (each history wraps its stores anew)."""
    return inspect.signature(function).replace(
        parameters=list(inspect.signature(function).parameters.values())[1:]
    )


def ungated() -> contextvars.Token[bool]:
    """Let the simulator read the stores without parking (reset the token after)."""
    return _INSIDE.set(True)


def reset_ungated(token: contextvars.Token[bool]) -> None:
    _INSIDE.reset(token)


def _brief(arguments: dict[str, Any]) -> str:
    shown = []
    for name, value in arguments.items():
        if name in ("self", "tenant", "requester_uuid", "user_uuid"):
            continue
        shown.append(f"{name}={_short(value)}")
    return ", ".join(shown)


def _short(value: object) -> str:
    text = getattr(value, "summary", None)
    if callable(text):
        return str(text())
    if hasattr(value, "status") and hasattr(value, "epoch") and hasattr(value, "message_id"):
        beat = getattr(value, "heartbeat_at", None)
        status = "handed" if beat is not None and beat.year < 2000 else value.status
        return f"<{status} {str(value.message_id)[:6]} e{value.epoch}>"
    if hasattr(value, "event") and hasattr(value, "session_id"):
        event = value.event
        return f"<put {str(event.message_id)[:6]} e{event.epoch} #{event.index}>"
    if hasattr(value, "message_id") and hasattr(value, "epoch") and hasattr(value, "index"):
        return f"<rec {str(value.message_id)[:6]} e{value.epoch} #{value.index}>"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_short(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(str(k) for k in value) + "}"
    if hasattr(value, "sender") and hasattr(value, "content"):
        return f"<{value.sender.value} {str(getattr(value, 'message_id', ''))[:12]}>"
    text = str(value)
    return text if len(text) <= 14 else text[:12] + ".."
