"""Stage an interleaving: hold a chosen store call at a named point until released.

"The heartbeat lands after the finish" is then one deterministic test::

    held = hold(store, "compare_and_swap_many")   # every batch of heartbeats
    ...start a turn; the batcher's call now waits at the gate...
    await held.reached()                          # the batch is in flight
    ...let the turn finish...
    held.release()                                # the batch lands late

The store's class is untouched (only the instance's method is replaced), so
code that asks which methods a store implements sees the store as it is.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any

_REACH_WITHIN = 10.0
"""Seconds a test waits for a held call before it fails."""


class Hold:
    """One held method of one store instance."""

    def __init__(self, target: object, method: str, when: Callable[..., bool], times: int) -> None:
        self._target = target
        self._method = method
        self._original = getattr(target, method)
        self._when = when
        self._remaining = times
        self._reached = asyncio.Event()
        self._released = asyncio.Event()
        self._returned = asyncio.Event()
        self.held_calls = 0
        """How many calls the gate has held (so far)."""

        @functools.wraps(self._original)
        async def gated(*args: Any, **kwargs: Any) -> Any:
            if self._remaining > 0 and self._when(*args, **kwargs):
                self._remaining -= 1
                self.held_calls += 1
                self._reached.set()
                await self._released.wait()
                try:
                    return await self._original(*args, **kwargs)
                finally:
                    self._returned.set()
            return await self._original(*args, **kwargs)

        setattr(target, method, gated)

    async def reached(self) -> None:
        """Wait until a call is held at the gate (bounded, so a broken test fails
        rather than hangs)."""
        async with asyncio.timeout(_REACH_WITHIN):
            await self._reached.wait()

    async def returned(self) -> None:
        """Wait until a held call, released, has returned from the store (or
        raised): what it wrote, or was refused, is settled."""
        async with asyncio.timeout(_REACH_WITHIN):
            await self._returned.wait()

    @property
    def is_holding(self) -> bool:
        return self._reached.is_set() and not self._released.is_set()

    def release(self) -> None:
        """Let every held call (and any later one) through to the store."""
        self._released.set()

    def restore(self) -> None:
        """Put the store's own method back (held calls still wait for ``release``)."""
        setattr(self._target, self._method, self._original)


def hold(
    target: object,
    method: str,
    *,
    when: Callable[..., bool] = lambda *args, **kwargs: True,
    times: int = 1,
) -> Hold:
    """Hold the next ``times`` calls of ``target.method`` for which ``when(*args,
    **kwargs)`` is true, before they reach the store, until ``release()``."""
    return Hold(target, method, when, times)
