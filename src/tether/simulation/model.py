"""The reference model: what the API promised, as the simulator saw it happen.

The stores' switch points tell it every write that landed or was refused
(``observe``), the operations tell it what clients were answered (a turn
accepted, a cancel or an erase that returned), the agent tells it what it
did. The invariants (``tether.simulation.invariants``) compare that with the
stores. Everything carries a sequence number, so "after the cancel returned"
is a comparison.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tether.domain.chat_agent_state_store import TURN_STATE_KEY
from tether.domain.chat_message import ChatMessage, ChatMessageSender
from tether.runtime import conversation_row as rows
from tether.simulation.gate import REPLICA

TENANT = "t"
OWNER = "u"
_READS = ("read", "load", "get_", "list_", "last_epoch", "find_", "server_time")


@dataclass(frozen=True)
class Write:
    """One store call that changes something, and whether it landed."""

    seq: int
    replica: str | None
    store: str
    method: str
    session: str
    epoch: int | None
    turn: str | None
    """The turn the write names (a row's, a put's, a checkpoint's marker, a message's)."""
    kind: str
    accepted: bool
    detail: str = ""


@dataclass
class TurnFacts:
    """What the model knows of one turn."""

    id: str
    session: str
    strategy: str = "?"
    accepted_seq: int | None = None
    """When its client was answered (a turn started, or queued)."""
    cancel_ok_seq: int | None = None
    rolled_back: bool = False
    erased: bool = False
    recorded: tuple[int, int, str] | None = None
    """The newest accepted recording of it: (epoch, index, content)."""
    row_verdicts: set[str] = field(default_factory=set)
    tool_runs: int = 0


@dataclass(frozen=True)
class Erase:
    """An erase (or a retention prune) of a session that returned."""

    session: str
    returned_seq: int
    erased_turns: frozenset[str]
    by: str


def turn_of(message_id: str | None) -> str | None:
    """The turn a transcript message id belongs to (``X``, ``X-user``, ``X-queued``)."""
    if not message_id:
        return None
    for suffix in ("-user", "-queued"):
        if message_id.endswith(suffix):
            return message_id[: -len(suffix)]
    return message_id


class Model:
    """The simulator's record of one history."""

    def __init__(self) -> None:
        self.seq = 0
        self.writes: list[Write] = []
        self.turns: dict[str, TurnFacts] = {}
        self.agent_events: list[tuple[int, str, str, str]] = []
        """(seq, turn, event, detail) as the agent told them."""
        self.erases: list[Erase] = []
        self.violations: list[str] = []
        self.version = 0
        """Counts the store calls that may have changed something."""

    def tick(self) -> int:
        self.seq += 1
        return self.seq

    def facts(self, turn: str, session: str = "?") -> TurnFacts:
        known = self.turns.get(turn)
        if known is None:
            known = self.turns[turn] = TurnFacts(turn, session)
        elif known.session == "?":
            known.session = session
        return known

    # ------------------------------------------------------------ what happened

    def accepted(self, turn: str, session: str, strategy: str, asked: int) -> None:
        """Turn ``turn`` was accepted, for a request that began at ``asked``."""
        facts = self.facts(turn, session)
        facts.strategy = strategy
        if facts.accepted_seq is None:
            facts.accepted_seq = self.tick()
        if any(e.session == session and e.returned_seq > asked for e in self.erases):
            facts.erased = True  # raced an erase of its conversation (``handlers.erase``)

    def cancel_returned(self, turn: str) -> None:
        facts = self.facts(turn)
        if facts.cancel_ok_seq is None:
            facts.cancel_ok_seq = self.tick()

    def erase_returned(self, session: str, before: int, by: str) -> None:
        """An erase of ``session`` that began at ``before`` returned: the turns
        accepted before it began are gone for good. A turn accepted while it
        ran may have lost its transcript (``handlers.erase``): it is no
        longer held to its answer either."""
        erased = frozenset(
            t.id
            for t in self.turns.values()
            if t.session == session and t.accepted_seq is not None and t.accepted_seq < before
        )
        for facts in self.turns.values():
            if facts.session == session and facts.accepted_seq is not None:
                facts.erased = True
        self.erases.append(Erase(session, self.tick(), erased, by))

    def erase_interrupted(self, session: str) -> None:
        """An erase of ``session`` died half way (its replica was killed): it
        may have removed the transcript already, so the turns accepted so far
        are no longer held to their answers; nothing is required gone (a new
        message may take its dead tombstone, or a takeover scan finish it,
        which the model then hears of as an erase that returned)."""
        for facts in self.turns.values():
            if facts.session == session and facts.accepted_seq is not None:
                facts.erased = True

    def agent_told(self, turn: str, event: str, detail: str) -> None:
        self.agent_events.append((self.tick(), turn, event, detail))
        if event == "tool":
            self.facts(turn).tool_runs += 1

    # ------------------------------------------------------------ the switch points

    def observe(
        self,
        store: str,
        method: str,
        arguments: dict[str, Any],
        result: object,
        error: BaseException | None,
    ) -> None:
        """A store call finished: log what it wrote, if anything."""
        if not method.startswith(_READS):
            self.version += 1
        if arguments.get("tenant", TENANT) != TENANT:
            return  # the retention lease's row
        session = str(arguments.get("session_id", "?"))
        for write in _writes(store, method, arguments, result, error, session):
            self._log(write)

    def _log(self, parts: tuple[str, int | None, str | None, str, bool, str]) -> None:
        session, epoch, turn, kind, accepted, detail = parts
        write = Write(
            self.tick(),
            REPLICA.get(),
            kind.split(":")[0],
            kind,
            session,
            epoch,
            turn,
            kind,
            accepted,
            detail,
        )
        self.writes.append(write)
        if not accepted or turn is None:
            return
        facts = self.facts(turn, session)
        if kind == "recording:put" and epoch is not None:
            index, content = detail.split("|", 1)
            entry = (epoch, int(index), content)
            if facts.recorded is None or entry[:2] >= facts.recorded[:2]:
                facts.recorded = entry
        elif kind == "supervision:row" and detail in ("done", "errored", "cancelled"):
            facts.row_verdicts.add(detail)
        elif kind == "conversation:remove":
            facts.rolled_back = facts.rolled_back or detail == "answer"


