"""One round: start several turns on one replica, fail it, recover each turn as its
client would, check the invariants per turn.

A round runs ``conversations`` turns at once on its producer, so a fault hits
every turn the replica holds, as a real crash does. Each turn's story is kept
as evidence (every reader's events with arrival times, its tool executions,
snapshots around a fenced producer, the stores after the round) and handed to
``invariants.check_round``; the metrics of the summary come from the same
evidence.

The faults (see ``faults``): kill, unattended, term and stop signal the producer at a point
of the first conversation's turn; pause-in-write arms the producer at its start
to stop itself inside a chosen store write; rolling-deploy drains the producer,
then the replica the turns were resumed on; cancel-at-end cancels each turn
from another replica as its answer ends; unattended kills the producer and
recovers nothing: each turn's client hangs up at the kill, and only a second
device, attached through another replica before it, watches the turn finish
by the replicas' automatic takeover; tool tells the producer, before the turns
start, to hold its calls of tools with one ``on_unknown`` policy (the tool
agent's tools record their runs in the tool-call ledger, which the hold is part
of), waits until every turn's call of that policy has started there, and kills
it: each turn is cut off inside a tool call, after the checkpoint recording the
call as started and before the one recording it completed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import signal
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

import httpx2

from tether.crashtest.client import ClientView, TetherAPI, TurnReader
from tether.crashtest.cluster import Cluster, Replica
from tether.crashtest.faults import FaultKind, FaultPlan, FaultPoint, inject
from tether.crashtest.fence import StoreReader, snapshot
from tether.crashtest.invariants import (
    UNKNOWN_OUTCOME,
    CancelEvidence,
    FenceEvidence,
    Observed,
    ReaderTrace,
    SeenEvent,
    Snapshot,
    StoredTurn,
    ToolCalls,
    Violation,
    check_round,
    rewound_characters,
    turn_answer,
)
from tether.crashtest.recovery import recover
from tether.crashtest.reference import Reference, has_completed_tool
from tether.crashtest.results import RoundResult
from tether.settings import TetherSettings
from tether.testing.pause_in_write import PAUSE_IN_VARIABLE
from tether.testing.tool_ledger import ToolLedger, ToolRun

Phase = Callable[[str], None]
# How long a SIGTERMed replica may take to drain and exit before it is killed.
_TERM_EXIT_WITHIN = 30.0


@dataclass(frozen=True)
class RoundPlan:
    number: int
    prompts: tuple[str, ...]
    """One per conversation of the round; the first one's turn places the fault."""
    producer: Replica
    fault: FaultPlan


@dataclass
class RoundContext:
    api: TetherAPI
    cluster: Cluster
    settings: TetherSettings
    stores: StoreReader | None
    """The store set, to read the recording and checkpoint after each round
    (None: not readable from here; those checks are skipped)."""
    phase: Phase
    conversation_store: bool = True


@dataclass
class _Evidence:
    readers: list[TurnReader] = field(default_factory=list)
    view: ClientView = field(default_factory=ClientView)
    fault_at: float | None = None
    longest_at_fault: int = 0
    recovered_at: float | None = None
    takeover: TurnReader | None = None
    continued_while_owner_streamed: bool | None = None
    left: Snapshot | None = None
    after: Snapshot | None = None
    old_readers_ended: bool = True
    cancel: CancelEvidence | None = None
    witness: TurnReader | None = None
    """An unattended round's second device, attached through another replica."""
    dead_at: float | None = None
    """Unattended: when the killed producer's turn read dead (its last heartbeat
    plus the dead threshold), as a ``time.time()``: the store's clock is this
    host's (SQLite) or a server on it (PostgreSQL)."""
    taken_at_once: bool = False
    """Unattended: the turn had a new producer when its status was first read
    after the kill, long before its last heartbeat could age past the
    threshold (its producer's presence lock said it was gone)."""
    fence_void: str | None = None
    """Why the fence cannot be checked: the producer was continued before the
    turn was taken over (the survivors could not take it: see the notes)."""
    killed_pid: int | None = None
    """Tool rounds: the process killed inside the turn's tool call."""


@dataclass
class _Turn:
    """One conversation of the round."""

    slot: int
    prompt: str
    reference: Reference
    result: RoundResult
    evidence: _Evidence = field(default_factory=_Evidence)
    first: TurnReader | None = None
    epoch_before: int | None = None
    started: bool = False
    checked: bool = False
    settled: asyncio.Event = field(default_factory=asyncio.Event)
    """Taken over by another replica, or recovered, or finished: nothing of
    this turn waits for the failed producer any more."""
    recovered: asyncio.Event = field(default_factory=asyncio.Event)
    """The client's recovery is over (the turn finished, or it gave up)."""


