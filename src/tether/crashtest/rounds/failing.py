"""How a round fails its producer: a signal at a point of the first
conversation's turn, a pause armed in a chosen store write, a kill once every
turn is inside a held tool call; or a cancel from another replica as each
answer ends.

Each marks when the fault came and how much every turn had shown by then
(``fault_at``, ``longest_at_fault``): the checks and the measures start there.
"""

from __future__ import annotations

import asyncio
import time

import httpx2

from tether.crashtest.client import TetherAPI
from tether.crashtest.cluster import Replica
from tether.crashtest.faults import FaultKind, FaultPlan, FaultPoint, inject
from tether.crashtest.instruments.tool_ledger import ToolLedger
from tether.crashtest.invariants import CancelEvidence, Violation
from tether.crashtest.reader import TurnReader
from tether.crashtest.reference import has_completed_tool
from tether.crashtest.rounds.state import (
    RoundContext,
    RoundPlan,
    RoundState,
    Turn,
    content_length,
    held_in,
)


async def fail(
    ctx: RoundContext, plan: RoundPlan, active: list[Turn], state: RoundState, *, within: float
) -> bool:
    """Fail the producer; False when the round has nothing to recover."""
    producer, kind = plan.producer, plan.fault.kind
    if kind is FaultKind.PAUSE_IN_WRITE:
        ctx.phase(
            f"round {plan.number}: waiting for {producer.name} to pause in {plan.fault.describe()}"
        )
        state.pause_fired = await producer.wait_stopped(
            within, unless=lambda: all(t.first is not None and t.first.done for t in active)
        )
        if not state.pause_fired:
            for turn in active:
                turn.result.notes.append(
                    f"the pause never came: {producer.name} made fewer {plan.fault.variant} "
                    "writes than planned while its turns ran"
                )
        _mark_fault(active)
        return True
    if kind is FaultKind.TOOL:
        return await _kill_inside_tool_calls(ctx, plan, active, within=within)
    lead = active[0]
    assert lead.first is not None
    if not await _reach(lead.first, plan.fault, within=within):
        for turn in active:
            turn.result.error = f"the turn ended before the fault point ({plan.fault.describe()})"
        return False
    _mark_fault(active)
    ctx.phase(f"round {plan.number}: {kind} {producer.name} at {plan.fault.describe()}")
    await inject(producer, kind)
    return True


async def _kill_inside_tool_calls(
    ctx: RoundContext, plan: RoundPlan, active: list[Turn], *, within: float
) -> bool:
    """Kill the producer once every turn's held call has started there."""
    producer, hold, ledger = plan.producer, plan.fault.hold, ctx.cluster.ledger
    assert hold is not None and producer.pid is not None
    pid = producer.pid
    ctx.phase(f"round {plan.number}: waiting for the turns to be inside a {hold} tool call")
    inside = await _inside_tool_calls(ledger, pid, hold, active, within=within)
    if not any(inside):
        ledger.release(pid)
        for turn in active:
            turn.result.error = (
                f"no turn started a call of a {hold} tool on {producer.name} within {within:.0f} s"
            )
        return False
    _mark_fault(active)
    ctx.phase(f"round {plan.number}: kill {producer.name} inside {sum(inside)} {hold} tool calls")
    await inject(producer, FaultKind.TOOL)
    ledger.release(pid)
    for turn in active:
        turn.evidence.killed_pid = pid
    return True


async def _inside_tool_calls(
    ledger: ToolLedger, pid: int, hold: str, active: list[Turn], *, within: float
) -> list[bool]:
    """Wait until each turn has a run of a ``hold`` tool started in process
    ``pid`` and not ended (it is held there), or its stream ended, or
    ``within`` seconds passed; which turns are inside such a call."""
    deadline = time.monotonic() + within
    while True:
        held = {run.message_id for run in ledger.runs() if held_in(run, pid, hold)}
        inside = [turn.result.message_id in held for turn in active]
        ended = [t.first is None or t.first.done for t in active]
        if all(i or e for i, e in zip(inside, ended, strict=True)):
            return inside
        if time.monotonic() > deadline:
            return inside
        await asyncio.sleep(0.01)


def _mark_fault(active: list[Turn]) -> None:
    now = time.monotonic()
    for turn in active:
        assert turn.first is not None
        turn.evidence.fault_at = now
        turn.evidence.longest_at_fault = max(
            (content_length(e.message) for e in turn.first.messages), default=0
        )


async def _reach(reader: TurnReader, fault: FaultPlan, *, within: float) -> bool:
    """Wait for the fault's point in the turn; False if the turn ended first."""
    if fault.after_seconds is not None:
        wait = reader.opened_at + fault.after_seconds - time.monotonic()
        await reader.wait_for(lambda _: False, max(0.0, wait))
    elif fault.point is FaultPoint.TOOL and fault.after_tool_delay is not None:
        # Messages are cumulative: the first one showing the completed call is
        # the moment right after it (and after the checkpoint that precedes it).
        seen = await reader.wait_for(
            lambda r: bool(r.messages) and has_completed_tool(r.messages[-1].message or {}),
            within,
        )
        if not seen:
            return False
        if fault.after_tool_delay:
            await reader.wait_for(lambda _: False, fault.after_tool_delay)
    else:
        count = fault.after_messages or 1
        await reader.wait_for(lambda r: len(r.messages) >= count, within)
    return not reader.done


async def cancel_at_end(
    api: TetherAPI, canceller: Replica, fault: FaultPlan, turn: Turn, *, within: float
) -> None:
    """Cancel the turn from another replica just as its answer ends."""
    first, evidence, result = turn.first, turn.evidence, turn.result
    assert first is not None and result.message_id is not None
    target = max(1, turn.reference.shape.messages - (fault.before_end or 0))
    await first.wait_for(lambda r: len(r.messages) >= target, within)
    if fault.cancel_delay:
        await first.wait_for(lambda _: False, fault.cancel_delay)
    evidence.fault_at = time.monotonic()
    evidence.longest_at_fault = max((content_length(e.message) for e in first.messages), default=0)
    status: int | None = None
    try:
        status = await api.cancel(canceller.url, result.message_id, result.session_id)
    except httpx2.HTTPError as error:
        result.notes.append(f"the cancel got no answer: {type(error).__name__}")
    if not await first.ended(within):
        result.violations.append(
            Violation("terminal", f"the client's stream did not end within {within:.0f} s")
        )
    evidence.view.take(first)
    evidence.recovered_at = first.ended_at
    result.path = [f"cancel:{status if status is not None else '-'}"]
    verdict = "done" if first.finished_turn else first.describe_end()
    evidence.cancel = CancelEvidence(response_status=status, reader_verdict=verdict)
