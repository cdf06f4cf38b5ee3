"""Invariants 4, 5 and 10 of design §5: what the turn left in the transcript
and the checkpoint.

- ``transcript`` (§5.5): the final transcript equals the crash-free run's, and the
  last answer the client was streamed is the one persisted;
- ``user-message`` (§5.4): the user's message is in it exactly once;
- ``one-answer`` (§5.4, §5.10): the transcript has exactly one bot message per
  turn, and one carrying the turn's own message id;
- ``own-checkpoint`` (§5.10): the checkpoint left in the store is the turn's
  own (its ``__turn__`` marker names the turn's message id, and the input it
  carries ends with the user's question), so a resume loaded its own turn's
  state and answered its own question.

Where a call of a tool that may not run twice was cut off, ``transcript``
compares less, because the model read another result than in the crash-free
run (see ``_answer_difference``): every message but the turn's answer, and in
the answer every part up to the end of the tool request holding that call,
must equal the crash-free run's, except that call's result; what the model
wrote after reading it must be there but is its own.

Without a conversation store the transcript checks are made on the turn's
recording instead (its last message is the answer).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tether.crashtest.invariants.observed import (
    UNKNOWN_OUTCOME,
    Expected,
    Observed,
    Violation,
    cancelled,
    common_prefix,
    normalize,
    normalize_all,
)


def transcript(expected: Expected, observed: Observed) -> list[Violation]:
    if observed.transcript is None:
        return [Violation("transcript", "the conversation does not exist")]
    actual = normalize_all(observed.transcript)
    if cancelled(observed):
        return _partial_answer(expected, actual)
    violations = []
    unknown = _unknown(observed)
    if unknown:
        problem = _masked_difference(expected.transcript, actual, unknown)
        if problem is not None:
            violations.append(Violation("transcript", problem))
    elif actual != expected.transcript:
        violations.append(Violation("transcript", _difference(expected.transcript, actual)))
    if observed.final_streamed is not None:
        bots = [m for m in actual if m.get("sender") == "bot"]
        streamed = normalize(observed.final_streamed)
        if not bots or bots[-1] != streamed:
            violations.append(
                Violation(
                    "transcript",
                    "the last answer streamed to the client is not the one persisted "
                    f"({len(str(streamed.get('content', '')))} characters streamed, "
                    f"{len(str(bots[-1].get('content', ''))) if bots else 0} persisted)",
                )
            )
    return violations


def _partial_answer(expected: Expected, actual: Sequence[dict[str, Any]]) -> list[Violation]:
    """A cancelled turn keeps a partial answer: everything but the answer as in
    the crash-free run, and the answer a beginning of the crash-free one."""
    others = [m for m in actual if m.get("sender") != "bot"]
    expected_others = [m for m in expected.transcript if m.get("sender") != "bot"]
    violations = []
    if others != expected_others:
        violations.append(
            Violation(
                "transcript", "besides the answer, the transcript differs from the crash-free run"
            )
        )
    bots = [m for m in actual if m.get("sender") == "bot"]
    whole = _answer(expected)
    if bots and not whole.startswith(str(bots[-1].get("content", ""))):
        kept = str(bots[-1].get("content", ""))
        violations.append(
            Violation(
                "transcript",
                f"the cancelled turn kept an answer that is not a beginning of the crash-free "
                f"one (differs at character {len(common_prefix(whole, kept))} of {len(kept)})",
            )
        )
    return violations


def _answer(expected: Expected) -> str:
    bots = [m for m in expected.transcript if m.get("sender") == "bot"]
    return str(bots[-1].get("content", "")) if bots else ""


def recorded_answer(expected: Expected, observed: Observed) -> list[Violation]:
    """Without a conversation store, the answer is the recording's last message."""
    bots = [m for m in expected.transcript if m.get("sender") == "bot"]
    want = bots[-1] if bots else None
    violations = []
    unknown = _unknown(observed)
    streamed = observed.final_streamed
    if streamed is not None and unknown and want is not None:
        problem = _answer_difference(want, normalize(streamed), unknown)
        if problem is not None:
            violations.append(Violation("transcript", f"the last answer streamed: {problem}"))
    elif streamed is not None and normalize(streamed) != want:
        violations.append(
            Violation(
                "transcript", "the last answer streamed to the client is not the crash-free one"
            )
        )
    stored = observed.stored
    if stored is None:
        return violations
    if stored.recorded_final is None or stored.recorded_message_id != observed.message_id:
        violations.append(Violation("transcript", "the turn's recording is gone"))
        return violations
    kept = normalize(stored.recorded_final)
    if cancelled(observed):
        if not _answer(expected).startswith(str(kept.get("content", ""))):
            violations.append(
                Violation(
                    "transcript", "the cancelled turn's recording is not a beginning of the answer"
                )
            )
    elif unknown and want is not None:
        problem = _answer_difference(want, kept, unknown)
        if problem is not None:
            violations.append(Violation("transcript", f"the recording's last message: {problem}"))
    elif kept != want:
        violations.append(
            Violation("transcript", "the recording's last message is not the crash-free answer")
        )
    return violations