@dataclass
class _RoundState:
    continue_task: asyncio.Task[None] | None = None
    deploy_task: asyncio.Task[None] | None = None
    pause_fired: bool = False
    second: Replica | None = None
    """The replica a rolling deploy drained second."""
    first_back: asyncio.Event = field(default_factory=asyncio.Event)
    """A rolling deploy restarted the replica it drained first (or gave up on
    it): the clients may resume now."""


def round_bound(reference: Reference, settings: TetherSettings) -> float:
    """The most a round may take: the turn twice over, plus the dead threshold and
    restarts, with room for a slow machine."""
    return 3 * reference.shape.duration + 4 * settings.dead_after + 60.0


async def play_round(
    ctx: RoundContext, plan: RoundPlan, references: dict[str, Reference]
) -> list[RoundResult]:
    """Play the round; one result per conversation."""
    turns = [
        _Turn(
            slot,
            prompt,
            references[prompt],
            RoundResult(
                number=plan.number,
                conversation=slot,
                producer=plan.producer.name,
                fault=str(plan.fault.kind),
                variant=plan.fault.variant,
                point=plan.fault.describe(),
                prompt=prompt,
                session_id=f"crash-{plan.number}-{slot}-{uuid.uuid4().hex[:10]}",
                expected_tool_runs=references[prompt].expected.tool_runs,
            ),
        )
        for slot, prompt in enumerate(plan.prompts)
    ]
    state = _RoundState()
    started = time.monotonic()
    bound = max(round_bound(turn.reference, ctx.settings) for turn in turns)
    if plan.fault.kind is FaultKind.ROLLING_DEPLOY:
        bound += _TERM_EXIT_WITHIN
    try:
        async with asyncio.timeout(bound):
            await _play(ctx, plan, turns, state, deadline=started + bound)
    except TimeoutError:
        for turn in turns:
            if not turn.checked and turn.result.error is None:
                turn.result.violations.append(
                    Violation(
                        "terminal", f"the round did not finish within its bound of {bound:.0f} s"
                    )
                )
    except asyncio.CancelledError:
        # Interrupted: hang up and leave; the cluster is stopped on the way out.
        for turn in turns:
            for reader in turn.evidence.readers:
                await reader.aclose()
        raise
    except (httpx2.HTTPError, OSError, ValueError, KeyError) as error:
        for turn in turns:
            if not turn.checked:
                turn.result.error = f"the round broke off: {type(error).__name__}: {error}"
    await _tidy_up(ctx, plan, turns, state)
    duration = time.monotonic() - started
    for turn in turns:
        turn.result.duration = duration
    return [turn.result for turn in turns]


