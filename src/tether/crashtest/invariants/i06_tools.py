"""Invariants 6 and 11 of design §5: how often the turn's tools ran.

- ``tool-once`` (§5.6): the calculator ran as often as in the crash-free run
  (once more at most where the fault came before any reader got its result:
  see ``Observed.tool_outcome_unknown``); for turns whose tools record their
  runs in the tool-call ledger, all of their tools, once more at most where a
  ``retry`` call was cut off;
- ``at-most-once`` (issue 14, turns whose tools record their runs in the
  tool-call ledger): a call of a tool whose ``on_unknown`` is not ``retry``
  ran at most once per idempotency key; every call ran as attempts 1, 2, ...
  (each run was recorded as started first); a call that ran to its end and
  was followed by another call of the turn (so its result was checkpointed)
  never ran again; a call cut off by the fault (started, never ended) is
  shown with the "may or may not have happened" result when its tool may not
  run twice, and ran again to completion when its tool says ``retry``; a call
  shown completed ran to its end.
"""

from __future__ import annotations

from tether.crashtest.invariants.observed import (
    UNKNOWN_OUTCOME,
    Expected,
    Observed,
    ToolCalls,
    Violation,
    cancelled,
    turn_answer,
    verdict_of,
)


def tool_once(expected: Expected, observed: Observed) -> list[Violation]:
    # The tool log counts the calculator; the tool-call ledger every tool.
    tools = "the calculator" if observed.tool_calls is None else "the turn's tools"
    if cancelled(observed):
        # Cancelled before its tool call, a turn runs it fewer times; never more.
        if observed.tool_runs > expected.tool_runs:
            return [
                Violation(
                    "tool-once",
                    f"{tools} ran {observed.tool_runs} times for a cancelled turn, "
                    f"{expected.tool_runs} in the crash-free run",
                )
            ]
        return []
    allowed = {expected.tool_runs}
    if observed.tool_outcome_unknown and expected.tool_runs:
        allowed.add(expected.tool_runs + 1)
    if observed.tool_runs not in allowed:
        return [
            Violation(
                "tool-once",
                f"{tools} ran {observed.tool_runs} times this round, "
                f"{expected.tool_runs} in the crash-free run",
            )
        ]
    return []


def at_most_once(observed: Observed, calls: ToolCalls) -> list[Violation]:
    """The rule of issue 14, from the runs the tools recorded outside the server."""
    violations = []
    for index, runs in calls.by_call().items():
        first = runs[0]
        name = f"call {index} ({first.tool}, on_unknown={first.on_unknown})"
        if first.at_most_once and len(runs) > 1:
            violations.append(
                Violation(
                    "at-most-once",
                    f"{name} ran {len(runs)} times with key {first.key}: at most once",
                )
            )
        attempts = [run.attempt for run in runs]
        if attempts != list(range(1, len(runs) + 1)):
            violations.append(
                Violation(
                    "at-most-once",
                    f"{name} ran as attempts {attempts}: a run was not recorded as started",
                )
            )
        for run in runs:
            if run.ended_at is None:
                continue
            # Calls run one at a time, each recorded completed before the next
            # starts: another call starting after this run ended proves its
            # result was checkpointed, and no resume may run it again.
            proof = min(
                (
                    o.started_at
                    for o in calls.runs
                    if o.index != index and o.started_at > run.ended_at
                ),
                default=None,
            )
            if proof is not None and any(later.started_at > proof for later in runs):
                violations.append(
                    Violation(
                        "at-most-once",
                        f"{name} ran again after it completed (another call started after it)",
                    )
                )
                break
    if verdict_of(observed) != "done" or cancelled(observed):
        return violations
    answer = turn_answer(observed)
    if answer is None:
        return violations
    shown = [
        dict(part.get("tool") or {})
        for part in answer.get("content_parts") or []
        if part.get("type") == "tool"
    ]
    by_call = calls.by_call()
    for index in sorted(calls.unknown()):
        tool = shown[index] if index < len(shown) else {}
        if tool.get("status") != "error" or UNKNOWN_OUTCOME not in str(tool.get("response")):
            violations.append(
                Violation(
                    "at-most-once",
                    f"call {index} ({by_call[index][0].tool}) was cut off, yet the answer shows "
                    f"it {tool.get('status', 'missing')}, not as {UNKNOWN_OUTCOME!r}",
                )
            )
    for index in sorted(calls.retried()):
        runs = by_call[index]
        tool = shown[index] if index < len(shown) else {}
        if not runs[-1].ended or tool.get("status") != "completed":
            violations.append(
                Violation(
                    "at-most-once",
                    f"call {index} ({runs[0].tool}, on_unknown=retry) was cut off and did not "
                    f"run again to completion (last run ended: {runs[-1].ended}, shown "
                    f"{tool.get('status', 'missing')})",
                )
            )
    for index, tool in enumerate(shown):
        if tool.get("status") == "completed" and not any(
            run.ended for run in by_call.get(index, [])
        ):
            violations.append(
                Violation(
                    "at-most-once",
                    f"call {index} ({tool.get('name')}) is shown completed but no run of it ended",
                )
            )
    return violations
