"""Which fault a round injects, and where in the turn.

A fault is real: a signal to the producing replica, or a client's request.

- ``kill``: SIGKILL (a crash);
- ``term``: SIGTERM (a deploy: the replica drains and hands its turns off);
- ``stop``: SIGSTOP (a replica that is only slow: paused past the dead
  threshold, then continued, to prove it is fenced);
- ``pause-in-write``: the replica stops itself *inside* a store write (a
  checkpoint, the transcript append, a recording batch), armed at its start by
  ``TETHER_CRASHTEST_PAUSE_IN`` (``tether.crashtest.instruments.pause_in_write``); it is
  continued once its turns finished elsewhere, so the write lands late;
- ``rolling-deploy``: SIGTERM the producer, let the client resume on a second
  replica, restart the first, then SIGTERM the second and resume once more;
- ``cancel-at-end``: cancel from another replica just as the answer ends;
- ``tool``: SIGKILL in the middle of a tool call (between the checkpoint that
  records it started and the one that records it completed). The round's turns
  are the tool agent's, whose tools count every execution in the tool-call
  ledger (``tether.crashtest.instruments.tool_ledger``); the producer is told to hold its
  calls of one ``on_unknown`` policy (``fail``: a write, or ``retry``: a read)
  and is killed once every turn's call of that policy has started there.

The point is chosen from the crash-free run of the same prompt, so it lands
inside the turn. ``mixed`` draws every round's kind from all of them (``tool``
only where the project has the tool agent).
"""

from __future__ import annotations

import random
import signal
from dataclasses import dataclass
from enum import StrEnum

from tether.crashtest.cluster import Replica
from tether.crashtest.instruments.pause_in_write import PauseInWrite, WriteKind


class FaultKind(StrEnum):
    KILL = "kill"
    UNATTENDED = "unattended"
    """SIGKILL with no client recovering: the client hangs up, and only a second
    device, attached through another replica before the kill, watches."""
    TERM = "term"
    STOP = "stop"
    PAUSE_IN_WRITE = "pause-in-write"
    ROLLING_DEPLOY = "rolling-deploy"
    CANCEL_AT_END = "cancel-at-end"
    TOOL = "tool"
    """SIGKILL inside a tool call of the tool agent's turns."""
    QUEUE = "queue"
    """A second message with a multitask strategy while the producer dies
    (``conversation_rounds``)."""
    ERASE = "erase"
    """An erase while the survivors take a killed producer's turns over
    (``conversation_rounds``)."""

    @property
    def conversational(self) -> bool:
        """A round of a conversation of several moves, checked as a whole
        (``conversation_rounds``), not of one turn against its crash-free run."""
        return self in (FaultKind.QUEUE, FaultKind.ERASE)

    @property
    def fences(self) -> bool:
        """Whether the failed producer comes back after others took its turns
        over, so the round proves it was fenced."""
        return self in (FaultKind.STOP, FaultKind.PAUSE_IN_WRITE)


class FaultChoice(StrEnum):
    """The ``--fault`` option: one kind for every round, or a random mix of all."""

    KILL = "kill"
    UNATTENDED = "unattended"
    TERM = "term"
    STOP = "stop"
    PAUSE_IN_WRITE = "pause-in-write"
    ROLLING_DEPLOY = "rolling-deploy"
    CANCEL_AT_END = "cancel-at-end"
    TOOL = "tool"
    QUEUE = "queue"
    ERASE = "erase"
    MIXED = "mixed"


class FaultPoint(StrEnum):
    TEXT = "text"  # while the answer's text streams
    TOOL = "tool"  # right after a tool call completed (its checkpoint just landed)
    CHECKPOINT = "checkpoint"  # when a periodic checkpoint is due
    WRITE = "write"  # inside a store write (pause-in-write)
    END = "end"  # as the answer ends (cancel-at-end)
    IN_TOOL = "in-tool"  # inside a tool call: started, not completed (tool)