async def _play(
    ctx: RoundContext,
    plan: RoundPlan,
    turns: list[_Turn],
    state: _RoundState,
    *,
    deadline: float,
) -> None:
    api, cluster, producer, kind = ctx.api, ctx.cluster, plan.producer, plan.fault.kind
    if plan.fault.pause is not None:
        ctx.phase(
            f"round {plan.number}: arming {producer.name} to pause in {plan.fault.describe()}"
        )
        await producer.restart(fault_env={PAUSE_IN_VARIABLE: plan.fault.pause.value})
    runs_before = cluster.tool_runs_by_expression()
    if plan.fault.hold is not None and producer.pid is not None:
        # Before the turns start: each one's call then waits for the kill.
        cluster.ledger.hold(producer.pid, plan.fault.hold)
    ctx.phase(f"round {plan.number}: {len(turns)} turns on {producer.name}")
    for turn in turns:
        turn.first = api.start_turn(
            producer.url, producer.name, turn.prompt, turn.result.session_id
        )
        turn.evidence.readers.append(turn.first)
    await asyncio.gather(*(_started(turn, producer) for turn in turns))
    active = [turn for turn in turns if turn.started]
    if not active:
        return
    turn_within = 2 * max(t.reference.shape.duration for t in active) + 15.0
    epochs = await asyncio.gather(
        *(_epoch(api, cluster, producer, t.result.session_id) for t in active)
    )
    for turn, epoch in zip(active, epochs, strict=True):
        turn.epoch_before = epoch

    if kind is FaultKind.CANCEL_AT_END:
        canceller = _any_running(cluster, prefer_not=producer)
        assert canceller is not None, "a cluster has at least two replicas"
        ctx.phase(f"round {plan.number}: cancelling from {canceller.name} as the answers end")
        await asyncio.gather(
            *(_cancel_at_end(api, canceller, plan.fault, t, within=turn_within) for t in active)
        )
    elif kind is FaultKind.UNATTENDED:
        await asyncio.gather(*(_witness(ctx, plan, t) for t in active))
        if not await _fail(ctx, plan, active, state, within=turn_within):
            return
        ctx.phase(f"round {plan.number}: nobody recovers; waiting for the verdicts")
        await asyncio.gather(*(_unattended(ctx, plan, t, turn_within) for t in active))
    else:
        if not await _fail(ctx, plan, active, state, within=turn_within):
            return
        ctx.phase(f"round {plan.number}: recovering from {plan.fault.describe()} ({kind})")
        if kind is FaultKind.STOP or (kind is FaultKind.PAUSE_IN_WRITE and state.pause_fired):
            state.continue_task = asyncio.create_task(
                _continue_producer(ctx, plan, active, within=turn_within)
            )
        elif kind is FaultKind.ROLLING_DEPLOY:
            state.deploy_task = asyncio.create_task(
                _deploy_on(ctx, plan, active, state, within=turn_within)
            )
        # A rolling deploy's clients resume once the drained producer is back
        # (see ``_deploy_on``). Not through a load balancer: it could send the
        # resume to the restarted replica, leaving none to drain second.
        staged = kind is FaultKind.ROLLING_DEPLOY and ctx.api.front is None
        resume_after = state.first_back if staged else None
        recover_turn = functools.partial(
            _recover_turn,
            deadline=deadline,
            resume_after=resume_after,
            failed_start=producer.starts,
        )
        await asyncio.gather(*(recover_turn(ctx, plan, t, turn_within) for t in active))
        if kind.fences:
            ctx.phase(f"round {plan.number}: continuing {producer.name}, checking the fence")
            await _fence_evidence(ctx, plan, active, state)
        elif kind is FaultKind.TERM:
            ctx.phase(f"round {plan.number}: waiting for {producer.name} to drain and exit")
            if await producer.wait_exit(_TERM_EXIT_WITHIN) is None:
                for turn in active:
                    turn.result.notes.append(
                        f"{producer.name} did not exit within {_TERM_EXIT_WITHIN:.0f} s of SIGTERM"
                    )
        elif kind is FaultKind.ROLLING_DEPLOY and state.deploy_task is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(state.deploy_task), _TERM_EXIT_WITHIN)

    ctx.phase(f"round {plan.number}: checking {len(active)} turns")
    runs = cluster.tool_runs_by_expression() - runs_before
    for turn in active:
        await _check(ctx, plan, turn, active, runs)


async def _started(turn: _Turn, producer: Replica) -> None:
    first, result = turn.first, turn.result
    assert first is not None
    if not await first.responded(10.0) or first.status_code != 201 or not first.message_id:
        result.error = f"the turn did not start on {producer.name}: {first.describe_end()}"
        return
    result.message_id = first.message_id
    if not await first.wait_for(lambda r: bool(r.messages), 15.0):
        result.error = f"no first message from {producer.name}: {first.describe_end()}"
        return
    result.time_to_first_message = first.messages[0].at - first.opened_at
    turn.started = True


async def _fail(
    ctx: RoundContext, plan: RoundPlan, active: list[_Turn], state: _RoundState, *, within: float
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
    ctx: RoundContext, plan: RoundPlan, active: list[_Turn], *, within: float
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
    ledger: ToolLedger, pid: int, hold: str, active: list[_Turn], *, within: float
) -> list[bool]:
    """Wait until each turn has a run of a ``hold`` tool started in process
    ``pid`` and not ended (it is held there), or its stream ended, or
    ``within`` seconds passed; which turns are inside such a call."""
    deadline = time.monotonic() + within
    while True:
        held = {run.message_id for run in ledger.runs() if _held_in(run, pid, hold)}
        inside = [turn.result.message_id in held for turn in active]
        ended = [t.first is None or t.first.done for t in active]
        if all(i or e for i, e in zip(inside, ended, strict=True)):
            return inside
        if time.monotonic() > deadline:
            return inside
        await asyncio.sleep(0.01)


def _held_in(run: ToolRun, pid: int, hold: str) -> bool:
    return run.pid == pid and run.on_unknown == hold and not run.ended


