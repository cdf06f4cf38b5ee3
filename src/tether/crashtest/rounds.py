"""One round: start a turn, fail its producer, recover as a client, check the invariants.

The round's story is kept as evidence (every reader's events with arrival times,
the tool log count, snapshots around a fenced producer) and handed to
``invariants.check_round``; the metrics of the summary come from the same evidence.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import signal
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import httpx2

from tether.crashtest.client import ClientView, TetherAPI, TurnReader
from tether.crashtest.cluster import Cluster, Replica
from tether.crashtest.faults import FaultKind, FaultPlan, FaultPoint, inject
from tether.crashtest.fence import snapshot, stored_turn
from tether.crashtest.invariants import (
    FenceEvidence,
    Observed,
    ReaderTrace,
    SeenEvent,
    Violation,
    check_round,
)
from tether.crashtest.recovery import recover
from tether.crashtest.reference import Reference, has_completed_tool
from tether.crashtest.results import RoundResult
from tether.settings import TetherSettings

Phase = Callable[[str], None]
# How long a SIGTERMed replica may take to drain and exit before it is killed.
_TERM_EXIT_WITHIN = 30.0


@dataclass(frozen=True)
class RoundPlan:
    number: int
    prompt: str
    producer: Replica
    fault: FaultPlan


@dataclass
class RoundContext:
    api: TetherAPI
    cluster: Cluster
    settings: TetherSettings
    store_url: str
    phase: Phase
    stream_store_url: str | None = None


@dataclass
class _Evidence:
    readers: list[TurnReader] = field(default_factory=list)
    view: ClientView = field(default_factory=ClientView)
    fault_at: float | None = None
    longest_at_fault: int = 0
    recovered_at: float | None = None
    continue_task: asyncio.Task[None] | None = None
    continued_while_owner_streamed: bool | None = None


def round_bound(reference: Reference, settings: TetherSettings) -> float:
    """The most a round may take: the turn twice over, plus the dead threshold and
    restarts, with room for a slow machine."""
    return 3 * reference.shape.duration + 4 * settings.dead_after + 60.0


async def play_round(ctx: RoundContext, plan: RoundPlan, reference: Reference) -> RoundResult:
    result = RoundResult(
        number=plan.number,
        producer=plan.producer.name,
        fault=str(plan.fault.kind),
        point=plan.fault.describe(),
        prompt=plan.prompt,
        session_id=f"crash-{plan.number}-{uuid.uuid4().hex[:10]}",
        expected_tool_runs=reference.expected.tool_runs,
    )
    evidence = _Evidence()
    started = time.monotonic()
    bound = round_bound(reference, ctx.settings)
    try:
        async with asyncio.timeout(bound):
            await _play(ctx, plan, reference, result, evidence, deadline=started + bound)
    except TimeoutError:
        result.violations.append(
            Violation("terminal", f"the round did not finish within its bound of {bound:.0f} s")
        )
    except asyncio.CancelledError:
        # Interrupted: hang up and leave; the cluster is stopped on the way out.
        for reader in evidence.readers:
            await reader.aclose()
        raise
    except (httpx2.HTTPError, OSError, ValueError, KeyError) as error:
        result.error = f"the round broke off: {type(error).__name__}: {error}"
    await _tidy_up(ctx, plan, result, evidence)
    result.duration = time.monotonic() - started
    return result


async def _play(
    ctx: RoundContext,
    plan: RoundPlan,
    reference: Reference,
    result: RoundResult,
    evidence: _Evidence,
    *,
    deadline: float,
) -> None:
    api, cluster, producer = ctx.api, ctx.cluster, plan.producer
    runs_before = cluster.tool_runs()
    ctx.phase(f"round {plan.number}: a turn on {producer.name}")
    first = api.start_turn(producer.url, producer.name, plan.prompt, result.session_id)
    evidence.readers.append(first)
    if not await first.responded(10.0) or first.status_code != 201 or not first.message_id:
        result.error = f"the turn did not start on {producer.name}: {first.describe_end()}"
        return
    message_id = result.message_id = first.message_id
    turn_within = 2 * reference.shape.duration + 15.0
    if not await first.wait_for(lambda r: bool(r.messages), 15.0):
        result.error = f"no first message from {producer.name}: {first.describe_end()}"
        return
    result.time_to_first_message = first.messages[0].at - first.opened_at
    epoch_before = await _epoch(api, cluster, producer, result.session_id)

    if not await _reach(first, plan.fault, within=turn_within):
        result.error = f"the turn ended before the fault point ({plan.fault.describe()})"
        return
    evidence.fault_at = time.monotonic()
    evidence.longest_at_fault = max(_length(e.message) for e in first.messages)
    ctx.phase(f"round {plan.number}: {plan.fault.kind} {producer.name} at {plan.fault.describe()}")
    await inject(producer, plan.fault.kind)
    await _noticed(first, evidence.fault_at, _stall(reference), within=turn_within)
    evidence.view.take(first)

    if first.finished_turn:
        # The producer finished the turn on its own (a drain that let it complete).
        result.path = ["finished"]
        evidence.recovered_at = first.ended_at
    else:
        ctx.phase(f"round {plan.number}: recovering from {plan.fault.kind}")
        recovery = await recover(
            api,
            cluster,
            producer,
            session_id=result.session_id,
            message_id=message_id,
            view=evidence.view,
            deadline=deadline - 10.0,
            on_takeover=_continue_later(evidence, producer, within=turn_within)
            if plan.fault.kind is FaultKind.STOP
            else None,
        )
        evidence.readers += recovery.readers
        result.path = recovery.path
        evidence.recovered_at = recovery.finished_at
        if recovery.problem is not None:
            result.violations.append(Violation("terminal", recovery.problem))

    fence = None
    if plan.fault.kind is FaultKind.STOP:
        ctx.phase(f"round {plan.number}: continuing {producer.name}, checking the fence")
        fence = await _fence_evidence(ctx, plan, result, evidence, epoch_before)
    elif plan.fault.kind is FaultKind.TERM:
        ctx.phase(f"round {plan.number}: waiting for {producer.name} to drain and exit")
        if await producer.wait_exit(_TERM_EXIT_WITHIN) is None:
            result.notes.append(
                f"{producer.name} did not exit within {_TERM_EXIT_WITHIN:.0f} s of SIGTERM"
            )

    survivor = _any_running(cluster, prefer_not=producer)
    final_status = transcript = None
    if survivor is not None:
        with contextlib.suppress(httpx2.HTTPError):
            final_status = await api.status(survivor.url, result.session_id)
            transcript = await api.transcript(survivor.url, result.session_id)
    result.tool_runs = cluster.tool_runs() - runs_before
    observed = Observed(
        transcript=transcript,
        final_status=final_status,
        tool_runs=result.tool_runs,
        readers=[_trace(reader, evidence.view) for reader in evidence.readers],
        final_streamed=_final_streamed(evidence),
        fence=fence,
    )
    result.violations += check_round(
        reference.expected, observed, producer_break=ctx.settings.max_turn_events // 2
    )
    _measure(result, evidence)
    result.readers = [_describe(reader) for reader in evidence.readers]


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


def _continue_later(
    evidence: _Evidence, producer: Replica, *, within: float
) -> Callable[[TurnReader], None]:
    """Continue the stopped producer once the new owner streams new content, so it
    wakes (timers due: heartbeat, flush, checkpoint) while another replica owns the
    turn: the hardest moment for fencing."""

    def schedule(reader: TurnReader) -> None:
        async def wake() -> None:
            longest = evidence.longest_at_fault
            await reader.wait_for(
                lambda r: any(_length(e.message) > longest for e in r.messages), within
            )
            evidence.continued_while_owner_streamed = not reader.done
            producer.send(signal.SIGCONT)

        if evidence.continue_task is None:
            evidence.continue_task = asyncio.create_task(wake())

    return schedule


async def _fence_evidence(
    ctx: RoundContext,
    plan: RoundPlan,
    result: RoundResult,
    evidence: _Evidence,
    epoch_before: int | None,
) -> FenceEvidence:
    api, producer = ctx.api, plan.producer
    owner = _any_running(ctx.cluster, prefer_not=producer)
    assert owner is not None, "a stop round always leaves another replica running"
    left = await snapshot(api, owner.url, result.session_id)
    if evidence.continue_task is not None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(evidence.continue_task, 10.0)
    producer.send(signal.SIGCONT)
    # Its readers must end: it learns at its next heartbeat that it lost the turn.
    old_readers = [r for r in evidence.readers if r.replica == producer.name]
    ended = all(await asyncio.gather(*(r.ended(10.0) for r in old_readers)))
    settings = ctx.settings
    await asyncio.sleep(
        2 * max(settings.heartbeat_interval, settings.recording_flush_interval) + 0.5
    )
    after = await snapshot(api, owner.url, result.session_id)
    result.fence = {
        "epoch_before_fault": epoch_before,
        "epoch_of_new_owner": left.status.epoch if left.status else None,
        "continued_while_new_owner_streamed": bool(evidence.continued_while_owner_streamed),
        "old_readers_heard": [r.describe_end() for r in old_readers],
    }
    fence = FenceEvidence(
        epoch_before_fault=epoch_before,
        left_by_new_owner=left,
        after_continue=after,
        old_readers_ended=ended,
    )
    try:
        message, recorded_epoch, checkpoint_epoch = await stored_turn(
            ctx.store_url, result.session_id, stream_store_url=ctx.stream_store_url
        )
    except Exception as error:
        note = f"the store set could not be read from here ({type(error).__name__}: {error})"
        result.notes.append(note)
        return replace(fence, store_error=note)
    return replace(
        fence,
        recorded_final=message,
        recorded_epoch=recorded_epoch,
        checkpoint_epoch=checkpoint_epoch,
    )


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


def _trace(reader: TurnReader, view: ClientView) -> ReaderTrace:
    taken = dict((id(r), count) for r, count in view.consumed)
    consumed_events = reader.events[: taken.get(id(reader), 0)]
    consumed = sum(1 for event in consumed_events if event.kind == "new_message")
    return ReaderTrace(
        label=reader.label,
        events=tuple(
            SeenEvent(event.index, event.message or {})
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
        result.recovery_latency = evidence.recovered_at - fault_at
    # A draining producer may stream on for its grace period; the takeover is
    # when another replica first shows more than the failed one had.
    first_reader, first_count = consumed[0]
    shown = max((_length(e.message) for e in first_reader.events[:first_count]), default=0)
    result.takeover_latency = _first_new(consumed[1:], fault_at, shown)


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
    ctx: RoundContext, plan: RoundPlan, result: RoundResult, evidence: _Evidence
) -> None:
    """Leave the cluster whole for the next round, whatever happened in this one."""
    producer = plan.producer
    if evidence.continue_task is not None and not evidence.continue_task.done():
        evidence.continue_task.cancel()
    if producer.paused:
        producer.send(signal.SIGCONT)
    for reader in evidence.readers:
        await reader.aclose()
    alive = producer.process is not None and producer.process.poll() is None
    if alive and (plan.fault.kind is not FaultKind.TERM or evidence.fault_at is None):
        return  # never failed, or only paused and continued: it serves on
    if alive:
        # Still draining past every bound: a second SIGTERM skips the drain.
        producer.stop()
    ctx.phase(f"round {plan.number}: restarting {producer.name}")
    await producer.start()