@dataclass(frozen=True)
class TurnShape:
    """How the crash-free turn went, as its client saw it."""

    messages: int
    duration: float  # first message to last, seconds
    tool_message: int | None  # position of the first message with a completed tool
    tool_policies: tuple[str, ...] = ()
    """The ``on_unknown`` policy of each call the tool-call ledger recorded
    (the tool agent's turns; empty for tools that do not record their runs)."""


@dataclass(frozen=True)
class FaultPlan:
    kind: FaultKind
    point: FaultPoint
    after_messages: int | None = None
    """Inject once the client has this many messages (TEXT, and TOOL's fallback)."""
    after_seconds: float | None = None
    """Inject this long after the turn started (CHECKPOINT)."""
    after_tool_delay: float | None = None
    """Inject this long after the completed tool call reached the client (TOOL)."""
    pause: PauseInWrite | None = None
    """Which write the producer pauses in (pause-in-write)."""
    before_end: int | None = None
    """Cancel once the client has all but this many of the answer's messages
    (cancel-at-end; 0: once it has them all, while the turn is being sealed)."""
    cancel_delay: float = 0.0
    """And this long after that (cancel-at-end)."""
    second_after: int | None = None
    """Drain the second producer once it streamed this many messages (rolling-deploy)."""
    hold: str | None = None
    """Kill inside the calls of tools with this ``on_unknown`` policy (tool)."""

    def describe(self) -> str:
        if self.hold is not None:
            return f"in {self.hold} tool call"
        if self.pause is not None:
            return f"{self.pause.kind} #{self.pause.call}"
        if self.before_end is not None:
            return f"end -{self.before_end} msg +{self.cancel_delay * 1000:.0f}ms"
        if self.after_seconds is not None:
            return f"{self.point} @{self.after_seconds:.2f}s"
        if self.after_tool_delay is not None:
            return f"{self.point} +{self.after_tool_delay * 1000:.0f}ms"
        if self.second_after is not None:
            return f"{self.point} @msg {self.after_messages}, +{self.second_after}"
        return f"{self.point} @msg {self.after_messages}"

    @property
    def variant(self) -> str | None:
        """The write a pause-in-write round pauses in, or the policy of the tool
        call a tool round kills inside (its results are told apart by it)."""
        if self.hold is not None:
            return self.hold
        return str(self.pause.kind) if self.pause is not None else None


# The policies of the calls a tool round may kill inside, as often as each is
# drawn: mostly writes, whose at-most-once rule is the point.
_HOLDS = ("fail", "fail", "retry")


def draw_kind(rng: random.Random, choice: FaultChoice, *, tool_rounds: bool = True) -> FaultKind:
    """The kind of one round: ``choice``, or one drawn from every single-turn
    kind for ``mixed`` (``tool`` only with ``tool_rounds``: the project has the
    tool agent). The conversation rounds (``queue``, ``erase``) are asked for
    by name: a mixed run's seeds keep drawing what they drew before."""
    if choice is not FaultChoice.MIXED:
        return FaultKind(choice)
    return rng.choice(
        [
            kind
            for kind in FaultKind
            if (tool_rounds or kind is not FaultKind.TOOL) and not kind.conversational
        ]
    )


