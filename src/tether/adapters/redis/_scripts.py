"""The Lua scripts, one per atomic step, read from package data and registered per client.

Redis runs a script without interleaving any other command, so each script's
read-check-write is atomic across every client and process. ``register_script``
sends ``EVALSHA`` and loads the source only when the server does not know it yet
(first use, or after a server restart flushed its script cache).

The scripts that compare epochs exactly begin with the helpers of
``_epochs.lua`` (not a script of its own): each is still one script, one step.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files
from typing import Any

import redis.asyncio
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

_NAMES = (
    "supervision_cas",
    "supervision_delete",
    "supervision_stale",
    "recording_put",
    "recording_delete",
    "recording_fence",
    "agent_state_save",
    "agent_state_fence",
    "tombstone_move",
)
_WITH_EPOCHS = frozenset(
    {
        "supervision_cas",
        "supervision_delete",
        "agent_state_save",
        "agent_state_fence",
        "tombstone_move",
    }
)
"""The scripts that start with the helpers of ``_epochs.lua``."""


def _read(name: str) -> str:
    return files(__package__).joinpath(f"{name}.lua").read_text(encoding="utf-8")


@cache
def _source(name: str) -> str:
    source = _read(name)
    return f"{_read('_epochs')}\n{source}" if name in _WITH_EPOCHS else source


class Scripts:
    """The scripts registered on one client; each returns the script's raw reply.

    The sources document their KEYS, ARGV and replies.
    """

    def __init__(self, client: redis.asyncio.Redis) -> None:
        self._scripts: dict[str, AsyncScript] = {
            name: client.register_script(_source(name)) for name in _NAMES
        }

    async def _run(self, name: str, keys: list[str], args: list[str | int]) -> Any:
        return await self._scripts[name](keys=keys, args=args)

    async def supervision_cas(self, keys: list[str], args: list[str | int]) -> Any:
        return await self._run("supervision_cas", keys, args)

    async def supervision_delete(self, keys: list[str], args: list[str | int]) -> Any:
        return await self._run("supervision_delete", keys, args)

    async def supervision_stale(self, keys: list[str], args: list[str | int]) -> Any:
        return await self._run("supervision_stale", keys, args)

    async def recording_put(self, keys: list[str], args: list[str | int]) -> Any:
        return await self._run("recording_put", keys, args)

    async def recording_put_many(self, calls: list[tuple[list[str], list[str | int]]]) -> list[Any]:
        """``recording_put`` once per ``(keys, args)``, all in one pipeline (one
        round trip, not a transaction: each call is its own atomic script run).
        Raises the first error any call met."""
        script = self._scripts["recording_put"]
        client = script.registered_client
        for attempt in (1, 2):
            async with client.pipeline(transaction=False) as pipe:
                for keys, args in calls:
                    pipe.evalsha(script.sha, len(keys), *keys, *args)
                try:
                    return list(await pipe.execute())
                except NoScriptError:
                    # The server lost its script cache (a restart, SCRIPT FLUSH): no
                    # call ran, so load the script and send the batch once more.
                    if attempt == 2:
                        raise
                    await client.script_load(script.script)
        raise AssertionError("unreachable")

    async def recording_delete(self, keys: list[str], args: list[str | int]) -> Any:
        return await self._run("recording_delete", keys, args)

    async def recording_fence(self, keys: list[str], args: list[str | int]) -> Any:
        return await self._run("recording_fence", keys, args)

    async def agent_state_save(self, keys: list[str], args: list[str | int]) -> Any:
        return await self._run("agent_state_save", keys, args)

    async def agent_state_fence(self, keys: list[str], args: list[str | int]) -> Any:
        return await self._run("agent_state_fence", keys, args)

    async def tombstone_move(self, keys: list[str]) -> Any:
        return await self._run("tombstone_move", keys, [])
