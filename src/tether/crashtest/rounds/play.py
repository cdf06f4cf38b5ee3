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

This module is the round's loop (``play_round``); what it is made of is
``state``, and the steps it takes are ``failing``, ``watching``,
``aftermath`` and ``evidence``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import signal
import time
import uuid

import httpx2

from tether.crashtest.client import TetherAPI
from tether.crashtest.cluster import Cluster, Replica
from tether.crashtest.faults import FaultKind
from tether.crashtest.instruments.pause_in_write import PAUSE_IN_VARIABLE
from tether.crashtest.invariants import Violation
from tether.crashtest.reference import Reference
from tether.crashtest.results import RoundResult
from tether.crashtest.rounds.aftermath import continue_producer, deploy_on, fence_evidence
from tether.crashtest.rounds.evidence import check_turn
from tether.crashtest.rounds.failing import cancel_at_end, fail
from tether.crashtest.rounds.state import (
    TERM_EXIT_WITHIN,
    RoundContext,
    RoundPlan,
    RoundState,
    Turn,
    any_running,
    round_bound,
)
from tether.crashtest.rounds.watching import attach_witness, recover_turn, unattended


async def play_round(
    ctx: RoundContext, plan: RoundPlan, references: dict[str, Reference]
) -> list[RoundResult]:
    """Play the round; one result per conversation."""
    turns = [
        Turn(
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
    state = RoundState()
    started = time.monotonic()
    bound = max(round_bound(turn.reference, ctx.settings) for turn in turns)
    if plan.fault.kind is FaultKind.ROLLING_DEPLOY:
        bound += TERM_EXIT_WITHIN
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
    turns: list[Turn],
    state: RoundState,
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
        canceller = any_running(cluster, prefer_not=producer)
        assert canceller is not None, "a cluster has at least two replicas"
        ctx.phase(f"round {plan.number}: cancelling from {canceller.name} as the answers end")
        await asyncio.gather(
            *(cancel_at_end(api, canceller, plan.fault, t, within=turn_within) for t in active)
        )
    elif kind is FaultKind.UNATTENDED:
        await asyncio.gather(*(attach_witness(ctx, plan, t) for t in active))
        if not await fail(ctx, plan, active, state, within=turn_within):
            return
        ctx.phase(f"round {plan.number}: nobody recovers; waiting for the verdicts")
        await asyncio.gather(*(unattended(ctx, plan, t, turn_within) for t in active))
    else:
        if not await fail(ctx, plan, active, state, within=turn_within):
            return
        ctx.phase(f"round {plan.number}: recovering from {plan.fault.describe()} ({kind})")
        if kind is FaultKind.STOP or (kind is FaultKind.PAUSE_IN_WRITE and state.pause_fired):
            state.continue_task = asyncio.create_task(
                continue_producer(ctx, plan, active, within=turn_within)
            )
        elif kind is FaultKind.ROLLING_DEPLOY:
            state.deploy_task = asyncio.create_task(
                deploy_on(ctx, plan, active, state, within=turn_within)
            )
        # A rolling deploy's clients resume once the drained producer is back
        # (see ``aftermath.deploy_on``). Not through a load balancer: it could send the
        # resume to the restarted replica, leaving none to drain second.
        staged = kind is FaultKind.ROLLING_DEPLOY and ctx.api.front is None
        resume_after = state.first_back if staged else None
        recover = functools.partial(
            recover_turn,
            deadline=deadline,
            resume_after=resume_after,
            failed_start=producer.starts,
        )
        await asyncio.gather(*(recover(ctx, plan, t, turn_within) for t in active))
        if kind.fences:
            ctx.phase(f"round {plan.number}: continuing {producer.name}, checking the fence")
            await fence_evidence(ctx, plan, active, state)
        elif kind is FaultKind.TERM:
            ctx.phase(f"round {plan.number}: waiting for {producer.name} to drain and exit")
            if await producer.wait_exit(TERM_EXIT_WITHIN) is None:
                for turn in active:
                    turn.result.notes.append(
                        f"{producer.name} did not exit within {TERM_EXIT_WITHIN:.0f} s of SIGTERM"
                    )
        elif kind is FaultKind.ROLLING_DEPLOY and state.deploy_task is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(state.deploy_task), TERM_EXIT_WITHIN)

    ctx.phase(f"round {plan.number}: checking {len(active)} turns")
    runs = cluster.tool_runs_by_expression() - runs_before
    for turn in active:
        await check_turn(ctx, plan, turn, active, runs)


async def _started(turn: Turn, producer: Replica) -> None:
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


async def _epoch(api: TetherAPI, cluster: Cluster, producer: Replica, session: str) -> int | None:
    replica = any_running(cluster, prefer_not=producer)
    if replica is None:
        return None
    try:
        status = await api.status(replica.url, session)
    except httpx2.HTTPError:
        return None
    return status.epoch if status is not None else None


async def _tidy_up(
    ctx: RoundContext, plan: RoundPlan, turns: list[Turn], state: RoundState
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