def _mark_fault(active: list[_Turn]) -> None:
    now = time.monotonic()
    for turn in active:
        assert turn.first is not None
        turn.evidence.fault_at = now
        turn.evidence.longest_at_fault = max(
            (_length(e.message) for e in turn.first.messages), default=0
        )


async def _recover_turn(
    ctx: RoundContext,
    plan: RoundPlan,
    turn: _Turn,
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
        await _noticed(first, evidence.fault_at, _stall(turn.reference), within=turn_within)
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
        owner = _any_running(ctx.cluster, prefer_not=plan.producer)
        if owner is not None:
            evidence.left = await snapshot(ctx.api, owner.url, result.session_id)


async def _witness(ctx: RoundContext, plan: RoundPlan, turn: _Turn) -> None:
    """Attach a second device to the turn through another replica, before the
    kill: it reads the turn through it and never reconnects, resumes or asks."""
    replica = _any_running(ctx.cluster, prefer_not=plan.producer)
    assert replica is not None and turn.result.message_id is not None
    witness = ctx.api.attach(
        replica.url, replica.name, turn.result.message_id, turn.result.session_id, label="witness"
    )
    turn.evidence.witness = witness
    turn.evidence.readers.append(witness)
    if not await witness.wait_for(lambda r: bool(r.messages), 10.0):
        turn.result.notes.append(f"the witness on {replica.name} got nothing before the kill")


async def _unattended(ctx: RoundContext, plan: RoundPlan, turn: _Turn, within: float) -> None:
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


async def _dead_at(ctx: RoundContext, plan: RoundPlan, turn: _Turn) -> tuple[float | None, bool]:
    """When the killed producer's turn reads dead by age: its row's last
    heartbeat plus the dead threshold, if the row is still the killed
    producer's; and whether it already had a new producer instead (taken
    over right after the kill, by the presence lock's verdict)."""
    replica = _any_running(ctx.cluster, prefer_not=plan.producer)
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
        replica = _any_running(ctx.cluster, prefer_not=plan.producer)
        status = None
        if replica is not None:
            with contextlib.suppress(httpx2.HTTPError):
                status = await ctx.api.status(replica.url, session_id)
        if status is not None and status.status in ("done", "errored", "cancelled"):
            return status.status
        await asyncio.sleep(0.1)
    return None


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


async def _noticed(reader: TurnReader, fault_at: float, stall: float, *, within: float) -> None:
    """Wait until a client would notice: its stream ended, or went quiet for ``stall``."""
    deadline = time.monotonic() + within
    while not reader.done and time.monotonic() < deadline:
        if time.monotonic() - max(reader.last_activity, fault_at) > stall:
            return
        await asyncio.sleep(0.01)


def _stall(reference: Reference) -> float:
    """Quiet long enough to mean trouble: ten typical gaps, at least a second."""
    shape = reference.shape
    typical = shape.duration / max(1, shape.messages - 1)
    return max(1.0, 10 * typical)


async def _all_settled(active: list[_Turn], within: float) -> bool:
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(within):
            await asyncio.gather(*(turn.settled.wait() for turn in active))
    return all(turn.settled.is_set() for turn in active)


async def _streams_past_fault(turn: _Turn, within: float) -> bool:
    """Wait until the turn's new owner streams more than the failed one had;
    whether its stream was still open then."""
    reader = turn.evidence.takeover
    if reader is None:
        return False
    longest = turn.evidence.longest_at_fault
    await reader.wait_for(lambda r: any(_length(e.message) > longest for e in r.messages), within)
    return not reader.done


async def _continue_producer(
    ctx: RoundContext, plan: RoundPlan, active: list[_Turn], *, within: float
) -> None:
    """Continue the paused producer once the other replicas own its turns.

    After a stop: once every turn it held was taken over (or finished) and the
    new owners stream new content, so it wakes (timers due: heartbeat, flush,
    checkpoint) while other replicas own its turns: the hardest moment for
    fencing. After a pause in a write: once every turn finished elsewhere, so
    the paused write lands after everything (what the new owners left is
    taken just before).

    A pause is a fault that ends: when the turns are not all taken over within
    the dead threshold and some slack (a store the paused process holds locked
    refuses everyone else), the producer is continued anyway, and those turns'
    fence is not checked (they were never fenced).
    """
    producer, settings = plan.producer, ctx.settings
    settle_within = settings.dead_after + max(_stall(t.reference) for t in active) + 12.0
    settled = await _all_settled(active, settle_within)
    if plan.fault.kind is FaultKind.STOP:
        if settled:
            streaming = await asyncio.gather(*(_streams_past_fault(t, within) for t in active))
            for turn, still in zip(active, streaming, strict=True):
                if turn.evidence.takeover is not None:
                    turn.evidence.continued_while_owner_streamed = still
        ready = [turn.settled.is_set() for turn in active]
    else:
        if settled:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(within):
                    await asyncio.gather(*(turn.recovered.wait() for turn in active))
        owner = _any_running(ctx.cluster, prefer_not=producer)
        if owner is not None:
            lefts = await asyncio.gather(
                *(snapshot(ctx.api, owner.url, t.result.session_id) for t in active)
            )
            for turn, left in zip(active, lefts, strict=True):
                turn.evidence.left = left
        ready = [turn.recovered.is_set() for turn in active]
    if not settled:
        refused = sorted(
            {
                f"{r.replica} answered {r.status_code}"
                for t in active
                for r in t.evidence.readers
                if r.status_code is not None and r.status_code >= 500
            }
        )
        why = f" ({', '.join(refused)}: a store the paused process holds?)" if refused else ""
        for turn in active:
            turn.result.notes.append(
                f"not every turn was taken over within {settle_within:.0f} s of the pause"
                f"{why}; {producer.name} was continued anyway"
            )
    for turn, is_ready in zip(active, ready, strict=True):
        if not is_ready:
            turn.evidence.fence_void = f"{producer.name} was continued before this turn was " + (
                "taken over" if plan.fault.kind is FaultKind.STOP else "finished elsewhere"
            )
    producer.send(signal.SIGCONT)


async def _deploy_on(
    ctx: RoundContext, plan: RoundPlan, active: list[_Turn], state: _RoundState, *, within: float
) -> None:
    """The rest of a rolling deploy: the drained producer exits and comes back
    (as a new replica would), the clients resume on another replica, and that
    one is drained too, once it has streamed a little of the turns.

    The clients wait for the restart (``state.first_back``). With automatic
    takeover off (``TETHER_TAKEOVER=false``: the seed's client-driven resume),
    a handed-off turn has no producer until its client resumes it, so each
    turn is still running when its second producer starts streaming it,
    however slowly the first one restarted; restarted while the second one
    streams, a slow start let it finish the turns before its drain. With
    automatic takeover on, a replica takes the turns over at once and the
    restart still races the answer (the clients then attach, not resume)."""
    first = plan.producer
    try:
        if await first.wait_exit(_TERM_EXIT_WITHIN) is None:
            first.stop()
        ctx.phase(f"round {plan.number}: restarting {first.name} (rolling deploy)")
        await first.start()
    finally:
        state.first_back.set()
    await _all_settled(active, within)
    lead = next((t for t in active if t.evidence.takeover is not None), None)
    if lead is None or lead.evidence.takeover is None:
        for turn in active:
            turn.result.notes.append("no turn was resumed elsewhere: no second drain")
        return
    reader = lead.evidence.takeover
    second = next((r for r in ctx.cluster.replicas if r.name == reader.replica), None)
    if second is None or second is first:
        return
    count = plan.fault.second_after or 1
    if not await reader.wait_for(lambda r: len(r.messages) >= count, within) or reader.done:
        for turn in active:
            turn.result.notes.append(f"the turn ended on {second.name} before its drain")
        return
    ctx.phase(f"round {plan.number}: draining {second.name} too (rolling deploy)")
    state.second = second
    for turn in active:
        turn.result.notes.append(f"drained {second.name} after it resumed the turns")
    await inject(second, FaultKind.TERM)
    await second.wait_exit(_TERM_EXIT_WITHIN)


async def _cancel_at_end(
    api: TetherAPI, canceller: Replica, fault: FaultPlan, turn: _Turn, *, within: float
) -> None:
    """Cancel the turn from another replica just as its answer ends."""
    first, evidence, result = turn.first, turn.evidence, turn.result
    assert first is not None and result.message_id is not None
    target = max(1, turn.reference.shape.messages - (fault.before_end or 0))
    await first.wait_for(lambda r: len(r.messages) >= target, within)
    if fault.cancel_delay:
        await first.wait_for(lambda _: False, fault.cancel_delay)
    evidence.fault_at = time.monotonic()
    evidence.longest_at_fault = max((_length(e.message) for e in first.messages), default=0)
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


async def _fence_evidence(
    ctx: RoundContext, plan: RoundPlan, active: list[_Turn], state: _RoundState
) -> None:
    """Continue the fenced producer (if not yet), give it time to do its worst,
    and take what the stores say before and after."""
    api, producer = ctx.api, plan.producer
    owner = _any_running(ctx.cluster, prefer_not=producer)
    assert owner is not None, "a fencing round always leaves another replica running"
    if plan.fault.kind is FaultKind.PAUSE_IN_WRITE:
        # Every turn finished elsewhere: what the new owners left, then the
        # paused write lands late.
        lefts = await asyncio.gather(
            *(snapshot(api, owner.url, t.result.session_id) for t in active)
        )
        for turn, left in zip(active, lefts, strict=True):
            turn.evidence.left = left
    elif state.continue_task is not None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(state.continue_task), 10.0)
    producer.send(signal.SIGCONT)
    # Its readers must end: it learns at its next heartbeat that it lost the turns.
    for turn in active:
        old = [r for r in turn.evidence.readers if r.replica == producer.name]
        turn.evidence.old_readers_ended = all(await asyncio.gather(*(r.ended(10.0) for r in old)))
    settings = ctx.settings
    await asyncio.sleep(
        2 * max(settings.heartbeat_interval, settings.recording_flush_interval) + 0.5
    )
    afters = await asyncio.gather(*(snapshot(api, owner.url, t.result.session_id) for t in active))
    for turn, after in zip(active, afters, strict=True):
        turn.evidence.after = after


