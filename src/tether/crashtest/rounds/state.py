"""What a round is made of: its plan, the context it plays in, its turns and
the evidence each keeps, and the state its faults leave for the loop to tidy up.

The round's other modules all read and write these (``failing`` and
``aftermath``, the faults; ``watching``, the clients; ``evidence``, the
checks; ``play``, the loop), so they stand below every one of them, with
the few small helpers those share.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from tether.crashtest.client import ClientView, TetherAPI
from tether.crashtest.cluster import Cluster, Replica
from tether.crashtest.faults import FaultPlan
from tether.crashtest.fence import StoreReader
from tether.crashtest.instruments.tool_ledger import ToolRun
from tether.crashtest.invariants import CancelEvidence, Snapshot
from tether.crashtest.reader import TurnReader
from tether.crashtest.reference import Reference
from tether.crashtest.results import RoundResult
from tether.settings import TetherSettings

Phase = Callable[[str], None]
# How long a SIGTERMed replica may take to drain and exit before it is killed.
TERM_EXIT_WITHIN = 30.0


@dataclass(frozen=True)
class RoundPlan:
    number: int
    prompts: tuple[str, ...]
    """One per conversation of the round; the first one's turn places the fault."""
    producer: Replica
    fault: FaultPlan


@dataclass
class RoundContext:
    api: TetherAPI
    cluster: Cluster
    settings: TetherSettings
    stores: StoreReader | None
    """The store set, to read the recording and checkpoint after each round
    (None: not readable from here; those checks are skipped)."""
    phase: Phase
    conversation_store: bool = True


@dataclass
class TurnEvidence:
    readers: list[TurnReader] = field(default_factory=list)
    view: ClientView = field(default_factory=ClientView)
    fault_at: float | None = None
    longest_at_fault: int = 0
    recovered_at: float | None = None
    takeover: TurnReader | None = None
    continued_while_owner_streamed: bool | None = None
    left: Snapshot | None = None
    after: Snapshot | None = None
    old_readers_ended: bool = True
    cancel: CancelEvidence | None = None
    witness: TurnReader | None = None
    """An unattended round's second device, attached through another replica."""
    dead_at: float | None = None
    """Unattended: when the killed producer's turn read dead (its last heartbeat
    plus the dead threshold), as a ``time.time()``: the store's clock is this
    host's (SQLite) or a server on it (PostgreSQL)."""
    taken_at_once: bool = False
    """Unattended: the turn had a new producer when its status was first read
    after the kill, long before its last heartbeat could age past the
    threshold (its producer's presence lock said it was gone)."""
    fence_void: str | None = None
    """Why the fence cannot be checked: the producer was continued before the
    turn was taken over (the survivors could not take it: see the notes)."""
    killed_pid: int | None = None
    """Tool rounds: the process killed inside the turn's tool call."""


@dataclass
class Turn:
    """One conversation of the round."""

    slot: int
    prompt: str
    reference: Reference
    result: RoundResult
    evidence: TurnEvidence = field(default_factory=TurnEvidence)
    first: TurnReader | None = None
    epoch_before: int | None = None
    started: bool = False
    checked: bool = False
    settled: asyncio.Event = field(default_factory=asyncio.Event)
    """Taken over by another replica, or recovered, or finished: nothing of
    this turn waits for the failed producer any more."""
    recovered: asyncio.Event = field(default_factory=asyncio.Event)
    """The client's recovery is over (the turn finished, or it gave up)."""


@dataclass
class RoundState:
    continue_task: asyncio.Task[None] | None = None
    deploy_task: asyncio.Task[None] | None = None
    pause_fired: bool = False
    second: Replica | None = None
    """The replica a rolling deploy drained second."""
    first_back: asyncio.Event = field(default_factory=asyncio.Event)
    """A rolling deploy restarted the replica it drained first (or gave up on
    it): the clients may resume now."""


def round_bound(reference: Reference, settings: TetherSettings) -> float:
    """The most a round may take: the turn twice over, plus the dead threshold and
    restarts, with room for a slow machine."""
    return 3 * reference.shape.duration + 4 * settings.dead_after + 60.0


def any_running(cluster: Cluster, *, prefer_not: Replica) -> Replica | None:
    others = cluster.others(prefer_not)
    if others:
        return others[0]
    return prefer_not if prefer_not.running else None


def content_length(message: dict[str, object] | None) -> int:
    return len(str((message or {}).get("content", "")))


def held_in(run: ToolRun, pid: int, hold: str) -> bool:
    return run.pid == pid and run.on_unknown == hold and not run.ended
