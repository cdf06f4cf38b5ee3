"""The tool-call ledger: every execution of a tool call, recorded outside the server.

A replica that ``tether crash-test`` starts carries ``TETHER_CRASHTEST_TOOL_CALLS``,
a directory shared by every replica. A tool wrapped with ``recorded`` appends
one line to ``calls.log`` there when an execution starts and one when it ends
(returned or raised), each flushed to disk before the tool goes on: the file
survives the replica being SIGKILLed in the middle of the call, so the crash
test can count, per idempotency key, how often a call really ran. The lines
are single appends to one file, so their order is the order the executions
started and ended in, across every replica.

The crash test can also *hold* a replica's calls: while ``holds/PID`` exists
and names a tool's ``on_unknown`` policy, an execution of such a tool in that
process records its start and then waits (until the file is gone, or at most
``HOLD_AT_MOST`` seconds). A SIGKILL sent then lands between the call's
*started* checkpoint (written before the tool runs) and its completion: the
outcome the ``on_unknown`` policy is for, reached deterministically.

Without the variable, ``recorded`` changes nothing: the tool runs as written.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tether.tools import Tool, current_tool_call

logger = logging.getLogger(__name__)

LEDGER_VARIABLE = "TETHER_CRASHTEST_TOOL_CALLS"
HOLD_AT_MOST = 300.0
"""Seconds a held execution waits before it goes on by itself (a crash test
that died without releasing it must not hang its replicas for ever)."""
_POLL = 0.01
_CALLS = "calls.log"
_HOLDS = "holds"


@dataclass(frozen=True)
class ToolRun:
    """One execution of one tool call, as the tool recorded it."""

    key: str
    """The call's idempotency key, ``{message_id}:{index}``."""
    tool: str
    on_unknown: str
    attempt: int
    """The attempt the tool loop gave it (``current_tool_call().attempt``)."""
    pid: int
    ended: bool
    """The tool returned or raised; False: its process died (or the turn was
    cancelled) in the middle of it."""
    started_at: int
    """Its start's line in the ledger (the ledger's order is the true order)."""
    ended_at: int | None = None
    """Its end's line in the ledger."""

    @property
    def message_id(self) -> str:
        return self.key.rpartition(":")[0]

    @property
    def index(self) -> int:
        """The call's place among the turn's tool calls (0 for the first)."""
        return int(self.key.rpartition(":")[2])

    @property
    def at_most_once(self) -> bool:
        """A call of this tool must never run twice (its outcome, when unknown,
        is not found out by running it again)."""
        return self.on_unknown != "retry"


class ToolLedger:
    """The ledger directory: written by the tools in the replicas, read and
    armed by the crash test."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.calls = directory / _CALLS
        self.holds = directory / _HOLDS

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ToolLedger | None:
        directory = (os.environ if environ is None else environ).get(LEDGER_VARIABLE)
        return cls(Path(directory)) if directory else None

    def create(self) -> dict[str, str]:
        """Make the directory; the environment that points a replica at it."""
        self.holds.mkdir(parents=True, exist_ok=True)
        self.calls.touch()
        return {LEDGER_VARIABLE: str(self.directory)}

    # ------------------------------------------------------------ the tool's side

    def record(self, event: str, key: str, tool: str, on_unknown: str, attempt: int) -> None:
        """Append one line and flush it to disk (blocking: call it off the loop)."""
        if any(character.isspace() for character in key + tool):
            raise ValueError(f"a ledger key and tool name hold no spaces: {key!r} {tool!r}")
        line = f"{event} {key} {tool} {on_unknown} {attempt} {os.getpid()}\n".encode()
        descriptor = os.open(self.calls, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            # One write of a short line to a file opened O_APPEND: whole, and
            # after every line written before it, whichever process wrote those.
            os.write(descriptor, line)
            os.fsync(descriptor)
        finally:
            os.close(descriptor)

    def held(self, on_unknown: str, pid: int | None = None) -> bool:
        """Whether this process (or ``pid``) is told to hold calls of tools with
        this policy."""
        try:
            named = (self.holds / str(pid or os.getpid())).read_text(encoding="utf-8")
        except OSError:
            return False
        return named.strip() == on_unknown

    async def hold_while_told(self, on_unknown: str) -> None:
        """Wait while this process is told to hold (see the module docstring)."""
        deadline = time.monotonic() + HOLD_AT_MOST
        if not self.held(on_unknown):
            return
        logger.warning("crash test: holding a %s tool call until the replica is killed", on_unknown)
        # The hold is a file another process removes: there is nothing to wait
        # on but the file itself.
        while True:
            await asyncio.sleep(_POLL)
            if not self.held(on_unknown) or time.monotonic() > deadline:
                return

    # ------------------------------------------------------- the crash test's side

    def hold(self, pid: int, on_unknown: str) -> None:
        """Hold process ``pid``'s calls of tools whose policy is ``on_unknown``."""
        target = self.holds / str(pid)
        temporary = target.with_suffix(".tmp")
        temporary.write_text(on_unknown, encoding="utf-8")
        os.replace(temporary, target)

    def release(self, pid: int | None = None) -> None:
        """Stop holding ``pid``'s calls (every process's when None)."""
        paths = [self.holds / str(pid)] if pid is not None else list(self.holds.glob("*"))
        for path in paths:
            path.unlink(missing_ok=True)

    def runs(self, message_id: str | None = None) -> list[ToolRun]:
        """Every execution recorded (of turn ``message_id``'s calls only, if
        given), in the order they started."""
        started: dict[tuple[str, int, int], int] = {}
        ended: dict[tuple[str, int, int], int] = {}
        fields: dict[tuple[str, int, int], tuple[str, str]] = {}
        with open(self.calls, encoding="utf-8") as ledger:
            for number, line in enumerate(ledger):
                parts = line.split()
                if len(parts) != 6 or not line.endswith("\n"):
                    continue  # a line being written right now
                event, key, tool, on_unknown, attempt, pid = parts
                if message_id is not None and key.rpartition(":")[0] != message_id:
                    continue
                run = (key, int(attempt), int(pid))
                if event == "start":
                    started.setdefault(run, number)
                    fields[run] = (tool, on_unknown)
                elif event == "end":
                    ended.setdefault(run, number)
        return sorted(
            (
                ToolRun(
                    key=run[0],
                    tool=fields[run][0],
                    on_unknown=fields[run][1],
                    attempt=run[1],
                    pid=run[2],
                    ended=run in ended,
                    started_at=line,
                    ended_at=ended.get(run),
                )
                for run, line in started.items()
            ),
            key=lambda run: run.started_at,
        )


def recorded(tool: Tool) -> Tool:
    """Record each execution of ``tool`` in the ledger (when the variable is
    set), and hold it there when told to; returns the same tool."""
    function: Callable[..., Awaitable[Any]] = tool.function

    @functools.wraps(function)
    async def run(**arguments: Any) -> Any:
        ledger = ToolLedger.from_env()
        call = current_tool_call()
        if ledger is None or call is None:
            return await function(**arguments)
        entry = (call.idempotency_key, tool.name, tool.on_unknown, call.attempt)
        await asyncio.to_thread(ledger.record, "start", *entry)
        await ledger.hold_while_told(tool.on_unknown)
        try:
            return await function(**arguments)
        finally:
            # Not when cancelled (a cancel, or the turn's loss): the call did
            # not complete, as a kill would leave it.
            if not _cancelling():
                await asyncio.to_thread(ledger.record, "end", *entry)

    tool.function = run
    return tool


def _cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
