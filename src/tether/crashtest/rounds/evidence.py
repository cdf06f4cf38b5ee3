"""After the round: each turn's evidence (``state.TurnEvidence``) made into
what the invariants read (``invariants.Observed``), checked, and measured into
the turn's result: its tool runs and calls, the fence, its readers, the
recovery and takeover latencies.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections import Counter

import httpx2

from tether.crashtest.client import ClientView
from tether.crashtest.invariants import (
    UNKNOWN_OUTCOME,
    FenceEvidence,
    Observed,
    ReaderTrace,
    SeenEvent,
    Snapshot,
    StoredTurn,
    ToolCalls,
    check_round,
    rewound_characters,
    turn_answer,
)
from tether.crashtest.reader import TurnReader
from tether.crashtest.reference import has_completed_tool
from tether.crashtest.results import RoundResult
from tether.crashtest.rounds.state import (
    RoundContext,
    RoundPlan,
    Turn,
    TurnEvidence,
    any_running,
    content_length,
    held_in,
)


async def check_turn(
    ctx: RoundContext, plan: RoundPlan, turn: Turn, active: list[Turn], runs: Counter[str]
) -> None:
    api, cluster, result, evidence = ctx.api, ctx.cluster, turn.result, turn.evidence
    survivor = any_running(cluster, prefer_not=plan.producer)
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


def _check_cut_off(plan: RoundPlan, turn: Turn, calls: ToolCalls) -> None:
    """A tool round whose kill did not cut this turn's held call off did not run
    as planned."""
    hold, pid = plan.fault.hold, turn.evidence.killed_pid
    if hold is None or pid is None:
        return
    if not any(held_in(run, pid, hold) for run in calls.runs):
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


def _fence(turn: Turn, stored: StoredTurn | None, store_error: str | None) -> FenceEvidence:
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


def _tool_runs(turn: Turn, active: list[Turn], runs: Counter[str], result: RoundResult) -> int:
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


def _tool_outcome_unknown(turn: Turn) -> bool:
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
        "first_chars": content_length(reader.messages[0].message) if indexes else None,
        "last_chars": content_length(reader.messages[-1].message) if indexes else None,
        "end": reader.describe_end(),
    }


def _final_streamed(evidence: TurnEvidence) -> dict[str, object] | None:
    """The answer the client ended up showing, if a stream told it the turn was done."""
    if not evidence.view.consumed:
        return None
    last, count = evidence.view.consumed[-1]
    if not last.finished_turn:
        return None
    messages = [e for e in last.events[:count] if e.kind == "new_message"]
    return messages[-1].message if messages else None


def _measure(result: RoundResult, evidence: TurnEvidence) -> None:
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
    shown = max((content_length(e.message) for e in first_reader.events[:first_count]), default=0)
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
        if event.kind == "new_message"
        and event.at > fault_at
        and content_length(event.message) > longest
    ]
    return min(arrivals) - fault_at if arrivals else None
