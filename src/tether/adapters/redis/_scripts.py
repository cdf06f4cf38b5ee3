"""The Lua scripts, one per atomic step, read from package data and registered per client.

Redis runs a script without interleaving any other command, so each script's
read-check-write is atomic across every client and process. ``register_script``
sends ``EVALSHA`` and loads the source only when the server does not know it yet
(first use, or after a server restart flushed its script cache).
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files
from typing import Any

import redis.asyncio
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

_NAMES = ("supervision_cas", "supervision_delete", "recording_put", "recording_delete")


@cache
def _source(name: str) -> str:
    return files(__package__).joinpath(f"{name}.lua").read_text(encoding="utf-8")


class Scripts:
    """The scripts registered on one client; each returns the script's raw reply.

    The sources document their KEYS, ARGV and replies.
    """

    def __init__(self, client: redis.asyncio.Redis) -> None:
        registered = {name: client.register_script(_source(name)) for name in _NAMES}
        self._supervision_cas: AsyncScript = registered["supervision_cas"]
        self._supervision_delete: AsyncScript = registered["supervision_delete"]
        self._recording_put: AsyncScript = registered["recording_put"]
        self._recording_delete: AsyncScript = registered["recording_delete"]

    async def supervision_cas(self, keys: list[str], args: list[str | int]) -> Any:
        return await self._supervision_cas(keys=keys, args=args)

    async def supervision_delete(self, key: str, args: list[str | int]) -> Any:
        return await self._supervision_delete(keys=[key], args=args)

    async def recording_put(self, key: str, args: list[str | int]) -> Any:
        return await self._recording_put(keys=[key], args=args)

    async def recording_put_many(self, calls: list[tuple[str, list[str | int]]]) -> list[Any]:
        """``recording_put`` once per ``(key, args)``, all in one pipeline (one
        round trip, not a transaction: each call is its own atomic script run).
        Raises the first error any call met."""
        script = self._recording_put
        client = script.registered_client
        for attempt in (1, 2):
            async with client.pipeline(transaction=False) as pipe:
                for key, args in calls:
                    pipe.evalsha(script.sha, 1, key, *args)
                try:
                    return list(await pipe.execute())
                except NoScriptError:
                    # The server lost its script cache (a restart, SCRIPT FLUSH): no
                    # call ran, so load the script and send the batch once more.
                    if attempt == 2:
                        raise
                    await client.script_load(script.script)
        raise AssertionError("unreachable")

    async def recording_delete(self, key: str, args: list[str | int]) -> Any:
        return await self._recording_delete(keys=[key], args=args)
