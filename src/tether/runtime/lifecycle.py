"""A turn's lifecycle on its producing replica: its states, what moves between them,
and which writes each state allows.

Read it as a table. A turn is ``CLAIMED`` once its lease is granted (the
stores fenced at its epoch, its input fixed); ``RUNNING`` while the agent
produces; ``SEALING`` while its answer is persisted; then it ends in exactly
one terminal state. Leaving the table's paths is a bug, and raises.

Every producer write goes through the turn's ``FencedWriter``, which asks
``allows`` first: a terminal state writes nothing, whoever asks. The store's
own fence is the second, independent guard (a paused producer may not know it
was fenced yet; the store does).
"""

from __future__ import annotations

from enum import StrEnum


class TurnState(StrEnum):
    CLAIMED = "claimed"
    """The lease is ours and the stores are fenced at our epoch; the agent has not run."""
    RUNNING = "running"
    """The agent is producing; recording, checkpoints and heartbeats flow."""
    SEALING = "sealing"
    """The answer is complete: final flush, checkpoint, transcript, then DONE."""
    FAILING = "failing"
    """The agent failed: the newest content and the error are being recorded."""
    CANCELLING = "cancelling"
    """A cancel was asked on this replica: the agent is stopped and the newest
    content flushed, so the kept partial is what every client saw."""
    HANDING_OFF = "handing_off"
    """Draining: the agent is stopped, the newest content and state saved, then
    the row is handed off so another replica resumes it at once."""
    DONE = "done"
    ERRORED = "errored"
    CANCELLED = "cancelled"
    HANDED_OFF = "handed_off"
    FENCED = "fenced"
    """A newer epoch owns the conversation (a takeover, a cancel elsewhere)."""


class Write(StrEnum):
    """The kinds of write a producer makes."""

    HEARTBEAT = "heartbeat"
    RECORDING = "recording"
    CHECKPOINT = "checkpoint"
    TRANSCRIPT = "transcript"
    STATUS = "status"
    """A terminal or hand-off write of the supervision row."""


TERMINAL = frozenset(
    {
        TurnState.DONE,
        TurnState.ERRORED,
        TurnState.CANCELLED,
        TurnState.HANDED_OFF,
        TurnState.FENCED,
    }
)

_W = Write
ALLOWED_WRITES: dict[TurnState, frozenset[Write]] = {
    TurnState.CLAIMED: frozenset({_W.HEARTBEAT, _W.CHECKPOINT, _W.TRANSCRIPT, _W.STATUS}),
    TurnState.RUNNING: frozenset({_W.HEARTBEAT, _W.RECORDING, _W.CHECKPOINT}),
    TurnState.SEALING: frozenset(
        {_W.HEARTBEAT, _W.RECORDING, _W.CHECKPOINT, _W.TRANSCRIPT, _W.STATUS}
    ),
    TurnState.FAILING: frozenset({_W.HEARTBEAT, _W.RECORDING, _W.TRANSCRIPT, _W.STATUS}),
    # The cancel itself (fence, row, partial answer) is the canceller's write,
    # made at the next epoch; the producer only flushes what it has shown.
    TurnState.CANCELLING: frozenset({_W.HEARTBEAT, _W.RECORDING}),
    TurnState.HANDING_OFF: frozenset({_W.RECORDING, _W.CHECKPOINT, _W.STATUS}),
    **{state: frozenset() for state in TERMINAL},
}
"""What each state may write. A heartbeat is allowed only while the turn can
still end by its own hand; the terminal states write nothing at all."""

TRANSITIONS: dict[TurnState, frozenset[TurnState]] = {
    TurnState.CLAIMED: frozenset(
        {TurnState.RUNNING, TurnState.FAILING, TurnState.CANCELLING, TurnState.HANDING_OFF}
    ),
    TurnState.RUNNING: frozenset(
        {TurnState.SEALING, TurnState.FAILING, TurnState.CANCELLING, TurnState.HANDING_OFF}
    ),
    TurnState.SEALING: frozenset({TurnState.DONE, TurnState.FAILING, TurnState.HANDING_OFF}),
    TurnState.FAILING: frozenset({TurnState.ERRORED}),
    TurnState.CANCELLING: frozenset({TurnState.CANCELLED}),
    TurnState.HANDING_OFF: frozenset({TurnState.HANDED_OFF}),
    **{state: frozenset() for state in TERMINAL},
}
"""Where each state may go next, besides ``FENCED`` and ``CANCELLED``, which any
live state may reach (the store refused a write; a cancel was accepted)."""

_FROM_ANY_LIVE = frozenset({TurnState.FENCED, TurnState.CANCELLED})


class IllegalTransitionError(RuntimeError):
    """A move the table does not have: a bug in the runtime, never a fault."""


class Lifecycle:
    """The current state of one turn, moved only along ``TRANSITIONS``."""

    def __init__(self) -> None:
        self.state = TurnState.CLAIMED

    @property
    def ended(self) -> bool:
        return self.state in TERMINAL

    def allows(self, write: Write) -> bool:
        return write in ALLOWED_WRITES[self.state]

    def can_move(self, to: TurnState) -> bool:
        if self.ended:
            return False
        return to in TRANSITIONS[self.state] or to in _FROM_ANY_LIVE

    def move(self, to: TurnState) -> None:
        if not self.can_move(to):
            raise IllegalTransitionError(f"a turn cannot go from {self.state} to {to}")
        self.state = to

    def end(self, to: TurnState) -> bool:
        """Move to a terminal state unless the turn has ended already (the first
        verdict stands); returns whether it moved."""
        if self.ended:
            return False
        self.move(to)
        return True
