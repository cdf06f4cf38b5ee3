"""The invariants of design §5, checked from the outside after each round.

Everything here is a pure function of what the client saw and fetched, so it can be
shown to fail on doctored evidence (tests/test_crash_test_invariants.py) as well as
pass on real rounds. The checks, one module a group, numbered as the design's
invariants:

- ``i03_streams``: ``no-regress`` (§5.3), ``shown-kept`` (§5.12), ``unique-ids``
  (design §3): what the readers were streamed;
- ``i04_transcript``: ``user-message`` (§5.4), ``transcript`` (§5.5),
  ``one-answer`` (§5.4, §5.10), ``own-checkpoint`` (§5.10);
- ``i06_tools``: ``tool-once`` (§5.6), ``at-most-once`` (§5.11, issue 14);
- ``i07_fence``: ``fenced`` (§5.7);
- ``i09_verdicts``: ``terminal`` (§5.9), ``verdict`` (cancel rounds).

``observed`` holds what they read (``Observed``, ``Expected``) and return
(``Violation``); ``check`` runs them all (``check_round``).
"""

from tether.crashtest.invariants.check import check_round
from tether.crashtest.invariants.i03_streams import rewound_characters
from tether.crashtest.invariants.observed import (
    UNKNOWN_OUTCOME,
    CancelEvidence,
    Expected,
    FenceEvidence,
    Observed,
    ReaderTrace,
    SeenEvent,
    Snapshot,
    StoredTurn,
    ToolCalls,
    Violation,
    normalize,
    normalize_all,
    turn_answer,
)

__all__ = [
    "UNKNOWN_OUTCOME",
    "CancelEvidence",
    "Expected",
    "FenceEvidence",
    "Observed",
    "ReaderTrace",
    "SeenEvent",
    "Snapshot",
    "StoredTurn",
    "ToolCalls",
    "Violation",
    "check_round",
    "normalize",
    "normalize_all",
    "rewound_characters",
    "turn_answer",
]
