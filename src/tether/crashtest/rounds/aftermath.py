"""After a fault that ends: the stopped or paused producer is continued once
the survivors own its turns, and what the stores say before and after is
kept (the fence's evidence); a rolling deploy restarts the drained producer,
then drains the replica the turns were resumed on too.

These run beside the clients' recovery (``watching``) and wait for it through
each turn's ``settled`` and ``recovered`` events.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal

from tether.crashtest.faults import FaultKind, inject
from tether.crashtest.fence import snapshot
from tether.crashtest.rounds.state import (
    TERM_EXIT_WITHIN,
    RoundContext,
    RoundPlan,
    RoundState,
    Turn,
    any_running,
    content_length,
)
from tether.crashtest.rounds.watching import stall_for


async def _all_settled(active: list[Turn], within: float) -> bool:
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(within):
            await asyncio.gather(*(turn.settled.wait() for turn in active))
    return all(turn.settled.is_set() for turn in active)


async def _streams_past_fault(turn: Turn, within: float) -> bool:
    """Wait until the turn's new owner streams more than the failed one had;
    whether its stream was still open then."""
    reader = turn.evidence.takeover
    if reader is None:
        return False
    longest = turn.evidence.longest_at_fault
    await reader.wait_for(
        lambda r: any(content_length(e.message) > longest for e in r.messages), within
    )
    return not reader.done


async def continue_producer(
    ctx: RoundContext, plan: RoundPlan, active: list[Turn], *, within: float
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
    settle_within = settings.dead_after + max(stall_for(t.reference) for t in active) + 12.0
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
        owner = any_running(ctx.cluster, prefer_not=producer)
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


async def deploy_on(
    ctx: RoundContext, plan: RoundPlan, active: list[Turn], state: RoundState, *, within: float
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
        if await first.wait_exit(TERM_EXIT_WITHIN) is None:
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
    await second.wait_exit(TERM_EXIT_WITHIN)


async def fence_evidence(
    ctx: RoundContext, plan: RoundPlan, active: list[Turn], state: RoundState
) -> None:
    """Continue the fenced producer (if not yet), give it time to do its worst,
    and take what the stores say before and after."""
    api, producer = ctx.api, plan.producer
    owner = any_running(ctx.cluster, prefer_not=producer)
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