async def _check(
    ctx: RoundContext, plan: RoundPlan, turn: _Turn, active: list[_Turn], runs: Counter[str]
) -> None:
    api, cluster, result, evidence = ctx.api, ctx.cluster, turn.result, turn.evidence
    survivor = _any_running(cluster, prefer_not=plan.producer)
    final_status = transcript = None
    last_turn_status = None
    if survivor is not None:
        with contextlib.suppress(httpx2.HTTPError):
            final_status = await api.status(survivor.url, result.session_id)
            conversation = await api.conversation(survivor.url, result.session_id)
            if conversation is not None:
                summary, transcript = conversation
                last_turn_status = summary.get("last_turn_status")
    result.final_status = final_status.status if final_status is not None else None
    stored: StoredTurn | None = None
    store_error: str | None = None
    if ctx.stores is not None:
        try:
            stored = await ctx.stores.read(result.session_id)
        except Exception as error:
            store_error = (
                f"the store set could not be read from here ({type(error).__name__}: {error})"
            )
            result.notes.append(store_error)
    else:
        store_error = "the store set is not readable from here"
    tool_calls = None
    if turn.reference.ledgered and result.message_id is not None:
        # The tools recorded their runs by idempotency key: this turn's own.
        tool_calls = ToolCalls(tuple(cluster.ledger.runs(result.message_id)))
        result.tool_runs = len(tool_calls.runs)
    else:
        result.tool_runs = _tool_runs(turn, active, runs, result)
    fence = None
    if plan.fault.kind.fences:
        if evidence.fence_void is None:
            fence = _fence(turn, stored, store_error)
            result.fence_checked = True
        else:
            result.fence_checked = False
            result.notes.append(f"fence not checked: {evidence.fence_void}")
    observed = Observed(
        transcript=transcript,
        final_status=final_status,
        tool_runs=result.tool_runs,
        readers=[_trace(reader, evidence.view) for reader in evidence.readers],
        final_streamed=_final_streamed(evidence),
        fence=fence,
        message_id=result.message_id,
        stored=stored,
        last_turn_status=last_turn_status,
        cancel=evidence.cancel,
        conversation_store=ctx.conversation_store,
        tool_outcome_unknown=(
            bool(tool_calls.retried()) if tool_calls is not None else _tool_outcome_unknown(turn)
        ),
        tool_calls=tool_calls,
    )
    if tool_calls is not None:
        result.tool_calls = _describe_calls(tool_calls, turn_answer(observed))
        _check_cut_off(plan, turn, tool_calls)
    elif observed.tool_outcome_unknown and result.tool_runs > turn.reference.expected.tool_runs:
        result.notes.append(
            "the calculator ran once more: the fault came before its result was shown "
            "(and so, maybe, before the checkpoint holding it landed)"
        )
    result.violations += check_round(
        turn.reference.expected, observed, producer_break=ctx.settings.max_turn_events // 2
    )
    result.rewound_characters = rewound_characters(observed)
    if fence is not None:
        left = fence.left_by_new_owner
        result.fence = {
            "epoch_before_fault": turn.epoch_before,
            "epoch_of_new_owner": left.status.epoch if left.status else None,
            "continued_while_new_owner_streamed": bool(evidence.continued_while_owner_streamed),
            "old_readers_heard": [
                r.describe_end() for r in evidence.readers if r.replica == plan.producer.name
            ],
        }
    _measure(result, evidence)
    result.readers = [_describe(reader) for reader in evidence.readers]
    turn.checked = True


