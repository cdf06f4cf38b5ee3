"""Crash-free runs: what each round's prompt gives when nothing fails.

One run per distinct prompt, each on a fresh session, all at once across the
replicas. Its transcript is what a round must end with; its calculator count is
how often the tool may run in a round; its timing places the faults.

A round runs several conversations at once, so each conversation's prompt
names an arithmetic expression of its own (``conversation_prompt``): the
calculator runs on it, and the tool log (one line per execution, with its
expression) tells whose turn ran the tool.

The tool agent (``tool`` rounds) counts its tools' executions in the tool-call
ledger instead (``tether.crashtest.instruments.tool_ledger``), by idempotency key, so each
turn's runs are its own: its references say which calls ran, with which
``on_unknown`` policy.

Without a conversation store there is no transcript to fetch: the reference
is the user's message and the answer the crash-free client was streamed.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tether.crashtest.client import TetherAPI
from tether.crashtest.cluster import Cluster, ClusterError
from tether.crashtest.faults import TurnShape
from tether.crashtest.instruments.tool_ledger import ToolLedger
from tether.crashtest.invariants import Expected, normalize_all

PROMPTS = (
    "Tell me about rivers and the towns along them.",
    "Write about the harbor at night and the people who work there.",
    "Describe a long journey across the mountains, step by step.",
)


@dataclass(frozen=True)
class Reference:
    expected: Expected
    shape: TurnShape
    tool_expressions: tuple[str, ...] = ()
    """The expressions of the calculator calls the answer completed (normalized)."""
    ledgered: bool = False
    """The agent's tools record their runs in the tool-call ledger: a round counts
    them there, by the turn's message id, not in the tool log."""


@dataclass(frozen=True)
class _Run:
    prompt: str
    message_id: str
    transcript: list[dict[str, Any]]
    shape: TurnShape


CRASH_FREE_AT_ONCE = 32
"""Crash-free runs of one agent streamed at once. The long and the tool
agent's runs go together, over the crash test's one HTTP client and its 100
connections: with every run at once (a 1,000-turn run has about 80 prompts
per agent) the client's pool timed out and the crash test could not start."""


def conversation_prompt(base: str, slot: int) -> str:
    """The prompt of conversation ``slot`` of a round: ``base`` with an
    expression no other conversation of the round has."""
    return f"{base} Start by working out {slot + 2} * 1001."


def tool_expressions(transcript: Sequence[dict[str, Any]]) -> tuple[str, ...]:
    """The expressions of the completed calculator calls in the bot's answers,
    as the tool log writes them (whitespace collapsed)."""
    found = []
    for message in transcript:
        if message.get("sender") != "bot":
            continue
        for part in message.get("content_parts") or []:
            tool = part.get("tool") or {}
            expression = (tool.get("params") or {}).get("expression")
            if part.get("type") == "tool" and tool.get("status") == "completed" and expression:
                found.append(" ".join(str(expression).split()))
    return tuple(found)


def completed_tool_calls(transcript: Sequence[dict[str, Any]]) -> int:
    """Tool calls the bot's answers show as completed."""
    return sum(_completed_in(m) for m in transcript if m.get("sender") == "bot")


def has_completed_tool(message: dict[str, Any]) -> bool:
    return _completed_in(message) > 0


def _completed_in(message: dict[str, Any]) -> int:
    return sum(
        1
        for part in message.get("content_parts") or []
        if part.get("type") == "tool" and (part.get("tool") or {}).get("status") == "completed"
    )


