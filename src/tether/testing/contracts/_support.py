"""What every contract module shares: awkward ids, a hand-moved clock, store factories."""

from __future__ import annotations

import asyncio
import inspect
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from tether.domain.capabilities import Capability
from tether.domain.chat_message import ChatMessage, ChatMessageSender

_T = TypeVar("_T")
_Tested = TypeVar("_Tested", bound=Callable[..., Any] | type)

TESTED = "tether_capabilities"
"""The attribute naming the optional capabilities a contract test exercises
(``exercises``); a test without it checks the port's required methods."""

CONTRACTS: dict[Capability, list[str]] = {}
"""The contract classes of the kit that test each optional capability."""


def exercises(*capabilities: Capability) -> Callable[[_Tested], _Tested]:
    """Name the optional capabilities a contract test (or every test of a
    contract class) exercises, for ``tether.testing.contracts.report``."""

    def tag(tested: _Tested) -> _Tested:
        if isinstance(tested, type):
            tests = [f for name, f in vars(tested).items() if name.startswith("test_")]
            owner = tested.__name__
        else:
            tests, owner = [tested], tested.__qualname__.partition(".")[0]
        for test in tests:
            setattr(test, TESTED, getattr(test, TESTED, frozenset()) | frozenset(capabilities))
        for capability in capabilities:
            named = CONTRACTS.setdefault(capability, [])
            if owner not in named:
                named.append(owner)
        return tested

    return tag


StoreFactory = Callable[[], Any]
"""A zero-argument callable building a store: returns the store, or an awaitable of
it. A store that is an async context manager is entered after building and exited
when the test is done, inside the same event loop."""

TRICKY_IDS: tuple[str, ...] = (
    "../../x",
    "..",
    ".",
    "",
    "/",
    "/etc/passwd",
    "a/b",
    "a\\b",
    "..\\..\\x",
    "nul\x00byte",
    "%2E%2E",
    "%2e%2e",
    "%none",
    "%sha256-0",
    "Session",
    "session",
    "SESSION",
    "ünïcødé",
    "会話",
    "emoji 🙂",
    "new\nline",
    " ",
    "~",
    "*",
    "x.lock",
    "x.json",
    ".hidden",
    "x" * 10_000,
    "x" * 9_999 + "y",
)
"""Ids a backend must store and read back exactly and separately: path traversal,
separators, NUL, dot names, empty, case variants, escape look-alikes, non-ASCII,
and 10,000-character ids differing only in their last character."""


def user(text: str) -> ChatMessage:
    """A user message with ``text``."""
    return ChatMessage(sender=ChatMessageSender.USER, content=text)


def bot(text: str) -> ChatMessage:
    """A bot message with ``text``."""
    return ChatMessage(sender=ChatMessageSender.BOT, content=text)


def unique(prefix: str) -> str:
    """A fresh id, so tests never meet each other's rows in a shared backend."""
    return f"{prefix}-{uuid.uuid4().hex}"


class ManualClock:
    """A clock that only moves when told: pass it as a store's ``clock``."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2030, 1, 1, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        """The current (frozen) time, timezone-aware UTC."""
        return self._now

    def advance(self, seconds: float = 1.0) -> datetime:
        """Move forward by ``seconds``; returns the new time."""
        self._now += timedelta(seconds=seconds)
        return self._now


async def open_store(factory: StoreFactory, stack: AsyncExitStack) -> Any:
    """Build a store with ``factory`` inside the running loop; enter it if it is a context."""
    created = factory()
    if inspect.isawaitable(created):
        created = await created
    if isinstance(created, AbstractAsyncContextManager):
        created = await stack.enter_async_context(created)
    return created


class PrivateLoop:
    """An event loop owned by sync code (a state machine, a test driving processes).

    It is never installed as the thread's current loop, so it cannot disturb the
    loops pytest-asyncio manages.
    """

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._stack = AsyncExitStack()

    def run(self, awaitable: Coroutine[Any, Any, _T] | Awaitable[_T]) -> _T:
        """Run ``awaitable`` to completion on this loop."""
        return self._loop.run_until_complete(awaitable)

    def open(self, factory: StoreFactory) -> Any:
        """Build (and enter) a store on this loop; it is closed by :meth:`close`."""
        return self.run(open_store(factory, self._stack))

    def close(self) -> None:
        """Exit the stores, stop the default executor's threads and close the loop."""
        try:
            self.run(self._stack.aclose())
            self.run(self._loop.shutdown_default_executor())
        finally:
            self._loop.close()
