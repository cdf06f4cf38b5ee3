"""Design §5's invariants, checked against the stores and the reference model.

``after_step`` runs after every step of a history: what must hold at every
moment (a tool call runs once, a cancel or an erase that returned is final,
one producer per epoch, every answer follows its own question, a resumed
turn answers its own question). ``at_end`` runs once faults have stopped and
every turn was driven to its end: every accepted message has exactly one
verdict, what was recorded of an answer is kept, questions alternate with
answers, and readers of a cancelled turn hear it cancelled.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from tether.domain.chat_agent_state_store import TURN_STATE_KEY
from tether.domain.chat_message import ChatMessage, ChatMessageSender
from tether.domain.chat_stream_recording_store import RecordedStreamEvent
from tether.domain.chat_stream_supervision_store import ChatStreamSupervision
from tether.domain.queued_messages import without_queued
from tether.handlers.turn_ends import ending_of
from tether.simulation.gate import reset_ungated, ungated
from tether.simulation.model import OWNER, TENANT, Model, TurnFacts, turn_of
from tether.simulation.world import World

_PRODUCING = ("supervision:row", "recording:put", "agent_state:checkpoint", "conversation:append")


@dataclass(frozen=True)
class Snapshot:
    """What the stores hold of one conversation, read without parking."""

    row: ChatStreamSupervision | None
    record: RecordedStreamEvent | None
    state: dict[str, Any]
    transcript: list[ChatMessage]

    def turns(self) -> set[str]:
        """Every turn whose content the stores hold: its messages, its
        recording, its checkpoint. (Not the supervision row, which holds no
        content, only a turn's id and status.)"""
        named = {turn_of(m.message_id) for m in self.transcript}
        if self.record is not None:
            named.add(self.record.message_id)
        marker = self.state.get(TURN_STATE_KEY)
        if isinstance(marker, dict):
            named.add(marker.get("message_id"))
        return {t for t in named if t}


async def snapshot(world: World, session: str) -> Snapshot:
    stores = world.stores
    assert stores.supervision and stores.recording and stores.agent_state and stores.conversation
    token = ungated()
    try:
        return Snapshot(
            await stores.supervision.read(TENANT, OWNER, session),
            await stores.recording.read(TENANT, OWNER, session),
            await stores.agent_state.load(TENANT, OWNER, session),
            await stores.conversation.get_transcript(TENANT, OWNER, session),
        )
    finally:
        reset_ungated(token)


def after_step(model: Model, snapshots: dict[str, Snapshot]) -> list[str]:
    found: list[str] = []
    for facts in model.turns.values():
        if facts.tool_runs > 1:
            found.append(f"tool ran twice: turn {facts.id[:6]} ran it {facts.tool_runs} times")
        if facts.cancel_ok_seq is not None:
            found.extend(_produced_after_cancel(model, facts))
    for erase in model.erases:
        left = snapshots[erase.session].turns() & erase.erased_turns
        if left:
            names = ", ".join(sorted(t[:6] for t in left))
            found.append(
                f"erase not final: {erase.by} of {erase.session} returned, "
                f"yet the stores hold {names}"
            )
    for session, shot in snapshots.items():
        found.extend(_form(model, session, shot.transcript))
    found.extend(_one_producer_per_epoch(model))
    return found


def _produced_after_cancel(model: Model, facts: TurnFacts) -> list[str]:
    after = facts.cancel_ok_seq or 0
    found = [
        f"produced after cancel: turn {facts.id[:6]} cancelled (OK at #{after}), "
        f"then {w.kind} {w.detail} e{w.epoch} landed at #{w.seq}"
        for w in model.writes
        if w.seq > after
        and w.accepted
        and w.turn == facts.id
        and w.kind in _PRODUCING
        and not (w.kind == "supervision:row" and w.detail != "running")
    ]
    found.extend(
        f"produced after cancel: turn {facts.id[:6]} (OK at #{after}), "
        f"its agent did {event} at #{seq}"
        for seq, turn, event, _ in model.agent_events
        if turn == facts.id and seq > after and event in ("start", "tool")
    )
    return found[:1]


def _form(model: Model, session: str, transcript: list[ChatMessage]) -> list[str]:
    """Every answer of an accepted turn right after its own question; no
    message twice. (A turn whose request died with its replica before its
    client was answered may leave the reaper's empty answer to a question
    never recorded: not held against it here.)"""
    read = without_queued(transcript)
    found = []
    ids = [m.message_id for m in read]
    if len(set(ids)) != len(ids):
        found.append(f"duplicate message: {session}")
    for i, message in enumerate(read):
        facts = model.turns.get(str(message.message_id))
        accepted = facts is not None and facts.accepted_seq is not None
        if message.sender is ChatMessageSender.BOT and accepted:
            question = f"{message.message_id}-user"
            if i == 0 or read[i - 1].message_id != question:
                found.append(
                    f"answer without its question: {session} {str(message.message_id)[:6]}"
                )
    return found


def _one_producer_per_epoch(model: Model) -> list[str]:
    named: dict[tuple[str, int], set[str]] = defaultdict(set)
    for w in model.writes:
        if w.accepted and w.turn is not None and w.epoch is not None and w.kind in _PRODUCING:
            named[(w.session, w.epoch)].add(w.turn)
    return [
        f"two producers in one epoch: {session} e{epoch} {len(turns)} turns"
        for (session, epoch), turns in named.items()
        if len(turns) > 1
    ]


def at_end(model: Model, snapshots: dict[str, Snapshot], readings: list[Any]) -> list[str]:
    found: list[str] = []
    verdicts: dict[str, str | None] = {}
    for facts in model.turns.values():
        if facts.accepted_seq is None or facts.erased or facts.rolled_back:
            continue
        transcript = snapshots[facts.session].transcript
        answer = next(
            (m for m in transcript if m.message_id == facts.id and m.sender.value == "bot"), None
        )
        verdict = _verdict(facts, answer)
        verdicts[facts.id] = verdict
        if verdict is None:
            found.append(f"no verdict: turn {facts.id[:6]} ({facts.strategy})")
        elif facts.cancel_ok_seq is not None and verdict == "errored":
            found.append(f"cancelled yet errored: turn {facts.id[:6]}")
        if facts.recorded is not None:
            shown = facts.recorded[2]
            if answer is None or not answer.content.startswith(shown):
                found.append(
                    f"recorded answer lost: turn {facts.id[:6]} ({facts.strategy}"
                    f"{', cancelled' if facts.cancel_ok_seq else ''}) recorded {shown!r}, "
                    f"(transcript: {answer.content if answer else None!r})"
                )
    for seq, turn, event, detail in model.agent_events:
        facts = model.facts(turn)
        if event == "start" and detail != f"{turn}-user" and not facts.erased:
            found.append(
                f"answers another question: turn {turn[:6]} was given "
                f"{detail[:6] or 'none'} at #{seq}"
            )
    for session, shot in snapshots.items():
        read = without_queued(shot.transcript)
        for first, second in pairwise(read):
            if first.sender is second.sender is ChatMessageSender.USER:
                asked = turn_of(first.message_id) or ""
                if verdicts.get(asked, "cancelled") != "cancelled":
                    found.append(
                        f"question without answer: {session} {asked[:6]} "
                        "is followed by another question"
                    )
    for reading in readings:
        read_of = model.turns.get(reading.turn)
        if read_of is None:
            continue
        facts = read_of
        if facts.erased or facts.rolled_back or facts.recorded is None:
            continue
        cancelled_at = facts.cancel_ok_seq
        if cancelled_at is not None and reading.started_seq > cancelled_at:
            if reading.end not in ("cancelled", "done"):
                found.append(f"cancelled turn read as {reading.end}: turn {facts.id[:6]}")
    return found


def _verdict(facts: TurnFacts, answer: ChatMessage | None) -> str | None:
    if answer is not None:
        return ending_of(answer).reason
    if facts.row_verdicts:
        return sorted(facts.row_verdicts)[0]
    if facts.cancel_ok_seq is not None:
        return "cancelled"
    return None
