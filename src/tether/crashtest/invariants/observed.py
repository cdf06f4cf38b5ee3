"""What the invariants read and what they return: the turn as the client saw
and fetched it (``Observed`` and its parts), the crash-free run of its prompt
(``Expected``), and ``Violation``; with the readings of them that more than
one group of checks makes (a message as content, the answer a turn kept,
its verdict).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tether.crashtest.client import TurnStatus
from tether.crashtest.instruments.tool_ledger import ToolRun

UNKNOWN_OUTCOME = "may or may not have happened"
"""What the result of a call whose outcome is unknown says (``tether.tools``)."""


# Fields that name the turn rather than say what it contains: a crash-free
# reference has its own session and message ids.
_IDENTITY_FIELDS = frozenset({"message_id", "session_id"})


@dataclass(frozen=True)
class Violation:
    invariant: str
    detail: str


@dataclass(frozen=True)
class SeenEvent:
    index: int | None
    message: dict[str, Any]
    event_id: str = ""
    """The SSE id as received, ``<message_id>:<index>`` (empty: key by index)."""


@dataclass(frozen=True)
class ReaderTrace:
    """One reader's ``new_message`` events; the client used the first ``consumed``."""

    label: str
    events: tuple[SeenEvent, ...]
    consumed: int


@dataclass(frozen=True)
class Expected:
    """The crash-free run of a prompt."""

    prompt: str
    transcript: tuple[dict[str, Any], ...]
    tool_runs: int


@dataclass(frozen=True)
class Snapshot:
    status: TurnStatus | None
    transcript: tuple[dict[str, Any], ...] | None


@dataclass(frozen=True)
class StoredTurn:
    """The turn as the store set holds it after the round."""

    recorded_final: dict[str, Any] | None = None
    recorded_epoch: int | None = None
    recorded_message_id: str | None = None
    checkpoint_epoch: int | None = None
    checkpoint_message_id: str | None = None
    """The message id in the checkpoint's ``__turn__`` marker."""
    checkpoint_input: tuple[dict[str, Any], ...] | None = None
    """The turn's input the marker carries (what a resume answers)."""


@dataclass(frozen=True)
class CancelEvidence:
    """What a cancel-at-end round saw of its cancel."""

    response_status: int | None
    """The HTTP status of ``DELETE /chat/stream/{id}`` (None: no answer)."""
    reader_verdict: str | None
    """How the client's stream ended: ``done`` (a clean end), ``cancelled``, or other."""


@dataclass(frozen=True)
class FenceEvidence:
    """What a stop round saw around continuing the fenced producer."""

    epoch_before_fault: int | None
    left_by_new_owner: Snapshot
    after_continue: Snapshot
    old_readers_ended: bool
    # Read from the store set itself once things settled; ``store_error`` says why
    # they could not be read (and those checks are skipped).
    recorded_final: dict[str, Any] | None = None
    recorded_epoch: int | None = None
    checkpoint_epoch: int | None = None
    store_error: str | None = None


@dataclass(frozen=True)
class ToolCalls:
    """A turn's tool calls as the tool-call ledger has them."""

    runs: tuple[ToolRun, ...]
    """Every execution of the turn's calls, in the order they started."""

    def by_call(self) -> dict[int, list[ToolRun]]:
        """The runs of each call (by its index in the turn), in order."""
        calls: dict[int, list[ToolRun]] = {}
        for run in self.runs:
            calls.setdefault(run.index, []).append(run)
        return dict(sorted(calls.items()))

    def cut_off(self) -> dict[int, ToolRun]:
        """The calls whose last run was cut off (started, never ended), by index."""
        return {index: runs[-1] for index, runs in self.by_call().items() if not runs[-1].ended}

    def unknown(self) -> frozenset[int]:
        """The calls the resume may not run again and must show as of unknown outcome."""
        return frozenset(i for i, run in self.cut_off().items() if run.at_most_once)

    def retried(self) -> frozenset[int]:
        """The ``retry`` calls a run of which was cut off (and that must run again)."""
        return frozenset(
            index
            for index, runs in self.by_call().items()
            if not runs[0].at_most_once and any(not run.ended for run in runs)
        )


@dataclass
class Observed:
    transcript: list[dict[str, Any]] | None
    final_status: TurnStatus | None
    tool_runs: int
    readers: list[ReaderTrace] = field(default_factory=list)
    final_streamed: dict[str, Any] | None = None
    fence: FenceEvidence | None = None
    unfinished: str | None = None  # why the turn did not reach a verdict in time
    message_id: str | None = None
    stored: StoredTurn | None = None
    """The recording and checkpoint as stored after the round (None: unreadable)."""
    last_turn_status: str | None = None
    """The conversation's last-turn status (complete, cancelled, ...)."""
    cancel: CancelEvidence | None = None
    """Set in a round that cancelled the turn: cancelled is a verdict it may end with."""
    conversation_store: bool = True
    """False: the servers keep no transcript; the recording is checked instead."""
    tool_outcome_unknown: bool = False
    """True where no reader got the tool's result before the fault: the fault may
    have fallen between the call and the checkpoint recording its result, and the
    resume then runs it once more (at-least-once until tool calls record
    *started* and *completed*, issue 14). One extra run is allowed, never two;
    once a result was shown, none."""
    tool_calls: ToolCalls | None = None
    """The turn's tool runs from the tool-call ledger (None: its tools record none)."""


def normalize(message: dict[str, Any]) -> dict[str, Any]:
    """A message as content: no identity fields and no unset (None) values."""
    return {
        key: _drop_none(value)
        for key, value in message.items()
        if key not in _IDENTITY_FIELDS and value is not None
    }


def _drop_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(item) for item in value]
    return value


def normalize_all(messages: Sequence[dict[str, Any]]) -> tuple[dict[str, Any], ...]:
    return tuple(normalize(message) for message in messages)


def turn_answer(observed: Observed) -> dict[str, Any] | None:
    """The turn's answer as kept: the transcript's, else the recording's, else
    the one last streamed."""
    if observed.transcript is not None:
        bots = [m for m in observed.transcript if m.get("sender") == "bot"]
        return bots[-1] if bots else None
    if observed.stored is not None and observed.stored.recorded_final is not None:
        return observed.stored.recorded_final
    return observed.final_streamed


def verdict_of(observed: Observed) -> str | None:
    return observed.final_status.status if observed.final_status is not None else None


def cancelled(observed: Observed) -> bool:
    return observed.cancel is not None and verdict_of(observed) == "cancelled"


def common_prefix(a: str, b: str) -> str:
    for position, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return a[:position]
    return a[: min(len(a), len(b))]
