"""The invariants of a conversation of several turns, checked after a round.

``invariants`` checks one turn against its crash-free run. A ``queue`` round
has two turns in one conversation, the second sent with a multitask strategy
while the first streams and its producer dies; an ``erase`` round erases a
conversation whose producer just died. What must hold then is about the
conversation as a whole:

- ``form``: the transcript reads question, answer, question, answer: every
  answer right after its own question, no message twice, no question left
  without its answer.
- ``verdict``: each turn the server accepted ended one way (done, cancelled
  or errored), and its client heard the same ending the transcript keeps.
- ``answer``: a turn that ended done answered what its crash-free run
  answered; one that was cancelled or errored keeps a beginning of it.
- ``strategy``: what the second message's strategy promises: ``enqueue``
  waits and both turns finish; ``interrupt`` and ``rollback`` always start
  (``rollback`` leaves nothing of the turn it interrupted); the default
  (``reject``) may be refused only while the first turn could still go on.
- ``shown``: no client was ever shown a turn's text shrink or change what it
  had shown (``rewound`` counts the characters taken back).
- ``erased``: after an erase returned, no replica serves anything of the
  conversation and the stores hold nothing of it, then and after every
  replica's takeover has had time to act.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tether.client.observer import TurnObserver
from tether.crashtest.invariants import Violation
from tether.domain.chat_message import ChatMessage
from tether.handlers.turn_ends import ending_of


@dataclass
class TurnTrace:
    """One turn of the conversation, as its client lived it."""

    prompt: str
    strategy: str = "reject"
    message_id: str | None = None
    outcome: str | None = None
    """How the client's stream ended (done, cancelled, errored, ...)."""
    refused: bool = False
    """The server answered the message 409 (the default strategy, busy)."""
    error: str | None = None
    """What went wrong on the client's side (not a finding about the server)."""
    shown: list[str] = field(default_factory=list)
    """The turn's text at each update the client was given, in order."""
    observer: TurnObserver = field(default_factory=TurnObserver)
    """The client's observer of the turn (it counts what its guard dropped)."""
    kept_off: int = 0
    """Characters the server sent going backwards, which the client's guard
    kept off the screen (``TurnObserver.dropped_characters``)."""


def rewound(shown: Sequence[str]) -> int:
    """Characters the client was shown and then had taken back: for each
    update that does not extend the text before it, what it dropped."""
    taken_back = 0
    for before, after in itertools.pairwise(shown):
        if not after.startswith(before):
            kept = os.path.commonprefix([before, after])  # noqa: RUF071 - characters wanted
            taken_back += len(before) - len(kept)
    return taken_back


def check_conversation(
    turns: Sequence[TurnTrace],
    transcript: Sequence[dict[str, Any]] | None,
    answers: dict[str, str],
) -> list[Violation]:
    """Every violation of a ``queue`` round's conversation. ``answers`` is the
    crash-free answer of each prompt; ``transcript`` the conversation's
    messages after the round (None: the servers keep none)."""
    found: list[Violation] = []
    for turn in turns:
        if (taken := rewound(turn.shown) + turn.kept_off) > 0:
            found.append(
                Violation(
                    "shown", f"turn {turn.message_id}: {taken} characters shown, then rewound"
                )
            )
    found += _strategy(turns)
    if transcript is None:
        return found
    read = [m for m in transcript if not m.get("queued")]
    found += _form(read)
    by_id = {str(m.get("message_id")): m for m in read}
    for turn in turns:
        if turn.message_id is None:
            continue
        answer = by_id.get(turn.message_id)
        if answer is None:
            if not _rolled_back(turn, turns) and not (
                turn.outcome == "cancelled" and f"{turn.message_id}-user" not in by_id
            ):
                found.append(Violation("verdict", f"turn {turn.message_id}: no answer kept"))
            continue
        try:
            kept = ending_of(ChatMessage.model_validate(answer)).reason
        except ValueError as error:
            found.append(Violation("form", f"turn {turn.message_id}: unreadable answer: {error}"))
            continue
        if turn.outcome is not None and turn.outcome != kept:
            found.append(
                Violation(
                    "verdict",
                    f"turn {turn.message_id}: its client heard {turn.outcome}, "
                    f"the transcript keeps {kept}",
                )
            )
        found += _answer(turn, str(answer.get("content") or ""), kept, answers.get(turn.prompt))
    found += _order(turns, [str(m.get("message_id")) for m in read])
    return found


