"""The clients' side of a round: each turn's client notices the fault (its
stream ends or goes quiet) and recovers the turn as a real client would
(``recovery.recover``); or, unattended, the client hangs up at the kill and a
second device, attached through another replica before it (the witness),
watches the turn reach its verdict by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from datetime import datetime

import httpx2

from tether.crashtest.faults import FaultKind
from tether.crashtest.fence import snapshot
from tether.crashtest.invariants import Violation
from tether.crashtest.reader import TurnReader
from tether.crashtest.recovery import recover
from tether.crashtest.reference import Reference
from tether.crashtest.rounds.state import RoundContext, RoundPlan, Turn, any_running


async def recover_turn(
    ctx: RoundContext,
    plan: RoundPlan,
    turn: Turn,
    turn_within: float,
    *,
    deadline: float,
    resume_after: asyncio.Event | None = None,
    failed_start: int | None = None,
) -> None:
    """Recover one turn as its client would, after the fault hit its producer
    (its start ``failed_start``), once ``resume_after`` is set, if given."""
    evidence, first, result = turn.evidence, turn.first, turn.result
    assert first is not None and evidence.fault_at is not None and result.message_id is not None
    try:
        await _noticed(first, evidence.fault_at, stall_for(turn.reference), within=turn_within)
        evidence.view.take(first)
        if first.finished_turn:
            # The producer finished the turn on its own (before the fault, or a
            # drain that let it complete).
            result.path = ["finished"]
            evidence.recovered_at = first.ended_at
            return
        if resume_after is not None and not resume_after.is_set():
            await resume_after.wait()
            result.notes.append(f"resumed once {plan.producer.name} was back")

        def took_over(reader: TurnReader) -> None:
            if evidence.takeover is None:
                evidence.takeover = reader
                turn.settled.set()

        recovery = await recover(
            ctx.api,
            ctx.cluster,
            plan.producer,
            session_id=result.session_id,
            message_id=result.message_id,
            view=evidence.view,
            deadline=deadline - 10.0,
            on_takeover=took_over,
            resumed_from_index=ctx.settings.max_turn_events,
            failed_start=failed_start,
        )
        evidence.readers += recovery.readers
        result.path = recovery.path
        evidence.recovered_at = recovery.finished_at
        if recovery.problem is not None:
            result.violations.append(Violation("terminal", recovery.problem))
    finally:
        turn.settled.set()
        turn.recovered.set()
    if plan.fault.kind is FaultKind.STOP:
        owner = any_running(ctx.cluster, prefer_not=plan.producer)
        if owner is not None:
            evidence.left = await snapshot(ctx.api, owner.url, result.session_id)


async def attach_witness(ctx: RoundContext, plan: RoundPlan, turn: Turn) -> None:
    """Attach a second device to the turn through another replica, before the
    kill: it reads the turn through it and never reconnects, resumes or asks."""
    replica = any_running(ctx.cluster, prefer_not=plan.producer)
    assert replica is not None and turn.result.message_id is not None
    witness = ctx.api.attach(
        replica.url, replica.name, turn.result.message_id, turn.result.session_id, label="witness"
    )
    turn.evidence.witness = witness
    turn.evidence.readers.append(witness)
    if not await witness.wait_for(lambda r: bool(r.messages), 10.0):
        turn.result.notes.append(f"the witness on {replica.name} got nothing before the kill")


async def unattended(ctx: RoundContext, plan: RoundPlan, turn: Turn, within: float) -> None:
    """Recover nothing: the client hangs up at the kill (a closed tab). Wait for
    the witness's stream to end and the turn to reach a verdict by itself."""
    evidence, first, result = turn.evidence, turn.first, turn.result
    witness = evidence.witness
    assert first is not None and witness is not None
    try:
        await first.aclose()  # its events stay evidence; the user saw the witness
        evidence.dead_at, evidence.taken_at_once = await _dead_at(ctx, plan, turn)
        await witness.ended(within)
        evidence.view.take(witness)
        result.path = ["unattended", f"witness:{witness.describe_end()}"]
        verdict = await _verdict_by_itself(ctx, plan, result.session_id, within)
        evidence.recovered_at = witness.ended_at
        if verdict is None:
            result.violations.append(
                Violation("terminal", f"no verdict within {within:.0f} s with no client recovering")
            )
    finally:
        turn.settled.set()
        turn.recovered.set()


async def _dead_at(ctx: RoundContext, plan: RoundPlan, turn: Turn) -> tuple[float | None, bool]:
    """When the killed producer's turn reads dead by age: its row's last
    heartbeat plus the dead threshold, if the row is still the killed
    producer's; and whether it already had a new producer instead (taken
    over right after the kill, by the presence lock's verdict)."""
    replica = any_running(ctx.cluster, prefer_not=plan.producer)
    if replica is None:
        return None, False
    with contextlib.suppress(httpx2.HTTPError):
        status = await ctx.api.status(replica.url, turn.result.session_id)
        if status is None or turn.epoch_before is None:
            return None, False
        if status.epoch == turn.epoch_before and status.heartbeat_at:
            heartbeat = datetime.fromisoformat(status.heartbeat_at).timestamp()
            return heartbeat + ctx.settings.dead_after, False
        return None, status.epoch > turn.epoch_before
    return None, False


async def _verdict_by_itself(
    ctx: RoundContext, plan: RoundPlan, session_id: str, within: float
) -> str | None:
    """The turn's verdict once it has one (polling its status, which recovers
    nothing); None if it still has none after ``within`` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        replica = any_running(ctx.cluster, prefer_not=plan.producer)
        status = None
        if replica is not None:
            with contextlib.suppress(httpx2.HTTPError):
                status = await ctx.api.status(replica.url, session_id)
        if status is not None and status.status in ("done", "errored", "cancelled"):
            return status.status
        await asyncio.sleep(0.1)
    return None


async def _noticed(reader: TurnReader, fault_at: float, stall: float, *, within: float) -> None:
    """Wait until a client would notice: its stream ended, or went quiet for ``stall``."""
    deadline = time.monotonic() + within
    while not reader.done and time.monotonic() < deadline:
        if time.monotonic() - max(reader.last_activity, fault_at) > stall:
            return
        await asyncio.sleep(0.01)


def stall_for(reference: Reference) -> float:
    """Quiet long enough to mean trouble: ten typical gaps, at least a second."""
    shape = reference.shape
    typical = shape.duration / max(1, shape.messages - 1)
    return max(1.0, 10 * typical)