async def crash_free_runs(
    api: TetherAPI,
    cluster: Cluster,
    prompts: Sequence[str],
    *,
    within: float,
    ledger: ToolLedger | None = None,
) -> tuple[dict[str, Reference], list[str]]:
    """The reference of each prompt, and warnings about what cannot be checked.

    With ``ledger`` (the tool agent), every completed call must have its one
    run in the ledger, under the turn's message id."""
    runs_before = cluster.tool_runs()
    unique = list(dict.fromkeys(prompts))
    gate = asyncio.Semaphore(CRASH_FREE_AT_ONCE)

    async def gated(number: int, prompt: str) -> _Run:
        async with gate:
            return await _run(api, cluster, prompt, number, within=within)

    runs = await asyncio.gather(*(gated(number, prompt) for number, prompt in enumerate(unique)))
    if ledger is not None:
        return {run.prompt: _ledgered(run, ledger) for run in runs}, []
    executed = cluster.tool_runs() - runs_before
    completed = sum(completed_tool_calls(run.transcript) for run in runs)
    warnings: list[str] = []
    counted = True
    if executed != completed:
        if executed:
            raise ClusterError(
                f"the crash-free runs completed {completed} tool calls but the tool log "
                f"counted {executed} executions; the count cannot be trusted"
            )
        # A project whose tools do not append to TETHER_TOOL_LOG.
        warnings.append(
            "the project's tools do not count their executions in TETHER_TOOL_LOG; "
            "tool-once is not checked"
        )
        counted = False
    references = {}
    for run in runs:
        tool_runs = completed_tool_calls(run.transcript) if counted else 0
        references[run.prompt] = Reference(
            Expected(run.prompt, normalize_all(run.transcript), tool_runs),
            run.shape,
            tool_expressions(run.transcript),
        )
    return references, warnings


def _ledgered(run: _Run, ledger: ToolLedger) -> Reference:
    """The reference of a tool agent's run: its calls as the ledger has them."""
    executions = ledger.runs(run.message_id)
    completed = completed_tool_calls(run.transcript)
    calls = sorted({execution.index for execution in executions})
    if not executions:
        raise ClusterError(
            f"the tool agent's crash-free run of {run.prompt!r} recorded no tool run in the "
            "tool-call ledger: its tools need tether.crashtest.instruments.tool_ledger.recorded"
        )
    if len(executions) != completed or calls != list(range(completed)):
        raise ClusterError(
            f"the crash-free run of {run.prompt!r} completed {completed} tool calls but the "
            f"tool-call ledger has {len(executions)} runs of calls {calls}; the count "
            "cannot be trusted"
        )
    policies = tuple(execution.on_unknown for execution in executions)
    shape = TurnShape(
        run.shape.messages, run.shape.duration, run.shape.tool_message, tool_policies=policies
    )
    return Reference(
        Expected(run.prompt, normalize_all(run.transcript), completed),
        shape,
        tool_expressions(run.transcript),
        ledgered=True,
    )


async def _run(
    api: TetherAPI, cluster: Cluster, prompt: str, number: int, *, within: float
) -> _Run:
    replica = cluster.replicas[number % len(cluster.replicas)]
    session = f"crash-free-{uuid.uuid4().hex[:12]}"
    reader = api.start_turn(replica.url, replica.name, prompt, session)
    if not await reader.ended(within):
        await reader.aclose()
        raise ClusterError(f"the crash-free run of {prompt!r} did not end within {within:.0f} s")
    if reader.status_code != 201 or not reader.finished_turn or not reader.messages:
        raise ClusterError(
            f"the crash-free run of {prompt!r} on {replica.name} failed: "
            f"{reader.describe_end()} {reader.http_error or reader.error or reader.stream_error}"
        )
    messages = reader.messages
    if api.conversations:
        transcript = await api.transcript(replica.url, session)
        if transcript is None:
            raise ClusterError(f"the crash-free run of {prompt!r} left no conversation")
    else:
        # No transcripts kept: the answer is the last message the client got.
        transcript = [{"sender": "user", "content": prompt}, messages[-1].message or {}]
    tool_at = next(
        (
            position
            for position, event in enumerate(messages)
            if event.message is not None and has_completed_tool(event.message)
        ),
        None,
    )
    shape = TurnShape(
        messages=len(messages), duration=messages[-1].at - messages[0].at, tool_message=tool_at
    )
    assert reader.message_id is not None, "a turn that started has a message id"
    return _Run(prompt, reader.message_id, transcript, shape)