def _check_cut_off(plan: RoundPlan, turn: _Turn, calls: ToolCalls) -> None:
    """A tool round whose kill did not cut this turn's held call off did not run
    as planned."""
    hold, pid = plan.fault.hold, turn.evidence.killed_pid
    if hold is None or pid is None:
        return
    if not any(_held_in(run, pid, hold) for run in calls.runs):
        turn.result.error = f"the kill did not land inside this turn's call of a {hold} tool"


def _describe_calls(calls: ToolCalls, answer: dict[str, object] | None) -> list[dict[str, object]]:
    """Each call of the turn: its tool and policy, its runs, whether one was cut
    off, and how the answer shows it (``unknown``: the may-or-may-not result)."""
    parts = answer.get("content_parts") if answer is not None else None
    shown = [
        dict(part.get("tool") or {})
        for part in (parts if isinstance(parts, list) else [])
        if isinstance(part, dict) and part.get("type") == "tool"
    ]
    described = []
    for index, runs in calls.by_call().items():
        tool = shown[index] if index < len(shown) else {}
        status = tool.get("status")
        if status == "error" and UNKNOWN_OUTCOME in str(tool.get("response")):
            status = "unknown"
        described.append(
            {
                "call": index,
                "tool": runs[0].tool,
                "on_unknown": runs[0].on_unknown,
                "runs": len(runs),
                "attempts": [run.attempt for run in runs],
                "cut_off": any(not run.ended for run in runs),
                "shown": status,
            }
        )
    return described


