"""Which fault a round injects, and where in the turn.

A fault is a real signal to the producing replica: SIGKILL (a crash), SIGTERM (a
deploy: the replica drains) or SIGSTOP (a replica that is only slow: paused past the
dead threshold, then continued, to prove it is fenced). The point is chosen from the
crash-free run of the same prompt, so it always lands inside the turn.
"""

from __future__ import annotations

import random
import signal
from dataclasses import dataclass
from enum import StrEnum

from tether.crashtest.cluster import Replica


class FaultKind(StrEnum):
    KILL = "kill"
    TERM = "term"
    STOP = "stop"


class FaultChoice(StrEnum):
    """The ``--fault`` option: one kind for every round, or a random mix."""

    KILL = "kill"
    TERM = "term"
    STOP = "stop"
    MIXED = "mixed"


class FaultPoint(StrEnum):
    TEXT = "text"  # while the answer's text streams
    TOOL = "tool"  # right after a tool call completed (its checkpoint just landed)
    CHECKPOINT = "checkpoint"  # when a periodic checkpoint is due


@dataclass(frozen=True)
class TurnShape:
    """How the crash-free turn went, as its client saw it."""

    messages: int
    duration: float  # first message to last, seconds
    tool_message: int | None  # position of the first message with a completed tool


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

    def describe(self) -> str:
        if self.after_seconds is not None:
            return f"{self.point} @{self.after_seconds:.2f}s"
        if self.after_tool_delay is not None:
            return f"{self.point} +{self.after_tool_delay * 1000:.0f}ms"
        return f"{self.point} @msg {self.after_messages}"


def plan_fault(
    rng: random.Random, choice: FaultChoice, shape: TurnShape, checkpoint_interval: float
) -> FaultPlan:
    kind = FaultKind(rng.choice(list(FaultKind)) if choice is FaultChoice.MIXED else choice)
    point = rng.choice(list(FaultPoint))
    # Leave the last stretch of the answer alone: a fault that lands after the
    # turn ended tests nothing.
    last = max(2, int(shape.messages * 0.85))
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


SIGNALS = {
    FaultKind.KILL: signal.SIGKILL,
    FaultKind.TERM: signal.SIGTERM,
    FaultKind.STOP: signal.SIGSTOP,
}


async def inject(replica: Replica, kind: FaultKind) -> None:
    """Send the fault's signal. A killed replica is waited for (it is gone at once);
    a terminated one drains in its own time while the client recovers."""
    replica.send(SIGNALS[kind])
    if kind is FaultKind.KILL:
        await replica.wait_exit(10.0)