def _unknown(observed: Observed) -> frozenset[int]:
    """The calls a done turn must show as of unknown outcome (none if cancelled)."""
    if observed.tool_calls is None or cancelled(observed):
        return frozenset()
    return observed.tool_calls.unknown()


def _masked_difference(
    expected: Sequence[dict[str, Any]], actual: Sequence[dict[str, Any]], unknown: frozenset[int]
) -> str | None:
    """How ``actual`` differs from the crash-free transcript beyond what the
    calls of unknown outcome change (see ``_answer_difference``); None if not."""
    if len(expected) != len(actual):
        return _difference(expected, actual)
    answer = max((n for n, m in enumerate(expected) if m.get("sender") == "bot"), default=None)
    for position, (want, got) in enumerate(zip(expected, actual, strict=True)):
        if position == answer and got.get("sender") == "bot":
            problem = _answer_difference(want, got, unknown)
            if problem is not None:
                return f"message {position} (bot): {problem}"
        elif want != got:
            return _difference([want], [got]).replace("message 0", f"message {position}", 1)
    return None


def _answer_difference(
    want: dict[str, Any], got: dict[str, Any], unknown: frozenset[int]
) -> str | None:
    """How the answer ``got`` differs from the crash-free ``want`` beyond what
    the calls ``unknown`` (by index among the answer's tool calls) change; None
    if it does not.

    Compared exactly: every field but the content; the parts up to the end of
    the tool request (a run of adjacent tool parts) that holds the first of
    those calls, each call's result included, except those calls', which must
    be errors saying the call may or may not have happened; and the content's
    beginning, the text before the first tool request. Not compared: the parts
    after that request, the model's reply to results other than the crash-free
    run's; there must be at least one, with text.
    """
    fields = {k: v for k, v in got.items() if k not in ("content", "content_parts")}
    if fields != {k: v for k, v in want.items() if k not in ("content", "content_parts")}:
        return "fields besides its content differ from the crash-free run's"
    want_parts = list(want.get("content_parts") or [])
    got_parts = list(got.get("content_parts") or [])
    tools = [n for n, part in enumerate(want_parts) if part.get("type") == "tool"]
    if min(unknown) >= len(tools):
        return f"it has no tool call {min(unknown)}: the crash-free run has {len(tools)}"
    end = tools[min(unknown)]
    while end + 1 < len(want_parts) and want_parts[end + 1].get("type") == "tool":
        end += 1
    compared = end + 1
    if len(got_parts) < compared:
        return f"{len(got_parts)} parts; the crash-free run has {compared} up to its tool results"
    call = -1
    for position in range(compared):
        wanted, part = want_parts[position], got_parts[position]
        if wanted.get("type") != "tool":
            if part != wanted:
                return f"part {position} ({wanted.get('type')}) differs from the crash-free run's"
            continue
        call += 1
        if call not in unknown:
            if part != wanted:
                return f"tool call {call} differs from the crash-free run's"
            continue
        tool, wanted_tool = dict(part.get("tool") or {}), dict(wanted.get("tool") or {})
        status, response = tool.pop("status", None), tool.pop("response", None)
        wanted_tool.pop("status", None)
        wanted_tool.pop("response", None)
        if tool != wanted_tool or part.get("type") != "tool":
            return f"tool call {call} is not the crash-free run's call"
        if status != "error" or UNKNOWN_OUTCOME not in str(response):
            return (
                f"tool call {call} ({tool.get('name')}) was cut off, yet is shown {status} "
                f"({str(response)[:60]!r}), not as {UNKNOWN_OUTCOME!r}"
            )
    reply = [
        part for part in got_parts[compared:] if part.get("type") == "text" and part.get("text")
    ]
    if not reply:
        return "the model wrote nothing after the tool results"
    opening = want_parts[0].get("text") if want_parts[0].get("type") == "text" else None
    if opening and not str(got.get("content", "")).startswith(str(opening)):
        return "its content does not begin with the crash-free run's text before the tool calls"
    return None