def plan_fault(
    rng: random.Random,
    choice: FaultChoice | FaultKind,
    shape: TurnShape,
    checkpoint_interval: float,
    *,
    conversations: int = 1,
    flush_interval: float = 0.5,
    writes: tuple[WriteKind, ...] = tuple(WriteKind),
) -> FaultPlan:
    """The fault of one round. ``shape`` is the crash-free run of the round's
    lead conversation; ``conversations`` turns run on the producer at once;
    ``writes`` are the writes the servers make (no transcript without a
    conversation store). ``choice`` may be a kind drawn already (``draw_kind``)."""
    kind = draw_kind(rng, FaultChoice(choice))
    last = max(2, int(shape.messages * 0.85))
    if kind is FaultKind.TOOL:
        policies = [hold for hold in _HOLDS if hold in shape.tool_policies] or list(_HOLDS)
        return FaultPlan(kind, FaultPoint.IN_TOOL, hold=rng.choice(policies))
    if kind is FaultKind.PAUSE_IN_WRITE:
        return FaultPlan(
            kind,
            FaultPoint.WRITE,
            pause=_pause(rng, rng.choice(writes), shape, checkpoint_interval, conversations,
                         flush_interval),
        )  # fmt: skip
    if kind is FaultKind.CANCEL_AT_END:
        delay = rng.choice((0.0, 0.0, rng.uniform(0.0, 0.05)))
        return FaultPlan(
            kind, FaultPoint.END, before_end=rng.choice((0, 0, 1, 2, 3)), cancel_delay=delay
        )
    if kind is FaultKind.ROLLING_DEPLOY:
        # Early enough that the second replica still has most of the turn to
        # produce when it is drained in its turn.
        early = max(2, int(shape.messages * 0.35))
        return FaultPlan(
            kind,
            FaultPoint.TEXT,
            after_messages=rng.randint(2, early),
            second_after=rng.randint(1, max(1, int(shape.messages * 0.15))),
        )
    point = rng.choice([FaultPoint.TEXT, FaultPoint.TOOL, FaultPoint.CHECKPOINT])
    # Leave the last stretch of the answer alone: a fault that lands after the
    # turn ended tests nothing.
    if point is FaultPoint.CHECKPOINT:
        due = [
            n * checkpoint_interval
            for n in range(1, 1000)
            if n * checkpoint_interval < shape.duration * 0.85
        ]
        if due:
            # Just before to just after the checkpoint's moment: the turn's workers
            # start a little after the client sends the request.
            return FaultPlan(kind, point, after_seconds=rng.choice(due) + rng.uniform(-0.05, 0.25))
        # A turn shorter than the checkpoint interval has one checkpoint: the one
        # right after its tool call.
        point = FaultPoint.TOOL
    if point is FaultPoint.TOOL and shape.tool_message is not None:
        return FaultPlan(kind, point, after_tool_delay=rng.choice((0.0, 0.0, rng.uniform(0, 0.1))))
    return FaultPlan(kind, FaultPoint.TEXT, after_messages=rng.randint(2, last))


def _pause(
    rng: random.Random,
    write: WriteKind,
    shape: TurnShape,
    checkpoint_interval: float,
    conversations: int,
    flush_interval: float,
) -> PauseInWrite:
    """Which call of ``write`` to pause in, counted over every turn on the
    producer (they run at once, so their calls interleave)."""
    if write is WriteKind.TRANSCRIPT:
        # One finished answer per turn: pause in the k-th to be sealed.
        return PauseInWrite(write, rng.randint(1, conversations))
    if write is WriteKind.CHECKPOINT:
        # Per turn: before and after its tool call, every interval, and at its end.
        periodic = int(shape.duration * 0.85 / checkpoint_interval)
        per_turn = periodic + 1 + (2 if shape.tool_message is not None else 0)
        return PauseInWrite(write, rng.randint(1, conversations * per_turn))
    # One recording batch per flush interval for all the replica's turns;
    # not the first few (every turn has started by then).
    batches = max(3, int(shape.duration * 0.85 / flush_interval))
    return PauseInWrite(write, rng.randint(min(3, batches), batches))


SIGNALS = {
    FaultKind.KILL: signal.SIGKILL,
    FaultKind.UNATTENDED: signal.SIGKILL,
    FaultKind.TERM: signal.SIGTERM,
    FaultKind.STOP: signal.SIGSTOP,
    FaultKind.ROLLING_DEPLOY: signal.SIGTERM,
    FaultKind.TOOL: signal.SIGKILL,
    FaultKind.QUEUE: signal.SIGKILL,
    FaultKind.ERASE: signal.SIGKILL,
}


async def inject(replica: Replica, kind: FaultKind) -> None:
    """Send the fault's signal. A killed replica is waited for (it is gone at once);
    a terminated one drains in its own time while the client recovers."""
    replica.send(SIGNALS[kind])
    if SIGNALS[kind] is signal.SIGKILL:
        await replica.wait_exit(10.0)