Parts = tuple[str, int | None, str | None, str, bool, str]


def _writes(
    store: str,
    method: str,
    arguments: dict[str, Any],
    result: object,
    error: BaseException | None,
    session: str,
) -> list[Parts]:
    ok = error is None
    if method == "compare_and_swap":
        row = arguments["supervision"]
        return [_row(session, row, ok and bool(result))]
    if method == "compare_and_swap_many":
        results = result if isinstance(result, list) else [False] * len(arguments["swaps"])
        return [
            _row(swap.session_id, swap.supervision, ok and bool(done))
            for swap, done in zip(arguments["swaps"], results, strict=False)
            if swap.tenant == TENANT
        ]
    if method in ("put", "put_many"):
        puts = arguments["puts"] if method == "put_many" else None
        if puts is None:
            event = arguments["event"]
            return [_put(session, event, ok)]
        results = result if isinstance(result, list) else [False] * len(puts)
        return [
            _put(p.session_id, p.event, ok and bool(done))
            for p, done in zip(puts, results, strict=False)
            if p.tenant == TENANT
        ]
    if method == "save_fenced" or method == "save":
        marker = arguments["state"].get(TURN_STATE_KEY, {})
        turn = marker.get("message_id") if isinstance(marker, dict) else None
        accepted = ok and (bool(result) if method == "save_fenced" else True)
        return [(session, arguments.get("epoch"), turn, "agent_state:checkpoint", accepted, "")]
    if method in ("append_fenced", "append_messages"):
        accepted = ok and (bool(result) if method == "append_fenced" else True)
        messages: list[ChatMessage] = arguments["messages"]
        kind = "conversation:append" if method == "append_fenced" else "conversation:queue"
        return [
            (
                session,
                arguments.get("epoch"),
                turn_of(m.message_id),
                kind,
                accepted,
                "user" if m.sender is ChatMessageSender.USER else "bot",
            )
            for m in messages
        ]
    if method == "remove_fenced":
        accepted = ok and bool(result)
        ids: list[str] = list(arguments["message_ids"])
        return [
            (
                session,
                arguments.get("epoch"),
                turn_of(i),
                "conversation:remove",
                accepted,
                "queued" if i.endswith("-queued") else ("answer" if i.endswith("-user") else "bot"),
            )
            for i in ids
        ]
    if method in ("delete", "delete_conversation"):
        return [(session, None, arguments.get("message_id"), f"{store}:delete", ok, "")]
    return []


def _row(session: str, row: Any, accepted: bool) -> Parts:
    status = row.status.value
    if status == "running" and row.heartbeat_at.year < 2000:
        status = "handed"  # a hand-off (``Lease.pass_on``, a drain): dead at once, by design
    elif status == "running" and row.producer in (rows.CANCELLER, rows.REAPER):
        status = "ending"  # another hand writing the turn's verdict, not its producer
    return (session, row.epoch, row.message_id, "supervision:row", accepted, status)


def _put(session: str, event: Any, accepted: bool) -> Parts:
    return (
        session,
        event.epoch,
        event.message_id,
        "recording:put",
        accepted,
        f"{event.index}|{event.message.content}",
    )