def _difference(expected: Sequence[dict[str, Any]], actual: Sequence[dict[str, Any]]) -> str:
    if len(expected) != len(actual):
        senders = [m.get("sender") for m in actual]
        return f"{len(actual)} messages {senders}, the crash-free run has {len(expected)}"
    for position, (want, got) in enumerate(zip(expected, actual, strict=True)):
        if want == got:
            continue
        want_text, got_text = str(want.get("content", "")), str(got.get("content", ""))
        if want_text != got_text:
            common = len(common_prefix(want_text, got_text))
            return (
                f"message {position} ({got.get('sender')}): content differs at character "
                f"{common} ({len(got_text)} characters, the crash-free run has {len(want_text)})"
            )
        return f"message {position} ({got.get('sender')}): content parts differ"
    return "transcripts differ"


def user_message(expected: Expected, observed: Observed) -> list[Violation]:
    if observed.transcript is None:
        return []
    users = [m for m in observed.transcript if m.get("sender") == "user"]
    matching = [m for m in users if m.get("content") == expected.prompt]
    if len(matching) != 1 or len(users) != 1:
        return [
            Violation(
                "user-message",
                f"the user's message is in the transcript {len(matching)} times "
                f"({len(users)} user messages in all; want exactly once)",
            )
        ]
    return []


def one_answer(observed: Observed) -> list[Violation]:
    """Exactly one bot message per turn (each user message is one turn), and
    exactly one carrying this turn's message id."""
    if observed.transcript is None:
        return []
    users = [m for m in observed.transcript if m.get("sender") == "user"]
    bots = [m for m in observed.transcript if m.get("sender") == "bot"]
    violations = []
    if len(bots) != len(users):
        violations.append(
            Violation(
                "one-answer",
                f"the transcript has {len(bots)} bot messages for {len(users)} user messages",
            )
        )
    if observed.message_id is not None:
        own = [m for m in bots if m.get("message_id") == observed.message_id]
        if len(own) != 1:
            violations.append(
                Violation(
                    "one-answer",
                    f"the transcript has {len(own)} bot messages of turn {observed.message_id}",
                )
            )
    return violations


def own_checkpoint(expected: Expected, observed: Observed) -> list[Violation]:
    """The checkpoint the turn leaves is its own: a resume loaded (and carried
    on) this turn's state, and answered this turn's question."""
    stored = observed.stored
    if stored is None or observed.message_id is None:
        return []
    if stored.checkpoint_message_id is None:
        return [Violation("own-checkpoint", "the agent state holds no turn marker")]
    violations = []
    if stored.checkpoint_message_id != observed.message_id:
        violations.append(
            Violation(
                "own-checkpoint",
                f"the checkpoint belongs to turn {stored.checkpoint_message_id}, "
                f"not {observed.message_id}",
            )
        )
    if stored.checkpoint_input is not None:
        users = [m for m in stored.checkpoint_input if m.get("sender") == "user"]
        if not users or users[-1].get("content") != expected.prompt:
            asked = repr(str(users[-1].get("content", ""))[:40]) if users else "no question"
            violations.append(
                Violation(
                    "own-checkpoint",
                    f"the checkpoint's turn input ends with {asked}, not the user's message",
                )
            )
    return violations