def _rolled_back(turn: TurnTrace, turns: Sequence[TurnTrace]) -> bool:
    """Whether ``turn`` was the one a later ``rollback`` interrupted."""
    later = turns[turns.index(turn) + 1 :]
    return turn.outcome == "cancelled" and any(t.strategy == "rollback" for t in later)


def _strategy(turns: Sequence[TurnTrace]) -> list[Violation]:
    found = []
    for turn in turns[1:]:
        if turn.error is not None:
            found.append(Violation("strategy", f"{turn.strategy}: {turn.error}"))
        elif turn.refused and turn.strategy != "reject":
            found.append(Violation("strategy", f"{turn.strategy}: refused as busy"))
        elif not turn.refused and turn.outcome != "done":
            found.append(
                Violation("strategy", f"{turn.strategy}: the new turn ended {turn.outcome}")
            )
        if turn.strategy == "enqueue" and turns[0].outcome != "done":
            found.append(
                Violation("strategy", f"enqueue: the turn it waited for ended {turns[0].outcome}")
            )
    first = turns[0]
    if first.error is not None:
        found.append(Violation("verdict", f"the first turn: {first.error}"))
    elif first.outcome not in ("done", "cancelled", "errored"):
        found.append(Violation("verdict", f"the first turn ended {first.outcome}"))
    return found


def _form(read: Sequence[dict[str, Any]]) -> list[Violation]:
    found = []
    ids = [str(m.get("message_id")) for m in read]
    if len(set(ids)) != len(ids):
        found.append(Violation("form", f"a message twice: {ids}"))
    for i, message in enumerate(read):
        question = f"{message.get('message_id')}-user"
        if message.get("sender") == "bot" and (i == 0 or ids[i - 1] != question):
            found.append(Violation("form", f"answer {ids[i]} not right after its question"))
        if message.get("sender") == "user":
            answer = ids[i].removesuffix("-user")
            if i + 1 >= len(ids) or ids[i + 1] != answer:
                found.append(Violation("form", f"question {ids[i]} without its answer"))
    return found


def _answer(turn: TurnTrace, kept: str, verdict: str, crash_free: str | None) -> list[Violation]:
    if crash_free is None:
        return []
    if verdict == "done" and kept != crash_free:
        return [
            Violation(
                "answer",
                f"turn {turn.message_id}: done with {len(kept)} characters, "
                f"not its crash-free answer of {len(crash_free)}",
            )
        ]
    if verdict != "done" and not crash_free.startswith(kept):
        return [
            Violation(
                "answer", f"turn {turn.message_id}: {verdict}, keeping text it never produced"
            )
        ]
    if turn.outcome == "done" and turn.shown and turn.shown[-1] != kept:
        return [Violation("answer", f"turn {turn.message_id}: its client's last text is not kept")]
    return []


def _order(turns: Sequence[TurnTrace], ids: list[str]) -> list[Violation]:
    """The turns' questions stand in the order they were sent."""
    positions = [ids.index(f"{t.message_id}-user") for t in turns if f"{t.message_id}-user" in ids]
    if positions != sorted(positions):
        return [Violation("form", "the questions stand out of the order they were sent")]
    return []


@dataclass(frozen=True)
class ErasedEvidence:
    """What an ``erase`` round saw after its erase returned (at once, and again
    after the takeover window)."""

    erase_status: int | None
    """The status the erase finally returned (None: it never did)."""
    served: tuple[str, ...]
    """What some replica still served: ``"<replica> conversation"`` and the like."""
    stored: tuple[str, ...]
    """What the store set still held: ``"recording"``, ``"checkpoint"``."""


def check_erased(evidence: ErasedEvidence) -> list[Violation]:
    if evidence.erase_status != 204:
        return [Violation("erased", f"the erase returned {evidence.erase_status}, not 204")]
    found = [
        Violation("erased", f"after the erase, {what} was still served") for what in evidence.served
    ]
    found += [
        Violation("erased", f"after the erase, the {what} was still stored")
        for what in evidence.stored
    ]
    return found