def _fence(turn: _Turn, stored: StoredTurn | None, store_error: str | None) -> FenceEvidence:
    evidence = turn.evidence
    empty = Snapshot(None, None)
    return FenceEvidence(
        epoch_before_fault=turn.epoch_before,
        left_by_new_owner=evidence.left or empty,
        after_continue=evidence.after or empty,
        old_readers_ended=evidence.old_readers_ended,
        recorded_final=stored.recorded_final if stored is not None else None,
        recorded_epoch=stored.recorded_epoch if stored is not None else None,
        checkpoint_epoch=stored.checkpoint_epoch if stored is not None else None,
        store_error=store_error,
    )


def _tool_runs(turn: _Turn, active: list[_Turn], runs: Counter[str], result: RoundResult) -> int:
    """The calculator's executions for this turn during the round, told apart by
    the expression each conversation's prompt names."""
    mine = set(turn.reference.tool_expressions)
    if not mine:
        return 0
    counted = sum(runs[expression] for expression in mine)
    sharing = [
        other
        for other in active
        if other is not turn and mine & set(other.reference.tool_expressions)
    ]
    if sharing:
        # Not told apart: the others are assumed to have run as expected, so a
        # surplus shows on every turn that shares the expression.
        counted -= sum(other.reference.expected.tool_runs for other in sharing)
        result.notes.append(
            f"tool runs counted together with conversations {[o.slot for o in sharing]}"
        )
    return counted


async def _epoch(api: TetherAPI, cluster: Cluster, producer: Replica, session: str) -> int | None:
    replica = _any_running(cluster, prefer_not=producer)
    if replica is None:
        return None
    try:
        status = await api.status(replica.url, session)
    except httpx2.HTTPError:
        return None
    return status.epoch if status is not None else None


def _any_running(cluster: Cluster, *, prefer_not: Replica) -> Replica | None:
    others = cluster.others(prefer_not)
    if others:
        return others[0]
    return prefer_not if prefer_not.running else None


def _length(message: dict[str, object] | None) -> int:
    return len(str((message or {}).get("content", "")))


def _tool_outcome_unknown(turn: _Turn) -> bool:
    """Whether the fault may have come between the tool's run and the checkpoint
    recording its result. The chat client shows a completed call only after that
    checkpoint landed, so a result some reader got before the fault means the
    resume knows it; without one, the call may have run unrecorded (a round of
    several conversations hits the others' calls wherever they are)."""
    fault_at = turn.evidence.fault_at
    if not turn.reference.expected.tool_runs or fault_at is None:
        return False
    return not any(
        event.at <= fault_at and event.message is not None and has_completed_tool(event.message)
        for reader in turn.evidence.readers
        for event in reader.events
    )


