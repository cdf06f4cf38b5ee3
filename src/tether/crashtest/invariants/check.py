"""``check_round``: every invariant over one turn's evidence, group by group;
which checks apply follows from the round (a conversation store or none, a
cancel, a fence, tools that record their runs in the tool-call ledger).
"""

from __future__ import annotations

from tether.crashtest.invariants.i03_streams import no_regress, shown_kept, unique_ids
from tether.crashtest.invariants.i04_transcript import (
    one_answer,
    own_checkpoint,
    recorded_answer,
    transcript,
    user_message,
)
from tether.crashtest.invariants.i06_tools import at_most_once, tool_once
from tether.crashtest.invariants.i07_fence import fenced
from tether.crashtest.invariants.i09_verdicts import terminal, verdict
from tether.crashtest.invariants.observed import Expected, Observed, Violation


def check_round(expected: Expected, observed: Observed, *, producer_break: int) -> list[Violation]:
    """Every violation the round's evidence shows. ``producer_break`` is the index
    jump that marks a new producer (a resumed turn's indexes start
    ``max_turn_events`` past the last recorded one)."""
    violations: list[Violation] = []
    violations += terminal(observed)
    if observed.conversation_store:
        violations += transcript(expected, observed)
        violations += user_message(expected, observed)
        violations += one_answer(observed)
    else:
        violations += recorded_answer(expected, observed)
    violations += tool_once(expected, observed)
    violations += no_regress(observed.readers, producer_break)
    violations += shown_kept(observed)
    violations += unique_ids(observed.readers)
    violations += own_checkpoint(expected, observed)
    if observed.cancel is not None:
        violations += verdict(observed)
    if observed.fence is not None:
        violations += fenced(observed.fence, expected)
    if observed.tool_calls is not None:
        violations += at_most_once(observed, observed.tool_calls)
    return violations
