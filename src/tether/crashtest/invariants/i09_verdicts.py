"""Invariant 9 of design §5, and the one verdict of a cancelled turn: how
the turn ended.

- ``terminal`` (§5.9): the turn ended done (or, where the round cancelled it,
  cancelled), within the round's bound;
- ``verdict`` (cancel rounds): the transcript's last-turn status, the
  supervision row, the cancel's answer and the client's stream agree on one
  verdict, cancelled or complete.
"""

from __future__ import annotations

from tether.crashtest.invariants.observed import Observed, Violation, verdict_of


def terminal(observed: Observed) -> list[Violation]:
    if observed.unfinished is not None:
        return [Violation("terminal", observed.unfinished)]
    status = observed.final_status
    if status is None:
        return [Violation("terminal", "the server knows no turn for the conversation")]
    allowed = ("done", "cancelled") if observed.cancel is not None else ("done",)
    if status.status not in allowed:
        return [
            Violation("terminal", f"the turn ended {status.status}, not {' or '.join(allowed)}")
        ]
    return []


def verdict(observed: Observed) -> list[Violation]:
    """A cancel near the end: one verdict, told the same by every witness."""
    status = verdict_of(observed)
    if status not in ("done", "cancelled"):
        return []  # ``terminal`` says so
    violations = []
    want = {"done": "complete", "cancelled": "cancelled"}[status]
    if observed.conversation_store and observed.last_turn_status != want:
        violations.append(
            Violation(
                "verdict",
                f"the supervision row says {status} but the transcript's last turn is "
                f"{observed.last_turn_status}",
            )
        )
    cancel = observed.cancel
    assert cancel is not None
    if cancel.response_status == 204 and status != "cancelled":
        violations.append(
            Violation("verdict", f"the cancel was accepted (204) but the turn is {status}")
        )
    if cancel.response_status == 410 and status != "done":
        violations.append(
            Violation("verdict", f"the cancel came too late (410) but the turn is {status}")
        )
    if cancel.reader_verdict in ("done", "cancelled") and cancel.reader_verdict != status:
        violations.append(
            Violation(
                "verdict",
                f"the client's stream ended {cancel.reader_verdict}; the row says {status}",
            )
        )
    return violations