def _trace(reader: TurnReader, view: ClientView) -> ReaderTrace:
    taken = dict((id(r), count) for r, count in view.consumed)
    consumed_events = reader.events[: taken.get(id(reader), 0)]
    consumed = sum(1 for event in consumed_events if event.kind == "new_message")
    return ReaderTrace(
        label=reader.label,
        events=tuple(
            SeenEvent(event.index, event.message or {}, event.event_id)
            for event in reader.events
            if event.kind == "new_message"
        ),
        consumed=consumed,
    )


def _describe(reader: TurnReader) -> dict[str, object]:
    indexes = [e.index for e in reader.messages if e.index is not None]
    return {
        "kind": reader.label,
        "replica": reader.replica,
        "messages": len(indexes),
        "first_index": indexes[0] if indexes else None,
        "last_index": indexes[-1] if indexes else None,
        "first_chars": _length(reader.messages[0].message) if indexes else None,
        "last_chars": _length(reader.messages[-1].message) if indexes else None,
        "end": reader.describe_end(),
    }


def _final_streamed(evidence: _Evidence) -> dict[str, object] | None:
    """The answer the client ended up showing, if a stream told it the turn was done."""
    if not evidence.view.consumed:
        return None
    last, count = evidence.view.consumed[-1]
    if not last.finished_turn:
        return None
    messages = [e for e in last.events[:count] if e.kind == "new_message"]
    return messages[-1].message if messages else None


def _measure(result: RoundResult, evidence: _Evidence) -> None:
    consumed = evidence.view.consumed
    for reader, count in consumed:
        times = [e.at for e in reader.events[:count] if e.kind == "new_message"]
        result.gaps += [b - a for a, b in itertools.pairwise(times)]
    fault_at = evidence.fault_at
    if fault_at is None or not consumed:
        return
    result.recovery_latency = _first_new(consumed, fault_at, evidence.longest_at_fault)
    if result.recovery_latency is None and evidence.recovered_at is not None:
        # Nothing new was streamed (the turn was done by the time the client asked):
        # recovered is when the client could show the whole answer.
        result.recovery_latency = max(0.0, evidence.recovered_at - fault_at)
    # A draining producer may stream on for its grace period; the takeover is
    # when another replica first shows more than the failed one had.
    first_reader, first_count = consumed[0]
    shown = max((_length(e.message) for e in first_reader.events[:first_count]), default=0)
    result.takeover_latency = _first_new(consumed[1:], fault_at, shown)
    if evidence.witness is not None:
        # Unattended: the witness is the only stream the user reads from, and
        # what it shows first beyond the killed producer's answer is the takeover's.
        result.takeover_latency = result.recovery_latency
        if evidence.dead_at is not None and result.recovery_latency is not None:
            shown_at = fault_at + result.recovery_latency
            wall = shown_at + (time.time() - time.monotonic())
            if wall >= evidence.dead_at:
                result.dead_to_new_content = wall - evidence.dead_at
            else:
                result.before_threshold = True
        result.before_threshold |= evidence.taken_at_once


def _first_new(
    consumed: list[tuple[TurnReader, int]], fault_at: float, longest: int
) -> float | None:
    """Seconds from the fault to the first consumed message longer than ``longest``."""
    arrivals = [
        event.at
        for reader, count in consumed
        for event in reader.events[:count]
        if event.kind == "new_message" and event.at > fault_at and _length(event.message) > longest
    ]
    return min(arrivals) - fault_at if arrivals else None


async def _tidy_up(
    ctx: RoundContext, plan: RoundPlan, turns: list[_Turn], state: _RoundState
) -> None:
    """Leave the cluster whole (and unarmed) for the next round, whatever happened
    in this one."""
    ctx.cluster.ledger.release()  # a held call goes on (its round is over)
    for task in (state.continue_task, state.deploy_task):
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
    for turn in turns:
        for reader in turn.evidence.readers:
            await reader.aclose()
    for replica in ctx.cluster.replicas:
        if replica.paused or replica.stopped_by_signal():
            replica.send(signal.SIGCONT)
    producer = plan.producer
    if plan.fault.pause is not None and not state.pause_fired and producer.alive:
        # Still armed: it would pause in a later round, maybe as a survivor.
        ctx.phase(f"round {plan.number}: restarting {producer.name} unarmed")
        await producer.restart()
    for replica in ctx.cluster.replicas:
        if replica.alive and replica.draining:
            # Still draining past every bound: a second SIGTERM skips the drain.
            replica.stop()
        if not replica.alive:
            ctx.phase(f"round {plan.number}: restarting {replica.name}")
            await replica.start()
